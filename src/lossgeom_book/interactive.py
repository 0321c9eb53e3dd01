"""Interactive figures that work in the book's static HTML, without a kernel.

:func:`glue_interactive` turns a plotly figure into one glued HTML snippet: a ``<div>``
whose id is fixed by the glue name, and a short script that draws the figure with
plotly.js once the page has loaded it (plotly.js is not embedded: the book's Sphinx
extension ``_ext/plotly_js.py`` serves ``plotly.min.js`` from the installed plotly
package, only on pages that carry :data:`MARKER`). Every number in the snippet has at
most ``sig`` significant digits and the JSON is written with sorted keys, so the stored
HTML is the same bytes on every machine and nbval compares it as text. A chapter shows
the snippet with a ``{glue} int-<name>`` directive, next to the static figure it explores.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np
from myst_nb import glue
from plotly.basedatatypes import BaseFigure

from lossgeom.formatting import round_sig

#: The class of every interactive figure's ``<div>``; ``_ext/plotly_js.py`` adds plotly.js
#: to the pages whose HTML contains ``class="lossgeom-plotly"``.
MARKER = "lossgeom-plotly"
#: Significant digits of every plotted number (enough to read, few enough to be portable).
DEFAULT_SIG = 4
#: Height of a figure in pixels; its width is the column's (100 %).
DEFAULT_HEIGHT = 440
#: plotly.js options: no logo, resize with the window.
CONFIG = {"displaylogo": False, "responsive": True}

_NAME = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
_NUMBER = re.compile(r"(?<![\w.])-?\d+\.\d+(?:[eE][+-]?\d+)?")  # a decimal number, as book-check reads one

_SCRIPT = """<div id="{div_id}" class="{marker}" style="width:100%;height:{height}px">\
Interactive figure: it draws where plotly.js is loaded (the book's HTML pages load it); \
the static figure beside it shows the same values.</div>
<script>
(function () {{
  var figure = {figure};
  function draw() {{
    var el = document.getElementById("{div_id}");
    var box = el && el.closest("details");
    if (!el || !window.Plotly || el.dataset.drawn) return;
    if (box && !box.open) {{ box.addEventListener("toggle", draw, {{once: true}}); return; }}
    el.dataset.drawn = "1";
    el.textContent = "";
    window.Plotly.newPlot(el, figure.data, figure.layout, figure.config);
  }}
  function start() {{ if (window.Plotly) draw(); else window.addEventListener("load", draw); }}
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
}})();
</script>"""


def rounded(values: Any, sig: int = DEFAULT_SIG) -> Any:
    """``values`` (a number, or a list, array or tensor of them) as plain floats rounded to ``sig`` digits.

    Use it on every plotted number before it enters a plotly figure: plotly would store a
    numpy array as base64 bytes that neither a reader nor nbval can compare.

    Raises:
        ValueError: if a value is not finite or ``sig`` is not an int >= 1.
        TypeError: if a value is not a real number.
    """
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    if isinstance(values, np.ndarray):
        values = values.tolist()
    if isinstance(values, (list, tuple)):
        return [rounded(value, sig) for value in values]
    if isinstance(values, (bool, np.bool_)) or not isinstance(values, (int, float, np.integer, np.floating)):
        raise TypeError(f"values must be real numbers (or lists, arrays of them), got {type(values).__name__}")
    if not math.isfinite(values):
        raise ValueError(f"values must be finite to be plotted, got {values!r}")
    return round_sig(values, sig)


def _significant_digits(token: str) -> int:
    return len(re.split(r"[eE]", token.lstrip("-"))[0].replace(".", "").lstrip("0"))


def _portable(obj: Any, sig: int, path: str) -> Any:
    """The figure's JSON tree with every float rounded to ``sig`` digits; refuse what is not portable."""
    if isinstance(obj, dict):
        if "bdata" in obj:
            raise ValueError(
                f"{path} is a binary-encoded array (plotly stores numpy arrays as bytes): pass plotted "
                "numbers as lists, e.g. lossgeom_book.interactive.rounded(values)"
            )
        return {str(key): _portable(value, sig, f"{path}.{key}") for key, value in obj.items()}
    if isinstance(obj, (list, tuple, np.ndarray)):
        return [_portable(value, sig, f"{path}[{i}]") for i, value in enumerate(obj)]
    if obj is None or isinstance(obj, (str, bool, np.bool_)):
        return bool(obj) if isinstance(obj, np.bool_) else obj
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        if not math.isfinite(obj):
            raise ValueError(f"{path} is {obj!r}: a plotted number must be finite (use None for a gap)")
        return round_sig(float(obj), sig)
    raise TypeError(f"{path} holds a {type(obj).__name__}, which has no portable JSON form")


def interactive_html(name: str, fig: BaseFigure, *, height: int = DEFAULT_HEIGHT, sig: int = DEFAULT_SIG) -> str:
    """The HTML snippet of ``fig``: a ``<div id="plotly-int-<name>">`` and the script that draws it.

    The snippet does not contain plotly.js; it draws the figure on ``DOMContentLoaded``
    (or at once where ``window.Plotly`` already exists), and inside a closed ``<details>``
    dropdown only when it is opened, so the figure takes the column's width. The
    figure's template is dropped (plotly.js's own defaults apply), its width is the
    column's and its height ``height`` pixels.

    Raises:
        ValueError: if ``name`` is not lower-case words joined by hyphens, ``height`` is not
            an int in [150, 1200], the layout fixes a width, a number is not finite or is
            stored as bytes, or a text holds a number with 13 or more significant digits.
        TypeError: if ``fig`` is not a plotly figure.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"name must be lower-case words joined by hyphens, such as 'ch02-orbit', got {name!r}")
    if not isinstance(fig, BaseFigure):
        raise TypeError(f"fig must be a plotly figure (plotly.graph_objects.Figure), got {type(fig).__name__}")
    if isinstance(height, bool) or not isinstance(height, int) or not 150 <= height <= 1200:
        raise ValueError(f"height must be an int number of pixels in [150, 1200], got {height!r}")
    if isinstance(sig, bool) or not isinstance(sig, int) or sig < 1:
        raise ValueError(f"sig must be an int >= 1 (significant digits), got {sig!r}")
    figure = fig.to_plotly_json()
    layout = dict(figure.get("layout", {}))
    if layout.get("width") is not None:
        raise ValueError("the layout must not fix a width: an interactive figure takes the column's width")
    layout.pop("template", None)
    layout.update(autosize=True, height=height)
    portable = _portable({"config": CONFIG, "data": figure.get("data", []), "layout": layout}, sig, "figure")
    text = json.dumps(portable, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    long = [token for token in _NUMBER.findall(text) if _significant_digits(token) >= 13]
    if long:
        raise ValueError(
            f"the figure's text holds {long[0]!r}, a number with 13+ significant digits that "
            "differs between machines: format it with lossgeom.formatting.fmt"
        )
    text = text.replace("</", "<\\/")  # a string may not close the <script> element
    return _SCRIPT.format(div_id=f"plotly-int-{name}", marker=MARKER, height=height, figure=text)


class InteractiveFigure:
    """A glued interactive figure: HTML for the book's pages, one line of text elsewhere."""

    def __init__(self, name: str, html: str):
        self.name, self.html = name, html

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return f"interactive figure int-{self.name} (plotly; {len(self.html.encode())} bytes of HTML)"


def glue_interactive(name: str, fig: BaseFigure, *, height: int = DEFAULT_HEIGHT, sig: int = DEFAULT_SIG) -> None:
    """Glue :func:`interactive_html` of ``fig`` as ``int-<name>``, to show with ``{glue} int-<name>``.

    Its text/plain form names the figure and the size of its HTML; nothing is displayed.
    """
    glue(f"int-{name}", InteractiveFigure(name, interactive_html(name, fig, height=height, sig=sig)), display=False)

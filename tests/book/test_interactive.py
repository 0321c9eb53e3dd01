"""Interactive figures for the static HTML: fixed ids, rounded numbers, no plotly.js inside,
the same bytes on every call, clear errors; and the Sphinx extension that serves plotly.js."""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from lossgeom.atlas import atlas
from lossgeom_book import interactive
from lossgeom_book.atlas_page import compact_cell_text, size_sweep_interactive
from lossgeom_book.interactive import MARKER, glue_interactive, interactive_html, rounded

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("plotly_js", ROOT / "_ext" / "plotly_js.py")
plotly_js = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plotly_js)


def figure_json(html: str) -> dict:
    """The figure the snippet's script hands to plotly.js."""
    (text,) = re.findall(r"^  var figure = (.*);$", html, flags=re.M)
    return json.loads(text)


def floats(tree) -> list[float]:
    if isinstance(tree, dict):
        return [f for value in tree.values() for f in floats(value)]
    if isinstance(tree, list):
        return [f for value in tree for f in floats(value)]
    return [tree] if isinstance(tree, float) else []


def significant_digits(value: float) -> int:
    return len(repr(abs(value)).split("e")[0].replace(".", "").lstrip("0").rstrip("0")) or 1


def line_figure(x, y, **layout) -> go.Figure:
    fig = go.Figure(go.Scatter(x=x, y=y, mode="lines+markers", name="a line"))
    fig.update_layout(**layout)
    return fig


def test_the_div_id_is_fixed_by_the_name():
    html = interactive_html("ch02-orbit", line_figure([1, 2], [3, 4]))
    assert html.startswith(f'<div id="plotly-int-ch02-orbit" class="{MARKER}" style="width:100%;height:440px">')
    assert html.count('"plotly-int-ch02-orbit"') == 2  # the div and the script that finds it
    assert 'id="plotly-int-atlas-sweep"' in interactive_html("atlas-sweep", line_figure([1, 2], [3, 4]))
    assert not re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-", html)  # no uuid, as plotly's own to_html writes


def test_every_plotted_number_is_rounded_to_sig_digits():
    x = [1 / 3, 2 / 3, math.pi, 12345.678, 2.0e-7 / 3]
    html = interactive_html("rounding", line_figure(x, [math.e] * 5, margin=dict(l=41.23456)), sig=4)
    data = figure_json(html)
    assert data["data"][0]["x"] == [0.3333, 0.6667, 3.142, 12350.0, 6.667e-08]
    assert data["data"][0]["y"] == [2.718] * 5 and data["layout"]["margin"]["l"] == 41.23
    assert max(significant_digits(f) for f in floats(data)) <= 4
    assert rounded(np.array([1 / 3, 2 / 3]), 2) == [0.33, 0.67] and rounded(torch.tensor([[1 / 7]]), 3) == [[0.143]]
    assert rounded(7) == 7 and rounded((0.5, 1 / 9), 1) == [0.5, 0.1]


def test_the_snippet_does_not_embed_plotly_js():
    html = interactive_html("small", line_figure([1, 2], [3, 4]))
    assert len(html.encode()) < 5_000 < plotly_js.plotly_js_path().stat().st_size // 100
    assert "<script src" not in html and "cdn" not in html.lower()
    assert html.count("<script>") == 1 and html.count("</script>") == 1
    assert "window.Plotly.newPlot" in html and 'addEventListener("DOMContentLoaded", start)' in html
    assert "template" not in figure_json(html)["layout"]  # plotly.js's own defaults, not a 8 kB template


def test_the_figure_takes_the_column_width_and_a_fixed_height():
    layout = figure_json(interactive_html("size", line_figure([1, 2], [3, 4]), height=300))["layout"]
    assert layout["autosize"] is True and layout["height"] == 300 and "width" not in layout
    assert figure_json(interactive_html("size", line_figure([1], [2])))["config"] == {
        "displaylogo": False,
        "responsive": True,
    }


def test_the_snippet_is_the_same_bytes_on_every_call_and_key_order():
    first = interactive_html("same", line_figure(rounded(np.linspace(0, 1, 7)), [1] * 7, title="t", height=500))
    again = interactive_html("same", line_figure(rounded(np.linspace(0, 1, 7)), [1] * 7, title="t", height=500))
    reordered = go.Figure(layout=dict(height=500, title="t"))
    reordered.add_trace(go.Scatter(name="a line", mode="lines+markers", y=[1] * 7, x=rounded(np.linspace(0, 1, 7))))
    assert first == again == interactive_html("same", reordered)


def test_a_text_cannot_close_the_script():
    html = interactive_html("escape", line_figure([1], [2], title="</script><b>x</b>"))
    assert html.count("</script>") == 1 and "<\\/script>" in html
    assert figure_json(html)["layout"]["title"]["text"] == "</script><b>x</b>"


@pytest.mark.parametrize("name", ["", "Ch02", "ch02 orbit", "-orbit", "orbit-", "a--b", 7])
def test_a_bad_name_is_refused(name):
    with pytest.raises(ValueError, match="lower-case words joined by hyphens"):
        interactive_html(name, line_figure([1], [2]))


def test_bad_figures_and_settings_are_refused():
    with pytest.raises(TypeError, match="must be a plotly figure"):
        interactive_html("x", {"data": [], "layout": {}})
    with pytest.raises(ValueError, match="binary-encoded array"):
        interactive_html("x", line_figure(np.array([0.1, 0.2]), [1, 2]))
    with pytest.raises(ValueError, match="must be finite"):
        interactive_html("x", line_figure([1.0, float("nan")], [1, 2]))
    with pytest.raises(ValueError, match="must not fix a width"):
        interactive_html("x", line_figure([1], [2], width=900))
    with pytest.raises(ValueError, match="height must be an int"):
        interactive_html("x", line_figure([1], [2]), height=20)
    with pytest.raises(ValueError, match="sig must be an int"):
        interactive_html("x", line_figure([1], [2]), sig=0)
    with pytest.raises(ValueError, match="13\\+ significant digits"):
        interactive_html("x", line_figure([1], [2], title=f"value {1 / 3!r}"))


def test_rounded_refuses_what_is_not_a_finite_number():
    with pytest.raises(ValueError, match="must be finite"):
        rounded([1.0, float("inf")])
    with pytest.raises(TypeError, match="real numbers"):
        rounded(["1.0"])
    with pytest.raises(TypeError, match="real numbers"):
        rounded(True)


def test_glue_interactive_glues_the_html_under_int_name(monkeypatch):
    glued = {}
    monkeypatch.setattr(interactive, "glue", lambda name, value, display=True: glued.update({name: (value, display)}))
    fig = line_figure([1, 2], [3, 4])
    assert glue_interactive("ch02-orbit", fig, height=300) is None
    value, displayed = glued["int-ch02-orbit"]
    assert displayed is False and value._repr_html_() == interactive_html("ch02-orbit", fig, height=300)
    assert repr(value) == f"interactive figure int-ch02-orbit (plotly; {len(value.html.encode())} bytes of HTML)"


def test_the_extension_finds_the_marker_and_plotly_js():
    assert plotly_js.MARKER == f'class="{MARKER}"'
    assert plotly_js.needs_plotly(interactive_html("x", line_figure([1], [2])))
    assert not plotly_js.needs_plotly("<p>the class lossgeom-plotly is named in prose</p>")
    path = plotly_js.plotly_js_path()
    assert path.name == "plotly.min.js" and path.stat().st_size > 1_000_000


def test_the_extension_adds_plotly_js_only_to_pages_with_a_figure(tmp_path):
    added = []
    app = SimpleNamespace(add_js_file=lambda name, **kwargs: added.append((name, kwargs)))
    with_figure = {"body": "<p>x</p>" + interactive_html("x", line_figure([1], [2]))}
    plotly_js._add_to_page(app, "appendices/atlas", "page.html", {"body": "<p>no figure</p>"}, doctree=object())
    assert added == []
    plotly_js._add_to_page(app, "genindex", "genindex.html", with_figure, doctree=None)  # not a document
    assert added == []
    plotly_js._add_to_page(app, "chapters/ch02", "page.html", with_figure, doctree=object())
    assert added == [("plotly.min.js", {"loading_method": "defer"})]


def test_the_extension_copies_plotly_js_into_static_after_an_html_build(tmp_path):
    app = SimpleNamespace(builder=SimpleNamespace(format="html"), outdir=str(tmp_path))
    plotly_js._copy_plotly_js(app, exception=RuntimeError("failed build"))
    assert not (tmp_path / "_static").exists()
    plotly_js._copy_plotly_js(app, exception=None)
    copied = tmp_path / "_static" / "plotly.min.js"
    assert copied.read_bytes() == plotly_js.plotly_js_path().read_bytes()
    latex = SimpleNamespace(builder=SimpleNamespace(format="latex"), outdir=str(tmp_path / "latex"))
    plotly_js._copy_plotly_js(latex, exception=None)
    assert not (tmp_path / "latex").exists()


SWEPT = ["trace", "sam", "fisher_rao"]
RESCALINGS = ["relu_rescaling", "layer_rescaling", "normalisation_rescaling"]
SIZES = (1.5, 2.0, 3.0)


@pytest.fixture(scope="module")
def sweep():
    """A 3-5-4 ReLU classifier's atlas at three sizes of one draw (the tests of atlas_page use the same model)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(3, 5, dtype=torch.float64), torch.nn.ReLU(), torch.nn.Linear(5, 4, dtype=torch.float64)
    )
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(24, 3, generator=gen, dtype=torch.float64), torch.randint(0, 4, (24,), generator=gen)
    return {
        r: atlas(
            model,
            torch.nn.CrossEntropyLoss(),
            (x, y),
            probe=x[:12],
            measures=SWEPT,
            transforms=RESCALINGS,
            size=r,
            seed=0,
        )
        for r in SIZES
    }


def test_the_interactive_sweep_draws_the_tables_factors_with_hover_and_a_legend_per_column(sweep):
    fig = size_sweep_interactive(sweep, SWEPT, RESCALINGS, title="small")
    assert [a.text for a in fig.layout.annotations] == ["tr H", "SAM", "Fisher-Rao"]  # a panel per measure
    assert len(fig.data) == len(SWEPT) * 2  # the two rescalings that apply (no normalisation layer)
    for n, trace in enumerate(fig.data):
        key, column = SWEPT[n // 2], RESCALINGS[n % 2]
        cells = [sweep[r].cell(key, column) for r in SIZES]
        assert list(trace.x) == list(SIZES) and list(trace.text) == [compact_cell_text(c) for c in cells]
        assert list(trace.y) == rounded([abs(c.factor) for c in cells])
        assert trace.legendgroup == column and trace.showlegend == (n < 2)  # one legend entry toggles every panel
    data = figure_json(interactive_html("atlas-sweep", fig))
    assert max(significant_digits(f) for f in floats(data)) <= 4
    assert data["layout"]["xaxis"]["type"] == "log" and data["layout"]["yaxis"]["type"] == "log"
    assert interactive_html("atlas-sweep", fig) == interactive_html(
        "atlas-sweep", size_sweep_interactive(sweep, SWEPT, RESCALINGS, title="small")
    )


def test_the_extension_lets_a_nitpicky_build_ignore_plotlys_classes():
    config = SimpleNamespace(nitpick_ignore_regex=[("py:class", "torch\\..*")])
    plotly_js._ignore_plotly_classes(app=None, config=config)
    assert config.nitpick_ignore_regex == [("py:class", "torch\\..*"), ("py:class", "plotly\\..*")]
    kind, pattern = config.nitpick_ignore_regex[-1]
    assert re.fullmatch(pattern, "plotly.graph_objs._figure.Figure") and not re.fullmatch(pattern, "lossgeom.Atlas")

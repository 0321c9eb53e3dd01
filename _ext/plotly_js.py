"""Sphinx extension: serve plotly.js from the installed plotly package, on the pages that need it.

The book's interactive figures (``lossgeom_book.interactive``) are HTML snippets that do not
embed plotly.js. This extension copies ``plotly.min.js`` from the installed ``plotly``
package (``plotly/package_data/plotly.min.js``, the same version as the Python package;
never downloaded, no CDN) into the build's ``_static/``, and adds a deferred
``<script>`` for it only to pages whose body contains an interactive figure's marker,
``class="lossgeom-plotly"``. Other pages load nothing more. plotly's own classes (a
``plotly.graph_objects.Figure`` in a type hint) have no documentation offline, so a
nitpicky build ignores references to them, as ``_config.yml`` does for torch and numpy.
"""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

#: What an interactive figure's ``<div>`` carries (``lossgeom_book.interactive.MARKER``).
MARKER = 'class="lossgeom-plotly"'
JS_FILE = "plotly.min.js"
#: plotly's classes, which no offline inventory documents (``nitpick_ignore_regex`` entry).
NITPICK_IGNORE = ("py:class", r"plotly\..*")


def plotly_js_path() -> Path:
    """``plotly.min.js`` of the installed plotly package."""
    path = Path(str(resources.files("plotly") / "package_data" / JS_FILE))
    if not path.is_file() or path.stat().st_size == 0:
        raise FileNotFoundError(f"{path}: the installed plotly package has no {JS_FILE}")
    return path


def needs_plotly(body: str) -> bool:
    """Whether a page's rendered body holds an interactive figure."""
    return MARKER in body


def _add_to_page(app, pagename, templatename, context, doctree) -> None:
    if doctree is not None and needs_plotly(context.get("body", "")):
        app.add_js_file(JS_FILE, loading_method="defer")  # on html-page-context: this page only


def _ignore_plotly_classes(app, config) -> None:
    config.nitpick_ignore_regex = [*config.nitpick_ignore_regex, NITPICK_IGNORE]


def _copy_plotly_js(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    target = Path(app.outdir) / "_static" / JS_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(plotly_js_path(), target)  # every build: the installed plotly's own copy


def setup(app):
    plotly_js_path()  # fail at start-up, not after the build, if plotly.js is missing
    app.connect("config-inited", _ignore_plotly_classes)
    app.connect("html-page-context", _add_to_page)
    app.connect("build-finished", _copy_plotly_js)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}

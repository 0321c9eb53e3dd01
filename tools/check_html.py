#!/usr/bin/env python3
"""Open the built book in headless Chromium and check what a reader would see.

For the landing page, every chapter page and the claims appendix this loads the page at
a 1300 x 900 laptop window, lets MathJax run, measures the layout with a small script
(injected into a temporary copy of the page) and checks that:

- formulas are typeset: at least one ``<mjx-container>`` per display or inline formula
  source, and no raw TeX delimiters (``$$``, ``\\(``, ``\\[``, ``\\begin{``) remain in text;
  MathJax is served locally (``_static/mathjax``), since no CDN is reachable;
- every figure is there: each ``{glue:figure}`` of the chapter's source appears as an
  ``<img>`` whose file exists under ``_build/html`` and is a non-empty PNG, with its
  measurement contract under the caption ("Measurement contract." once per figure);
- chapter numbers agree everywhere: the heading's number, the sidebar's number and the
  claims appendix's number of each chapter equal the number ``_toc.yml`` gives it
  (:func:`lossgeom_book.toc.chapter_numbers`); every "Chapter N" in the prose is a link to
  chapter N (a typed number would go stale when chapters move);
- every chapter page has its launch buttons: Binder, Colab and live code (Thebe);
- nothing scrolls sideways: no code-cell line, no output, no table and no display formula
  is wider than the article column at a 1300 px window;
- interactive figures (``{glue} int-<name>``, :mod:`lossgeom_book.interactive`) are drawn
  by plotly.js (their dropdowns opened first) and fit the column; plotly.js is served from
  ``_static/plotly.min.js`` and loaded on exactly the pages that hold one;
- figures are numbered per chapter: every figure number on chapter N's pages (the chapter
  and its sub-pages, listed under it with ``sections:`` in ``_toc.yml``) reads "N.k", with
  k counting 1, 2, ... in page order; a sub-page's heading is a section of chapter N.

Run after `make book` (``make check-html``). Exits non-zero with a list of problems.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"
sys.path.insert(0, str(ROOT / "src"))
from lossgeom_book.toc import chapter_numbers, toc_chapters  # noqa: E402

WINDOW = "1300,900"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    "--virtual-time-budget=20000",
    f"--window-size={WINDOW}",
    "--dump-dom",
]

# Measures, after MathJax has typeset, every code-cell input and display formula that is
# wider than the box it sits in, and writes the result into the DOM as JSON.
MEASURE = r"""
<script>
window.addEventListener('load', function () {
  // open the dropdowns that hold interactive figures, so that they draw before measuring
  document.querySelectorAll('div.lossgeom-plotly').forEach(function (d) {
    var box = d.closest('details'); if (box) { box.open = true; }
  });
  setTimeout(function () {
  var out = {code: [], math: [], output: [], table: [], figures: [], interactive: []};
  document.querySelectorAll('div.cell_output pre, div.cell_output div.output').forEach(function (o) {
    if (o.scrollWidth > o.clientWidth + 1) {
      var first = o.textContent.trim().split('\n')[0].slice(0, 60);
      out.output.push(first + ' (' + o.scrollWidth + ' > ' + o.clientWidth + ' px)');
    }
  });
  var article = document.querySelector('article.bd-article') || document.body;
  document.querySelectorAll('article table').forEach(function (t) {
    var box = t.parentElement;
    if (t.getBoundingClientRect().width > article.clientWidth + 1 || box.scrollWidth > box.clientWidth + 1) {
      out.table.push(t.textContent.trim().replace(/\s+/g, ' ').slice(0, 60));
    }
  });
  document.querySelectorAll('figure span.caption-number, div.figure span.caption-number').forEach(function (c) {
    out.figures.push(c.textContent.trim());
  });
  document.querySelectorAll('div.cell_input pre').forEach(function (pre) {
    if (pre.scrollWidth > pre.clientWidth + 1) {
      var longest = pre.textContent.split('\n').reduce(function (a, b) { return a.length >= b.length ? a : b; }, '');
      out.code.push(longest.trim().slice(0, 80) + ' (' + longest.length + ' chars)');
    }
  });
  document.querySelectorAll('mjx-container[display="true"]').forEach(function (m) {
    var box = m.parentElement;
    if (m.scrollWidth > box.clientWidth + 1 || m.getBoundingClientRect().width > box.clientWidth + 1) {
      out.math.push((m.getAttribute('aria-label') || m.textContent || '').slice(0, 60));
    }
  });
  document.querySelectorAll('div.lossgeom-plotly').forEach(function (d) {
    out.interactive.push({id: d.id, drawn: !!d.querySelector('svg.main-svg'),
                          wide: d.getBoundingClientRect().width > article.clientWidth + 1});
  });
  var pre = document.createElement('pre'); pre.id = 'lossgeom-measure';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 6000); });
</script>
"""


class Page(HTMLParser):
    """Visible prose (outside script, style, code and typeset math), images, links, numbers."""

    SKIP = ("script", "style", "pre", "code")  # code listings may hold TeX strings legitimately

    def __init__(self) -> None:
        super().__init__()
        self.skip = 0
        self.text: list[str] = []
        self.images: list[str] = []
        self.links: list[tuple[str, str]] = []  # (href, text)
        self._link: list | None = None
        self.heading_number: str | None = None
        self._h1 = self._number = False
        self.sidebar_current: str | None = None
        self._current = False
        self.hrefs: list[str] = []
        self.thebe = False
        self.measure = ""
        self._measure = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = (attrs.get("class") or "").split()
        if tag == "pre" and attrs.get("id") == "lossgeom-measure":
            self._measure = True
        if tag in self.SKIP or tag.startswith("mjx-"):
            self.skip += 1
        if tag == "img":
            self.images.append(attrs.get("src", ""))
        if tag == "a":
            self.hrefs.append(attrs.get("href", ""))
            self._link = [attrs.get("href", ""), ""]
            self._current = "current" in classes and attrs.get("href") == "#"
        if tag == "h1":
            self._h1 = True
        if tag == "span" and self._h1 and "section-number" in classes:
            self._number = True
        if tag == "button" and "btn-launch-thebe" in classes:
            self.thebe = True

    def handle_endtag(self, tag):
        if (tag in self.SKIP or tag.startswith("mjx-")) and self.skip:
            self.skip -= 1
        if tag == "pre":
            self._measure = False
        if tag == "a" and self._link is not None:
            self.links.append((self._link[0], self._link[1].strip()))
            self._link = None
            self._current = False
        if tag == "h1":
            self._h1 = False
        if tag == "span":
            self._number = False

    def handle_data(self, data):
        if self._measure:
            self.measure += data
        if self._number and self.heading_number is None:
            self.heading_number = data.strip().rstrip(".")
        if self._current and self.sidebar_current is None:
            self.sidebar_current = data.strip()
        if self._link is not None:
            self._link[1] += data
        if not self.skip:
            self.text.append(data)


def browser() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit("no Chromium found: install Debian's `chromium` (apt-get install -y chromium)")


def load(page: Path) -> Page:
    """Render ``page`` (a temporary copy with the measuring script, beside the original)."""
    copy = page.with_name(f".check-{page.name}")
    copy.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    try:
        with tempfile.TemporaryDirectory() as profile:
            result = subprocess.run(
                [browser(), *FLAGS, f"--user-data-dir={profile}", copy.as_uri()],
                capture_output=True,
                text=True,
                timeout=180,
            )
    finally:
        copy.unlink(missing_ok=True)
    if result.returncode != 0:
        raise RuntimeError(f"chromium failed on {page}: {result.stderr[-500:]}")
    parsed = Page()
    parsed.feed(result.stdout)
    parsed.dom = result.stdout
    return parsed


def chapter_of(href: str) -> str | None:
    match = re.search(r"(ch\d\d_[a-z0-9_]+)\.html", href)
    return match.group(1) if match else None


def check_interactive(name: str, source: str, dom: str, figures: list[dict], problems: list[str]) -> None:
    """Each ``{glue} int-<name>`` of the source is drawn by plotly.js, inside the column.

    plotly.js (``_static/plotly.min.js``, served by ``_ext/plotly_js.py``) is loaded on
    exactly the pages that hold an interactive figure.
    """
    expected = len(re.findall(r"\{glue\}\s+int-", source))
    loads_plotly = "_static/plotly.min.js" in dom
    if len(figures) != expected:
        problems.append(f"{name}: {len(figures)} interactive figures for {expected} in the source")
    for figure in figures:
        if not figure.get("drawn"):
            problems.append(f"{name}: interactive figure {figure.get('id')} was not drawn by plotly.js")
        if figure.get("wide"):
            problems.append(f"{name}: interactive figure {figure.get('id')} is wider than the column at {WINDOW}")
    if expected and not loads_plotly:
        problems.append(f"{name}: has interactive figures but does not load plotly.min.js")
    if not expected and loads_plotly:
        problems.append(f"{name}: loads plotly.min.js without an interactive figure")


def check_page(
    page: Path,
    numbers: dict[str, int],
    problems: list[str],
    subpages: dict[str, int] | None = None,
    figures_of: dict[int, list[str]] | None = None,
) -> None:
    """Check one page; ``subpages`` maps a chapter sub-page's stem to its chapter's number.

    The figure numbers of a chapter and its sub-pages are appended, in page order, to
    ``figures_of[number]`` for :func:`main` to check that they count 1, 2, ... per chapter.
    """
    subpages = subpages or {}
    figures_of = {} if figures_of is None else figures_of
    source = ROOT / page.relative_to(HTML).with_suffix(".md")
    src_text = source.read_text() if source.exists() else ""
    parsed = load(page)
    name = str(page.relative_to(HTML))
    formulas = parsed.dom.count("<mjx-container")
    text = "".join(parsed.text)
    prose = re.sub(r"^```.*?^```", "", src_text, flags=re.S | re.M)  # formulas in prose only, not in code
    expected_math = len(re.findall(r"\$\$|(?<![\$\\])\$(?!\$)", prose)) // 2
    expected_figures = src_text.count("{glue:figure}")
    images = [src for src in parsed.images if src.endswith(".png")]
    raw = [m.group(0) for m in re.finditer(r"\$\$|\\\(|\\\[|\\begin\{|\\frac\{", text)]
    missing = [src for src in images if not (page.parent / src).is_file() or (page.parent / src).stat().st_size < 100]
    print(
        f"{name}: {formulas} typeset formulas (source has {expected_math}), "
        f"{len(images)} images (source has {expected_figures} figures)"
    )
    if expected_math and formulas < expected_math:
        problems.append(f"{name}: only {formulas} typeset formulas, source has {expected_math}")
    if raw:
        problems.append(f"{name}: raw TeX visible: {sorted(set(raw))}")
    if len(images) < expected_figures:
        problems.append(f"{name}: {len(images)} images for {expected_figures} figures")
    if missing:
        problems.append(f"{name}: image files missing or empty: {missing}")
    contracts = text.count("Measurement contract.")
    if contracts < expected_figures:
        problems.append(f"{name}: {contracts} measurement contracts under {expected_figures} figures")

    # nothing scrolls sideways at a laptop window
    try:
        measured = json.loads(parsed.measure)
    except json.JSONDecodeError:
        problems.append(f"{name}: the layout could not be measured (no result from the measuring script)")
        measured = {"code": [], "math": [], "output": [], "table": [], "figures": [], "interactive": []}
    for line in measured["output"]:
        problems.append(f"{name}: an output scrolls sideways at {WINDOW}: {line}")
    for table in measured["table"]:
        problems.append(f"{name}: a table is wider than the column at {WINDOW}: {table!r}")
    for line in measured["code"]:
        problems.append(f"{name}: a code line scrolls sideways at {WINDOW}: {line}")
    for formula in measured["math"]:
        problems.append(f"{name}: a display formula is wider than the column at {WINDOW}: {formula!r}")
    check_interactive(name, src_text, parsed.dom, measured["interactive"], problems)

    # "Chapter N" in prose must be a link to chapter N
    for href, label in parsed.links:
        match = re.fullmatch(r"Chapter (\d+)", label)
        target = chapter_of(href) or (page.stem if href.startswith("#") else None)
        if match and target in numbers and int(match.group(1)) != numbers[target]:
            problems.append(
                f"{name}: link 'Chapter {match.group(1)}' points to {target}, which is chapter {numbers[target]}"
            )
    linked = sum(1 for _, label in parsed.links if re.fullmatch(r"Chapter \d+", label))
    typed = len(re.findall(r"\bChapters? \d+", text)) - linked
    if typed > 0:
        problems.append(f"{name}: {typed} typed chapter number(s) in the prose; use {{numref}} to the chapter's label")

    stem = page.stem
    if stem in numbers or stem in subpages:
        number = numbers.get(stem, subpages.get(stem))
        figures = [re.sub(r"^Fig\.?\s*", "", f).rstrip(". ") for f in measured["figures"]]
        figures_of.setdefault(number, []).extend(figures)
        expected = str(number)
        if stem in numbers and parsed.heading_number != expected:
            problems.append(f"{name}: heading number {parsed.heading_number!r}, _toc.yml gives {expected}")
        if stem in subpages and not (parsed.heading_number or "").startswith(expected + "."):
            problems.append(f"{name}: heading number {parsed.heading_number!r} is not a section of chapter {expected}")
        sidebar = (parsed.sidebar_current or "").split(".")[0]
        if sidebar != expected:
            problems.append(f"{name}: sidebar shows {parsed.sidebar_current!r}, _toc.yml gives chapter {expected}")
        buttons = {"Binder": "mybinder.org", "Colab": "colab.research.google.com"}
        for button, host in buttons.items():
            if not any(host in href and f"chapters/{stem}.ipynb" in href for href in parsed.hrefs):
                problems.append(f"{name}: no {button} launch button for this chapter")
        if not parsed.thebe:
            problems.append(f"{name}: no live-code (Thebe) launch button")

    if name == "appendices/claims.html":
        numbers = {**numbers, **subpages}  # a claim is listed under its page's chapter number
        rows = 0
        for href, label in parsed.links:
            target = chapter_of(href)
            if target and re.fullmatch(r"\d+", label):
                rows += 1
                if int(label) != numbers.get(target):
                    problems.append(
                        f"{name}: a claim lists {target} as chapter {label}; _toc.yml gives {numbers.get(target)}"
                    )
        if rows == 0:
            problems.append(f"{name}: no claim rows with chapter numbers found")
        if "executed in this build" not in text:
            problems.append(f"{name}: the claims table was not built from the chapters executed in this build")


def main() -> int:
    if not (HTML / "index.html").exists():
        print("no built book: run `make book` first", file=sys.stderr)
        return 2
    problems: list[str] = []
    if not (HTML / "_static" / "mathjax" / "tex-chtml.js").exists():
        problems.append("MathJax is not served from _static/mathjax")
    plotly_js = HTML / "_static" / "plotly.min.js"
    if not plotly_js.is_file() or plotly_js.stat().st_size < 1_000_000:
        problems.append("plotly.js is not served from _static/plotly.min.js")
    numbers = chapter_numbers(ROOT / "_toc.yml")
    entries = [c for c in toc_chapters(ROOT / "_toc.yml") if c.number is not None]
    subpages = {c.stem: c.number for c in entries if c.parent is not None}
    pages = [HTML / "intro.html"] + [HTML / f"{c.docname}.html" for c in entries]
    pages += [
        HTML / "appendices" / f"{name}.html"
        for name in ("claims", "atlas", "atlas_classic", "atlas_modern", "atlas_decoder", "audit", "scale")
    ]
    figures_of: dict[int, list[str]] = {}
    for page in pages:
        if not page.is_file():
            problems.append(f"{page.relative_to(HTML)} was not built")
            continue
        check_page(page, numbers, problems, subpages, figures_of)
    for number, figures in sorted(figures_of.items()):
        wanted = [f"{number}.{k}" for k in range(1, len(figures) + 1)]
        if figures != wanted:
            problems.append(f"chapter {number}: figure numbers {figures[:8]} do not count {number}.1, {number}.2, ...")
    if problems:
        print("check-html: problems found")
        for p in problems:
            print("  -", p)
        return 1
    print(
        f"check-html: {len(pages)} pages: formulas typeset, figures present, chapter numbers agree, "
        "launch buttons present, nothing scrolls sideways, figures numbered per chapter, each with its contract, "
        "interactive figures drawn"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Open the built book in headless Chromium and check what a reader would see.

For every chapter page (and the landing page) this dumps the rendered DOM after
MathJax has run and checks that:

- formulas are typeset: at least one ``<mjx-container>`` per display or inline formula
  source, and no raw TeX delimiters (``$$``, ``\\(``, ``\\[``, ``\\begin{``) remain in text;
- every figure is there: each ``{glue:figure}`` of the chapter's source appears as an
  ``<img>`` whose file exists under ``_build/html`` and is a non-empty PNG;
- MathJax was served locally (``_static/mathjax``), since no CDN is reachable.

Run after `make book` (``make check-html``). Exits non-zero with a list of problems.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run",
         "--virtual-time-budget=15000", "--dump-dom"]


class TextAndImages(HTMLParser):
    """Collect visible prose (outside script, style, code and typeset math) and image sources."""

    def __init__(self) -> None:
        super().__init__()
        self.skip = 0
        self.text: list[str] = []
        self.images: list[str] = []

    SKIP = ("script", "style", "pre", "code")  # code listings may hold TeX strings legitimately

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP or tag.startswith("mjx-"):
            self.skip += 1
        if tag == "img":
            self.images.append(dict(attrs).get("src", ""))

    def handle_endtag(self, tag):
        if (tag in self.SKIP or tag.startswith("mjx-")) and self.skip:
            self.skip -= 1

    def handle_data(self, data):
        if not self.skip:
            self.text.append(data)


def browser() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit("no Chromium found: install Debian's `chromium` (apt-get install -y chromium)")


def dump(page: Path) -> str:
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run([browser(), *FLAGS, f"--user-data-dir={profile}", page.as_uri()],
                                capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"chromium failed on {page}: {result.stderr[-500:]}")
    return result.stdout


def main() -> int:
    if not (HTML / "index.html").exists():
        print("no built book: run `make book` first", file=sys.stderr)
        return 2
    problems: list[str] = []
    if not (HTML / "_static" / "mathjax" / "tex-chtml.js").exists():
        problems.append("MathJax is not served from _static/mathjax")
    pages = [HTML / "intro.html"] + sorted((HTML / "chapters").glob("*.html"))
    for page in pages:
        source = ROOT / page.relative_to(HTML).with_suffix(".md")
        src_text = source.read_text() if source.exists() else ""
        dom = dump(page)
        formulas = dom.count("<mjx-container")
        parser = TextAndImages()
        parser.feed(dom)
        text = "".join(parser.text)
        prose = re.sub(r"^```.*?^```", "", src_text, flags=re.S | re.M)  # formulas in prose only, not in code
        expected_math = len(re.findall(r"\$\$|(?<![\$\\])\$(?!\$)", prose)) // 2
        expected_figures = src_text.count("{glue:figure}")
        images = [src for src in parser.images if src.endswith(".png")]
        raw = [m.group(0) for m in re.finditer(r"\$\$|\\\(|\\\[|\\begin\{|\\frac\{", text)]
        missing = [src for src in images if not (page.parent / src).is_file() or (page.parent / src).stat().st_size < 100]
        print(f"{page.relative_to(HTML)}: {formulas} typeset formulas (source has {expected_math}), "
              f"{len(images)} images (source has {expected_figures} figures)")
        if expected_math and formulas < expected_math:
            problems.append(f"{page.name}: only {formulas} typeset formulas, source has {expected_math}")
        if raw:
            problems.append(f"{page.name}: raw TeX visible: {sorted(set(raw))}")
        if len(images) < expected_figures:
            problems.append(f"{page.name}: {len(images)} images for {expected_figures} figures")
        if missing:
            problems.append(f"{page.name}: image files missing or empty: {missing}")
    if problems:
        print("check-html: problems found")
        for p in problems:
            print("  -", p)
        return 1
    print(f"check-html: {len(pages)} pages, formulas typeset and every figure present")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The book's own files: its table of contents, chapter numbers and the claims table.

Chapter numbers are never typed: Jupyter Book numbers the chapters of the numbered parts
of ``_toc.yml`` consecutively (part captions take no number; appendices are
unnumbered), and :func:`toc_chapters` reproduces that rule so that generated pages
(the claims appendix) show the same numbers as the sidebar and the headings.
``make check-html`` checks that they agree in the rendered book.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from lossgeom_book.ledger import STATUSES, escape_text, id_order, value_text


@dataclass(frozen=True)
class BookChapter:
    """One page of the table of contents: its chapter number (None if unnumbered) and file.

    A chapter's sub-page (listed under it with ``sections:``) carries its chapter's
    number and names that chapter's file as ``parent``; a chapter's ``parent`` is None.
    """

    number: int | None
    docname: str
    part: str
    parent: str | None = None

    @property
    def stem(self) -> str:
        return Path(self.docname).name


def toc_chapters(toc: str | Path) -> list[BookChapter]:
    """The pages of a Jupyter Book ``_toc.yml`` (format ``jb-book``) with their chapter numbers.

    Chapters of parts marked ``numbered: true`` are numbered 1, 2, ... in order across
    parts; chapters of other parts get ``None``. The sub-pages of a chapter (its
    ``sections:``, at any depth) follow it in the list with its number and ``parent``;
    Jupyter Book numbers them as sections of that chapter (8.12, ...), and their figures
    continue the chapter's figure numbers.
    """
    path = Path(toc)
    if not path.is_file():
        raise FileNotFoundError(f"toc must be the path of a _toc.yml file, got {path}")
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or data.get("format") != "jb-book" or not isinstance(data.get("parts"), list):
        raise ValueError(f"{path} is not a jb-book table of contents with a list of parts")
    chapters, number = [], 0

    def sections(entry: dict, chapter: BookChapter) -> None:
        for sub in entry.get("sections", []) or []:
            if "file" in sub:
                chapters.append(BookChapter(chapter.number, str(sub["file"]), chapter.part, chapter.docname))
            sections(sub, chapter)

    for part in data["parts"]:
        numbered = bool(part.get("numbered", False))
        for entry in part.get("chapters", []):
            if "file" not in entry:
                continue
            if numbered:
                number += 1
            chapter = BookChapter(number if numbered else None, str(entry["file"]), str(part.get("caption", "")))
            chapters.append(chapter)
            sections(entry, chapter)
    return chapters


def chapter_numbers(toc: str | Path) -> dict[str, int]:
    """Map each numbered chapter's file stem (``ch08_softmax_gauge``) to its number."""
    return {c.stem: c.number for c in toc_chapters(toc) if c.number is not None and c.parent is None}


def page_numbers(toc: str | Path) -> dict[str, int]:
    """Map every page of a numbered chapter (the chapter and its sub-pages) to the chapter's number.

    Each such page is a notebook with its own results ledger; the claims appendix lists
    a claim under the chapter number of the page whose ledger establishes it.
    """
    return {c.stem: c.number for c in toc_chapters(toc) if c.number is not None}


def _escape(text: str) -> str:
    return escape_text(text)


def _value(value) -> str:
    return value_text(value, 15)


def claims_page(rows: Iterable[dict], numbers: dict[str, int]) -> str:
    """MyST for the claims appendix: a narrow summary table, then each claim's details.

    The table shows id, chapter number, status and claim (no wide value columns, so it
    fits a laptop screen); each claim's computed value, reported value and note follow in
    a collapsed dropdown. ``rows`` are ledger rows with a ``chapter`` stem (as
    :func:`lossgeom_book.ledger.read_ledgers` returns them).
    """
    rows = sorted(rows, key=lambda r: id_order(r["id"]))
    for r in rows:
        if r["chapter"] not in numbers:
            raise ValueError(f"ledger of {r['chapter']!r} is not a numbered chapter of the table of contents")
        if r["status"] not in STATUSES:
            raise ValueError(f"claim {r['id']} has unknown status {r['status']!r}")
    lines = ["| claim | chapter | status | statement |", "|---|---|---|---|"]
    for r in rows:
        chapter = f"{{doc}}`{numbers[r['chapter']]} <../chapters/{r['chapter']}>`"
        claim = f"{{ref}}`{r['id']} <claim-{r['id'].lower()}>`"
        lines.append(f"| {claim} | {chapter} | {r['status']} | {_escape(r['claim'])} |")
    lines += ["", "## Details", ""]
    for r in rows:
        lines += [
            f"({'claim-' + r['id'].lower()})=",
            f":::{{admonition}} {r['id']} ({r['status']}, chapter {numbers[r['chapter']]})",
            ":class: dropdown",
            "",
            _escape(r["claim"]),
            "",
            f"- **computed here:** {_value(r.get('computed'))}",
            f"- **reported:** {_value(r.get('reported'))}",
        ]
        if r.get("note"):
            lines.append(f"- **note:** {_escape(r['note'])}")
        if r.get("details"):
            lines.append(f"- **also measured:** {_value(r['details'])}")
        lines += [":::", ""]
    return "\n".join(lines)


#: First line of every chapter's Colab cell (how tools recognise it).
COLAB_MARKER = "# Only on Google Colab: install the book's package and what the chapter imports."


def repository(config: str | Path) -> tuple[str, str]:
    """The ``(url, branch)`` of the ``repository`` setting in the book's ``_config.yml``."""
    data = yaml.safe_load(Path(config).read_text())
    repo = data.get("repository", {}) if isinstance(data, dict) else {}
    url, branch = repo.get("url"), repo.get("branch", "main")
    if not isinstance(url, str) or not url.startswith("https://github.com/"):
        raise ValueError(
            f"{config}: repository.url must be a https://github.com/... URL (Colab needs GitHub), got {url!r}"
        )
    return url.rstrip("/"), str(branch)


def colab_cell(config: str | Path) -> str:
    """Source of the hidden first cell of every chapter: on Colab only, pip-install the book.

    The URL and branch come from the one ``repository`` setting of ``_config.yml``.
    Outside Colab the cell does nothing, so it is executed (and compared) like any other.
    """
    url, branch = repository(config)
    return "\n".join(
        [
            COLAB_MARKER,
            "import subprocess, sys",
            'if "google.colab" in sys.modules:',
            f'    book = "lossgeom[book] @ git+{url}@{branch}"',
            '    subprocess.run([sys.executable, "-m", "pip", "install", "-q", book], check=True)',
        ]
    )

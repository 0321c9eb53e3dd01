"""The book's own files: table of contents numbering, the claims page, the Colab cell."""

from pathlib import Path

import pytest

from lossgeom_book.toc import (
    COLAB_MARKER,
    chapter_numbers,
    claims_page,
    colab_cell,
    page_numbers,
    repository,
    toc_chapters,
)

ROOT = Path(__file__).resolve().parents[2]
TOC = """format: jb-book
root: intro
parts:
  - caption: One
    numbered: true
    chapters:
      - file: chapters/ch01_a
      - file: chapters/ch02_b
        sections:
          - file: chapters/ch02_b_more
  - caption: Two
    numbered: true
    chapters:
      - file: chapters/ch05_c
  - caption: Appendices
    chapters:
      - file: appendices/claims
"""


def test_chapters_are_numbered_across_numbered_parts_only(tmp_path):
    toc = tmp_path / "_toc.yml"
    toc.write_text(TOC)
    numbers = [(c.number, c.stem) for c in toc_chapters(toc)]
    assert numbers == [(1, "ch01_a"), (2, "ch02_b"), (2, "ch02_b_more"), (3, "ch05_c"), (None, "claims")]
    assert chapter_numbers(toc) == {"ch01_a": 1, "ch02_b": 2, "ch05_c": 3}
    assert page_numbers(toc) == {"ch01_a": 1, "ch02_b": 2, "ch02_b_more": 2, "ch05_c": 3}
    assert [c.parent for c in toc_chapters(toc)] == [None, None, "chapters/ch02_b", None, None]


def test_the_books_own_toc_numbers_every_chapter_file():
    numbers = chapter_numbers(ROOT / "_toc.yml")
    assert sorted(numbers.values()) == list(range(1, len(numbers) + 1))
    assert all((ROOT / "chapters" / f"{stem}.md").is_file() for stem in page_numbers(ROOT / "_toc.yml"))


def test_toc_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="toc must be the path"):
        toc_chapters(tmp_path / "missing.yml")
    bad = tmp_path / "bad.yml"
    bad.write_text("format: jb-article\n")
    with pytest.raises(ValueError, match="not a jb-book"):
        toc_chapters(bad)


ROWS = [
    {
        "chapter": "ch05_c",
        "id": "S2",
        "claim": "a | b",
        "computed": {"x": 1.5},
        "reported": None,
        "status": "holds at our scale",
        "note": "small",
    },
    {
        "chapter": "ch01_a",
        "id": "P1",
        "claim": "first",
        "computed": "1/2",
        "reported": 0.5,
        "status": "holds",
        "note": "",
    },
]


def test_claims_page_is_a_narrow_table_with_details_on_demand():
    page = claims_page(ROWS, {"ch01_a": 1, "ch05_c": 3})
    table = [ln for ln in page.splitlines() if ln.startswith("|")]
    assert table[0] == "| claim | chapter | status | statement |"
    assert table[2].startswith("| {ref}`P1 <claim-p1>` | {doc}`1 <../chapters/ch01_a>` | holds |")
    assert "a \\| b" in table[3] and "x: 1.5" not in "".join(table)  # values only in the details
    assert ":class: dropdown" in page and "- **computed here:** x: 1.5" in page
    assert "(claim-s2)=" in page and "**note:** small" in page


def test_claims_page_refuses_unknown_chapters_and_statuses():
    with pytest.raises(ValueError, match="not a numbered chapter"):
        claims_page(ROWS, {"ch01_a": 1})
    with pytest.raises(ValueError, match="unknown status"):
        claims_page([{**ROWS[1], "status": "true"}], {"ch01_a": 1})


def test_colab_cell_comes_from_the_one_repository_setting(tmp_path):
    config = tmp_path / "_config.yml"
    config.write_text("repository:\n  url: https://github.com/me/book/\n  branch: pages\n")
    assert repository(config) == ("https://github.com/me/book", "pages")
    cell = colab_cell(config)
    assert cell.startswith(COLAB_MARKER) and "git+https://github.com/me/book@pages" in cell
    assert 'if "google.colab" in sys.modules:' in cell
    compile(cell, "colab", "exec")
    config.write_text("repository:\n  url: https://gitlab.com/me/book\n")
    with pytest.raises(ValueError, match="Colab needs GitHub"):
        repository(config)

"""Each chapter's .md, .py and .ipynb hold the same code, and the .ipynb was fully executed.

nbval silently passes a cell that was never executed, so this test is what makes the
strict nbval run meaningful. The .ipynb must also carry a results ledger.
"""

from pathlib import Path

import pytest

# the chapters' pairing is the book's: without its packages (pip install ".[book]") the file skips
pytest.importorskip("lossgeom_book")
pytest.importorskip("jupytext", reason="the pairing test reads the chapters with jupytext")

import jupytext
import nbformat

from lossgeom_book.toc import colab_cell

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "chapters").glob("*.md"))


def code(nb) -> list[str]:
    return [c.source.strip() for c in nb.cells if c.cell_type == "code"]


def test_there_are_chapters():
    assert CHAPTERS, "no chapters/*.md found"


@pytest.mark.parametrize("md", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_md_py_ipynb_hold_the_same_code(md):
    py, ipynb = md.with_suffix(".py"), md.with_suffix(".ipynb")
    assert py.exists() and ipynb.exists(), f"{md.name} needs its .py and .ipynb twins (run `make outputs`)"
    from_md = code(jupytext.read(md))
    assert code(jupytext.read(py)) == from_md, f"{py.name} differs from {md.name}: run `make outputs`"
    stored = code(nbformat.read(ipynb, as_version=4))
    assert stored == from_md, f"{ipynb.name} differs from {md.name}: run `make outputs`"


@pytest.mark.parametrize("md", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_every_code_cell_was_executed_in_order_without_errors(md):
    nb = nbformat.read(md.with_suffix(".ipynb"), as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    counts = [c.get("execution_count") for c in cells]
    assert counts == list(range(1, len(cells) + 1)), f"{md.stem}: cells not executed top to bottom once: {counts}"
    errors = [o for c in cells for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{md.stem}: stored outputs contain an error"
    ledgers = [
        o
        for c in cells
        for o in c.outputs
        if isinstance(o.get("data", {}).get("application/json"), dict) and "ledger" in o["data"]["application/json"]
    ]
    assert len(ledgers) == 1, f"{md.stem}: expected exactly one results ledger output, found {len(ledgers)}"


@pytest.mark.parametrize("md", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_first_cell_installs_the_book_on_colab_only(md):
    first = next(c for c in jupytext.read(md).cells if c.cell_type == "code")
    expected = colab_cell(ROOT / "_config.yml")
    assert first.source.strip() == expected, f"{md.name}: run `make outputs` to add the Colab cell"
    assert "remove-cell" in first.metadata.get("tags", []), f"{md.name}: the Colab cell must be hidden (remove-cell)"

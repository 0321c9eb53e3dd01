"""Every chapter page reads as a lesson: bookkeeping out of sight, key ideas first, a closing box.

A reader sees the cells that teach; the cells that keep the book's records (ledger rows,
glue, figures' contracts, interactive snippets) carry a ``remove-*`` or ``hide-*`` tag. The
one exception is the chapter that teaches the measurement contract itself
(:data:`TEACHES_THE_CONTRACT`), where building a contract and glueing a figure with it
are the lesson.
"""

from __future__ import annotations

import re
from pathlib import Path

import jupytext
import pytest

CHAPTERS = sorted((Path(__file__).resolve().parents[2] / "chapters").glob("ch*.md"))
#: Calls that keep records rather than teach.
BOOKKEEPING = re.compile(r"ledger\.add\(|glue_value\(|glue_interactive\(|\bglue\(")
#: Figure records: bookkeeping everywhere but in the chapter that teaches them.
FIGURE_RECORDS = re.compile(r"glue_figure\(|MeasurementContract\(")
#: The chapter whose lesson is the measurement contract (claim P13): its contracts are shown.
TEACHES_THE_CONTRACT = "ch01_object_and_metric"


def visible_bookkeeping(text: str, stem: str) -> list[str]:
    """First lines of the visible code cells of a MyST notebook that only keep records."""
    found = []
    for cell in jupytext.reads(text, fmt="md:myst").cells:
        tags = cell.metadata.get("tags", [])
        if cell.cell_type != "code" or any(t.startswith(("remove-", "hide-")) for t in tags):
            continue
        if BOOKKEEPING.search(cell.source) or (stem != TEACHES_THE_CONTRACT and "MeasurementContract(" in cell.source):
            found.append(cell.source.splitlines()[0])
    return found


def test_a_planted_visible_ledger_cell_is_found():
    text = "```{code-cell} ipython3\nx = 1\nledger.add('P1', 'c', x)\n```\n"
    hidden = "```{code-cell} ipython3\n:tags: [remove-cell]\nledger.add('P1', 'c', 1)\n```\n"
    assert visible_bookkeeping(text, "ch99_x") == ["x = 1"]
    assert visible_bookkeeping(hidden, "ch99_x") == []


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_no_visible_bookkeeping_cell(chapter):
    assert visible_bookkeeping(chapter.read_text(), chapter.stem) == []


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_key_ideas_first_and_a_closing_box(chapter):
    text = chapter.read_text()
    first_section = text.find("\n## ")
    assert re.search(r"key ideas", text[:first_section], re.I), "no key-ideas box before the first section"
    assert re.search(r"what you now know", text, re.I), "no closing 'what you now know' box"
    assert re.search(r"what does not follow", text, re.I), "no 'what does not follow' in the closing box"

"""Every chapter's committed ledger reads as a table for people: ids in order, short values, short notes.

The ledger is the last thing a reader of a chapter sees and what the claims appendix
gathers. Its rows come in id order; ``computed`` is one short value (the full record of
what was measured goes in ``details``, one click away); a note is at most
:data:`lossgeom_book.ledger.NOTE_WORDS` words; maths is typeset (``$...$``), not written
in ASCII outside it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lossgeom_book.ledger import NOTE_WORDS, STATUSES, id_order, read_ledgers

CHAPTERS = sorted((Path(__file__).resolve().parents[2] / "chapters").glob("ch*.ipynb"))
#: The longest ``computed`` text a ledger cell shows (characters, maths source included).
COMPUTED_CHARS = 160
#: ASCII maths that belongs inside ``$...$``: powers, arrows, ``<=``.
ASCII_MATHS = re.compile(r"\^|->|<=|>=")


def _outside_maths(text: str) -> str:
    return re.sub(r"\$[^$]+\$", "", text)


def row_problems(r: dict) -> list[str]:
    """What keeps one ledger row from reading well (empty when it is fine)."""
    problems = []
    if r["status"] not in STATUSES:
        problems.append(f"{r['id']}: unknown status {r['status']!r}")
    words = len(r.get("note", "").split())
    if words > NOTE_WORDS:
        problems.append(f"{r['id']}: note of {words} words (at most {NOTE_WORDS})")
    computed = r["computed"]
    if isinstance(computed, dict):
        problems.append(f"{r['id']}: computed is a dict; give one value, the rest in details")
    elif len(str(computed)) > COMPUTED_CHARS:
        problems.append(f"{r['id']}: computed has {len(str(computed))} characters (at most {COMPUTED_CHARS})")
    for field in ("claim", "computed"):
        stray = ASCII_MATHS.findall(_outside_maths(str(r.get(field) or "")))
        if stray:
            problems.append(f"{r['id']}: ASCII maths {stray} in {field} outside $...$")
    return problems


@pytest.mark.parametrize("notebook", CHAPTERS, ids=lambda p: p.stem)
def test_ledger_rows_are_short_ordered_and_typeset(notebook):
    rows = read_ledgers([notebook])
    assert rows, f"{notebook.name} has no results ledger"
    ids = [r["id"] for r in rows]
    assert ids == sorted(ids, key=id_order), f"rows out of id order: {ids}"
    problems = [p for r in rows for p in row_problems(r)]
    assert not problems, "\n".join(problems)


def test_the_rule_catches_planted_rows():
    good = {"id": "P3", "claim": "$c^2 + c^{-2}$ at $c \\to 0$", "computed": "$\\lambda$ = 2", "status": "holds"}
    assert row_problems(good) == []
    planted = {
        "long note": {**good, "status": "differs", "note": "word " * (NOTE_WORDS + 1)},
        "dict": {**good, "computed": {"a": 1.0}},
        "long value": {**good, "computed": "x" * (COMPUTED_CHARS + 1)},
        "ASCII maths": {**good, "claim": "eigenvalues 0 and a^2+b^2"},
        "status": {**good, "status": "true"},
    }
    for what, row in planted.items():
        assert len(row_problems(row)) == 1, what

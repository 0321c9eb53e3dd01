"""The results ledger: one row per claim a chapter establishes.

Every chapter ends with a :class:`Ledger`. Displaying it renders a table for readers
(text/markdown and text/plain) and, in the same output, the rows as
``application/json`` of the form ``{"ledger": [{"id": ..., "claim": ..., "computed":
..., "reported": ..., "status": ...}]}`` so that tools (the claims appendix,
``book-check``) can read every chapter's results. :func:`read_ledgers` collects them
back from executed notebooks.

A row is written for a reader: ``claim`` and ``computed`` are short MyST text in which
``$...$`` is typeset maths, ``note`` is at most :data:`NOTE_WORDS` words, and everything
else that was measured goes in ``details`` (a dict), which the table shows one click away.
Rows are shown, and stored, in id order.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lossgeom.formatting import SIGNIFICANT_DIGITS, fmt, round_sig

#: The statuses a claim can have (see CLAIMS.md). Anything but ``holds`` needs a note.
STATUSES = ("holds", "holds at our scale", "differs", "not reproduced")
_ID = re.compile(r"^[A-Z][0-9]+$")
#: The longest note a row may carry (words); the details go in ``details``.
NOTE_WORDS = 45
_MATH = re.compile(r"(\$[^$]+\$)")


#: The claim series in the order of the book's parts, P for Part I, M for Part II, S, Q and T
#: for Part III, X for Part IV.
SERIES_ORDER = ("P", "M", "S", "Q", "T", "X")


def id_order(row_id: str) -> tuple[int, str, int]:
    """Sort key of a claim id: its series in the book's order, then its number (``P9`` before ``P11``)."""
    letter = row_id[:1]
    series = SERIES_ORDER.index(letter) if letter in SERIES_ORDER else len(SERIES_ORDER)
    return (series, letter, int(row_id[1:]) if row_id[1:].isdigit() else 0)


def escape_text(text: str) -> str:
    """Escape Markdown syntax outside ``$...$`` maths, which is kept for MyST to typeset."""
    parts = _MATH.split(str(text).replace("\n", " "))
    out = []
    for i, part in enumerate(parts):
        if i % 2:  # a maths span: only the table's pipe needs a LaTeX spelling
            out.append(part.replace("\\|", "\\Vert ").replace("|", "\\vert "))
        else:
            for ch in ("\\", "|", "*", "_", "`", "[", "]", "<", ">"):
                part = part.replace(ch, "\\" + ch)
            out.append(part)
    return "".join(out)


def _jsonable(value: Any, sig: int) -> Any:
    """Convert numbers, arrays and sympy objects to JSON values.

    Floats are rounded to ``sig`` significant digits, exactly as the table prints them,
    so the JSON holds what readers see and nothing a change of machine could alter.
    Integers, strings and exact objects (sympy rationals, as their exact text) are kept.
    """
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"ledger value must be finite, got {value}")
        return round_sig(value, sig)
    if isinstance(value, np.integer):
        return int(value)
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        return _jsonable(value.item(), sig)
    if isinstance(value, dict):
        return {str(k): _jsonable(v, sig) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_jsonable(v, sig) for v in value]
    if type(value).__module__.startswith("sympy"):
        import sympy  # only when a row holds a sympy object

        return f"${sympy.latex(value)}$"  # exact, and typeset in the table
    return str(value)  # other exact objects: their exact text


def _cell(value: Any, sig: int) -> str:
    if value is None:
        return ""
    if isinstance(value, dict):
        return "; ".join(f"{k}: {_cell(v, sig)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(_cell(v, sig) for v in value)
    return fmt(value, sig)


@dataclass(frozen=True)
class LedgerRow:
    """One claim: its id, what it says, what we computed, what the source reports, status."""

    id: str
    claim: str
    computed: Any
    reported: Any
    status: str
    note: str = ""
    sig: int = SIGNIFICANT_DIGITS
    details: Any = None


class Ledger:
    """Collect a chapter's claims and display them as a table plus JSON.

    Args:
        chapter: short chapter name, shown above the table.
        sig: significant digits of every float in the row, in the table and in the JSON
            alike (default :data:`lossgeom.formatting.SIGNIFICANT_DIGITS`); a row may state
            its own with ``add(..., sig=...)``. Rounding-level values belong in the ledger
            as :func:`lossgeom.formatting.rounding_level` text, not as floats.

    Example:
        >>> led = Ledger("demo")
        >>> led.add("P3", "nonzero eigenvalue at $c = 10$", 100.01, reported=100.01, status="holds")
        >>> led.to_json()["ledger"][0]["status"]
        'holds'
    """

    def __init__(self, chapter: str, sig: int = SIGNIFICANT_DIGITS) -> None:
        if not isinstance(chapter, str) or not chapter.strip():
            raise ValueError("chapter must be a non-empty string")
        round_sig(1.0, sig)  # validates sig
        self.chapter = chapter
        self.sig = int(sig)
        self._rows: list[LedgerRow] = []

    @property
    def rows(self) -> list[LedgerRow]:
        """The rows in id order."""
        return sorted(self._rows, key=lambda r: id_order(r.id))

    def add(
        self,
        id: str,
        claim: str,
        computed: Any,
        reported: Any = None,
        status: str = "holds",
        note: str = "",
        sig: int | None = None,
        details: dict | None = None,
    ) -> None:
        """Record one claim. ``status`` must be one of :data:`STATUSES`.

        ``claim`` and ``computed`` are short MyST text (``$...$`` is typeset) or values;
        everything else measured goes in ``details`` (a dict, shown one click away). A
        status other than ``holds`` needs a ``note`` saying why, of at most
        :data:`NOTE_WORDS` words (checked over the committed chapters by
        ``tests/book/test_chapter_ledgers.py``). ``sig`` overrides the ledger's significant
        digits for this row's floats.
        """
        sig = self.sig if sig is None else sig
        round_sig(1.0, sig)  # validates sig
        if not isinstance(id, str) or not _ID.match(id):
            raise ValueError(f"id must look like 'P3' or 'S12' (a capital letter then digits), got {id!r}")
        if any(r.id == id for r in self._rows):
            raise ValueError(f"id {id!r} is already in this ledger")
        if not isinstance(claim, str) or not claim.strip():
            raise ValueError("claim must be a non-empty string")
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        if status != "holds" and not note.strip():
            raise ValueError(f"status {status!r} needs a note saying why")
        if details is not None and not isinstance(details, dict):
            raise TypeError(f"details must be a dict of what else was measured, got {type(details).__name__}")
        self._rows.append(
            LedgerRow(
                id,
                claim,
                _jsonable(computed, sig),
                _jsonable(reported, sig),
                status,
                note,
                int(sig),
                None if details is None else _jsonable(details, sig),
            )
        )

    def to_json(self) -> dict:
        """The ledger as ``{"ledger": [row, ...]}`` in id order, with JSON values (rounded as shown)."""
        rows = []
        for r in self.rows:
            row = {k: v for k, v in asdict(r).items() if k not in ("sig", "details")}
            if r.details is not None:
                row["details"] = r.details
            rows.append(row)
        return {"ledger": rows}

    def to_markdown(self) -> str:
        return rows_to_markdown(self.to_json()["ledger"], sig=[r.sig for r in self.rows])

    def to_text(self) -> str:
        blocks = [f"Results ledger: {self.chapter}"]
        for r in self.rows:
            blocks.append(
                f"{r.id} [{r.status}] {r.claim}\n    computed: {_cell(r.computed, r.sig)}"
                + (f"\n    reported: {_cell(r.reported, r.sig)}" if r.reported is not None else "")
                + (f"\n    note: {r.note}" if r.note else "")
                + (f"\n    details: {_cell(r.details, r.sig)}" if r.details is not None else "")
            )
        return "\n".join(blocks)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        if not self._rows:
            raise ValueError("the ledger is empty: add at least one claim before displaying it")
        return {
            "text/markdown": self.to_markdown(),
            "text/plain": self.to_text(),
            "application/json": self.to_json(),
        }


def _md_text(text: str) -> str:
    """Escape what Markdown would read as emphasis, code or table syntax, keeping ``$...$`` maths."""
    return escape_text(text)


def value_text(value: Any, sig: int) -> str:
    """A computed or reported value as table text: numbers formatted, text (with its maths) as written."""
    if value is None or value == "":
        return "-"
    if isinstance(value, str):
        return escape_text(value)
    return escape_text(_cell(value, sig).replace("\n", " "))


def rows_to_markdown(rows: Iterable[dict], sig: int | Sequence[int] = 15, chapter_links: bool = False) -> str:
    """Render ledger rows (dicts as in :meth:`Ledger.to_json`) as a Markdown table.

    ``sig`` is one number of significant digits for every row, or one per row. Rows
    read back from a ledger's JSON are already rounded, so the default shows them as
    stored. With ``chapter_links=True`` (the claims appendix) each row's ``chapter``
    becomes a ``{doc}`` link to ``../chapters/<chapter>``. The table stays narrow: each
    row's note is listed under it, and rows with ``details`` get a collapsed block listing
    them; the whole sits in a ``ledger`` container (the book's CSS sets its size).
    """
    rows = list(rows)
    sigs = [sig] * len(rows) if isinstance(sig, (int, np.integer)) else list(sig)
    if len(sigs) != len(rows):
        raise ValueError(f"sig must be one int or one per row ({len(rows)}), got {len(sigs)}")
    head = ["id", "claim", "computed", "reported", "status"]
    if chapter_links:
        head.insert(1, "chapter")
    lines = ["::::{container} ledger", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r, row_sig in zip(rows, sigs):
        cells = [
            r["id"],
            _md_text(r["claim"]),
            value_text(r["computed"], row_sig),
            value_text(r.get("reported"), row_sig),
            _md_text(r["status"]) + (f" ({r['id']} note)" if r.get("note") else ""),
        ]
        if chapter_links:
            cells.insert(1, f"{{doc}}`{r['chapter']} <../chapters/{r['chapter']}>`")
        lines.append("| " + " | ".join(cells) + " |")
    noted = [r for r in rows if r.get("note")]
    if noted:
        lines += [""] + [f"- **{r['id']} note** ({_md_text(r['status'])}): {_md_text(r['note'])}" for r in noted]
    detailed = [(r, s) for r, s in zip(rows, sigs) if r.get("details")]
    if detailed:
        lines += ["", ":::{dropdown} Everything each row measured", ""]
        for r, row_sig in detailed:
            items = "; ".join(f"{escape_text(str(k))}: {value_text(v, row_sig)}" for k, v in r["details"].items())
            lines.append(f"- **{r['id']}**: {items}")
        lines += [":::"]
    lines += ["", "::::"]
    return "\n".join(lines)


def read_ledgers(paths: Iterable[str | Path]) -> list[dict]:
    """Read the ledger rows from executed notebooks, adding the notebook's stem as ``chapter``."""
    rows = []
    for path in paths:
        path = Path(path)
        nb = json.loads(path.read_text())
        for cell in nb.get("cells", []):
            for out in cell.get("outputs", []):
                data = out.get("data", {}).get("application/json")
                if isinstance(data, dict) and isinstance(data.get("ledger"), list):
                    rows.extend({"chapter": path.stem, **row} for row in data["ledger"])
    return rows

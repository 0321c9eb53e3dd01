"""A myst-nb mime renderer that renders the book's results-ledger JSON as nothing in HTML.

Each chapter's ledger output carries ``text/markdown`` (the table readers see) and
``application/json`` (for tools). myst-nb knows no renderer for ``application/json``
and would warn; this plugin, registered through the ``myst_nb.mime_renderers``
entry point in ``pyproject.toml``, accepts ledger JSON only and renders nothing.

It is a top-level module of its own, not part of ``lossgeom_book``: myst-nb loads every
registered renderer in any environment where it is installed, and ``lossgeom_book``
refuses to import without the book's extra dependencies. This module imports nothing
beyond the standard library, so a library-only install beside someone else's myst-nb
project loads it without error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar


class LedgerJsonRenderer:
    """Render ``application/json`` ledger outputs as nothing; reject any other JSON."""

    mime_priority_overrides: ClassVar[Sequence[tuple[str, str, int | None]]] = ()

    @staticmethod
    def handle_mime(renderer, data, inline):
        if data.mime_type != "application/json":
            return None
        content = data.content
        if isinstance(content, dict) and isinstance(content.get("ledger"), list):
            return []
        return None

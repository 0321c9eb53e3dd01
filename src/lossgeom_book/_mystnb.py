"""A myst-nb mime renderer that renders the results ledger's JSON as nothing in HTML.

Each chapter's ledger output carries ``text/markdown`` (the table readers see) and
``application/json`` (for tools). myst-nb knows no renderer for ``application/json``
and would warn; this plugin, registered through the ``myst_nb.mime_renderers``
entry point in ``pyproject.toml``, accepts ledger JSON only and renders nothing.
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

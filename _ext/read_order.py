"""Sphinx extension: read the generated appendix pages after every chapter.

Sphinx reads documents in name order, so ``appendices/claims`` would be executed before
``chapters/*``. The claims appendix tabulates the ledgers of the chapters executed *in
the same build* (``_build/jupyter_execute/chapters/*.ipynb``, which myst-nb writes while
reading each chapter), so it must be read last. Parallel reading (``-j``) is not used.
"""

from __future__ import annotations

#: Pages that summarise the chapters and must be read after them, in this order.
READ_LAST = ("appendices/claims", "appendices/execution")


def _read_generated_pages_last(app, env, docnames: list[str]) -> None:
    last = [name for name in READ_LAST if name in docnames]
    docnames[:] = [name for name in docnames if name not in last] + last


def setup(app):
    app.connect("env-before-read-docs", _read_generated_pages_last)
    return {"version": "1.0", "parallel_read_safe": False, "parallel_write_safe": True}

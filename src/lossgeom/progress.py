"""Progress bars for long computations, shown in interactive use only.

The long-running entry points (eigensolvers, stochastic Lanczos quadrature, trace
estimators, the atlas, the symmetry audit) take ``progress``:

- ``None`` (the default), automatic: a bar only when standard error is an interactive
  terminal (``sys.stderr.isatty()``), neither ``CI`` nor ``PYTEST_CURRENT_TEST`` is set
  in the environment (to a non-empty value), and no other bar of this library is open
  (a computation inside a computation that shows a bar shows none of its own). A Jupyter
  kernel's standard error is not a terminal, so notebooks, and notebooks executed by
  nbval or jupyter-book, show no bar unless asked;
- ``True``: a bar on standard error (``tqdm``), whatever the above;
- ``False``: never a bar.

A bar counts the computation's own unit (products, Lanczos steps, atlas cells, audited
symmetries) against its total where one is known in advance (an upper bound where the
computation may stop early). It only reads counts: it never changes a returned number or
the products spent.
"""

from __future__ import annotations

import contextvars
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from tqdm import tqdm

#: environment variables whose (non-empty) presence turns the automatic bar off
QUIET_ENVIRONMENT = ("CI", "PYTEST_CURRENT_TEST")

#: whether a bar of this library is open in the current context (nested automatic bars stay off)
_OPEN: contextvars.ContextVar[bool] = contextvars.ContextVar("lossgeom_progress_open", default=False)


def show_progress(progress: bool | None) -> bool:
    """Whether a computation called with ``progress`` shows a bar.

    ``True`` and ``False`` are obeyed; ``None`` is automatic (see the module docstring):
    a bar only on an interactive standard error, outside CI and pytest, and not inside
    another bar of this library.

    >>> from lossgeom.progress import show_progress
    >>> show_progress(True), show_progress(False)
    (True, False)

    Args:
        progress: ``True``, ``False`` or ``None`` (automatic).

    Returns:
        Whether to draw a bar.

    Raises:
        TypeError: if ``progress`` is not a bool or ``None``.
    """
    if progress is None:
        isatty = getattr(sys.stderr, "isatty", None)
        return bool(
            callable(isatty)
            and isatty()
            and not any(os.environ.get(name) for name in QUIET_ENVIRONMENT)
            and not _OPEN.get()
        )
    if not isinstance(progress, bool):
        raise TypeError(
            "progress must be True (a bar on stderr), False (none) or None (automatic: a bar only "
            f"on an interactive terminal), got {progress!r} ({type(progress).__name__})"
        )
    return progress


@contextmanager
def progress_bar(progress: bool | None, *, total: int | None, desc: str, unit: str) -> Iterator[tqdm]:
    """A ``tqdm`` bar on standard error, or a disabled one, for the duration of a ``with`` block.

    Call ``bar.update(n)`` (or :func:`advance_to`) as units complete; a disabled bar
    ignores them. The bar is cleared when the block ends (``leave=False``). While a shown
    bar is open, nested calls with ``progress=None`` draw none.

    Args:
        progress: ``True``, ``False`` or ``None`` (automatic, see :func:`show_progress`).
        total: the number of units expected (an upper bound where the computation may stop
            early), or ``None`` where it is not known.
        desc: what is computed, the bar's label.
        unit: the unit counted, singular (``"product"``).

    Yields:
        The bar.

    Raises:
        TypeError: if ``progress`` is not a bool or ``None``.
    """
    show = show_progress(progress)
    token = _OPEN.set(True) if show else None
    bar = tqdm(total=total, desc=desc, unit=unit, disable=not show, file=sys.stderr, leave=False, dynamic_ncols=True)
    try:
        yield bar
    finally:
        bar.close()
        if token is not None:
            _OPEN.reset(token)


def advance_to(bar: tqdm, count: int) -> None:
    """Move ``bar`` forward to ``count`` units done (a count read off the computation, e.g. its products).

    Args:
        bar: a bar from :func:`progress_bar`.
        count: the units done so far; a count at or below the bar's is ignored.
    """
    if count > bar.n:
        bar.update(count - bar.n)


__all__ = ["QUIET_ENVIRONMENT", "advance_to", "progress_bar", "show_progress"]

"""The one set-up call every chapter opens with.

``ledger = setup("chapter title")`` puts torch in float64, applies the book's plot style
and returns the chapter's :class:`~lossgeom_book.ledger.Ledger`. A chapter whose numbers
are reductions over many terms asks for ``single_thread=True``, which also limits torch
and the BLAS behind numpy and scipy to one thread, so that the order of every summation
is the same on every machine (``make test-portable`` reruns the chapters under other
kernels and thread counts to show the stored digits do not depend on it).
"""

from __future__ import annotations

import torch
from threadpoolctl import threadpool_limits

from lossgeom_book.display import use_book_style
from lossgeom_book.ledger import Ledger

_LIMITS: list = []  # the threadpool limit stays in force for the rest of the kernel's life


def setup(title: str, *, single_thread: bool = False) -> Ledger:
    """Set float64, the plot style and (optionally) one thread; return the chapter's ledger.

    Args:
        title: the chapter's title, as the ledger and the claims page show it.
        single_thread: limit torch and the BLAS of numpy/scipy to one thread.

    Returns:
        An empty :class:`~lossgeom_book.ledger.Ledger` titled ``title``.
    """
    torch.set_default_dtype(torch.float64)
    if single_thread:
        torch.set_num_threads(1)
        _LIMITS.append(threadpool_limits(limits=1))
    use_book_style()
    return Ledger(title)

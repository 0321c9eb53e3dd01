"""Number formatting and the book's plot style.

Every number a chapter prints or glues goes through :func:`fmt`, so the number of
significant digits is stated once and compared outputs are deterministic.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

#: Significant digits used in printed and glued numbers unless a call says otherwise.
SIGNIFICANT_DIGITS = 10


def fmt(value: Any, sig: int = SIGNIFICANT_DIGITS) -> str:
    """Format a real number with ``sig`` significant digits (``'%.{sig}g'``).

    Integers print as integers; non-numbers fall back to ``str``. Torch and numpy
    scalars are converted first.

    >>> fmt(2.0), fmt(100.0001, 5), fmt(1/3, 4)
    ('2', '100', '0.3333')
    """
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return f"{value:.{sig}g}"
    return str(value)


class Plain(str):
    """A string whose text/plain representation is itself (no quotes).

    Glue a :class:`Plain` to show a computed sentence with ``{glue:text}``.
    """

    def __repr__(self) -> str:
        return str(self)


def use_book_style() -> None:
    """Set the book's matplotlib style once per chapter (sizes, grid, no timestamps).

    SVG output carries no date and fixed hash salt, so rendered figures are stable.
    """
    import matplotlib as mpl

    mpl.rcParams.update(
        {
            "figure.figsize": (6.4, 3.6),
            "figure.dpi": 110,
            "savefig.dpi": 110,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "font.size": 10,
            "legend.frameon": False,
            "svg.hashsalt": "lossgeom",
            "image.cmap": "viridis",
        }
    )
    np.set_printoptions(precision=10, suppress=False)

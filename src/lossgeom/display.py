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


def glue_figure(name: str, fig, contract, summary: str) -> None:
    """Glue ``fig`` as ``fig-<name>`` and its caption as ``cap-<name>``, then close it.

    The caption is ``contract.caption(summary)``: the figure's one-sentence summary
    followed by every field of its :class:`~lossgeom.contract.MeasurementContract`, so
    no figure of the book can be captioned without its measurement contract. A chapter
    shows it with a ``{glue:figure} fig-<name>`` block whose caption is
    ``{glue:text}`cap-<name>```.
    """
    from matplotlib import pyplot as plt
    from myst_nb import glue

    from lossgeom.contract import MeasurementContract

    if not isinstance(name, str) or not name.strip():
        raise ValueError("name must be a non-empty string such as 'ch02-eigenvalue'")
    if not isinstance(contract, MeasurementContract):
        raise TypeError(f"contract must be a MeasurementContract, got {type(contract).__name__}")
    caption = contract.caption(summary)
    glue(f"fig-{name}", fig, display=False)
    glue(f"cap-{name}", Plain(caption), display=False)
    plt.close(fig)


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

"""Portable glue and the book's plot style.

A chapter glues every number through :func:`glue_value`, which stores it rounded by
:func:`lossgeom.formatting.round_sig`, and every figure through :func:`glue_figure`, whose
caption is the figure's measurement contract.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib import pyplot as plt
from myst_nb import glue

from lossgeom.contract import MeasurementContract
from lossgeom.formatting import SIGNIFICANT_DIGITS, Plain, round_sig


def glue_value(name: str, value: Any, sig: int = SIGNIFICANT_DIGITS) -> None:
    """Glue ``value`` rounded to ``sig`` significant digits (strings are glued as text).

    The stored ``text/plain`` then holds the rounded number (``0.03219``), not its full
    ``repr``, so strict nbval compares only portable digits. ``{glue:text}`` format specs
    still apply in the prose. Returns None, so a cell that ends with it shows nothing
    (a returned value would be displayed as the cell's result). :func:`round_sig` gives
    the stored value.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError("name must be a non-empty string such as 'ch04-gradnorm'")
    stored = Plain(value) if isinstance(value, str) else round_sig(value, sig)
    glue(name, stored, display=False)


def glue_figure(name: str, fig, contract, summary: str) -> None:
    """Glue ``fig`` as ``fig-<name>`` and its caption as ``cap-<name>``, then close it.

    The caption is ``contract.caption(summary)``: the figure's one-sentence summary
    followed by every field of its :class:`~lossgeom.contract.MeasurementContract`, so
    no figure of the book can be captioned without its measurement contract. A chapter
    shows it with a ``{glue:figure} fig-<name>`` block whose caption is
    ``{glue:text}`cap-<name>```.
    """
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
    plt.rcParams.update(
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

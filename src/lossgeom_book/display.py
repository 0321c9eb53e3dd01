"""Portable glue and the book's plot style.

A chapter glues every number through :func:`glue_value`, which stores it rounded by
:func:`lossgeom.formatting.round_sig`, and every figure through :func:`glue_figure`, which
glues the figure, a caption that says what to see, and the figure's measurement contract
in one compact, uniform line (:func:`contract_markdown`) shown under the caption.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from IPython.display import Markdown
from matplotlib import pyplot as plt
from myst_nb import glue

from lossgeom.contract import MeasurementContract
from lossgeom.formatting import SIGNIFICANT_DIGITS, Plain, round_sig
from lossgeom_book.ledger import escape_text


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


def contract_markdown(contract: MeasurementContract) -> str:
    """The contract as one compact Markdown line: every field, bold label, in a fixed order.

    Every figure of the book shows its contract in this one form, under its caption (the
    ``legend`` of a ``{glue:figure}`` block), so a reader finds the same ten fields in the
    same place under every figure.
    """
    if not isinstance(contract, MeasurementContract):
        raise TypeError(f"contract must be a MeasurementContract, got {type(contract).__name__}")
    fields = " · ".join(f"**{k.replace('_', ' ')}** {escape_text(v)}" for k, v in contract.as_dict().items())
    return f"*Measurement contract.* {fields}"


def glue_figure(name: str, fig, contract, summary: str) -> None:
    """Glue ``fig`` as ``fig-<name>``, its caption as ``cap-<name>`` and contract as ``con-<name>``.

    The caption is ``summary`` (what to see in the figure); the contract is
    :func:`contract_markdown` of the figure's
    :class:`~lossgeom.contract.MeasurementContract`, so no figure of the book can be
    shown without its measurement contract. A chapter shows it with a
    ``{glue:figure} fig-<name>`` block whose caption is ``{glue:text}`cap-<name>``` and
    whose legend is ``{glue:md}`con-<name>```; ``make check-html`` checks that every
    figure carries one. The figure is closed.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError("name must be a non-empty string such as 'ch02-eigenvalue'")
    if not isinstance(contract, MeasurementContract):
        raise TypeError(f"contract must be a MeasurementContract, got {type(contract).__name__}")
    if not isinstance(summary, str) or not summary.strip():
        raise ValueError("summary must be a non-empty sentence saying what the figure shows")
    summary = summary.strip()
    if summary[-1] not in ".!?":
        summary += "."
    glue(f"fig-{name}", fig, display=False)
    glue(f"cap-{name}", Plain(summary), display=False)
    glue(f"con-{name}", Markdown(contract_markdown(contract)), display=False)
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

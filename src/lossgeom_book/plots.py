"""Matplotlib drawings of the library's results for the book's figures.

:func:`draw_slice` draws a :class:`lossgeom.landscape.slices.Slice` as filled contours.
"""

from __future__ import annotations

import numpy as np
from matplotlib.colors import TwoSlopeNorm

from lossgeom.landscape.slices import Slice, shared_levels


def draw_slice(ax, piece: Slice, levels=None, labels: tuple[str, str] = ("s", "t")):
    """Filled contours of L - L(centre) on matplotlib axes ``ax``; returns the contour set.

    Colours are diverging around the centre value (white): red above it, blue below, so
    a region lower than the centre, the visual sign of a saddle or of a slope, stands
    out. ``levels`` defaults to :func:`~lossgeom.landscape.slices.shared_levels` of this slice alone; pass shared
    levels to put several slices on one colour scale. The centre is marked with a cross.
    """
    if not isinstance(piece, Slice):
        raise TypeError(f"piece must be a Slice, got {type(piece).__name__}")
    levels = shared_levels([piece]) if levels is None else np.asarray(levels, dtype=float)
    norm = TwoSlopeNorm(vcenter=0.0, vmin=float(levels[0]), vmax=float(levels[-1]))
    image = ax.contourf(
        piece.axis, piece.axis, piece.values - piece.centre_value, levels=levels, cmap="RdBu_r", norm=norm
    )
    ax.plot(0, 0, "k+")
    ax.set(xlabel=labels[0], ylabel=labels[1], aspect="equal")
    return image

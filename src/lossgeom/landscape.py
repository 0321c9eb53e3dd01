"""Two-dimensional loss slices with their geometry stated (Chapter 3, later Part II).

:func:`plane_grid` lays a square grid centre + s d1 + t d2 for s, t in [-radius, radius];
the directions are used exactly as given (any normalisation is the caller's, and goes
in the figure's measurement contract).
"""
from __future__ import annotations

import numpy as np

from lossgeom._checks import finite_array, positive, positive_int


def plane_grid(centre, d1, d2, radius: float, resolution: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (S, T, points) with points[i, j] = centre + S[i, j] d1 + T[i, j] d2.

    Args:
        centre: the slice's centre, a vector of length n.
        d1, d2: the two directions, vectors of length n (not normalised here).
        radius: half the side of the square in the (s, t) coordinates (> 0).
        resolution: number of grid values per axis (>= 2).
    """
    centre = finite_array("centre", centre, ndim=1)
    d1 = finite_array("d1", d1, shape=centre.shape)
    d2 = finite_array("d2", d2, shape=centre.shape)
    radius = positive("radius", radius)
    resolution = positive_int("resolution", resolution)
    if resolution < 2:
        raise ValueError(f"resolution must be >= 2, got {resolution}")
    if np.linalg.matrix_rank(np.stack([d1, d2])) < 2:
        raise ValueError("d1 and d2 must be linearly independent")
    axis = np.linspace(-radius, radius, resolution)
    S, T = np.meshgrid(axis, axis, indexing="xy")
    points = centre + S[..., None] * d1 + T[..., None] * d2
    return S, T, points

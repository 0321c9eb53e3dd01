"""The product model f(a, b; x) = a b x, trained on (x, y) = (1, 1).

The book's exact laboratory (Chapters 1-3). With L(a, b) = 1/2 (a b x - y)^2:

- gradient ((abx - y) b x, (abx - y) a x);
- Hessian [[b^2 x^2, (2abx - y) x], [(2abx - y) x, a^2 x^2]], which at ab x = y is the
  outer product x^2 (b, a)(b, a)^T with eigenvalues 0 and x^2 (a^2 + b^2);
- the rescaling (a, b) -> (c a, b / c), c > 0, keeps every prediction, so at (c, 1/c)
  the nonzero eigenvalue c^2 + c^-2 varies while the function x -> x does not.

Numeric functions take and return float64 numpy values; :func:`params`,
:func:`forward` and :func:`loss` are the torch versions used with autograd and the
symmetry audit.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import torch

from lossgeom._checks import as_real, finite_array, positive
from lossgeom.curvature import dense_hessian

Params = Mapping[str, torch.Tensor]


def params(a: float, b: float) -> dict[str, torch.Tensor]:
    """The parameter dict ``{"a": a, "b": b}`` as float64 scalar tensors."""
    return {"a": torch.tensor(as_real("a", a), dtype=torch.float64),
            "b": torch.tensor(as_real("b", b), dtype=torch.float64)}


def _ab(p: Params) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(p, Mapping) or set(p) != {"a", "b"}:
        raise ValueError("params must be a dict with exactly the keys 'a' and 'b'")
    return p["a"], p["b"]


def forward(p: Params, x: torch.Tensor) -> torch.Tensor:
    """Predictions a b x for a tensor of inputs ``x`` (any shape)."""
    a, b = _ab(p)
    return a * b * x


def loss(p: Params, x: torch.Tensor | float = 1.0, y: torch.Tensor | float = 1.0) -> torch.Tensor:
    """Mean over examples of 1/2 (a b x - y)^2 (a single example by default)."""
    x = torch.as_tensor(x, dtype=torch.float64)
    y = torch.as_tensor(y, dtype=torch.float64)
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same shape, got {tuple(x.shape)} and {tuple(y.shape)}")
    return (0.5 * (forward(p, x) - y) ** 2).mean()


def orbit_point(c: float) -> tuple[float, float]:
    """The point (c, 1/c) of the zero-loss orbit ab = 1, for c > 0."""
    c = positive("c", c)
    return c, 1.0 / c


def nonzero_eigenvalue(c: float | np.ndarray) -> float | np.ndarray:
    """The Hessian's nonzero eigenvalue c^2 + c^-2 at (c, 1/c) (Chapter 2, claim P3)."""
    arr = finite_array("c", c)
    if np.any(arr <= 0):
        raise ValueError("c must be > 0 (the orbit point is (c, 1/c))")
    out = arr**2 + arr**-2
    return float(out) if out.ndim == 0 else out


def gradient(a: float, b: float, x: float = 1.0, y: float = 1.0) -> np.ndarray:
    """Analytic gradient ((abx - y) b x, (abx - y) a x)."""
    a, b, x, y = (as_real(n, v) for n, v in zip("abxy", (a, b, x, y)))
    r = a * b * x - y
    return np.array([r * b * x, r * a * x])


def hessian(a: float, b: float, x: float = 1.0, y: float = 1.0) -> np.ndarray:
    """Analytic Hessian [[b^2 x^2, (2abx - y) x], [(2abx - y) x, a^2 x^2]]."""
    a, b, x, y = (as_real(n, v) for n, v in zip("abxy", (a, b, x, y)))
    off = (2 * a * b * x - y) * x
    return np.array([[b * b * x * x, off], [off, a * a * x * x]])


def hessian_autograd(a: float, b: float, x: float = 1.0, y: float = 1.0) -> np.ndarray:
    """The same Hessian by torch autograd (``torch.func.hessian``), float64."""
    xt = torch.tensor(as_real("x", x), dtype=torch.float64)
    yt = torch.tensor(as_real("y", y), dtype=torch.float64)
    return dense_hessian(lambda p: loss(p, xt, yt), params(a, b)).numpy()


def rescale(points: np.ndarray, c: float) -> np.ndarray:
    """Map balanced coordinates (u, v) to (c u, v / c); ``points`` has shape (..., 2)."""
    c = positive("c", c)
    pts = finite_array("points", points)
    if pts.ndim == 0 or pts.shape[-1] != 2:
        raise ValueError(f"points must have shape (..., 2), got {pts.shape}")
    return pts * np.array([c, 1.0 / c])


def loss_at(points: np.ndarray, x: float = 1.0, y: float = 1.0) -> np.ndarray:
    """Exact loss 1/2 (a b x - y)^2 at every point of an array of shape (..., 2)."""
    pts = finite_array("points", points)
    if pts.ndim == 0 or pts.shape[-1] != 2:
        raise ValueError(f"points must have shape (..., 2), got {pts.shape}")
    x, y = as_real("x", x), as_real("y", y)
    return 0.5 * (pts[..., 0] * pts[..., 1] * x - y) ** 2

"""The product model f(a, b; x) = a b x, trained on (x, y) = (1, 1).

The book's exact laboratory (Part I: chapters ``ch01_object_and_metric``,
``ch02_family_of_minima`` and ``ch03_perturbation_sets``). With L(a, b) = 1/2 (a b x - y)^2:

- gradient ((abx - y) b x, (abx - y) a x);
- Hessian [[b^2 x^2, (2abx - y) x], [(2abx - y) x, a^2 x^2]], which at ab x = y is the
  outer product x^2 (b, a)(b, a)^T with eigenvalues 0 and x^2 (a^2 + b^2);
- the rescaling (a, b) -> (c a, b / c), c > 0, keeps every prediction, so at (c, 1/c)
  the nonzero eigenvalue c^2 + c^-2 varies while the function x -> x does not.

Numeric functions take and return float64 numpy values; :func:`params`,
:func:`forward` and :func:`loss` are the torch versions used with autograd and the
symmetry audit, and :func:`product_rescaling` is the rescaling as a
:class:`lossgeom.symmetries.Symmetry`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

from lossgeom.curvature import closure_hessian
from lossgeom.formatting import fmt
from lossgeom.symmetries import Symmetry
from lossgeom.training import sgd, train
from lossgeom.types import Params
from lossgeom_book.checks import as_real, finite_array, positive, positive_int


def params(a: float, b: float) -> dict[str, torch.Tensor]:
    """The parameter dict ``{"a": a, "b": b}`` as float64 scalar tensors."""
    return {
        "a": torch.tensor(as_real("a", a), dtype=torch.float64),
        "b": torch.tensor(as_real("b", b), dtype=torch.float64),
    }


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


def product_rescaling(c: float) -> Symmetry:
    """The product model's rescaling (a, b) -> (c a, b / c) for c > 0 (Chapters 1 and 2).

    ``ab`` is unchanged, so the function x -> abx is unchanged on every input.

    Args:
        c: the rescaling factor, > 0.

    Returns:
        A :class:`Symmetry` on params ``{"a", "b"}``.
    """
    c = positive("c", c)

    def transform(params: Params) -> dict[str, torch.Tensor]:
        missing = {"a", "b"} - set(params)
        if missing:
            raise ValueError(f"product_rescaling needs params 'a' and 'b'; missing {sorted(missing)}")
        return {"a": params["a"] * c, "b": params["b"] / c}

    return Symmetry(f"rescaling (a, b) -> (c a, b / c), c = {fmt(c)}", transform)


def orbit_point(c: float) -> tuple[float, float]:
    """The point (c, 1/c) of the zero-loss orbit ab = 1, for c > 0."""
    c = positive("c", c)
    return c, 1.0 / c


def nonzero_eigenvalue(c: float | np.ndarray) -> float | np.ndarray:
    """The Hessian's nonzero eigenvalue c^2 + c^-2 at (c, 1/c) (``ch02_family_of_minima``, claim P3)."""
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
    return closure_hessian(lambda p: loss(p, xt, yt), params(a, b)).numpy()


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


def largest_hessian_eigenvalue(p: Params) -> float:
    """Largest eigenvalue of the autograd Hessian of :func:`loss` at the parameter dict ``p``.

    The geometry measure the symmetry audit recomputes in ``ch01_object_and_metric``; at
    (c, 1/c) it equals c^2 + c^-2 (:func:`nonzero_eigenvalue`).
    """
    a, b = _ab(p)
    return float(np.linalg.eigvalsh(hessian_autograd(float(a), float(b)))[-1])


def tangent_line(c: float, steps: np.ndarray) -> np.ndarray:
    """Points (c, 1/c) + s t_hat on the straight line along the unit zero-eigenvalue direction.

    t_hat = (c, -1/c) / norm((c, -1/c)) is the orbit's tangent at (c, 1/c). The loss along the
    line is s^4 / (2 (c^2 + c^-2)^2), derived in ``ch02_family_of_minima`` (claim P4).
    Returns an array of shape (len(steps), 2).
    """
    c = positive("c", c)
    steps = finite_array("steps", steps, ndim=1)
    direction = np.array([c, -1.0 / c]) / math.hypot(c, 1.0 / c)
    return np.array(orbit_point(c)) + steps[:, None] * direction


def orbit_curve(c: float, t: np.ndarray) -> np.ndarray:
    """Points (c e^t, e^-t / c) of the zero-loss orbit through (c, 1/c), shape (len(t), 2)."""
    c = positive("c", c)
    t = finite_array("t", t, ndim=1)
    return np.stack([c * np.exp(t), np.exp(-t) / c], axis=-1)


def negative_curvature_predicted(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Where the Hessian has a negative eigenvalue: (ab - 1)(3ab - 1) > 0.

    det H = -(ab - 1)(3ab - 1) at x = y = 1 and tr H = a^2 + b^2 >= 0, so a negative
    eigenvalue exists exactly where the determinant is negative (``ch02_family_of_minima``,
    claim P5).
    """
    ab = finite_array("a", a) * finite_array("b", b)
    return (ab - 1.0) * (3.0 * ab - 1.0) > 0


def log_coordinate_hessian(a: float, b: float) -> np.ndarray:
    """Autograd Hessian of the loss in log coordinates a = e^alpha, b = e^beta (a, b > 0).

    By the chain rule it equals J^T H J + (ab - 1) ab I with J = diag(a, b): the second
    term is the gradient term that vanishes only on the orbit (``ch02_family_of_minima``,
    claim P6).
    """
    a, b = positive("a", a), positive("b", b)
    log_params = {"alpha": torch.tensor(math.log(a)), "beta": torch.tensor(math.log(b))}

    def loss_in_logs(q: Params) -> torch.Tensor:
        return loss({"a": torch.exp(q["alpha"]), "b": torch.exp(q["beta"])})

    return closure_hessian(loss_in_logs, log_params).numpy()


def regression_sample(n: int, noise: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded regression sample for the product model: x ~ N(0, 1), y = x + noise * N(0, 1).

    Uses ``numpy.random.default_rng(seed)``; returns (x, y), each of shape (n,).
    """
    n = positive_int("n", n)
    noise = positive("noise", noise)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    return x, x + noise * rng.normal(size=n)


def _xy(x, y) -> tuple[np.ndarray, np.ndarray]:
    x, y = finite_array("x", x, ndim=1), finite_array("y", y, ndim=1)
    if x.shape != y.shape or x.size == 0:
        raise ValueError(f"x and y must be non-empty and of one shape, got {x.shape} and {y.shape}")
    return x, y


def dataset_loss(a: float, b: float, x, y) -> float:
    """Mean over examples of 1/2 (a b x_i - y_i)^2."""
    a, b = as_real("a", a), as_real("b", b)
    x, y = _xy(x, y)
    return float(np.mean(0.5 * (a * b * x - y) ** 2))


def dataset_hessian(a: float, b: float, x, y) -> np.ndarray:
    """Hessian of :func:`dataset_loss`: [[b^2 m, 2ab m - r], [2ab m - r, a^2 m]].

    Here m = mean x_i^2 and r = mean x_i y_i; the mean of the per-example Hessians of
    :func:`hessian` (``ch01_object_and_metric``).
    """
    a, b = as_real("a", a), as_real("b", b)
    x, y = _xy(x, y)
    m, r = float(np.mean(x * x)), float(np.mean(x * y))
    off = 2 * a * b * m - r
    return np.array([[b * b * m, off], [off, a * a * m]])


def gradient_descent(a: float, b: float, x, y, lr: float, steps: int) -> tuple[float, float]:
    """Full-batch gradient descent on :func:`dataset_loss` from (a, b), with
    :func:`lossgeom.training.train` (plain SGD without momentum); returns the final (a, b).
    """
    x, y = _xy(x, y)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    run = train(lambda p, idx: loss(p, xt, yt), params(a, b), sgd(positive("lr", lr)), positive_int("steps", steps))
    return float(run.params["a"]), float(run.params["b"])


def balanced_representative(a: float, b: float) -> tuple[float, float]:
    """The point of the orbit of (a, b) with abs(a) = abs(b): (sign(ab) sqrt(abs(ab)), sqrt(abs(ab))).

    It implements the same function x -> abx, so a measure evaluated there is a function
    of the predictor alone (a convention that fixes the coordinates, ``ch01_object_and_metric``).
    """
    k = as_real("a", a) * as_real("b", b)
    root = math.sqrt(abs(k))
    return math.copysign(root, k), root

"""Perturbation sets that move with the coordinates (chapter ``ch03_perturbation_sets``).

A perturbation experiment is a set of displacements plus a loss. Under the rescaling
(a, b) = (c u, v / c) a Euclidean circle in balanced coordinates becomes an ellipse,
and the same angle list evaluated on both gives the same losses point by point
(claim P8). A maximum over a finite angle list is only a lower bound on the
continuous maximum; for the product model the continuous maximum is known exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lossgeom_book.checks import as_real, finite_array, positive, positive_int
from lossgeom_book.product import loss_at, rescale


def angular_grid(n: int, offset: float = 0.0) -> np.ndarray:
    """Angles offset + 2 pi k / n for k = 0, ..., n - 1."""
    n = positive_int("n", n)
    offset = as_real("offset", offset)
    return offset + 2.0 * np.pi * np.arange(n) / n


def circle(centre: np.ndarray, radius: float, angles: np.ndarray) -> np.ndarray:
    """Points centre + radius (cos t, sin t) for each angle t; shape (len(angles), 2)."""
    centre = finite_array("centre", centre, shape=(2,))
    radius = positive("radius", radius)
    angles = finite_array("angles", angles, ndim=1)
    return centre + radius * np.stack([np.cos(angles), np.sin(angles)], axis=-1)


@dataclass(frozen=True)
class CircleReceipt:
    """Pointwise comparison of a balanced circle with its transformed ellipse (P8)."""

    c: float
    radius: float
    n_angles: int
    max_pointwise_discrepancy: float
    sampled_max_balanced: float
    sampled_max_transformed: float
    sampled_max_control: float
    exact_max: float


def transformed_circle_receipt(c: float, radius: float, n_angles: int) -> CircleReceipt:
    """Evaluate the product loss on one angle grid three ways and compare.

    - balanced: circle of ``radius`` around (1, 1);
    - transformed: the same points mapped by (u, v) -> (c u, v / c), an ellipse around (c, 1/c);
    - control: an untransformed circle of ``radius`` around (c, 1/c).
    """
    c = positive("c", c)
    radius = positive("radius", radius)
    angles = angular_grid(n_angles)
    balanced = circle(np.array([1.0, 1.0]), radius, angles)
    transformed = rescale(balanced, c)
    control = circle(np.array([c, 1.0 / c]), radius, angles)
    lb, lt, lc = loss_at(balanced), loss_at(transformed), loss_at(control)
    return CircleReceipt(
        c=c,
        radius=radius,
        n_angles=len(angles),
        max_pointwise_discrepancy=float(np.max(np.abs(lt - lb))),
        sampled_max_balanced=float(lb.max()),
        sampled_max_transformed=float(lt.max()),
        sampled_max_control=float(lc.max()),
        exact_max=product_circle_max(radius),
    )


def product_circle_max(radius: float) -> float:
    """Exact maximum of 1/2 ((1 + r cos t)(1 + r sin t) - 1)^2 over all angles t.

    With s = cos t + sin t in [-sqrt 2, sqrt 2] the residual is g(s) = r s + r^2 (s^2 - 1) / 2,
    a convex quadratic, so ``|g|`` is largest at s = sqrt 2 (t = pi/4) or at its vertex
    s = -1/r when that lies in range (r >= 1/sqrt 2). Derived in ``ch03_perturbation_sets``.
    """
    r = positive("radius", radius)
    candidates = [math.sqrt(2) * r + r * r / 2, -math.sqrt(2) * r + r * r / 2]
    if 1.0 / r <= math.sqrt(2):
        candidates.append(-0.5 - r * r / 2)
    return 0.5 * max(g * g for g in candidates)


def sampled_circle_max(radius: float, n_angles: int) -> float:
    """Largest loss over the grid circle of ``radius`` around (1, 1) with ``n_angles`` angles.

    A lower bound on :func:`product_circle_max` (equal when the grid contains pi/4).
    """
    points = circle(np.array([1.0, 1.0]), radius, angular_grid(n_angles))
    return float(loss_at(points).max())


@dataclass(frozen=True)
class SquareLosses:
    """Losses over a fixed and a transformed square around (c, 1/c) (claim P10).

    ``fixed[i, j]`` is the loss at (c + S[i, j], 1/c + T[i, j]); ``transformed[i, j]`` at the
    rescaled image (c (1 + S), (1 + T) / c) of the balanced square; ``balanced`` at
    (1 + S, 1 + T).
    """

    c: float
    S: np.ndarray
    T: np.ndarray
    fixed: np.ndarray
    transformed: np.ndarray
    balanced: np.ndarray


def square_losses(c: float, half_width: float, resolution: int) -> SquareLosses:
    """Evaluate the product loss over the fixed and the transformed square (P10).

    Both squares use :func:`lossgeom.landscape.plane_grid` with the axes (1, 0), (0, 1)
    and the grid coordinates (sigma, tau) in [-half_width, half_width].
    """
    from lossgeom.landscape import plane_grid

    c = positive("c", c)
    axes = ([1.0, 0.0], [0.0, 1.0])
    S, T, balanced = plane_grid([1.0, 1.0], *axes, half_width, resolution)
    _, _, fixed = plane_grid(list((c, 1.0 / c)), *axes, half_width, resolution)
    return SquareLosses(c, S, T, loss_at(fixed), loss_at(rescale(balanced, c)), loss_at(balanced))


def gaussian_expected_loss(a: float, b: float, sd: float) -> float:
    """Exact E[1/2 ((a + e1)(b + e2) - 1)^2] for independent e1, e2 ~ N(0, sd^2).

    Equals 1/2 ((ab - 1)^2 + sd^2 (a^2 + b^2) + sd^4) (``ch03_perturbation_sets``, claim M1).
    """
    a, b = as_real("a", a), as_real("b", b)
    sd = positive("sd", sd)
    return 0.5 * ((a * b - 1.0) ** 2 + sd**2 * (a * a + b * b) + sd**4)


def monte_carlo_expected_loss(a: float, b: float, sd: float, n_samples: int, seed: int) -> tuple[float, float]:
    """Monte Carlo estimate of :func:`gaussian_expected_loss` and its standard error.

    Uses ``numpy.random.default_rng(seed)``; returns (mean, standard error).
    """
    a, b = as_real("a", a), as_real("b", b)
    sd = positive("sd", sd)
    n = positive_int("n_samples", n_samples)
    if n < 2:
        raise ValueError("n_samples must be >= 2 to estimate a standard error")
    rng = np.random.default_rng(seed)
    noise = rng.normal(0.0, sd, size=(n, 2))
    values = loss_at(np.array([a, b]) + noise)
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(n))


def _metric(name: str, metric, n: int) -> np.ndarray:
    if metric is None:
        return np.eye(n)
    P = finite_array(name, metric, shape=(n, n))
    if not np.allclose(P, P.T) or np.linalg.eigvalsh(P).min() <= 0:
        raise ValueError(f"{name} must be symmetric positive definite")
    return P


def _gradient_at(gradient, point: np.ndarray, where: str) -> np.ndarray:
    if not callable(gradient):
        raise TypeError("gradient must be callable as gradient(point) -> array")
    return finite_array(f"gradient({where})", gradient(point), shape=point.shape)


def gradient_step(gradient, point, lr: float, metric=None) -> np.ndarray:
    """One (preconditioned) gradient-descent step: point' = point - lr * P grad L(point).

    With P = J J^T for a linear reparametrisation theta = J u this is the Euclidean step
    taken in the u coordinates and mapped back; P = I (default) is plain gradient descent,
    which is *not* invariant under the reparametrisation (``ch03_perturbation_sets``, P9).

    Args:
        gradient: callable mapping a point (1-D array) to the loss gradient there.
        point: the current parameters, a 1-D array.
        lr: the step size (> 0).
        metric: optional (n, n) symmetric positive definite matrix P.
    """
    point = finite_array("point", point, ndim=1)
    lr = positive("lr", lr)
    P = _metric("metric", metric, point.shape[0])
    return point - lr * (P @ _gradient_at(gradient, point, "point"))


def sam_step(gradient, point, radius: float, lr: float, ascent_metric=None, descent_metric=None) -> np.ndarray:
    """One sharpness-aware minimisation step with declared ascent and descent metrics (P9).

    With gradient g at ``point``, an ascent metric A and a descent metric P (symmetric
    positive definite; identity by default, i.e. plain Euclidean SAM of Foret et al.):

        eps = radius * A g / sqrt(g^T A g),   point' = point - lr * P grad L(point + eps).

    The ascent solves max <g, eps> over the ellipse eps^T A^-1 eps <= radius^2, the
    neighbourhood SAM searches. With A = P = J J^T for a linear reparametrisation
    theta = J u this is exactly the Euclidean SAM step taken in the u coordinates and
    mapped back, so equivalent points move to equivalent points; A alone transforms the
    neighbourhood but leaves the descent Euclidean, and P alone transforms the descent
    but keeps SAM's Euclidean ball (``ch03_perturbation_sets``).

    Args:
        gradient: callable mapping a point (1-D array) to the loss gradient there.
        point: the current parameters, a 1-D array.
        radius: SAM's neighbourhood radius rho (> 0).
        lr: the step size (> 0).
        ascent_metric: optional (n, n) symmetric positive definite matrix A.
        descent_metric: optional (n, n) symmetric positive definite matrix P.
    """
    point = finite_array("point", point, ndim=1)
    radius = positive("radius", radius)
    A = _metric("ascent_metric", ascent_metric, point.shape[0])
    g = _gradient_at(gradient, point, "point")
    norm = math.sqrt(float(g @ A @ g))
    if norm == 0.0:
        raise ValueError("the gradient is zero at point: SAM's ascent direction is undefined")
    eps = radius * (A @ g) / norm
    P = _metric("descent_metric", descent_metric, point.shape[0])
    return point - positive("lr", lr) * (P @ _gradient_at(gradient, point + eps, "point + eps"))


def rescaling_metric(c: float) -> np.ndarray:
    """J J^T = diag(c^2, c^-2) for the product rescaling (a, b) = J (u, v), J = diag(c, 1/c).

    The metric in which a Euclidean set or step of the balanced coordinates is drawn at
    the rescaled point (``ch03_perturbation_sets``).
    """
    c = positive("c", c)
    return np.diag([c * c, 1.0 / (c * c)])


#: The update rules compared in ``ch03_perturbation_sets`` (claim P9): which of SAM's
#: two ingredients, the neighbourhood (ascent) and the descent, is drawn in the metric
#: carried by the rescaling. The four SAM rules are the 2 x 2 of {Euclidean,
#: transformed} ascent x {Euclidean, transformed} descent; the two GD rules are the
#: descents alone, without a neighbourhood.
UPDATE_RULES = (
    "plain GD",
    "transformed GD",
    "Euclidean SAM",
    "transformed ascent, Euclidean descent",
    "Euclidean ascent, transformed descent",
    "transformed SAM",
)


def update_rule(name: str, c: float, radius: float, lr: float, gradient=None):
    """The step function ``point -> point'`` of one of :data:`UPDATE_RULES` at scale c.

    "transformed" means drawn in :func:`rescaling_metric` (c): the balanced coordinates'
    Euclidean set or step mapped to the rescaled point; at c = 1 every rule reduces to
    its Euclidean form. "X ascent, Y descent" is :func:`sam_step` with only the named
    ingredient transformed (``ascent_metric`` or ``descent_metric``). ``gradient``
    defaults to the product model's analytic gradient.
    """
    from lossgeom_book.product import gradient as product_gradient

    if name not in UPDATE_RULES:
        raise ValueError(f"name must be one of {UPDATE_RULES}, got {name!r}")
    if gradient is None:

        def gradient(q):
            return product_gradient(q[0], q[1])

    M = rescaling_metric(c)
    radius, lr = positive("radius", radius), positive("lr", lr)
    rules = {
        "plain GD": lambda q: gradient_step(gradient, q, lr),
        "transformed GD": lambda q: gradient_step(gradient, q, lr, metric=M),
        "Euclidean SAM": lambda q: sam_step(gradient, q, radius, lr),
        "transformed ascent, Euclidean descent": lambda q: sam_step(gradient, q, radius, lr, ascent_metric=M),
        "Euclidean ascent, transformed descent": lambda q: sam_step(gradient, q, radius, lr, descent_metric=M),
        "transformed SAM": lambda q: sam_step(gradient, q, radius, lr, ascent_metric=M, descent_metric=M),
    }
    return rules[name]


def trajectory(step, start, n_steps: int) -> np.ndarray:
    """Iterate ``step`` from ``start``: an array of shape (n_steps + 1, len(start))."""
    if not callable(step):
        raise TypeError("step must be callable as step(point) -> point")
    path = [finite_array("start", start, ndim=1)]
    for _ in range(positive_int("n_steps", n_steps)):
        path.append(finite_array("step(point)", step(path[-1]), shape=path[0].shape))
    return np.array(path)

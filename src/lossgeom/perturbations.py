"""Perturbation sets that move with the coordinates (Chapter 3).

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

from lossgeom._checks import as_real, finite_array, positive, positive_int
from lossgeom.product import loss_at, rescale


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
        c=c, radius=radius, n_angles=len(angles),
        max_pointwise_discrepancy=float(np.max(np.abs(lt - lb))),
        sampled_max_balanced=float(lb.max()), sampled_max_transformed=float(lt.max()),
        sampled_max_control=float(lc.max()), exact_max=product_circle_max(radius),
    )


def product_circle_max(radius: float) -> float:
    """Exact maximum of 1/2 ((1 + r cos t)(1 + r sin t) - 1)^2 over all angles t.

    With s = cos t + sin t in [-sqrt 2, sqrt 2] the residual is g(s) = r s + r^2 (s^2 - 1) / 2,
    a convex quadratic, so ``|g|`` is largest at s = sqrt 2 (t = pi/4) or at its vertex
    s = -1/r when that lies in range (r >= 1/sqrt 2). Derived in Chapter 3.
    """
    r = positive("radius", radius)
    candidates = [math.sqrt(2) * r + r * r / 2, -math.sqrt(2) * r + r * r / 2]
    if 1.0 / r <= math.sqrt(2):
        candidates.append(-0.5 - r * r / 2)
    return 0.5 * max(g * g for g in candidates)


def gaussian_expected_loss(a: float, b: float, sd: float) -> float:
    """Exact E[1/2 ((a + e1)(b + e2) - 1)^2] for independent e1, e2 ~ N(0, sd^2).

    Equals 1/2 ((ab - 1)^2 + sd^2 (a^2 + b^2) + sd^4) (Chapter 3, claim M1).
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


def sam_step(gradient, point, radius: float, lr: float, preconditioner=None) -> np.ndarray:
    """One sharpness-aware minimisation step, optionally in a declared metric (claim P9).

    With gradient g at ``point`` and a symmetric positive definite preconditioner P
    (identity by default, i.e. plain Euclidean SAM of Foret et al.):

        eps = radius * P g / sqrt(g^T P g),   point' = point - lr * P grad L(point + eps).

    With P = J J^T for a linear reparametrisation theta = J u this is exactly the
    Euclidean SAM step taken in the u coordinates and mapped back, so two equivalent
    points move to equivalent points (Chapter 3).

    Args:
        gradient: callable mapping a point (1-D array) to the loss gradient there.
        point: the current parameters, a 1-D array.
        radius: SAM's neighbourhood radius rho (> 0).
        lr: the step size (> 0).
        preconditioner: optional (n, n) symmetric positive definite matrix P.
    """
    point = finite_array("point", point, ndim=1)
    radius, lr = positive("radius", radius), positive("lr", lr)
    n = point.shape[0]
    P = np.eye(n) if preconditioner is None else finite_array("preconditioner", preconditioner, shape=(n, n))
    if not np.allclose(P, P.T) or np.linalg.eigvalsh(P).min() <= 0:
        raise ValueError("preconditioner must be symmetric positive definite")
    if not callable(gradient):
        raise TypeError("gradient must be callable as gradient(point) -> array")
    g = finite_array("gradient(point)", gradient(point), shape=(n,))
    norm = math.sqrt(float(g @ P @ g))
    if norm == 0.0:
        raise ValueError("the gradient is zero at point: SAM's ascent direction is undefined")
    eps = radius * (P @ g) / norm
    return point - lr * (P @ finite_array("gradient(point + eps)", gradient(point + eps), shape=(n,)))

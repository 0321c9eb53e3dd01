"""Feature-space robustness certificates for a softmax classifier (Chapter 8).

For one example with feature ``h``, label ``y`` and classifier ``W`` (K x d), the loss
is ``l_y(h) = -log softmax(W h)_y``. Chapter 8 (``chapters/ch08_certificates``) compares
two ways of turning curvature into a certified radius:

- the *published* curvature-only expression of Walter et al. (2026),
  ``delta^2 / (2 r^2) * B_raw + delta^3 / (24 r^3) * K m`` (:func:`published_expression`),
  for an input perturbation of size ``delta`` given a lower bound ``r <= ||phi(x)||`` on
  the feature norm; it drops the first-order term, so it is not a valid bound
  (:func:`published_radius` inverts it);
- the sound bound of seed 004's Proposition 4 (:func:`sound_bound`):
  ``l_y(h + d) - l_y(h) <= ||d|| ||g_h|| + D_W^2 / 8 ||d||^2``, with
  ``g_h = W^T (p - e_y)`` and ``D_W = max_ij ||w_i - w_j||`` (:func:`row_diameter`);
  :func:`sound_radius` solves it for a tolerance.

Both ``g_h`` and ``D_W`` are unchanged by common-row shifts ``W -> W + 1 v^T``, so the
sound bound is gauge invariant; ``B_raw`` is not.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from scipy.optimize import brentq

from lossgeom._checks import as_real, positive, positive_int
from lossgeom.softmax import _classifier, _features, probabilities


def _labels(y, n: int | None, K: int) -> torch.Tensor:
    y = torch.as_tensor(y)
    if y.dtype.is_floating_point or y.dtype == torch.bool:
        raise TypeError(f"y must hold integer class labels, got dtype {y.dtype}")
    expected = () if n is None else (n,)
    if tuple(y.shape) != expected:
        raise ValueError(f"y must have shape {expected} to match h, got {tuple(y.shape)}")
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= K):
        raise ValueError(f"y must hold class labels in 0..{K - 1}")
    return y.to(torch.int64)


def _prepare(W, h, y):
    W = _classifier(W)
    h = _features(h, W.shape[1])
    y = _labels(y, None if h.ndim == 1 else h.shape[0], W.shape[0])
    return W, h, y


def row_diameter(W: torch.Tensor) -> torch.Tensor:
    """``D_W = max_{i,j} ||w_i - w_j||_2``, the largest distance between two class rows."""
    W = _classifier(W)
    return torch.cdist(W.unsqueeze(0), W.unsqueeze(0)).max()


def cross_entropy(W: torch.Tensor, h: torch.Tensor, y) -> torch.Tensor:
    """``l_y(h) = -log softmax(W h)_y`` per example (shape () or (n,))."""
    W, h, y = _prepare(W, h, y)
    z = h @ W.T
    return torch.logsumexp(z, dim=-1) - z.gather(-1, y.unsqueeze(-1)).squeeze(-1)


def feature_gradient(W: torch.Tensor, h: torch.Tensor, y) -> torch.Tensor:
    """``g_h = grad_h l_y(h) = W^T (p - e_y)`` (shape (d,) or (n, d)).

    ``p_y - 1`` is formed as ``-sum_{k != y} p_k`` so a confident example keeps a
    nonzero, accurate gradient instead of rounding to zero.
    """
    W, h, y = _prepare(W, h, y)
    p = probabilities(W, h)
    onehot = torch.nn.functional.one_hot(y, W.shape[0]).to(p.dtype)
    others = p * (1 - onehot)
    residual = others - onehot * others.sum(dim=-1, keepdim=True)
    return residual @ W


def loss_increase(W: torch.Tensor, h: torch.Tensor, y, d: torch.Tensor) -> torch.Tensor:
    """``l_y(h + d) - l_y(h)``, computed without cancellation (Chapter 8).

    ``= log(sum_k p_k exp(delta_k - delta_y))`` with ``delta = W d``, evaluated as
    ``log1p(sum_{k != y} p_k expm1(delta_k - delta_y))``: accurate even for tiny ``d``.
    """
    W, h, y = _prepare(W, h, y)
    d = _features(d, W.shape[1])
    if d.shape != h.shape:
        raise ValueError(f"d must have the shape of h {tuple(h.shape)}, got {tuple(d.shape)}")
    p = probabilities(W, h)
    delta = d @ W.T
    rel = delta - delta.gather(-1, y.unsqueeze(-1))
    return torch.log1p((p * torch.expm1(rel)).sum(dim=-1))


def sound_bound(W: torch.Tensor, h: torch.Tensor, y, d_norm) -> torch.Tensor:
    """Seed 004's Proposition 4: ``||d|| ||g_h|| + D_W^2 / 8 ||d||^2`` bounds ``l_y(h+d) - l_y(h)``.

    Valid for every feature perturbation of norm ``d_norm`` (no stationarity needed).
    """
    d_norm = torch.as_tensor(d_norm, dtype=torch.float64)
    if not torch.isfinite(d_norm).all() or (d_norm < 0).any():
        raise ValueError("d_norm must be finite and >= 0")
    g = feature_gradient(W, h, y).norm(dim=-1)
    return d_norm * g + row_diameter(W) ** 2 / 8 * d_norm**2


def sound_radius(W: torch.Tensor, h: torch.Tensor, y, epsilon: float) -> torch.Tensor:
    """The radius certified by :func:`sound_bound` at loss tolerance ``epsilon`` > 0.

    ``rho = 2 eps / (||g_h|| + sqrt(||g_h||^2 + D_W^2 eps / 2))``, the positive root of
    ``rho ||g_h|| + D_W^2 rho^2 / 8 = eps`` (``inf`` when ``D_W = 0``).
    """
    epsilon = positive("epsilon", epsilon)
    g = feature_gradient(W, h, y).norm(dim=-1)
    D = row_diameter(W)
    if D == 0:
        return torch.full_like(g, math.inf)
    return 2 * epsilon / (g + torch.sqrt(g**2 + D**2 * epsilon / 2))


def raw_quadratic(W: torch.Tensor, h: torch.Tensor, d_norm) -> torch.Tensor:
    """The curvature-only quadratic ``||d||^2 / 2 * ||W||_F^2 (1 - ||p||^2)`` in feature space.

    Equals ``Delta^2 / 2 * B_raw(W, h)`` for ``||d|| = Delta ||h||``: the published
    expression's quadratic with the most favourable feature bound ``r = ||h||``.
    """
    W = _classifier(W)
    h = _features(h, W.shape[1])
    d_norm = torch.as_tensor(d_norm, dtype=torch.float64)
    if not torch.isfinite(d_norm).all() or (d_norm < 0).any():
        raise ValueError("d_norm must be finite and >= 0")
    p = probabilities(W, h)
    return d_norm**2 / 2 * (W**2).sum() * (1 - (p**2).sum(dim=-1))


def curvature_only_radius(W: torch.Tensor, h: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Feature radius where :func:`raw_quadratic` reaches ``epsilon`` > 0: ``sqrt(2 eps / (||W||^2 Tr P))``."""
    epsilon = positive("epsilon", epsilon)
    W = _classifier(W)
    p = probabilities(W, _features(h, W.shape[1]))
    curvature = (W**2).sum() * (1 - (p**2).sum(dim=-1))
    return torch.sqrt(2 * epsilon / curvature)


def published_expression(delta, b_raw_value, r, K, m) -> float:
    """The curvature-only certificate expression ``delta^2/(2 r^2) B_raw + delta^3/(24 r^3) K m``.

    Args:
        delta: input perturbation size (>= 0).
        b_raw_value: ``B_raw(W, phi(x))`` (>= 0), see :func:`lossgeom.softmax.b_raw`.
        r: the feature lower bound ``r <= ||phi(x)||`` the expression needs (> 0).
        K: number of classes (>= 2); m: the dimension constant of the expression (>= 1;
            the counterexample of Chapter 8 has ``m = d = 1``).
    """
    delta, b_val = as_real("delta", delta), as_real("b_raw_value", b_raw_value)
    if delta < 0 or b_val < 0:
        raise ValueError("delta and b_raw_value must be >= 0")
    r = positive("r", r)
    K, m = positive_int("K", K), positive_int("m", m)
    if K < 2:
        raise ValueError(f"K must be >= 2, got {K}")
    return delta**2 / (2 * r**2) * b_val + delta**3 / (24 * r**3) * K * m


def published_radius(epsilon, b_raw_value, r, K, m) -> float:
    """The radius the published expression certifies: its unique root ``delta > 0`` at ``epsilon``.

    The expression is strictly increasing in ``delta > 0``, so the root is unique.
    """
    epsilon = positive("epsilon", epsilon)
    f = lambda delta: published_expression(delta, b_raw_value, r, K, m) - epsilon
    hi = 1.0
    while f(hi) < 0:
        hi *= 2.0
    return float(brentq(f, 0.0, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps))


__all__ = [
    "cross_entropy",
    "curvature_only_radius",
    "feature_gradient",
    "loss_increase",
    "published_expression",
    "published_radius",
    "raw_quadratic",
    "row_diameter",
    "sound_bound",
    "sound_radius",
]

"""Feature-space robustness certificates for a softmax classifier.

For one example with feature ``h``, label ``y`` and classifier ``W`` (K x d), the loss
is ``l_y(h) = -log softmax(W h)_y``. The chapter "Certificates need the first-order
term" (``chapters/ch09_certificates``) compares two ways of turning curvature into a
certified radius:

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

On learned features, :func:`responses_along_gradient` moves each feature along its loss
gradient and records the realised increase next to the retained raw quadratic, the
omitted linear term and the sound bound; :func:`summarise_responses` reduces them to the
columns of seed 004's Table 1 and :func:`response_table` prints them.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.optimize import brentq

from lossgeom.flatness.softmax_gauge import probabilities
from lossgeom_book.checks import as_real, classifier, features, positive, positive_int


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
    W = classifier(W)
    h = features(h, W.shape[1])
    y = _labels(y, None if h.ndim == 1 else h.shape[0], W.shape[0])
    return W, h, y


def row_diameter(W: torch.Tensor) -> torch.Tensor:
    """``D_W = max_{i,j} ||w_i - w_j||_2``, the largest distance between two class rows."""
    W = classifier(W)
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
    """``l_y(h + d) - l_y(h)``, computed without cancellation.

    ``= log(sum_k p_k exp(delta_k - delta_y))`` with ``delta = W d``, evaluated as
    ``log1p(sum_{k != y} p_k expm1(delta_k - delta_y))``: accurate even for tiny ``d``.
    """
    W, h, y = _prepare(W, h, y)
    d = features(d, W.shape[1])
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
    W = classifier(W)
    h = features(h, W.shape[1])
    d_norm = torch.as_tensor(d_norm, dtype=torch.float64)
    if not torch.isfinite(d_norm).all() or (d_norm < 0).any():
        raise ValueError("d_norm must be finite and >= 0")
    p = probabilities(W, h)
    return d_norm**2 / 2 * (W**2).sum() * (1 - (p**2).sum(dim=-1))


def curvature_only_radius(W: torch.Tensor, h: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Feature radius where :func:`raw_quadratic` reaches ``epsilon`` > 0: ``sqrt(2 eps / (||W||^2 Tr P))``."""
    epsilon = positive("epsilon", epsilon)
    W = classifier(W)
    p = probabilities(W, features(h, W.shape[1]))
    curvature = (W**2).sum() * (1 - (p**2).sum(dim=-1))
    return torch.sqrt(2 * epsilon / curvature)


def published_expression(delta, b_raw_value, r, K, m) -> float:
    """The curvature-only certificate expression ``delta^2/(2 r^2) B_raw + delta^3/(24 r^3) K m``.

    Args:
        delta: input perturbation size (>= 0).
        b_raw_value: ``B_raw(W, phi(x))`` (>= 0), see :func:`lossgeom.flatness.b_raw`.
        r: the feature lower bound ``r <= ||phi(x)||`` the expression needs (> 0).
        K: number of classes (>= 2); m: the dimension constant of the expression (>= 1;
            the dataset-minimum counterexample has ``m = d = 1``).
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


#: The quantities :func:`responses_along_gradient` records for every example and step size.
RESPONSE_KEYS = ("actual", "raw", "linear", "bound")


def responses_along_gradient(W: torch.Tensor, h: torch.Tensor, y, deltas) -> dict[float, dict[str, torch.Tensor]]:
    """Per-example loss responses to the step ``d = Delta ||h|| u`` along ``u = g_h / ||g_h||``.

    For each ``Delta`` in ``deltas`` and each row of ``h`` (shape (n, d)) it records

    - ``actual``: the realised increase ``l_y(h + d) - l_y(h)`` (:func:`loss_increase`);
    - ``raw``: the retained raw quadratic ``Delta^2 / 2 * B_raw(W, h)`` (:func:`raw_quadratic`);
    - ``linear``: the omitted first-order term ``||d|| ||g_h|| = Delta ||h|| ||g_h||``;
    - ``bound``: the sound bound ``||d|| ||g_h|| + D_W^2 / 8 ||d||^2`` (:func:`sound_bound`).

    Since ``linear / raw = 2 ||g_h|| / (Delta ||h|| ||W||_F^2 (1 - ||p||^2))``, that ratio
    times ``Delta`` does not depend on ``Delta``: an identity, not a measurement.

    Returns:
        ``{Delta: {key: tensor of shape (n,)}}`` with the keys of :data:`RESPONSE_KEYS`.
    """
    W, h, y = _prepare(W, h, y)
    if h.ndim != 2:
        raise ValueError(f"h must be a batch of features of shape (n, {W.shape[1]}), got {tuple(h.shape)}")
    deltas = [as_real("deltas", dlt) for dlt in deltas]
    if not deltas or any(dlt <= 0 for dlt in deltas):
        raise ValueError("deltas must be a non-empty sequence of step sizes > 0")
    g = feature_gradient(W, h, y)
    g_norm = g.norm(dim=-1)
    if (g_norm == 0).any():
        raise ValueError("every example needs a nonzero feature gradient g_h to define the direction u")
    u = g / g_norm[:, None]
    out = {}
    for dlt in deltas:
        size = dlt * h.norm(dim=-1)
        out[dlt] = {
            "actual": loss_increase(W, h, y, size[:, None] * u),
            "raw": raw_quadratic(W, h, size),
            "linear": size * g_norm,
            "bound": sound_bound(W, h, y, size),
        }
    return out


def pool_responses(per_model) -> dict[float, dict[str, np.ndarray]]:
    """Concatenate :func:`responses_along_gradient` results of several models, per ``Delta``."""
    per_model = list(per_model)
    if not per_model or any(set(r) != set(per_model[0]) for r in per_model):
        raise ValueError("per_model must be a non-empty list of responses with the same step sizes")
    return {
        dlt: {key: torch.cat([r[dlt][key] for r in per_model]).numpy() for key in RESPONSE_KEYS} for dlt in per_model[0]
    }


def summarise_responses(pooled: dict) -> dict[float, dict[str, float]]:
    """The columns of seed 004's Table 1 for each ``Delta`` of pooled responses.

    ``exceed``: share of pairs whose realised increase exceeds the retained raw quadratic;
    ``lin_raw``: median of linear / raw; ``covered``: share with increase <= sound bound;
    ``tight_median``, ``tight_p90``: median and 90th percentile of bound / increase.
    """
    summary = {}
    for dlt, r in pooled.items():
        tight = r["bound"] / r["actual"]
        summary[dlt] = {
            "exceed": float(np.mean(r["actual"] > r["raw"])),
            "lin_raw": float(np.median(r["linear"] / r["raw"])),
            "covered": float(np.mean(r["actual"] <= r["bound"])),
            "tight_median": float(np.median(tight)),
            "tight_p90": float(np.quantile(tight, 0.9)),
        }
    return summary


def response_table(summary: dict, reported: dict | None = None, sig: int = 4) -> str:
    """:func:`summarise_responses` as a text table, a reported value beside each measured one.

    ``reported`` maps ``Delta`` to ``{column: value}`` for the entries the source states;
    every other reported cell shows ``-``. Shares print as percentages.
    """
    from lossgeom.formatting import fmt

    reported = reported or {}
    columns = {
        "exceed": "actual>raw",
        "lin_raw": "lin/raw",
        "covered": "covered",
        "tight_median": "bound/actual",
        "tight_p90": "p90",
    }
    shown = lambda key, value: fmt(100 * value, sig) + "%" if key in ("exceed", "covered") else fmt(value, sig)
    lines = [f"{'Delta':>6} | " + " | ".join(f"{label:>12} {'(rep.)':>7}" for label in columns.values())]
    for dlt, row in summary.items():
        rep = reported.get(dlt, {})
        cells = [f"{shown(c, row[c]):>12} {shown(c, rep[c]) if c in rep else '-':>7}" for c in columns]
        lines.append(f"{fmt(dlt):>6} | " + " | ".join(cells))
    return "\n".join(lines)


def curvature_only_radius_fails(W: torch.Tensor, h: torch.Tensor, y, epsilon: float) -> torch.Tensor:
    """Does the curvature-only radius admit an increase above ``epsilon`` along ``g_h``? (per example)

    Moves each feature by :func:`curvature_only_radius` along ``u = g_h / ||g_h||`` and
    compares the realised increase with ``epsilon``.
    """
    W, h, y = _prepare(W, h, y)
    g = feature_gradient(W, h, y)
    radius = curvature_only_radius(W, h, epsilon)
    return loss_increase(W, h, y, radius[..., None] * g / g.norm(dim=-1, keepdim=True)) > epsilon


def sound_bound_on_random_instances(n_classifiers: int = 120, seed: int = 0) -> tuple[float, int]:
    """Smallest ``sound bound / realised increase`` over seeded random instances.

    Each of ``n_classifiers`` classifiers has 2-10 classes, feature dimension 1-8, a row
    scale between 0.1 and 10 and 10 labelled features; each feature moves by
    ``10^-4, 10^-2, 1, 10`` in a random direction and along its gradient. Only positive
    increases enter the ratio.

    Returns:
        (smallest ratio, number of positive increases).
    """
    n_classifiers = positive_int("n_classifiers", n_classifiers)
    gen = torch.Generator().manual_seed(int(seed))
    worst, count = math.inf, 0
    for _ in range(n_classifiers):
        K = int(torch.randint(2, 11, (1,), generator=gen))
        d = int(torch.randint(1, 9, (1,), generator=gen))
        W = 10 ** (2 * torch.rand(1, generator=gen, dtype=torch.float64) - 1) * torch.randn(
            K, d, generator=gen, dtype=torch.float64
        )
        h = torch.randn(10, d, generator=gen, dtype=torch.float64)
        y = torch.randint(0, K, (10,), generator=gen)
        g = feature_gradient(W, h, y)
        for size in (1e-4, 1e-2, 1.0, 10.0):
            for direction in (torch.randn(10, d, generator=gen, dtype=torch.float64), g):
                step = size * direction / direction.norm(dim=-1, keepdim=True)
                actual = loss_increase(W, h, y, step)
                bound = sound_bound(W, h, y, step.norm(dim=-1))
                positive_increase = actual > 0
                count += int(positive_increase.sum())
                worst = min(worst, float((bound[positive_increase] / actual[positive_increase]).min()))
    return worst, count


__all__ = [
    "RESPONSE_KEYS",
    "cross_entropy",
    "curvature_only_radius",
    "curvature_only_radius_fails",
    "feature_gradient",
    "loss_increase",
    "published_expression",
    "pool_responses",
    "published_radius",
    "raw_quadratic",
    "response_table",
    "responses_along_gradient",
    "row_diameter",
    "sound_bound",
    "sound_bound_on_random_instances",
    "sound_radius",
    "summarise_responses",
]

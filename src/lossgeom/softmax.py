"""The softmax gauge: common-row shifts of a linear classifier and the flatness proxies.

A classifier ``W`` (K x d) maps a feature ``h`` (d,) to probabilities
``p = softmax(W h)``. Adding one vector ``v`` to every row, ``W -> W + 1 v^T``, adds the
scalar ``v^T h`` to every logit and leaves ``p`` unchanged: a function-preserving
symmetry (the *gauge*). The chapter *The softmax gauge* (``chapters/ch07_softmax_gauge``)
derives:

- ``P(p) = Diag(p) - p p^T`` (:func:`covariance`), the covariance of the one-hot label and
  the softmax Jacobian; the cross-entropy Hessian in ``W`` is ``P(p) kron h h^T``;
- ``kappa_exact = ||h||^2 Tr(W^T P(p) W)`` (:func:`kappa_exact`), invariant under shifts;
- ``B_raw = ||W||_F^2 ||h||^2 (1 - ||p||^2)`` (:func:`b_raw`), an upper bound of
  ``kappa_exact`` that is *not* invariant and grows without bound along the orbit;
- ``B_quot`` (:func:`b_quot`), the same expression at the centred representative
  ``W_c = W - 1 wbar^T`` (:func:`centre`), which is the orbit minimum of ``B_raw``.

All functions take and return float64 torch tensors and are differentiable in ``W`` and
``h``. ``h`` may be one feature ``(d,)`` or a batch ``(n, d)``; with a batch,
``reduction="mean"`` averages over examples and ``reduction="none"`` returns ``(n,)``.
The proxies are those of Petzka et al. (2021), studied by Opazo et al. (seed 004).
"""
from __future__ import annotations

import numpy as np
import torch

from lossgeom._checks import finite_tensor, positive, positive_int
from lossgeom.symmetries import Params, Symmetry

_REDUCTIONS = ("mean", "none")


def _float64(name: str, value) -> torch.Tensor:
    value = finite_tensor(name, value)
    return value if value.dtype == torch.float64 else value.to(torch.float64)


def _classifier(W) -> torch.Tensor:
    if not isinstance(W, torch.Tensor):
        raise TypeError(f"W must be a torch.Tensor of shape (K, d), got {type(W).__name__}")
    if W.ndim != 2:
        raise ValueError(f"W must be 2-D of shape (K, d), got shape {tuple(W.shape)}")
    if W.shape[0] < 2:
        raise ValueError(f"W must have K >= 2 class rows, got K = {W.shape[0]}")
    if W.shape[1] < 1:
        raise ValueError(f"W must have at least one feature column, got shape {tuple(W.shape)}")
    return _float64("W", W)


def _features(h, d: int) -> torch.Tensor:
    if not isinstance(h, torch.Tensor):
        raise TypeError(f"h must be a torch.Tensor of shape (d,) or (n, d), got {type(h).__name__}")
    if h.ndim not in (1, 2) or h.shape[-1] != d:
        raise ValueError(f"h must have shape ({d},) or (n, {d}) to match W's d = {d}, got {tuple(h.shape)}")
    if h.ndim == 2 and h.shape[0] == 0:
        raise ValueError("h must hold at least one example")
    return _float64("h", h)


def _reduce(values: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if reduction == "mean" and values.ndim == 1:
        return values.mean()
    return values


def logits(W: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """The logits ``z = W h`` (shape (K,) or (n, K)), checked finite."""
    W = _classifier(W)
    h = _features(h, W.shape[1])
    z = h @ W.T
    if not torch.isfinite(z).all():
        raise ValueError("logits W h must be finite; W and h overflow float64")
    return z


def probabilities(W: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``p = softmax(W h)`` over the class axis (shape (K,) or (n, K))."""
    return torch.softmax(logits(W, h), dim=-1)


def covariance(p: torch.Tensor) -> torch.Tensor:
    """``P(p) = Diag(p) - p p^T``: the one-hot label's covariance and the softmax Jacobian.

    Derived in the chapter *The softmax gauge*.

    Args:
        p: probabilities of shape (K,) or a batch (n, K), K >= 2.

    Returns:
        (K, K) or (n, K, K). ``P(p) 1 = 0`` and ``Tr P(p) = 1 - ||p||^2``.
    """
    if not isinstance(p, torch.Tensor):
        raise TypeError(f"p must be a torch.Tensor of shape (K,) or (n, K), got {type(p).__name__}")
    if p.ndim not in (1, 2) or p.shape[-1] < 2:
        raise ValueError(f"p must have shape (K,) or (n, K) with K >= 2, got {tuple(p.shape)}")
    p = _float64("p", p)
    return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)


def centre(W: torch.Tensor) -> torch.Tensor:
    """``W_c = W - 1 wbar^T`` (``wbar`` the mean row): the orbit's minimum-norm point.

    The unique minimiser of ``||W + 1 v^T||_F`` over ``v`` (chapter *The softmax gauge*).
    """
    W = _classifier(W)
    return W - W.mean(dim=0, keepdim=True)


def mean_row(W: torch.Tensor) -> torch.Tensor:
    """The mean row ``wbar = W^T 1 / K`` (shape (d,)): the function-null part of ``W``."""
    return _classifier(W).mean(dim=0)


def mean_row_share(W: torch.Tensor) -> torch.Tensor:
    """``K ||wbar||^2 / ||W||_F^2``: the share of ``||W||_F^2`` that centring removes.

    Chapter *The softmax gauge*.

    ``||W||_F^2 = ||W_c||_F^2 + K ||wbar||^2`` (orthogonal split), so ``B_raw / B_quot =
    1 / (1 - share)`` for every feature.
    """
    W = _classifier(W)
    total = (W**2).sum()
    if total == 0:
        raise ValueError("W must be nonzero to have a mean-row share")
    return W.shape[0] * (W.mean(dim=0) ** 2).sum() / total


def common_row_shift(W: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The gauge transform ``G_v(W) = W + 1 v^T``: adds ``v`` to every row (*The softmax gauge*)."""
    W = _classifier(W)
    v = _shift_vector(v, W.shape[1])
    return W + v.unsqueeze(0)


def reference_class(W: torch.Tensor, r: int) -> torch.Tensor:
    """The reference-class representative ``W - 1 w_r^T``, whose row ``r`` is zero.

    Equal to ``W_c - 1 w_{c,r}^T``: same function, different ``||W||_F``
    (chapter *The softmax gauge*).
    """
    W = _classifier(W)
    if isinstance(r, bool) or not isinstance(r, int):
        raise TypeError(f"r must be an int class index, got {type(r).__name__}")
    K = W.shape[0]
    if not 0 <= r < K:
        raise ValueError(f"r must be a class index in 0..{K - 1}, got {r}")
    return W - W[r].unsqueeze(0)


def reference_ratio(W: torch.Tensor, r: int) -> torch.Tensor:
    """``B_raw(W^(r)) / B_quot(W_c) = 1 + K ||w_{c,r}||^2 / ||W_c||_F^2`` for any feature.

    The closed form of the reference-class ratio (chapter *The softmax gauge*); its mean
    over ``r`` is exactly 2.
    """
    Wc = centre(W)
    norm_c = (Wc**2).sum()
    if norm_c == 0:
        raise ValueError("W must not be a pure common-row matrix (its centred part is zero)")
    shifted = reference_class(Wc, r)
    return (shifted**2).sum() / norm_c


def shift_for_norm_factor(W: torch.Tensor, direction: torch.Tensor, factor: float) -> torch.Tensor:
    """The shift ``v = t u`` (``u`` the unit ``direction``, ``t >= 0``) with
    ``||W + 1 v^T||_F^2 = factor * ||W||_F^2``.

    ``||W + t 1 u^T||_F^2 = ||W||_F^2 + 2 t (1^T W u) + K t^2`` is quadratic in ``t``;
    this returns its nonnegative root. For a centred ``W`` the cross term vanishes and
    ``t = sqrt((factor - 1) ||W||_F^2 / K)``, so ``B_raw`` of the shifted classifier is
    ``factor`` times ``B_quot`` while ``p``, ``B_quot`` and ``kappa_exact`` do not move.
    Used in the chapters *The softmax gauge*, *Certificates* and *Regulariser updates*.
    """
    W = _classifier(W)
    u = _shift_vector(direction, W.shape[1])
    if float(u.norm()) == 0.0:
        raise ValueError("direction must be a nonzero vector")
    factor = positive("factor", factor)
    if factor < 1:
        raise ValueError(f"factor must be >= 1 so that a shift along a ray reaches it, got {factor}")
    u = u / u.norm()
    K, cross, norm_sq = W.shape[0], float(W.sum(0) @ u), float((W**2).sum())
    t = (-cross + (cross**2 + K * (factor - 1) * norm_sq) ** 0.5) / K
    return t * u


def _shift_vector(v, d: int) -> torch.Tensor:
    if not isinstance(v, torch.Tensor):
        raise TypeError(f"v must be a torch.Tensor of shape ({d},), got {type(v).__name__}")
    if v.shape != (d,):
        raise ValueError(f"v must have shape ({d},) to match W's d = {d}, got {tuple(v.shape)}")
    return _float64("v", v)


def _norm_sq(h: torch.Tensor) -> torch.Tensor:
    return (h**2).sum(dim=-1)


def _trace_cov(p: torch.Tensor) -> torch.Tensor:
    return 1.0 - (p**2).sum(dim=-1)


def _prepare(W, h) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    W = _classifier(W)
    h = _features(h, W.shape[1])
    return W, h, probabilities(W, h)


def kappa_exact(W: torch.Tensor, h: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """``kappa_exact = ||h||^2 Tr(W^T P(p) W)``, the last-layer relative flatness.

    Chapter *The softmax gauge*; :func:`kappa_exact_by_trace` is the dense reference.

    Computed as ``||h||^2 sum_k p_k ||w_k - W^T p||^2``, i.e. ``||h||^2`` times the
    variance of the row ``w_C`` under ``C ~ Cat(p)`` (no cancellation), on the centred
    ``W_c`` (``P = Pi P Pi``); invariant under common-row shifts.
    """
    W, h, p = _prepare(W, h)
    Wc = centre(W)
    spread = Wc - (p @ Wc).unsqueeze(-2)
    variance = (p * (spread**2).sum(dim=-1)).sum(dim=-1)
    return _reduce(_norm_sq(h) * variance, reduction)


def b_raw(W: torch.Tensor, h: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """``B_raw = ||W||_F^2 ||h||^2 (1 - ||p||^2)``, the operational proxy (*The softmax gauge*)."""
    W, h, p = _prepare(W, h)
    return _reduce((W**2).sum() * _norm_sq(h) * _trace_cov(p), reduction)


def b_quot(W: torch.Tensor, h: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """``B_quot = ||W_c||_F^2 ||h||^2 (1 - ||p||^2)``: ``B_raw`` at the centred representative.

    Equal to ``inf_v B_raw(W + 1 v^T, h)`` and invariant under common-row shifts.
    """
    W, h, p = _prepare(W, h)
    return _reduce((centre(W) ** 2).sum() * _norm_sq(h) * _trace_cov(p), reduction)


def kappa_exact_by_trace(W: torch.Tensor, h: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Dense reference for :func:`kappa_exact`: ``||h||^2 Tr(W^T P(p) W)`` with ``P(p)`` built.

    Forms the ``K x K`` matrix :func:`covariance` of every example and takes the trace
    literally, as written in the chapter *The softmax gauge*; use it to test
    :func:`kappa_exact`, which computes the same number as a variance.
    """
    W, h, p = _prepare(W, h)
    traces = torch.einsum("ki,...kl,li->...", W, covariance(p), W)
    return _reduce(_norm_sq(h) * traces, reduction)


def raw_quotient_ratio(W: torch.Tensor) -> torch.Tensor:
    """``B_raw / B_quot = ||W||_F^2 / ||W_c||_F^2 = 1 / (1 - share)``, the same for every feature.

    The factor ``||h||^2 (1 - ||p||^2)`` is common to both proxies, so their ratio depends
    on ``W`` alone (chapter *The softmax gauge*).

    Raises:
        ValueError: if ``W`` is a pure common-row matrix (``W_c = 0``).
    """
    W = _classifier(W)
    centred = (centre(W) ** 2).sum()
    if centred == 0:
        raise ValueError("W must not be a pure common-row matrix (its centred part is zero)")
    return (W**2).sum() / centred


def initial_ratio_quantiles(K: int, d: int, quantiles) -> np.ndarray:
    """Quantiles of ``||W||_F^2 / ||W_c||_F^2`` for ``W`` (K x d) with i.i.d. N(0, s^2) entries.

    The centring projector splits each column orthogonally, so ``K ||wbar||^2 / s^2`` and
    ``||W_c||_F^2 / s^2`` are independent chi-square variables with ``d`` and ``(K - 1) d``
    degrees of freedom, and the ratio is ``1 + F / (K - 1)`` with ``F ~ F(d, (K - 1) d)``
    (chapter *The softmax gauge*). Its mean is ``1 + d / ((K - 1) d - 2)``, close to
    ``K / (K - 1)``, and its spread shrinks like ``sqrt(2 / d) / (K - 1)``. For PyTorch's
    uniform initialisation the law holds approximately (the mean row is a mean of ``K``
    entries); the chapter compares it with seeded draws.

    Args:
        K: number of classes, >= 2.
        d: feature width, >= 1 (``(K - 1) d > 2`` for a finite mean).
        quantiles: probabilities in (0, 1).

    Returns:
        The quantiles as a float64 array of the shape of ``quantiles``.
    """
    from scipy import stats

    K, d = positive_int("K", K), positive_int("d", d)
    if K < 2:
        raise ValueError(f"K must be >= 2 classes, got {K}")
    q = np.asarray(quantiles, dtype=np.float64)
    if q.size == 0 or not np.all((q > 0) & (q < 1)):
        raise ValueError(f"quantiles must be probabilities in (0, 1), got {quantiles!r}")
    return 1.0 + stats.f(d, (K - 1) * d).ppf(q) / (K - 1)


def reference_class_ratios(W: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``B_raw(W^(r), h) / B_quot(W_c, h)`` for every reference class ``r`` (shape (K,)).

    Evaluated through the proxies themselves (means over ``h``), with
    ``W^(r) = W_c - 1 w_{c,r}^T``; :func:`reference_ratio` is the closed form
    ``1 + K ||w_{c,r}||^2 / ||W_c||_F^2`` and the mean over ``r`` is exactly 2
    (chapter *The softmax gauge*).
    """
    W = _classifier(W)
    Wc = centre(W)
    base = b_quot(Wc, h)
    return torch.stack([b_raw(reference_class(Wc, r), h) for r in range(W.shape[0])]) / base


def quotient_looseness(W: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``B_quot(W, h) / kappa_exact(W, h)``: how loose the quotient bound is (>= 1).

    With a batch ``h`` this is the ratio of the two means. At uniform probabilities it is
    exactly ``K - 1``; in general see :func:`pair_distance_ratio` (chapter
    *The softmax gauge*).
    """
    exact = kappa_exact(W, h)
    if not bool(torch.all(exact > 0)):
        raise ValueError("kappa_exact must be > 0 (h nonzero and W_c nonzero) for the looseness to exist")
    return b_quot(W, h) / exact


def pair_distance_ratio(W: torch.Tensor, h: torch.Tensor, reduction: str = "none") -> torch.Tensor:
    """Mean of ``||w_i - w_j||^2`` over all class pairs over its ``p``-weighted mean.

    With ``D_ij = ||w_i - w_j||^2``, ``sum_ij p_i p_j D_ij = 2 Var_p(w_C)`` and
    ``sum_ij D_ij = 2 K ||W_c||_F^2``, so for one example

        ``B_quot / kappa_exact = (K - 1) * mean_{i != j} D_ij / (sum_ij p_i p_j D_ij / (1 - ||p||^2))``,

    i.e. ``(K - 1)`` times this ratio (chapter *The softmax gauge*). It is 1 at uniform
    ``p`` and exceeds 1 when the classes an example hesitates between have closer rows
    than an average pair. Computed from the pairwise distances, independently of
    :func:`b_quot` and :func:`kappa_exact`.

    Raises:
        ValueError: if an example's ``p`` puts all mass on one class, or all rows coincide.
    """
    W, h, p = _prepare(W, h)
    K = W.shape[0]
    distances = torch.cdist(W, W) ** 2
    all_pairs = distances.sum() / (K * (K - 1))
    if all_pairs == 0:
        raise ValueError("W must have at least two different rows")
    hesitation = _trace_cov(p)
    if not bool(torch.all(hesitation > 0)):
        raise ValueError("p must not put all its mass on one class (1 - ||p||^2 = 0)")
    weighted = torch.einsum("...i,ij,...j->...", p, distances, p) / hesitation
    return _reduce(all_pairs / weighted, reduction)


def invariance_gaps(proxy, W: torch.Tensor, W_other: torch.Tensor, h: torch.Tensor) -> tuple[float, float]:
    """Relative change of ``proxy(W, h)`` and of its gradient in ``W`` between two classifiers.

    Returns ``(|proxy(W') / proxy(W) - 1|, ||grad(W') - grad(W)|| / ||grad(W)||)``, the
    gradients by ``torch.func.grad``. For ``W' = W + 1 v^T`` both are zero in exact
    arithmetic when ``proxy`` is gauge invariant (:func:`kappa_exact`, :func:`b_quot`)
    and not for :func:`b_raw` (chapter *The softmax gauge*). The two classifiers must be
    the same predictor on ``h`` (checked with :func:`max_probability_gap`, tolerance 1e-9).
    """
    if not callable(proxy):
        raise TypeError(f"proxy must be a function proxy(W, h) -> scalar tensor, got {type(proxy).__name__}")
    W, W_other = _classifier(W), _classifier(W_other)
    h = _features(h, W.shape[1])
    max_probability_gap(W, W_other, h, tol=1e-9)
    value, value_other = float(proxy(W, h)), float(proxy(W_other, h))
    if value == 0:
        raise ValueError("proxy(W, h) must be nonzero for a relative change")
    gradient = torch.func.grad(lambda w: proxy(w, h))
    grad, grad_other = gradient(W), gradient(W_other)
    grad_norm = float(grad.norm())
    if grad_norm == 0:
        raise ValueError("the gradient of proxy at W must be nonzero for a relative change")
    return abs(value_other / value - 1), float((grad_other - grad).norm()) / grad_norm


def orbit_minimum(W: torch.Tensor, h: torch.Tensor, gtol: float = 1e-10) -> tuple[float, torch.Tensor]:
    """``min_v B_raw(W + 1 v^T, h)`` found numerically, and the minimising shift ``v``.

    scipy's BFGS (``scipy.optimize.minimize``) over the ``d`` shift coordinates from
    ``v = 0``, with gradients by torch autograd. The chapter *The softmax gauge* proves the
    minimum is :func:`b_quot` at ``v = -wbar``; this is the independent numerical check.

    Returns:
        ``(minimum, v)``: the smallest ``B_raw`` found (mean over ``h``) and its shift.

    Raises:
        RuntimeError: if BFGS reports failure.
    """
    from scipy.optimize import minimize

    W = _classifier(W)
    h = _features(h, W.shape[1])
    gtol = positive("gtol", gtol)

    def value_and_gradient(v):
        v = torch.from_numpy(v).requires_grad_(True)
        value = b_raw(common_row_shift(W, v), h)
        return float(value.detach()), torch.autograd.grad(value, v)[0].numpy()

    result = minimize(value_and_gradient, np.zeros(W.shape[1]), jac=True, method="BFGS", options={"gtol": gtol})
    if not result.success:
        raise RuntimeError(f"BFGS did not converge: {result.message}")
    return float(result.fun), torch.from_numpy(result.x)


def max_probability_gap(W: torch.Tensor, W_other: torch.Tensor, h: torch.Tensor, tol: float) -> float:
    """Largest ``|p(W) - p(W_other)|`` on features ``h``; raises if it exceeds ``tol`` (> 0).

    The functional check behind a gauge comparison: two classifiers are compared as
    representatives of one predictor only if their probabilities agree to ``tol``.
    """
    tol = positive("tol", tol)
    W, W_other = _classifier(W), _classifier(W_other)
    if W.shape != W_other.shape:
        raise ValueError(f"W and W_other must have the same shape, got {tuple(W.shape)} and {tuple(W_other.shape)}")
    with torch.no_grad():
        gap = float((probabilities(W, h) - probabilities(W_other, h)).abs().max())
    if gap > tol:
        raise ValueError(f"W and W_other are not the same predictor on h: probability gap {gap:.3g} exceeds tol {tol:.3g}")
    return gap


def row_shift_symmetry(v: torch.Tensor, name: str = "weight") -> Symmetry:
    """The common-row shift as a :class:`~lossgeom.symmetries.Symmetry` on ``params[name]``.

    Args:
        v: the shift vector, shape (d,) where ``params[name]`` is the (K, d) classifier.
        name: the parameter-dict key holding ``W`` (e.g. ``"2.weight"`` for an MLP's
            last layer). Only that entry changes; a bias of the same layer is unaffected.

    Returns:
        A symmetry for :func:`lossgeom.symmetries.audit_symmetry`.
    """
    if not isinstance(name, str) or not name:
        raise TypeError("name must be a non-empty parameter name")
    if not isinstance(v, torch.Tensor) or v.ndim != 1:
        raise ValueError(f"v must be a 1-D torch.Tensor of shape (d,), got "
                         f"{tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__}")
    v = _float64("v", v)

    def transform(params: Params) -> dict[str, torch.Tensor]:
        if name not in params:
            raise ValueError(f"row_shift_symmetry needs params[{name!r}] (the classifier W); got {sorted(params)}")
        out = dict(params)
        out[name] = common_row_shift(params[name], v)
        return out

    return Symmetry(f"common-row shift W -> W + 1 v^T on {name!r}, |v| = {float(v.norm()):.4g}", transform)


# --- small softmax classifiers for the chapters' experiments (softmax gauge, certificates) ---


def init_classifier(sizes, seed: int = 0, init_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """Seeded parameters of a ReLU MLP whose last layer is a bias-free classifier ``W``.

    Args:
        sizes: widths ``[input, hidden..., K]``; ``[d, K]`` is the linear softmax model
            (its feature ``h`` is the input itself).
        seed: seed of the generator that draws the weights.
        init_scale: multiplies PyTorch's default uniform initialisation
            ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` of every weight and bias.

    Returns:
        ``{"hidden.i.weight", "hidden.i.bias", ..., "weight"}``; ``"weight"`` is ``W``
        (K x d) with no bias, so the common-row shift acts on it alone.
    """
    sizes = [int(s) for s in sizes]
    if len(sizes) < 2 or min(sizes) < 1 or sizes[-1] < 2:
        raise ValueError(f"sizes must list >= 2 positive widths ending in K >= 2 classes, got {sizes}")
    init_scale = positive("init_scale", init_scale)
    gen = torch.Generator().manual_seed(int(seed))
    params: dict[str, torch.Tensor] = {}

    def uniform(shape, fan_in):
        bound = init_scale / fan_in**0.5
        return (2 * torch.rand(shape, generator=gen, dtype=torch.float64) - 1) * bound

    for i, (n_in, n_out) in enumerate(zip(sizes[:-2], sizes[1:-1])):
        params[f"hidden.{i}.weight"] = uniform((n_out, n_in), n_in)
        params[f"hidden.{i}.bias"] = uniform((n_out,), n_in)
    params["weight"] = uniform((sizes[-1], sizes[-2]), sizes[-2])
    return params


def classifier_features(params: Params, x: torch.Tensor) -> torch.Tensor:
    """The last-layer features ``h`` of :func:`init_classifier`'s model (ReLU hidden layers)."""
    if "weight" not in params:
        raise ValueError("params must hold the classifier under 'weight' (see init_classifier)")
    h = finite_tensor("x", x)
    i = 0
    while f"hidden.{i}.weight" in params:
        h = torch.relu(h @ params[f"hidden.{i}.weight"].T + params[f"hidden.{i}.bias"])
        i += 1
    if h.shape[-1] != params["weight"].shape[1]:
        raise ValueError(f"x gives features of width {h.shape[-1]} but W expects {params['weight'].shape[1]}")
    return h


def classifier_logits(params: Params, x: torch.Tensor) -> torch.Tensor:
    """Logits ``W h(x)`` of :func:`init_classifier`'s model."""
    return classifier_features(params, x) @ params["weight"].T


def train_classifier(params: Params, x: torch.Tensor, y: torch.Tensor, *, steps: int, lr: float,
                     momentum: float = 0.9, weight_decay: float = 0.0, optimizer: str = "sgd",
                     record_every: int = 0, record=None) -> tuple[dict[str, torch.Tensor], list]:
    """Full-batch training of the mean cross-entropy; returns trained params and a history.

    ``optimizer="sgd"`` is heavy-ball SGD with coupled L2 weight decay (``torch.optim.SGD``);
    ``"adam"`` is ``torch.optim.Adam`` with the same coupled decay. Every ``record_every``
    steps (and at step 0 and the end) ``record(step, params)`` is appended to the history.
    """
    steps = int(steps)
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    lr = positive("lr", lr)
    if optimizer not in ("sgd", "adam"):
        raise ValueError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    if optimizer == "sgd":
        opt = torch.optim.SGD(leaves.values(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    else:
        opt = torch.optim.Adam(leaves.values(), lr=lr, weight_decay=weight_decay)
    history = []

    def snapshot(step):
        if record is not None and record_every and (step % record_every == 0 or step == steps):
            with torch.no_grad():
                history.append(record(step, {k: v.detach() for k, v in leaves.items()}))

    snapshot(0)
    for step in range(1, steps + 1):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(classifier_logits(leaves, x), y).backward()
        opt.step()
        snapshot(step)
    return {k: v.detach().clone() for k, v in leaves.items()}, history

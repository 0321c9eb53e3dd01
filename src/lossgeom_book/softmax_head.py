"""The softmax gauge's proxies at work: orbit minima, reference classes, looseness, gaps.

The book's measurements of the three last-layer measures of
:mod:`lossgeom.flatness.softmax_head` (``kappa_exact <= B_quot <= B_raw``) on a
classifier ``W`` (K x d) with features ``h`` and ``p = softmax(W h)`` (chapter 8, *The
softmax gauge*, and its sub-page *Reproducing the source's numbers*):

- :func:`kappa_exact_by_trace`: the dense reference of ``kappa_exact``;
- :func:`orbit_minimum`: ``min_v B_raw(W + 1 v^T, h)`` found by BFGS (it is ``B_quot``);
- how far ``B_raw`` sits above ``B_quot``: :func:`raw_quotient_ratio`,
  :func:`reference_ratio`, :func:`reference_class_ratios`, :func:`initial_ratio_quantiles`;
- how far ``B_quot`` sits above ``kappa_exact``: :func:`quotient_looseness`,
  :func:`pair_distance_ratio`;
- whether a measure, and its gradient, move along the orbit: :func:`invariance_gaps`.

All functions take and return float64 torch tensors; ``h`` may be one feature ``(d,)`` or a
batch ``(n, d)``. Citation keys refer to the book's ``references.bib``.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats
from scipy.optimize import minimize

from lossgeom.flatness import b_quot, b_raw, kappa_exact
from lossgeom.flatness.softmax_gauge import centre, common_row_shift, covariance, max_probability_gap, probabilities
from lossgeom.symmetries.layers import reference_class
from lossgeom_book.checks import classifier as _classifier
from lossgeom_book.checks import features as _features
from lossgeom_book.checks import positive, positive_int

_REDUCTIONS = ("mean", "none")


def _reduce(values: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if reduction == "mean" and values.ndim == 1:
        return values.mean()
    return values


def _norm_sq(h: torch.Tensor) -> torch.Tensor:
    return (h**2).sum(dim=-1)


def _trace_cov(p: torch.Tensor) -> torch.Tensor:
    return 1.0 - (p**2).sum(dim=-1)


def _prepare(W, h) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    W = _classifier(W)
    h = _features(h, W.shape[1])
    return W, h, probabilities(W, h)


def kappa_exact_by_trace(W: torch.Tensor, h: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Dense reference for :func:`kappa_exact`: ``||h||^2 Tr(W^T P(p) W)`` with ``P(p)`` built.

    Forms the ``K x K`` matrix :func:`lossgeom.flatness.softmax_gauge.covariance` of every example and
    takes the trace literally, as written in the chapter *The softmax gauge*
    (``petzka2021relative``); use it to test :func:`kappa_exact`, which computes the same
    number as a variance.

    Args:
        W: the classifier, shape (K, d). h: one feature (d,) or a batch (n, d).
        reduction: ``"mean"`` or ``"none"``.

    Returns:
        A scalar tensor, or (n,) with ``reduction="none"``.
    """
    W, h, p = _prepare(W, h)
    traces = torch.einsum("ki,...kl,li->...", W, covariance(p), W)
    return _reduce(_norm_sq(h) * traces, reduction)


def orbit_minimum(W: torch.Tensor, h: torch.Tensor, gtol: float = 1e-10) -> tuple[float, torch.Tensor]:
    """``min_v B_raw(W + 1 v^T, h)`` found numerically, and the minimising shift ``v``.

    scipy's BFGS (``scipy.optimize.minimize``) over the ``d`` shift coordinates from
    ``v = 0``, with gradients by torch autograd. The chapter *The softmax gauge* proves the
    minimum is :func:`b_quot` at ``v = -wbar`` (``opazo2026flatness``); this is the
    independent numerical check.

    Args:
        W: the classifier, shape (K, d), K >= 2.
        h: one feature (d,) or a batch (n, d).
        gtol: BFGS's gradient-norm tolerance (positive).

    Returns:
        ``(minimum, v)``: the smallest ``B_raw`` found (mean over ``h``) and its shift.

    Raises:
        RuntimeError: if BFGS reports failure.
    """
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


# ----------------------------------------------------------------- how far B_raw sits above B_quot


def raw_quotient_ratio(W: torch.Tensor) -> torch.Tensor:
    """``B_raw / B_quot = ||W||_F^2 / ||W_c||_F^2 = 1 / (1 - share)``, the same for every feature.

    The factor ``||h||^2 (1 - ||p||^2)`` is common to both proxies, so their ratio depends
    on ``W`` alone; ``share`` is :func:`lossgeom.flatness.softmax_gauge.mean_row_share` (chapter
    *The softmax gauge*, after ``opazo2026flatness``).

    Args:
        W: the classifier, shape (K, d), K >= 2.

    Returns:
        ``||W||_F^2 / ||W_c||_F^2`` (>= 1), a scalar tensor.

    Raises:
        ValueError: if ``W`` is a pure common-row matrix (``W_c = 0``).
    """
    W = _classifier(W)
    centred = (centre(W) ** 2).sum()
    if centred == 0:
        raise ValueError("W must not be a pure common-row matrix (its centred part is zero)")
    return (W**2).sum() / centred


def reference_ratio(W: torch.Tensor, r: int) -> torch.Tensor:
    """``B_raw(W^(r)) / B_quot(W_c) = 1 + K ||w_{c,r}||^2 / ||W_c||_F^2`` for any feature.

    The closed form of the reference-class ratio, ``W^(r) = W_c - 1 w_{c,r}^T`` the
    representative whose row ``r`` is zero (chapter *The softmax gauge*,
    ``opazo2026flatness``); its mean over ``r`` is exactly 2.

    Args:
        W: the classifier, shape (K, d), K >= 2.
        r: the reference class, an int in ``0..K-1``.

    Returns:
        ``||W^(r)||_F^2 / ||W_c||_F^2``, a scalar tensor.

    Raises:
        ValueError: if ``W`` is a pure common-row matrix (``W_c = 0``) or ``r`` is out of range.
    """
    Wc = centre(W)
    norm_c = (Wc**2).sum()
    if norm_c == 0:
        raise ValueError("W must not be a pure common-row matrix (its centred part is zero)")
    shifted = reference_class(Wc, r)
    return (shifted**2).sum() / norm_c


def reference_class_ratios(W: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``B_raw(W^(r), h) / B_quot(W_c, h)`` for every reference class ``r`` (shape (K,)).

    Evaluated through the proxies themselves (means over ``h``), with
    ``W^(r) = W_c - 1 w_{c,r}^T``; :func:`reference_ratio` is the closed form
    ``1 + K ||w_{c,r}||^2 / ||W_c||_F^2`` and the mean over ``r`` is exactly 2
    (chapter *The softmax gauge*, ``opazo2026flatness``).

    Args:
        W: the classifier, shape (K, d), K >= 2.
        h: one feature (d,) or a batch (n, d).

    Returns:
        the K ratios, a tensor of shape (K,).
    """
    W = _classifier(W)
    Wc = centre(W)
    base = b_quot(Wc, h)
    return torch.stack([b_raw(reference_class(Wc, r), h) for r in range(W.shape[0])]) / base


def initial_ratio_quantiles(K: int, d: int, quantiles) -> np.ndarray:
    """Quantiles of ``B_raw / B_quot = ||W||_F^2 / ||W_c||_F^2`` for ``W`` (K x d) with i.i.d. N(0, s^2) entries.

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
    K, d = positive_int("K", K), positive_int("d", d)
    if K < 2:
        raise ValueError(f"K must be >= 2 classes, got {K}")
    q = np.asarray(quantiles, dtype=np.float64)
    if q.size == 0 or not np.all((q > 0) & (q < 1)):
        raise ValueError(f"quantiles must be probabilities in (0, 1), got {quantiles!r}")
    return 1.0 + stats.f(d, (K - 1) * d).ppf(q) / (K - 1)


# ----------------------------------------------------------------- how far B_quot sits above kappa_exact


def quotient_looseness(W: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``B_quot(W, h) / kappa_exact(W, h)``: how loose the quotient bound is (>= 1).

    With a batch ``h`` this is the ratio of the two means. At uniform probabilities it is
    exactly ``K - 1``; in general see :func:`pair_distance_ratio` (chapter
    *The softmax gauge*; the measures of ``opazo2026flatness`` and ``petzka2021relative``).

    Args:
        W: the classifier, shape (K, d), K >= 2.
        h: one feature (d,) or a batch (n, d).

    Returns:
        ``B_quot / kappa_exact`` (of the means over ``h``), a scalar tensor.

    Raises:
        ValueError: if ``kappa_exact`` is not > 0 (``h = 0`` or ``W_c = 0``).
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

    Args:
        W: the classifier, shape (K, d), K >= 2.
        h: one feature (d,) or a batch (n, d).
        reduction: ``"none"`` (one ratio per example) or ``"mean"`` over the batch.

    Returns:
        ``mean_{i != j} D_ij / (sum_ij p_i p_j D_ij / (1 - ||p||^2))``: a scalar tensor for one
        feature or ``reduction="mean"``, else (n,).

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


# ----------------------------------------------------------------- does a measure move along the orbit


def invariance_gaps(proxy, W: torch.Tensor, W_other: torch.Tensor, h: torch.Tensor) -> tuple[float, float]:
    """Relative change of ``proxy(W, h)`` and of its gradient in ``W`` between two classifiers.

    Returns ``(|proxy(W') / proxy(W) - 1|, ||grad(W') - grad(W)|| / ||grad(W)||)``, the
    gradients by ``torch.func.grad``. For ``W' = W + 1 v^T`` both are zero in exact
    arithmetic when ``proxy`` is gauge invariant (:func:`kappa_exact`, :func:`b_quot`)
    and not for :func:`b_raw` (chapter *The softmax gauge*). The two classifiers must be
    the same predictor on ``h`` (checked with :func:`lossgeom.flatness.softmax_gauge.max_probability_gap`,
    tolerance 1e-9).

    Args:
        proxy: a measure ``proxy(W, h) -> scalar tensor``, differentiable in ``W``.
        W: the classifier, shape (K, d), K >= 2.
        W_other: another classifier of the same shape, the same predictor on ``h``.
        h: one feature (d,) or a batch (n, d).

    Returns:
        ``(value_gap, gradient_gap)``: the relative changes of ``proxy`` and of its gradient, floats.

    Raises:
        ValueError: if the probabilities of ``W`` and ``W_other`` differ by more than 1e-9, or
            ``proxy(W, h)`` or its gradient at ``W`` is zero.
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

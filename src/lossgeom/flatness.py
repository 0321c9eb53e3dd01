"""Flatness measures, organised by measure: what each computes, where it is derived, whom it follows.

Every measure here is a number read off a trained model that claims to say how flat its
minimum is. The operations that move a model along its symmetry orbit (centring, mean
rows, common-row shifts, the covariance ``P(p) = Diag(p) - p p^T``) live in
:mod:`lossgeom.softmax`; this module only measures.

Last-layer relative flatness of a softmax classifier
    A classifier ``W`` (K x d) on features ``h`` with ``p = softmax(W h)``; the chapter
    *The softmax gauge* derives all three measures and their order
    ``kappa_exact <= B_quot <= B_raw``:

    - :func:`kappa_exact`: ``||h||^2 Tr(W^T P(p) W)``, the relative flatness of
      ``petzka2021relative`` restricted to the last layer; invariant under
      ``W -> W + 1 v^T``. :func:`kappa_exact_by_trace` is its dense reference.
    - :func:`b_raw`: ``||W||_F^2 ||h||^2 (1 - ||p||^2)``, the operational upper bound used
      for certificates (``walter2026flatness``) and as a regulariser (``han2025flatness``);
      not invariant, unbounded along the orbit.
    - :func:`b_quot`: ``||W_c||_F^2 ||h||^2 (1 - ||p||^2)``, ``B_raw`` at the centred
      representative, its orbit minimum (``opazo2026flatness``; checked numerically by
      :func:`orbit_minimum`).

    Relatives, each a ratio or a gap of the three: :func:`raw_quotient_ratio`,
    :func:`reference_ratio`, :func:`reference_class_ratios`,
    :func:`initial_ratio_quantiles` (how far ``B_raw`` sits above ``B_quot``),
    :func:`quotient_looseness` and :func:`pair_distance_ratio` (how far ``B_quot`` sits
    above ``kappa_exact``), and :func:`invariance_gaps` (does a measure, and its gradient,
    move along the orbit).

Quotient flatness of two-layer ReLU networks
    ``F(x) = sum_r a_r ReLU(w_r^T x)`` with the square loss ``L``; the chapter
    *Quotient flatness* derives both measures on the coordinates of
    :mod:`lossgeom.quotient`:

    - :func:`quotient_flatness`: ``Flat^Q``, the trace of the Riemannian Hessian of ``L``
      on the quotient by the rescalings ``(a_r / c_r, c_r w_r)`` (``miyagawa2026symmetry``),
      in closed form; :func:`quotient_flatness_autograd` is its autograd reference.
    - :func:`raw_hessian_trace`: the Euclidean Hessian trace in ``(a, W)``, which moves
      along the orbit as ``sum_r (c_r^2 P_r + Q_r / c_r^2)`` (``dinh2017sharp``).

Spectral bounds and Fisher-geometric sharpness
    Measures of a curvature matrix; the chapter *Flatness in high dimensions, and other
    measures* derives them:

    - :func:`wolkowicz_styan_bound`: for a real symmetric ``n x n`` matrix ``A`` with
      ``m = tr(A) / n`` and ``s^2 = tr(A^2) / n - m^2``, ``lambda_max(A) <= m + s sqrt(n - 1)``
      (``wolkowicz1980bounds``); also from the two traces alone
      (:func:`wolkowicz_styan_from_traces`), its gradient in ``A``
      (:func:`wolkowicz_styan_gradient`) and, through the Hessian, in the parameters
      (:func:`hessian_wolkowicz_styan`).
    - :func:`fisher_riemannian_sharpness`: the largest eigenvalue of the Hessian in the
      Fisher metric, ``sup_v v^T H v / v^T F v`` over directions the Fisher sees, and
      :func:`diagonal_fisher_sharpness`, the same with a diagonal estimate of ``F``;
      :func:`hessian_sharpness` is the Euclidean ``lambda_max``.

Module-first measures of the symmetry audit atlas
    The atlas appendix (:mod:`lossgeom.atlas`) measures each of these on a
    ``torch.nn.Module``, a loss module and data (or one :class:`LossPoint`, which keeps the
    dense curvature they share): :func:`lambda_max`, :func:`hessian_trace`,
    :func:`keskar_sharpness`, :func:`sam_sharpness`, :func:`adaptive_sharpness`,
    :func:`fisher_rao_norm`, :func:`relative_flatness`, :func:`classifier_kappa_exact`,
    :func:`classifier_b_raw`, :func:`classifier_b_quot`, :func:`model_quotient_flatness`,
    :func:`riemannian_sharpness` and :func:`wolkowicz_styan`.

All functions take and return float64 torch tensors. The softmax measures are
differentiable in ``W`` and ``h``; ``h`` may be one feature ``(d,)`` or a batch ``(n, d)``;
with a batch, ``reduction="mean"`` averages over examples and ``reduction="none"`` returns
``(n,)``.
Citation keys refer to the book's ``references.bib``.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from lossgeom._validation import finite_tensor, positive, positive_int
from lossgeom.curvature import flatten_params
from lossgeom.quotient import _checked, _inputs, quotient_coordinates, regression_loss, relu_network
from lossgeom.softmax import (
    _classifier,
    _features,
    centre,
    common_row_shift,
    covariance,
    max_probability_gap,
    probabilities,
    reference_class,
)
from lossgeom.types import Params

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


# ----------------------------------------------------------------- last-layer relative flatness


def kappa_exact(W: torch.Tensor, h: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """The last-layer relative flatness ``kappa_exact = ||h||^2 Tr(W^T P(p) W)``.

    The trace of the cross-entropy Hessian in ``W`` (``P(p) kron h h^T``) contracted with
    ``W``, after ``petzka2021relative``; derived in the chapter *The softmax gauge*.
    Computed as ``||h||^2 sum_k p_k ||w_k - W^T p||^2``, i.e. ``||h||^2`` times the
    variance of the row ``w_C`` under ``C ~ Cat(p)`` (no cancellation), on the centred
    ``W_c`` (``P = Pi P Pi``); invariant under common-row shifts.
    :func:`kappa_exact_by_trace` is the dense reference.

    Args:
        W: the classifier, shape (K, d), K >= 2.
        h: one feature (d,) or a batch (n, d).
        reduction: ``"mean"`` over the batch or ``"none"``.

    Returns:
        A scalar tensor, or (n,) with ``reduction="none"``.
    """
    W, h, p = _prepare(W, h)
    Wc = centre(W)
    spread = Wc - (p @ Wc).unsqueeze(-2)
    variance = (p * (spread**2).sum(dim=-1)).sum(dim=-1)
    return _reduce(_norm_sq(h) * variance, reduction)


def kappa_exact_by_trace(W: torch.Tensor, h: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Dense reference for :func:`kappa_exact`: ``||h||^2 Tr(W^T P(p) W)`` with ``P(p)`` built.

    Forms the ``K x K`` matrix :func:`lossgeom.softmax.covariance` of every example and
    takes the trace literally, as written in the chapter *The softmax gauge*
    (``petzka2021relative``); use it to test :func:`kappa_exact`, which computes the same
    number as a variance.

    Args:
        W: the classifier, shape (K, d). h: one feature (d,) or a batch (n, d).
        reduction: ``"mean"`` or ``"none"``.
    """
    W, h, p = _prepare(W, h)
    traces = torch.einsum("ki,...kl,li->...", W, covariance(p), W)
    return _reduce(_norm_sq(h) * traces, reduction)


def b_raw(W: torch.Tensor, h: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """The operational proxy ``B_raw = ||W||_F^2 ||h||^2 (1 - ||p||^2)``.

    An upper bound of :func:`kappa_exact` (``Tr(W^T P W) <= ||W||_F^2 Tr P``), used for
    curvature certificates (``walter2026flatness``) and as a flatness regulariser
    (``han2025flatness``). Not invariant under common-row shifts: it grows without bound
    along the orbit (chapter *The softmax gauge*).

    Args:
        W: the classifier, shape (K, d). h: one feature (d,) or a batch (n, d).
        reduction: ``"mean"`` or ``"none"``.
    """
    W, h, p = _prepare(W, h)
    return _reduce((W**2).sum() * _norm_sq(h) * _trace_cov(p), reduction)


def b_quot(W: torch.Tensor, h: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """The quotient proxy ``B_quot = ||W_c||_F^2 ||h||^2 (1 - ||p||^2)``: ``B_raw`` at ``W_c``.

    Equal to ``inf_v B_raw(W + 1 v^T, h)`` (the orbit minimum, ``opazo2026flatness``;
    :func:`orbit_minimum` checks it numerically) and invariant under common-row shifts;
    ``kappa_exact <= B_quot`` (chapter *The softmax gauge*).

    Args:
        W: the classifier, shape (K, d). h: one feature (d,) or a batch (n, d).
        reduction: ``"mean"`` or ``"none"``.
    """
    W, h, p = _prepare(W, h)
    return _reduce((centre(W) ** 2).sum() * _norm_sq(h) * _trace_cov(p), reduction)


def orbit_minimum(W: torch.Tensor, h: torch.Tensor, gtol: float = 1e-10) -> tuple[float, torch.Tensor]:
    """``min_v B_raw(W + 1 v^T, h)`` found numerically, and the minimising shift ``v``.

    scipy's BFGS (``scipy.optimize.minimize``) over the ``d`` shift coordinates from
    ``v = 0``, with gradients by torch autograd. The chapter *The softmax gauge* proves the
    minimum is :func:`b_quot` at ``v = -wbar`` (``opazo2026flatness``); this is the
    independent numerical check.

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


# ----------------------------------------------------------------- how far B_raw sits above B_quot


def raw_quotient_ratio(W: torch.Tensor) -> torch.Tensor:
    """``B_raw / B_quot = ||W||_F^2 / ||W_c||_F^2 = 1 / (1 - share)``, the same for every feature.

    The factor ``||h||^2 (1 - ||p||^2)`` is common to both proxies, so their ratio depends
    on ``W`` alone; ``share`` is :func:`lossgeom.softmax.mean_row_share` (chapter
    *The softmax gauge*, after ``opazo2026flatness``).

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
    from scipy import stats

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


# ----------------------------------------------------------------- does a measure move along the orbit


def invariance_gaps(proxy, W: torch.Tensor, W_other: torch.Tensor, h: torch.Tensor) -> tuple[float, float]:
    """Relative change of ``proxy(W, h)`` and of its gradient in ``W`` between two classifiers.

    Returns ``(|proxy(W') / proxy(W) - 1|, ||grad(W') - grad(W)|| / ||grad(W)||)``, the
    gradients by ``torch.func.grad``. For ``W' = W + 1 v^T`` both are zero in exact
    arithmetic when ``proxy`` is gauge invariant (:func:`kappa_exact`, :func:`b_quot`)
    and not for :func:`b_raw` (chapter *The softmax gauge*). The two classifiers must be
    the same predictor on ``h`` (checked with :func:`lossgeom.softmax.max_probability_gap`,
    tolerance 1e-9).
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


# ----------------------------------------------------------------- quotient flatness of two-layer ReLU networks


def quotient_flatness(a: torch.Tensor, W: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                      part: str = "full") -> torch.Tensor:
    """``Flat^Q``: the trace of the Riemannian Hessian of ``L`` on the quotient, in closed form.

    ``Flat^Q = (1/n) sum_i sum_r 1[u_r^T x_i > 0] ((u_r^T x_i)^2
    + alpha_r^2 (||x_i||^2 - (u_r^T x_i)^2)) - (d - 1) (1/n) sum_i r_i F(x_i)``, valid off
    the kinks ``u_r^T x_i = 0``, in the quotient coordinates ``alpha_r = a_r ||w_r||``,
    ``u_r = w_r / ||w_r||`` (:func:`lossgeom.quotient.quotient_coordinates`). The second
    term comes from the curvature of the spheres (the trace of the Riemannian Hessian of
    ``F`` is ``-(d - 1) F``; ``absil2008optimization``). ``part="gauss_newton"`` returns
    the first term alone, which equals the full trace at an interpolant (every
    ``r_i = 0``). The measure of ``miyagawa2026symmetry``, derived in the chapter
    *Quotient flatness*; invariant under every rescaling ``(a_r / c_r, c_r w_r)``.

    Args:
        a: output weights ``(..., m)`` (one output; leading dimensions batch models).
        W: input weights ``(..., m, d)``.
        x: inputs ``(n, d)``. y: targets ``(n,)``.
        part: ``"full"`` or ``"gauss_newton"``.

    Returns:
        ``Flat^Q`` of every model, shape ``(...)``.
    """
    if part not in ("full", "gauss_newton"):
        raise ValueError(f"part must be 'full' or 'gauss_newton', got {part!r}")
    a, W, _ = _checked(a, W)
    x = _inputs(x, W.shape[-1])
    alpha, U = quotient_coordinates(a, W)
    z = U @ x.T
    active = (z > 0).to(x.dtype)
    sq = (x * x).sum(-1)
    gauss_newton = (active * (z**2 + alpha[..., None] ** 2 * (sq - z**2))).sum(-2).mean(-1)
    if part == "gauss_newton":
        return gauss_newton
    F = relu_network(a, W, x)
    y = finite_tensor("y", y)
    if y.shape != F.shape[-1:]:
        raise ValueError(f"y must have shape ({F.shape[-1]},), got {tuple(y.shape)}")
    return gauss_newton - (W.shape[-1] - 1) * ((F - y) * F).mean(-1)


def _tangent_frames(U: torch.Tensor) -> torch.Tensor:
    """Orthonormal bases ``(m, d, d-1)`` of the tangent spaces ``u_r^perp`` (QR of ``[u_r, I]``)."""
    d = U.shape[-1]
    stacked = torch.cat([U[:, :, None], torch.eye(d, dtype=U.dtype).expand(U.shape[0], d, d)], dim=-1)
    Q, _ = torch.linalg.qr(stacked)
    return Q[:, :, 1:d]


def quotient_flatness_autograd(a: torch.Tensor, W: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> float:
    """``Flat^Q`` by autograd: the trace of the dense Hessian of ``L`` in a chart of the quotient.

    The chart is ``(alpha, v) -> (alpha, R(v))`` with the retraction
    ``u_r(v_r) = (u_r + E_r v_r) / ||u_r + E_r v_r||`` (``E_r`` an orthonormal basis of
    ``u_r^perp``). It is an isometry at ``v = 0`` and its second derivative there is normal
    to the sphere (a second-order retraction), so the Euclidean Hessian at ``v = 0`` is the
    Riemannian Hessian and its trace is ``Flat^Q`` (one model; absent neurons dropped;
    ``absil2008optimization`` for the retraction). The dense reference of
    :func:`quotient_flatness` in the chapter *Quotient flatness*.
    """
    a, W, vector = _checked(a, W)
    if vector or W.ndim != 2:
        raise ValueError("quotient_flatness_autograd takes one one-output network: a (m,), W (m, d)")
    x = _inputs(x, W.shape[-1])
    y = finite_tensor("y", y)
    present = W.norm(dim=-1) > 0
    alpha, U = quotient_coordinates(a[present], W[present])
    frames = _tangent_frames(U)
    m, d = U.shape

    def loss(z: torch.Tensor) -> torch.Tensor:
        v = z[m:].reshape(m, d - 1)
        moved = U + (frames @ v[..., None])[..., 0]
        return regression_loss(z[:m], moved / moved.norm(dim=-1, keepdim=True), x, y)

    start = torch.cat([alpha, torch.zeros(m * (d - 1), dtype=alpha.dtype)])
    with warnings.catch_warnings():
        # torch's forward-mode AD registers decompositions with torch.jit.script on first use
        # and warns that jit is deprecated; the warning is about torch itself.
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*", category=DeprecationWarning)
        return float(torch.func.hessian(loss)(start).trace())


def raw_hessian_trace(a: torch.Tensor, W: torch.Tensor, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
    """The Euclidean Hessian trace of ``L`` in the raw parameters ``(a, W)`` (one output), closed form.

    ``tr H = (1/n) sum_i sum_r (ReLU(w_r^T x_i)^2 + a_r^2 1[w_r^T x_i > 0] ||x_i||^2)`` at every
    point off the kinks: the raw Hessian of ``F`` has only the mixed ``a_r``-``w_r`` blocks,
    so the residual term has zero trace (``y`` is accepted for symmetry and not needed).
    Under ``(a_r / c_r, c_r w_r)`` neuron r's two terms scale by ``c_r^2`` and ``c_r^-2``:
    the coordinate-dependent trace that ``dinh2017sharp`` show can be made as large as one
    likes, set against :func:`quotient_flatness` in the chapter *Quotient flatness*.
    """
    a, W, vector = _checked(a, W)
    if vector:
        raise ValueError("raw_hessian_trace needs a one-output network (a of shape (..., m))")
    x = _inputs(x, W.shape[-1])
    z = W @ x.T
    sq = (x * x).sum(-1)
    return (torch.relu(z) ** 2 + (a**2)[..., None] * (z > 0).to(x.dtype) * sq).sum(-2).mean(-1)




def _symmetric(name: str, matrix, tol: float = 1e-10) -> torch.Tensor:
    A = finite_tensor(name, matrix)
    if A.dtype != torch.float64:
        A = A.to(torch.float64)
    if A.ndim != 2 or A.shape[0] != A.shape[1] or A.shape[0] < 2:
        raise ValueError(f"{name} must be a square matrix of size >= 2, got shape {tuple(A.shape)}")
    scale = float(A.abs().max())
    if float((A - A.T).abs().max()) > tol * max(scale, 1e-300):
        raise ValueError(f"{name} must be symmetric (the bound is about real symmetric matrices)")
    return A


def _moments(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(m, s)`` without checks, differentiable (also inside torch.func transforms)."""
    n = A.shape[0]
    m = torch.diagonal(A).sum() / n
    second = (A * A).sum() / n  # tr(A^2) for symmetric A
    return m, torch.sqrt(torch.clamp(second - m * m, min=0.0))


def spectral_moments(matrix) -> tuple[float, float]:
    """``m = tr(A) / n`` and ``s = sqrt(tr(A^2) / n - m^2)``: mean and spread of the spectrum."""
    m, s = _moments(_symmetric("matrix", matrix))
    return float(m), float(s)


def wolkowicz_styan_from_traces(trace: float, trace_of_square: float, n: int) -> float:
    """``m + s sqrt(n - 1)`` from ``tr(A)``, ``tr(A^2)`` and the size ``n`` (no matrix needed).

    Both traces can be estimated matrix-free (Hutchinson: ``E[z^T A z]`` and
    ``E[|A z|^2]``), which is what makes the bound cheap for a large Hessian.

    Raises:
        ValueError: if ``n < 2`` or the traces are inconsistent (``tr(A^2) < tr(A)^2 / n``).
    """
    n = positive_int("n", n)
    if n < 2:
        raise ValueError(f"n must be >= 2, got {n}")
    trace, trace_of_square = float(trace), float(trace_of_square)
    m = trace / n
    variance = trace_of_square / n - m * m
    if variance < -1e-12 * max(1.0, trace_of_square / n):
        raise ValueError(f"trace_of_square must be >= trace^2 / n (Cauchy-Schwarz), got {trace_of_square} "
                         f"with trace {trace} and n {n}")
    return m + math.sqrt(max(variance, 0.0)) * math.sqrt(n - 1)


def wolkowicz_styan_bound(matrix) -> float:
    """The Wolkowicz-Styan upper bound ``lambda_max(A) <= m + s sqrt(n - 1)`` (chapter ``ch12_high_dimensions``).

    With ``x_i = lambda_i - m``: ``sum x_i = 0`` and ``sum x_i^2 = n s^2``; Cauchy-Schwarz on
    the other ``n - 1`` deviations gives ``x_max^2 <= (n - 1)(n s^2 - x_max^2)``, that is
    ``x_max <= s sqrt(n - 1)``. Equality holds when the other ``n - 1`` eigenvalues coincide.
    """
    A = _symmetric("matrix", matrix)
    m, s = _moments(A)
    return float(m + s * math.sqrt(A.shape[0] - 1))


def wolkowicz_styan_gradient(matrix) -> torch.Tensor:
    """``d/dA (m + s sqrt(n - 1)) = I / n + sqrt(n - 1) (A - m I) / (n s)`` (chapter ``ch12_high_dimensions``).

    From ``dm/dA = I / n`` and ``d tr(A^2) / dA = 2 A``, so ``ds/dA = (A - m I) / (n s)``.

    Raises:
        ValueError: where ``s = 0`` (all eigenvalues equal), where the bound is not
            differentiable.
    """
    A = _symmetric("matrix", matrix)
    n = A.shape[0]
    m, s = _moments(A)
    if float(s) <= 1e-14 * max(1.0, float(A.abs().max())):
        raise ValueError("the bound is not differentiable where all eigenvalues coincide (s = 0)")
    eye = torch.eye(n, dtype=torch.float64)
    return eye / n + math.sqrt(n - 1) * (A - m * eye) / (n * s)


def hessian_wolkowicz_styan(loss_fn: Callable[[dict[str, torch.Tensor]], torch.Tensor],
                            params: Params) -> tuple[float, dict[str, torch.Tensor]]:
    """``WS(theta) = m(H) + s(H) sqrt(n - 1)`` of the loss Hessian ``H(theta)`` and its gradient.

    The gradient ``dWS/dtheta = sum_ij (dWS/dH_ij) dH_ij/dtheta`` needs third derivatives of
    the loss; it is taken by reverse-mode autograd through ``torch.func.hessian`` (the
    closed form of the seed's HSR regulariser is this chain rule written out for one
    architecture). Small models only: the dense Hessian is formed.

    Returns:
        ``(value, gradient)`` with the gradient as a dict shaped like ``params``.
    """
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable as loss_fn(params) -> scalar tensor")
    flat, unflatten = flatten_params(params)
    flat = flat.detach().to(torch.float64)
    n = flat.numel()
    if n < 2:
        raise ValueError("params must hold at least two parameters")

    def bound_at(vector: torch.Tensor) -> torch.Tensor:
        H = torch.func.hessian(lambda v: loss_fn(unflatten(v)).reshape(()))(vector)
        m, s = _moments(0.5 * (H + H.T))
        return m + s * math.sqrt(n - 1)

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*", category=DeprecationWarning)
        grad, value = torch.func.grad_and_value(bound_at)(flat)
    if not torch.isfinite(value) or not torch.isfinite(grad).all():
        raise ValueError("the bound or its gradient is not finite at params")
    return float(value), unflatten(grad.detach())


@dataclass(frozen=True)
class RiemannianSharpness:
    """The Hessian measured in the Fisher metric (chapter ``ch12_high_dimensions``).

    Attributes:
        value: ``max_v v^T H v / v^T F v`` over ``v`` in the range of ``F``: the largest
            eigenvalue of ``F^(+1/2) H F^(+1/2)``.
        trace: the sum of those eigenvalues, ``tr(F^+ H)`` on the range of ``F``.
        rank: the dimension of the range of ``F`` (eigenvalues above the threshold).
        kernel_leakage: ``|H N|_2 / |H|_2`` for an orthonormal basis ``N`` of the kernel of
            ``F``: the curvature in directions the Fisher does not see. The definition is
            a function of the point (invariant under reparametrisation) when this is zero,
            as at a critical point whose Fisher kernel consists of symmetry directions.
    """

    value: float
    trace: float
    rank: int
    kernel_leakage: float


def fisher_riemannian_sharpness(hessian, fisher, rel_threshold: float = 1e-9) -> RiemannianSharpness:
    """Fisher-Riemannian sharpness: the largest eigenvalue of ``H`` in the metric ``F``.

    With ``F = U diag(phi) U^T`` and ``R = U_+ diag(phi_+)^(-1/2)`` over the eigenvalues
    ``phi > rel_threshold * max(phi)``, the value is ``lambda_max(R^T H R)``. Under a
    reparametrisation with invertible Jacobian ``J`` at a critical point, ``H -> J^T H J``
    and ``F -> J^T F J``; the generalised eigenvalues of ``(H, F)`` do not change
    (``det(J^T (H - mu F) J) = det(J)^2 det(H - mu F)``), so neither does the value.

    Raises:
        ValueError: if the matrices are not symmetric of one size, or ``F`` is zero.
    """
    H, F = _symmetric("hessian", hessian), _symmetric("fisher", fisher)
    if H.shape != F.shape:
        raise ValueError(f"hessian and fisher must have the same shape, got {tuple(H.shape)} and {tuple(F.shape)}")
    rel_threshold = positive("rel_threshold", rel_threshold)
    phi, U = np.linalg.eigh(F.numpy())
    if phi[-1] <= 0:
        raise ValueError("fisher must have a positive eigenvalue")
    keep = phi > rel_threshold * phi[-1]
    R = U[:, keep] / np.sqrt(phi[keep])
    mu = np.linalg.eigvalsh(R.T @ H.numpy() @ R)
    kernel = U[:, ~keep]
    h_norm = np.linalg.norm(H.numpy(), 2)
    leakage = float(np.linalg.norm(H.numpy() @ kernel, 2) / h_norm) if kernel.size and h_norm > 0 else 0.0
    return RiemannianSharpness(float(mu[-1]), float(mu.sum()), int(keep.sum()), leakage)


def diagonal_fisher_sharpness(hessian, fisher_diagonal) -> float:
    """``lambda_max(D^(-1/2) H D^(-1/2))`` with ``D`` a diagonal Fisher estimate (chapter ``ch12_high_dimensions``).

    A diagonal reparametrisation ``theta = S psi`` maps ``H -> S H S`` and the Fisher's
    diagonal to ``S D S``, so the value is kept; a non-diagonal ``J`` maps the diagonal of
    ``J^T F J`` to something that is not ``J^T D J``, and the value moves.

    Raises:
        ValueError: if ``fisher_diagonal`` has an entry <= 0 or the wrong length.
    """
    H = _symmetric("hessian", hessian)
    D = finite_tensor("fisher_diagonal", fisher_diagonal).to(torch.float64)
    if D.shape != (H.shape[0],):
        raise ValueError(f"fisher_diagonal must have shape ({H.shape[0]},), got {tuple(D.shape)}")
    if not bool((D > 0).all()):
        raise ValueError("fisher_diagonal must be > 0 everywhere (add damping where a parameter has no Fisher mass)")
    scale = D.rsqrt()
    return float(torch.linalg.eigvalsh(scale[:, None] * H * scale[None, :])[-1])


def hessian_sharpness(loss_fn: Callable[[dict[str, torch.Tensor]], torch.Tensor], params: Params,
                      tol: float = 1e-6, seed: int = 0) -> float:
    """``lambda_max`` of the loss Hessian by Lanczos on Hessian-vector products (the raw sharpness).

    :func:`lossgeom.curvature.top_eigenpairs` of :func:`lossgeom.curvature.hessian_operator`;
    no dense matrix is formed, so it serves networks with thousands of parameters.
    """
    from lossgeom.curvature import hessian_operator, top_eigenpairs

    return float(top_eigenpairs(hessian_operator(loss_fn, params), k=1, tol=positive("tol", tol), seed=seed).values[0])


def scale_to_loss(loss_fn: Callable[[dict[str, torch.Tensor]], torch.Tensor], params: Params, name: str,
                  target: float) -> dict[str, torch.Tensor]:
    """``params`` with ``params[name]`` multiplied by the ``t > 0`` that makes the loss ``target``.

    For a bias-free last layer ``name`` this multiplies every logit by ``t``: the predicted
    classes (and so every accuracy) are kept while the cross-entropy moves monotonically,
    which lets two interpolants be compared at the same training loss. ``t`` is found by
    ``scipy.optimize.brentq`` on ``log t`` in ``[-20, 20]``.

    Raises:
        ValueError: if ``name`` is not a parameter or no ``t`` in ``[e^-20, e^20]`` reaches
            ``target``.
    """
    from scipy.optimize import brentq

    if name not in params:
        raise ValueError(f"name must be one of the parameters {sorted(params)}, got {name!r}")
    target = positive("target", target)

    def scaled(log_t: float) -> dict[str, torch.Tensor]:
        return {**params, name: params[name] * math.exp(log_t)}

    gap = lambda log_t: float(loss_fn(scaled(log_t))) - target
    if gap(-20.0) * gap(20.0) > 0:
        raise ValueError(f"no scale of {name!r} in [e^-20, e^20] brings the loss to target {target}")
    return scaled(brentq(gap, -20.0, 20.0, xtol=1e-12))


# =======================================================================================
# Module-first measures (the symmetry audit atlas, ``appendices/atlas``)
# =======================================================================================
#
# Each measure below takes a ``torch.nn.Module``, a loss module (``nn.CrossEntropyLoss()``
# or ``nn.MSELoss()``, mean reduction) and data ``(x, y)`` (or an iterable of ``(x, y)``
# batches), or instead one :class:`LossPoint` that keeps the dense curvature several
# measures share. The model is evaluated in its own dtype; results are Python floats. A
# measure that is not defined for the model or loss at hand raises :class:`NotApplicable`.


class NotApplicable(ValueError):
    """A measure is not defined for this model or loss (the message says why)."""


_LOSS_KINDS = {nn.CrossEntropyLoss: "cross_entropy", nn.MSELoss: "mse"}


def _loss_kind(loss) -> str:
    for cls, kind in _LOSS_KINDS.items():
        if type(loss) is cls:
            if loss.reduction != "mean":
                raise ValueError(f"loss must use reduction='mean' (the measures are of the mean loss), "
                                 f"got reduction={loss.reduction!r}")
            if kind == "cross_entropy" and (loss.weight is not None or loss.label_smoothing != 0.0):
                raise ValueError("loss must be a plain nn.CrossEntropyLoss() (no class weights, no label "
                                 "smoothing): the Fisher and softmax measures assume the plain likelihood")
            return kind
    raise TypeError(f"loss must be nn.CrossEntropyLoss() or nn.MSELoss() (a loss module, mean reduction), "
                    f"got {type(loss).__name__}")


def _as_data(data) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(t, torch.Tensor) for t in data):
        x, y = data
    else:
        try:
            batches = list(data)
        except TypeError:
            raise TypeError(f"data must be a pair (x, y) of tensors or an iterable of (x, y) batches, got "
                            f"{type(data).__name__}") from None
        if not batches or not all(isinstance(b, (tuple, list)) and len(b) == 2
                                  and all(isinstance(t, torch.Tensor) for t in b) for b in batches):
            raise TypeError("data must be a pair (x, y) of tensors or a non-empty iterable of (x, y) tensor batches")
        # the mean loss over all examples is the size-weighted mean of the batch means
        x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    if x.ndim == 0 or x.shape[0] == 0:
        raise ValueError(f"data must hold at least one example, got x of shape {tuple(x.shape)}")
    if y.ndim == 0 or y.shape[0] != x.shape[0]:
        raise ValueError(f"data must hold one target per example: x has {x.shape[0]} rows, y has shape "
                         f"{tuple(y.shape)}")
    return x, y


class LossPoint:
    """A model at one parameter point, with its loss and data, and the curvature computed there.

    The measures of this section accept a ``LossPoint`` in place of ``(model, loss,
    data)``: build one to evaluate several measures at one point without recomputing the
    dense Hessian (:meth:`hessian`) and the Fisher (:meth:`fisher`), which are kept after
    their first use. The parameters are copied when the point is made; the model itself
    is only called (``torch.func.functional_call``), never changed.

    Args:
        model: a ``torch.nn.Module`` whose parameters share one float dtype; layers with
            state (batch norm) must be in eval mode.
        loss: ``nn.CrossEntropyLoss()`` (outputs are logits ``(N, K)``, targets class
            indices) or ``nn.MSELoss()`` (targets of the outputs' shape), mean reduction.
        data: ``(x, y)`` tensors or an iterable of ``(x, y)`` batches (concatenated: the
            mean loss over all examples is the size-weighted mean of the batch means).
        params: evaluate at these parameters (a dict with the names, shapes and dtypes of
            ``model.named_parameters()``) instead of the model's own.
        max_dense: the largest parameter count for which a dense Hessian or Fisher is
            formed (their cost grows as ``n^2`` in memory and ``n`` products).

    Raises:
        TypeError, ValueError: on a bad model, loss, data or params (named), or a
            non-finite loss.
    """

    def __init__(self, model: nn.Module, loss: nn.Module, data, *, params: Params | None = None,
                 max_dense: int = 5000) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.kind = _loss_kind(loss)
        floating = [p for p in model.parameters() if torch.is_floating_point(p)]
        if not floating:
            raise ValueError(f"model {type(model).__name__} has no floating-point parameters")
        dtypes = {p.dtype for p in floating}
        if len(dtypes) > 1:
            raise ValueError(f"model parameters must share one dtype, got {sorted(map(str, dtypes))}")
        if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()) and model.training:
            raise ValueError("model has batch norm in training mode: call model.eval() so the loss is a fixed function")
        self.model, self.loss, self.dtype = model, loss, dtypes.pop()
        self.max_dense = positive_int("max_dense", max_dense)
        x, y = _as_data(data)
        self.x = x.to(self.dtype) if torch.is_floating_point(x) else x
        self.y = y.to(self.dtype) if torch.is_floating_point(y) else y
        own = dict(model.named_parameters())
        if params is None:
            params = own
        elif not isinstance(params, Mapping) or set(params) != set(own):
            raise ValueError(f"params must be a dict with exactly the model's parameter names {list(own)}")
        for name, value in params.items():
            if not isinstance(value, torch.Tensor) or value.shape != own[name].shape or value.dtype != own[name].dtype:
                raise ValueError(f"params[{name!r}] must be a tensor of shape {tuple(own[name].shape)} and dtype "
                                 f"{own[name].dtype} like the model's")
        self.params = {name: params[name].detach().clone() for name in own}
        with torch.no_grad():
            try:
                outputs = self.outputs(self.params)
            except RuntimeError as err:
                raise ValueError(f"model failed on x of shape {tuple(self.x.shape)}: {err}") from err
            if self.kind == "cross_entropy" and (outputs.ndim != 2 or self.y.shape != (outputs.shape[0],)
                                                 or torch.is_floating_point(self.y)):
                raise ValueError(f"nn.CrossEntropyLoss needs logits (N, K) and integer class targets (N,), got "
                                 f"outputs {tuple(outputs.shape)} and y {tuple(self.y.shape)} {self.y.dtype}")
            if self.kind == "mse" and self.y.shape != outputs.shape:
                raise ValueError(f"nn.MSELoss needs targets of the outputs' shape {tuple(outputs.shape)}, got "
                                 f"{tuple(self.y.shape)} (a mismatch would broadcast silently)")
            value = self.loss(outputs, self.y)
        if not torch.isfinite(value):
            raise ValueError(f"the loss is not finite ({value.item()}) at the model's parameters")
        self._hessian: np.ndarray | None = None
        self._fisher: np.ndarray | None = None

    @property
    def n_parameters(self) -> int:
        return sum(p.numel() for p in self.params.values())

    @property
    def data(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x, self.y

    def model_at_point(self) -> nn.Module:
        """A copy of the model carrying the point's parameters (the model itself is not changed)."""
        import copy

        twin = copy.deepcopy(self.model)
        with torch.no_grad():
            for name, value in twin.named_parameters():
                value.copy_(self.params[name])
        return twin

    def _typed(self, params: Params) -> dict[str, torch.Tensor]:
        return {k: (v.to(self.dtype) if torch.is_floating_point(v) else v) for k, v in params.items()}

    def outputs(self, params: Params) -> torch.Tensor:
        """The model's outputs on the data with ``params``."""
        return torch.func.functional_call(self.model, self._typed(params), (self.x,))

    def loss_fn(self, params: Params) -> torch.Tensor:
        """The mean loss on the data at ``params`` (a scalar tensor)."""
        return self.loss(self.outputs(params), self.y)

    def per_example_losses(self, params: Params) -> torch.Tensor:
        """The loss of each example at ``params``; their mean is :meth:`loss_fn`."""
        out = self.outputs(params)
        if self.kind == "cross_entropy":
            return nn.functional.cross_entropy(out, self.y, reduction="none")
        return ((out - self.y) ** 2).reshape(out.shape[0], -1).mean(dim=1)

    def value(self) -> float:
        """The mean loss at the point."""
        with torch.no_grad():
            return float(self.loss_fn(self.params))

    def flat(self) -> torch.Tensor:
        """The parameters as one float64 vector (the order of ``model.named_parameters()``)."""
        return flatten_params(self.params)[0].detach().to(torch.float64)

    def unflatten(self, vector: torch.Tensor) -> dict[str, torch.Tensor]:
        return flatten_params(self.params)[1](vector)

    def value_and_gradient(self, vector: torch.Tensor) -> tuple[float, torch.Tensor]:
        """The loss and its gradient (float64, flat) at the flat parameter vector ``vector``."""
        leaf = vector.detach().to(torch.float64).clone().requires_grad_(True)
        value = self.loss_fn(self.unflatten(leaf))
        (grad,) = torch.autograd.grad(value, leaf)
        return float(value.detach()), grad.detach()

    def _check_dense(self, what: str) -> None:
        if self.n_parameters > self.max_dense:
            raise NotApplicable(f"{what} needs the dense {self.n_parameters} x {self.n_parameters} matrix, above "
                                f"max_dense = {self.max_dense}; raise max_dense if memory allows")

    def hessian(self) -> np.ndarray:
        """The dense loss Hessian (float64, symmetrised), from Hessian-vector products.

        Reverse-over-reverse products of :func:`lossgeom.curvature.hessian_operator`, one per
        column; computed once per point.
        """
        if self._hessian is None:
            from lossgeom.curvature import hessian_operator

            self._check_dense("the dense Hessian")
            operator = hessian_operator(self.loss_fn, self.params, method="reverse-over-reverse")
            eye = torch.eye(operator.shape[0], dtype=operator.dtype, device=operator.device)
            H = operator.matmat(eye).detach().cpu().numpy().astype(np.float64)
            self._hessian = 0.5 * (H + H.T)
        return self._hessian

    def fisher(self) -> np.ndarray:
        """The Fisher of the likelihood whose mean negative log-likelihood is the loss (float64, dense).

        For the softmax cross-entropy this is the true Fisher
        ``(1/N) sum_i J_i^T (diag p_i - p_i p_i^T) J_i``; for the mean squared error, that of
        the Gaussian likelihood with the variance that makes its mean negative
        log-likelihood the loss. Both equal the generalised Gauss-Newton matrix
        (Martens 2020), computed by :func:`lossgeom.curvature.dense_ggn`; for a model in
        another dtype than float64, on a float64 copy of it.
        """
        if self._fisher is None:
            import copy

            from lossgeom.curvature import dense_ggn

            self._check_dense("the dense Fisher")
            model, params, x, y = self.model, self.params, self.x, self.y
            if self.dtype != torch.float64:
                model = copy.deepcopy(model).to(torch.float64)
                params = {k: v.to(torch.float64) for k, v in params.items()}
                x = x.to(torch.float64) if torch.is_floating_point(x) else x
                y = y.to(torch.float64) if torch.is_floating_point(y) else y
            G = dense_ggn(model, params, x, y, self.kind).detach()
            G = np.asarray(G.to(torch.float64).numpy())
            self._fisher = 0.5 * (G + G.T)
        return self._fisher

    def block_indices(self, name: str) -> np.ndarray:
        """The positions of parameter ``name`` in the flat vector (and in the Hessian's rows)."""
        if name not in self.params:
            raise ValueError(f"{name!r} is not a parameter of the model; parameters are {sorted(self.params)}")
        start = 0
        for key, value in self.params.items():
            if key == name:
                return np.arange(start, start + value.numel())
            start += value.numel()
        raise AssertionError("unreachable")

    def classifier(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``([W b], [h 1])``: the last Linear layer (bias as an extra column) and its input features.

        The features are what the Linear layer whose output is the model's output reads on
        the data (found with forward hooks, so any model whose logits come straight from an
        ``nn.Linear`` qualifies). A bias ``b`` joins ``W`` as a last column and ``h`` gains a
        constant 1, so the logits are ``[W b] [h; 1]`` and the common-row shift acts on the
        augmented rows.

        Raises:
            NotApplicable: if the loss is not a softmax cross-entropy, or the outputs are
                not an ``nn.Linear`` layer's output.
        """
        if self.kind != "cross_entropy":
            raise NotApplicable("the softmax proxies need a softmax cross-entropy loss (nn.CrossEntropyLoss)")
        seen: list[tuple[nn.Linear, torch.Tensor, torch.Tensor]] = []
        hooks = [m.register_forward_hook(lambda mod, args, out: seen.append((mod, args[0], out)))
                 for m in self.model.modules() if isinstance(m, nn.Linear)]
        try:
            with torch.no_grad():
                out = self.outputs(self.params)
        finally:
            for hook in hooks:
                hook.remove()
        found = [(mod, h) for mod, h, o in seen if o is out]
        if not found:
            raise NotApplicable("the model's outputs are not the output of an nn.Linear layer, so there is no "
                                "softmax classifier W to read")
        module, h = found[-1]
        name = next(n for n, m in self.model.named_modules() if m is module)
        W = self.params[f"{name}.weight" if name else "weight"].detach().to(torch.float64)
        h = h.detach().to(torch.float64).reshape(h.shape[0], -1)
        if module.bias is not None:
            b = self.params[f"{name}.bias" if name else "bias"].detach().to(torch.float64)
            W = torch.cat([W, b[:, None]], dim=1)
            h = torch.cat([h, torch.ones(h.shape[0], 1, dtype=torch.float64)], dim=1)
        return W, h


def _point(model, loss, data) -> LossPoint:
    if isinstance(model, LossPoint):
        if loss is not None or data is not None:
            raise TypeError("pass either a LossPoint alone or (model, loss, data), not both")
        return model
    if loss is None or data is None:
        raise TypeError("a measure needs (model, loss, data), or one LossPoint")
    return LossPoint(model, loss, data)


def lambda_max(model, loss=None, data=None, *, tol: float = 1e-8, seed: int = 0) -> float:
    """``lambda_max(H)``: the largest eigenvalue of the loss Hessian, by Lanczos (raw sharpness).

    :func:`lossgeom.curvature.top_eigenpairs` (``scipy.sparse.linalg.eigsh``) on
    Hessian-vector products (reverse-over-reverse, the cheapest per product when many
    are taken at one point); no dense matrix is formed. Chapters ``ch04_curvature_spectrum``
    and ``ch05_step_size`` derive what it governs.
    """
    from lossgeom.curvature import hessian_operator, top_eigenpairs

    point = _point(model, loss, data)
    if point.n_parameters < 2:
        raise ValueError("lambda_max needs at least two parameters (Lanczos)")
    operator = hessian_operator(point.loss_fn, point.params, method="reverse-over-reverse")
    return float(top_eigenpairs(operator, k=1, tol=positive("tol", tol), seed=seed).values[0])


def hessian_trace(model, loss=None, data=None, *, method: str = "exact", n_hvp: int = 99, seed: int = 0) -> float:
    """``tr(H)``: the trace of the loss Hessian (the expected loss increase under isotropic noise).

    ``method="exact"`` sums the diagonal of the dense Hessian (:meth:`LossPoint.hessian`);
    ``method="hutchpp"`` estimates it from ``n_hvp`` products with Hutch++
    (:func:`lossgeom.curvature.hutchpp_trace`, Meyer et al. 2021) for models too large to
    form ``H``.
    """
    point = _point(model, loss, data)
    if method == "exact":
        return float(np.trace(point.hessian()))
    if method == "hutchpp":
        from lossgeom.curvature import hessian_operator, hutchpp_trace

        return float(hutchpp_trace(hessian_operator(point.loss_fn, point.params), n_hvp=n_hvp, seed=seed).estimate)
    raise ValueError(f"method must be 'exact' or 'hutchpp', got {method!r}")


def keskar_sharpness(model, loss=None, data=None, *, epsilon: float = 1e-3, max_iter: int = 20) -> float:
    """Keskar et al.'s (2017) epsilon-sharpness, in percent, over the box ``|z_i| <= epsilon (|theta_i| + 1)``.

    ``100 (max_{z in C} L(theta + z) - L(theta)) / (1 + L(theta))`` with the box ``C`` in the
    full parameter space (their ``A = I``); the maximum is sought as they do, by L-BFGS-B
    (``scipy.optimize.minimize``) from ``z = 0`` for at most ``max_iter`` iterations, so the
    value is a lower bound on the true maximum. The box grows with ``|theta_i|``, so a
    rescaling that preserves the function changes the set searched.
    """
    from scipy.optimize import Bounds, minimize

    point = _point(model, loss, data)
    epsilon, max_iter = positive("epsilon", epsilon), positive_int("max_iter", max_iter)
    theta = point.flat()
    base = point.value()
    half_width = (epsilon * (theta.abs() + 1.0)).numpy()

    def negative(z: np.ndarray) -> tuple[float, np.ndarray]:
        value, grad = point.value_and_gradient(theta + torch.from_numpy(z))
        return -value, -grad.numpy()

    # no stopping on a small projected gradient or a small decrease: a box of width 1e-3
    # around a trained point has both, and the search would stop at z = 0
    result = minimize(negative, np.zeros(theta.numel()), jac=True, method="L-BFGS-B",
                      bounds=Bounds(-half_width, half_width),
                      options={"maxiter": max_iter, "gtol": 0.0, "ftol": 0.0})
    highest = max(-float(result.fun), base)
    return 100.0 * (highest - base) / (1.0 + base)


def sam_sharpness(model, loss=None, data=None, *, rho: float = 0.05) -> float:
    """SAM sharpness (Foret et al. 2021): ``L(theta + rho g / |g|) - L(theta)``, ``g`` the gradient.

    The first-order solution of ``max_{|e|_2 <= rho} L(theta + e) - L(theta)``, the quantity
    sharpness-aware minimisation adds to the loss; zero where the gradient vanishes.
    """
    point = _point(model, loss, data)
    rho = positive("rho", rho)
    theta = point.flat()
    base, grad = point.value_and_gradient(theta)
    norm = float(grad.norm())
    if norm == 0.0:
        return 0.0
    with torch.no_grad():
        return float(point.loss_fn(point.unflatten(theta + (rho / norm) * grad))) - base


def _asam_scale(point: LossPoint, eta: float) -> torch.Tensor:
    """ASAM's ``T_w``: ``|w| + eta`` on weights (parameters named ``*weight*``), 1 on the others."""
    pieces = [(p.detach().to(torch.float64).abs() + eta) if "weight" in name
              else torch.ones(p.numel(), dtype=torch.float64) for name, p in point.params.items()]
    return torch.cat([piece.reshape(-1) for piece in pieces])


def adaptive_sharpness(model, loss=None, data=None, *, rho: float = 0.5, eta: float = 0.01) -> float:
    """ASAM's adaptive sharpness (Kwon et al. 2021): ``L(theta + e) - L(theta)``, ``e = rho T^2 g / |T g|``.

    The first-order solution of ``max_{|T^-1 e|_2 <= rho} L(theta + e) - L(theta)`` with the
    element-wise normalisation ``T = diag(|w| + eta)`` on weight parameters and ``T = 1`` on
    biases and other parameters, as in the authors' implementation. With ``eta = 0`` and no
    bias the ball moves with a per-neuron rescaling and the value is invariant under it;
    ``eta > 0`` and unnormalised biases make the invariance approximate.
    """
    point = _point(model, loss, data)
    rho, eta = positive("rho", rho), float(eta)
    if not (math.isfinite(eta) and eta >= 0):
        raise ValueError(f"eta must be finite and >= 0, got {eta}")
    theta = point.flat()
    base, grad = point.value_and_gradient(theta)
    scale = _asam_scale(point, eta)
    norm = float((scale * grad).norm())
    if norm == 0.0:
        return 0.0
    with torch.no_grad():
        return float(point.loss_fn(point.unflatten(theta + (rho / norm) * scale**2 * grad))) - base


def fisher_rao_norm(model, loss=None, data=None) -> float:
    """The Fisher-Rao norm (Liang et al. 2019): ``|theta|_fr = sqrt(<theta, I(theta) theta>)``.

    With the empirical Fisher ``I = (1/N) sum_i g_i g_i^T`` (``g_i`` the gradient of example
    ``i``'s loss), ``<theta, I theta> = (1/N) sum_i <theta, g_i>^2``; the directional
    derivatives ``<theta, g_i>`` of all examples come from one forward-mode product
    (``torch.func.jvp``). A linear change of coordinates ``theta = D psi`` that keeps the
    function keeps every ``<theta, g_i>``, so the norm is invariant under rescalings and
    permutations; a common-row shift adds a direction the per-example gradients are
    orthogonal to.
    """
    point = _point(model, loss, data)
    theta = point.flat()

    def losses(vector: torch.Tensor) -> torch.Tensor:
        return point.per_example_losses(point.unflatten(vector)).to(torch.float64)

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*", category=DeprecationWarning)
        _, directional = torch.func.jvp(losses, (theta,), (theta,))
    return float(directional.pow(2).mean().sqrt())


def _first_weight(point: LossPoint) -> str:
    for name, value in point.params.items():
        if name.endswith("weight") and value.ndim >= 2:
            return name.removesuffix(".weight").removesuffix("weight")
    raise NotApplicable("relative flatness needs a layer with a weight matrix (a parameter '<layer>.weight' of "
                        "two or more dimensions)")


def relative_flatness(model, loss=None, data=None, *, layer: str | None = None) -> float:
    """Petzka et al.'s (2021) relative flatness of one layer: ``sum_{s,s'} <w_s, w_s'> Tr(H_{s,s'})``.

    ``w_s`` is row ``s`` of the layer's weight (the weights into unit or channel ``s``,
    flattened for a convolution) and ``H_{s,s'}`` the Hessian block of the loss between
    rows ``s`` and ``s'``. Rescaling the layer's units (rows) by ``c_s`` multiplies
    ``<w_s, w_s'>`` by ``c_s c_s'`` and divides ``H_{s,s'}`` by it, so the value is kept; for
    the last layer of a softmax classifier it is ``kappa_exact`` (chapter
    ``ch08_softmax_gauge``).

    Args:
        layer: the layer's name prefix (``"0"`` for ``model[0]``); default the first
            parameter named ``*weight`` with two or more dimensions.
    """
    point = _point(model, loss, data)
    layer = _first_weight(point) if layer is None else layer
    name = f"{layer}.weight" if layer else "weight"
    if name not in point.params or point.params[name].ndim < 2:
        raise ValueError(f"layer {layer!r} has no weight matrix {name!r}; weights are "
                         f"{[k for k, v in point.params.items() if v.ndim >= 2]}")
    weight = point.params[name].detach().to(torch.float64)
    rows, width = weight.shape[0], weight[0].numel()
    index = point.block_indices(name)
    block = point.hessian()[np.ix_(index, index)].reshape(rows, width, rows, width)
    traces = np.einsum("sjtj->st", block)
    W = weight.reshape(rows, width).numpy()
    return float(((W @ W.T) * traces).sum())


def classifier_kappa_exact(model, loss=None, data=None) -> float:
    """``kappa_exact`` of the model's last layer: ``mean_i |h_i|^2 Tr(W^T P(p_i) W)``.

    :func:`kappa_exact` at the classifier and features of :meth:`LossPoint.classifier`
    (a bias joins ``W`` as a column, ``h`` gains a 1); the chapter *The softmax gauge*.
    """
    W, h = _point(model, loss, data).classifier()
    return float(kappa_exact(W, h))


def classifier_b_raw(model, loss=None, data=None) -> float:
    """``B_raw = |W|_F^2 mean_i |h_i|^2 (1 - |p_i|^2)`` of the model's last layer (:func:`b_raw`)."""
    W, h = _point(model, loss, data).classifier()
    return float(b_raw(W, h))


def classifier_b_quot(model, loss=None, data=None) -> float:
    """``B_quot``: ``B_raw`` at the centred classifier ``W - 1 wbar^T`` (:func:`b_quot`)."""
    W, h = _point(model, loss, data).classifier()
    return float(b_quot(W, h))


def model_quotient_flatness(model, loss=None, data=None) -> float:
    """``Flat^Q`` of a two-layer bias-free ReLU regression network (chapter ``ch11_quotient_flatness``).

    :func:`quotient_flatness` (the trace of the Riemannian Hessian on the
    rescaling quotient) times 2, since ``nn.MSELoss`` is ``(1/N) sum (F - y)^2``, twice the
    ``(1/2N) sum (F - y)^2`` of that chapter.

    Raises:
        NotApplicable: unless the model is ``Sequential(Linear(d, m, bias=False), ReLU(),
            Linear(m, 1, bias=False))`` and the loss ``nn.MSELoss()``.
    """
    from lossgeom import quotient

    point = _point(model, loss, data)
    if point.kind != "mse":
        raise NotApplicable("Flat^Q is derived for the square loss (nn.MSELoss)")
    try:
        a, W = quotient.two_layer_weights(point.params)
        quotient.two_layer_weights(point.model)
    except (TypeError, ValueError) as err:
        raise NotApplicable(f"Flat^Q is defined for two-layer bias-free ReLU networks: {err}") from None
    if a.ndim != 1:
        raise NotApplicable("Flat^Q is derived for one output")
    x = point.x.to(torch.float64).reshape(point.x.shape[0], -1)
    return 2.0 * float(quotient_flatness(a.to(torch.float64), W.to(torch.float64), x,
                                         point.y.to(torch.float64).reshape(-1)))


def riemannian_sharpness(model, loss=None, data=None, *, fisher: str = "true") -> float:
    """Fisher-Riemannian sharpness: ``lambda_max`` of the Hessian in a Fisher metric (chapter ``ch12_high_dimensions``).

    ``fisher="true"``: :func:`fisher_riemannian_sharpness` of the dense Hessian and the
    Fisher of :meth:`LossPoint.fisher` (the largest generalised eigenvalue on the Fisher's
    range); ``fisher="diagonal"``: :func:`diagonal_fisher_sharpness` with the Fisher's
    diagonal, over the parameters whose diagonal entry is positive (a dead unit's weights
    have no Fisher mass and, being dead, no curvature either; a parameter with curvature
    but no Fisher mass is an error, the value being infinite).

    Both are invariant under a linear change of coordinates (a diagonal one for the
    diagonal version) when the Hessian vanishes on the Fisher's kernel; where it does not
    (``kernel_leakage`` of :func:`fisher_riemannian_sharpness`, away from a critical
    point), the restriction to the Fisher's range depends on the coordinates.
    """
    point = _point(model, loss, data)
    H, F = point.hessian(), point.fisher()
    if fisher == "true":
        return fisher_riemannian_sharpness(H, F).value
    if fisher == "diagonal":
        diagonal = np.diag(F)
        seen = diagonal > 0
        if not seen.any():
            raise ValueError("the Fisher is zero: there is no metric to measure the Hessian in")
        blind = ~seen
        if blind.any() and np.abs(H[blind]).max() > 1e-12 * np.abs(H).max():
            raise ValueError("the Hessian has curvature in parameters the Fisher does not see (zero Fisher "
                             "diagonal): the diagonal-Fisher sharpness is infinite there")
        if seen.sum() < 2:
            return float(H[seen][:, seen].item() / diagonal[seen].item())
        return diagonal_fisher_sharpness(H[np.ix_(seen, seen)], diagonal[seen])
    raise ValueError(f"fisher must be 'true' or 'diagonal', got {fisher!r}")


def wolkowicz_styan(model, loss=None, data=None) -> float:
    """The Wolkowicz-Styan bound ``m + s sqrt(n - 1) >= lambda_max(H)`` (chapter ``ch12_high_dimensions``).

    :func:`wolkowicz_styan_bound` of the dense Hessian: ``m = tr(H) / n`` and
    ``s^2 = tr(H^2) / n - m^2``.
    """
    return wolkowicz_styan_bound(_point(model, loss, data).hessian())


# --------------------------------------------------------------------------- reparametrisations


@dataclass(frozen=True)
class CoordinateChange:
    """A smooth invertible change of coordinates ``theta = phi(psi)`` on flat parameter vectors.

    Attributes:
        name: what the map is.
        forward: ``phi``, a differentiable torch function of a 1-D tensor (autograd takes its
            Jacobian and second derivatives).
        inverse: ``phi^(-1)``, so that a point ``theta`` can be read in the new coordinates.
    """

    name: str
    forward: Callable[[torch.Tensor], torch.Tensor]
    inverse: Callable[[torch.Tensor], torch.Tensor]

    def jacobian(self, psi: torch.Tensor) -> torch.Tensor:
        """``J = d phi / d psi`` at ``psi`` by autograd, shape ``(n, n)``."""
        psi = finite_tensor("psi", psi)
        return torch.autograd.functional.jacobian(self.forward, psi)


def _lower_shear_matrix(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(int(seed))
    return torch.randn(n, n, generator=gen, dtype=torch.float64).tril(-1) / math.sqrt(n)


def nonlinear_shear(n: int, strength: float, seed: int = 0) -> CoordinateChange:
    """``theta = psi + t tanh(P psi)`` with ``P`` strictly lower triangular (entries ``N(0, 1/n)``).

    Smooth and nonlinear, with Jacobian ``I + t diag(sech^2(P psi)) P``: unit lower
    triangular, so never singular (``det J = 1``) and not diagonal. The inverse is exact by
    forward substitution, ``psi_i = theta_i - t tanh(sum_{j<i} P_ij psi_j)``.
    """
    n, t = positive_int("n", n), positive("strength", strength)
    P = _lower_shear_matrix(n, seed)

    def forward(psi: torch.Tensor) -> torch.Tensor:
        return psi + t * torch.tanh(P @ psi)

    def inverse(theta: torch.Tensor) -> torch.Tensor:
        theta = finite_tensor("theta", theta).to(torch.float64)
        if theta.shape != (n,):
            raise ValueError(f"theta must have shape ({n},), got {tuple(theta.shape)}")
        psi = torch.zeros_like(theta)
        for i in range(n):
            psi[i] = theta[i] - t * torch.tanh(P[i, :i] @ psi[:i])
        return psi

    return CoordinateChange(f"nonlinear shear psi + {t:g} tanh(P psi), P strictly lower triangular (seed {seed})",
                            forward, inverse)


def elementwise_sinh() -> CoordinateChange:
    """``theta_i = sinh(psi_i)``: smooth, nonlinear, with the diagonal Jacobian ``diag(cosh psi)``."""
    return CoordinateChange("theta = sinh(psi), elementwise", torch.sinh,
                            lambda theta: torch.asinh(finite_tensor("theta", theta)))


class Reparametrised(nn.Module):
    """``model`` read in other coordinates: one parameter ``"psi"`` with ``theta = phi(psi)``.

    ``theta`` is the flat vector of ``model``'s parameters in ``named_parameters`` order
    (:func:`lossgeom.curvature.flatten_params`), and ``forward(x)`` evaluates ``model`` at
    ``phi(psi)`` with ``torch.func.functional_call``: the same family of functions in new
    coordinates. Hessians and Fishers of this module come from autograd through ``phi``
    (its Jacobian and second derivatives), not from a transformation law, so they test one.
    The wrapped model is not registered as a submodule: ``"psi"`` is the only parameter.

    Args:
        model: the network (its own parameters are only read for names and shapes).
        change: the :class:`CoordinateChange`.
        theta: the point to start from (a parameter dict of ``model``); ``psi`` is set to
            ``change.inverse(flat theta)``. Defaults to the model's own parameters.
    """

    def __init__(self, model: nn.Module, change: CoordinateChange, theta: Mapping[str, torch.Tensor] | None = None):
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(change, CoordinateChange):
            raise TypeError(f"change must be a CoordinateChange, got {type(change).__name__}")
        own = {k: v.detach() for k, v in model.named_parameters()}
        theta = own if theta is None else dict(theta)
        if set(theta) != set(own) or any(theta[k].shape != own[k].shape for k in own):
            raise ValueError(f"theta must hold the model's parameters {sorted(own)} with their shapes")
        self._wrapped = (model,)  # a tuple: not a registered submodule
        self._shapes = {k: own[k].shape for k in own}
        self.change = change
        flat = torch.cat([theta[k].detach().reshape(-1) for k in own]).to(torch.float64)
        self.psi = nn.Parameter(change.inverse(flat).detach().clone())

    @property
    def model(self) -> nn.Module:
        return self._wrapped[0]

    def theta(self, psi: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The original parameters ``phi(psi)`` as a dict of ``model`` (default: at ``self.psi``)."""
        flat = self.change.forward(self.psi if psi is None else psi)
        out, start = {}, 0
        for name, shape in self._shapes.items():
            size = math.prod(shape)
            out[name] = flat[start:start + size].reshape(shape)
            start += size
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(self.model, self.theta(), (x,))

r"""The softmax gauge: common-row shifts of a linear classifier.

A classifier :math:`W \in \mathbb{R}^{K \times d}` maps a feature :math:`h \in \mathbb{R}^d`
to probabilities :math:`p = \operatorname{softmax}(W h)`. Adding one vector :math:`v` to every
row, :math:`W \to W + \mathbf 1 v^\top`, adds the scalar :math:`v^\top h` to every logit and
leaves :math:`p` unchanged: a function-preserving symmetry (the *gauge*). The gauge
operations computed here:

- :math:`P(p) = \operatorname{diag}(p) - p p^\top` (:func:`covariance`), the covariance of the
  one-hot label and the softmax Jacobian; the cross-entropy Hessian in :math:`W` is
  :math:`P(p) \otimes h h^\top`;
- the centred representative :math:`W_c = W - \mathbf 1 \bar w^\top` (:func:`centre`), the
  mean row :math:`\bar w` (:func:`mean_row`) and its share of :math:`\lVert W \rVert_F^2`
  (:func:`mean_row_share`);
- the shifts themselves (:func:`common_row_shift`,
  :func:`lossgeom.symmetries.layers.reference_class`, :func:`shift_for_norm_factor`), the
  functional check that two classifiers are one predictor (:func:`max_probability_gap`)
  and the shift as a :class:`~lossgeom.symmetries.core.Symmetry` (:func:`row_shift_symmetry`).

The flatness measures of a softmax classifier (:math:`\kappa_{\rm exact}`, :math:`B_{\rm raw}`,
:math:`B_{\rm quot}`) live in :mod:`lossgeom.flatness.softmax_head`.

All functions take and return float64 torch tensors and are differentiable in ``W`` and
``h``. ``h`` may be one feature ``(d,)`` or a batch ``(n, d)``.
"""

from __future__ import annotations

import torch

from lossgeom._validation import positive
from lossgeom.symmetries.core import Symmetry
from lossgeom.symmetries.layers import _classifier, _float64, softmax_row_shift


def _features(h: torch.Tensor, d: int) -> torch.Tensor:
    if not isinstance(h, torch.Tensor):
        raise TypeError(f"h must be a torch.Tensor of shape (d,) or (n, d), got {type(h).__name__}")
    if h.ndim not in (1, 2) or h.shape[-1] != d:
        raise ValueError(f"h must have shape ({d},) or (n, {d}) to match W's d = {d}, got {tuple(h.shape)}")
    if h.ndim == 2 and h.shape[0] == 0:
        raise ValueError("h must hold at least one example")
    return _float64("h", h)


def logits(W: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """The logits ``z = W h`` (shape (K,) or (n, K)), checked finite.

    Args:
        W: the classifier, shape (K, d), K >= 2.
        h: one feature (d,) or a batch (n, d).

    Returns:
        the float64 logits ``z``, shape (K,) or (n, K).

    Raises:
        ValueError: if the shapes do not match or the logits are not finite.
    """
    W = _classifier(W)
    h = _features(h, W.shape[1])
    z = h @ W.T
    if not torch.isfinite(z).all():
        raise ValueError("logits W h must be finite; W and h overflow float64")
    return z


def probabilities(W: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``p = softmax(W h)`` over the class axis (shape (K,) or (n, K)).

    Args:
        W: the classifier, shape (K, d), K >= 2.
        h: one feature (d,) or a batch (n, d).

    Returns:
        the float64 probabilities ``p``, shape (K,) or (n, K), each row summing to 1.
    """
    return torch.softmax(logits(W, h), dim=-1)


def covariance(p: torch.Tensor) -> torch.Tensor:
    r""":math:`P(p) = \operatorname{diag}(p) - p p^\top`: the one-hot label's covariance and the softmax Jacobian.

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

    The unique minimiser of ``||W + 1 v^T||_F`` over ``v``.

    Args:
        W: the classifier, shape (K, d), K >= 2.

    Returns:
        the centred classifier ``W_c`` (K, d), whose rows sum to zero.
    """
    W = _classifier(W)
    return W - W.mean(dim=0, keepdim=True)


def mean_row(W: torch.Tensor) -> torch.Tensor:
    """The mean row ``wbar = W^T 1 / K`` (shape (d,)): the function-null part of ``W``.

    Args:
        W: the classifier, shape (K, d), K >= 2.

    Returns:
        ``wbar``, shape (d,).
    """
    return _classifier(W).mean(dim=0)


def mean_row_share(W: torch.Tensor) -> torch.Tensor:
    """``K ||wbar||^2 / ||W||_F^2``: the share of ``||W||_F^2`` that centring removes.

    ``||W||_F^2 = ||W_c||_F^2 + K ||wbar||^2`` (orthogonal split), so ``B_raw / B_quot =
    1 / (1 - share)`` for every feature.

    Args:
        W: the classifier, shape (K, d), K >= 2, not zero.

    Returns:
        the share, a scalar tensor in ``[0, 1]``.

    Raises:
        ValueError: if ``W`` is zero.
    """
    W = _classifier(W)
    total = (W**2).sum()
    if total == 0:
        raise ValueError("W must be nonzero to have a mean-row share")
    return W.shape[0] * (W.mean(dim=0) ** 2).sum() / total


def common_row_shift(W: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The gauge transform ``G_v(W) = W + 1 v^T``: adds ``v`` to every row (*The softmax gauge*).

    Args:
        W: the classifier, shape (K, d), K >= 2.
        v: the shift vector, shape (d,).

    Returns:
        the shifted classifier ``W + 1 v^T`` (K, d), the same predictor as ``W``.

    Raises:
        ValueError: if ``v`` does not have shape (d,).
    """
    W = _classifier(W)
    v = _shift_vector(v, W.shape[1])
    return W + v.unsqueeze(0)


def shift_for_norm_factor(W: torch.Tensor, direction: torch.Tensor, factor: float) -> torch.Tensor:
    """The shift ``v = t u`` (``u`` the unit ``direction``, ``t >= 0``) with ``||W + 1 v^T||_F^2 = factor * ||W||_F^2``.

    ``||W + t 1 u^T||_F^2 = ||W||_F^2 + 2 t (1^T W u) + K t^2`` is quadratic in ``t``;
    this returns its nonnegative root. For a centred ``W`` the cross term vanishes and
    ``t = sqrt((factor - 1) ||W||_F^2 / K)``, so ``B_raw`` of the shifted classifier is
    ``factor`` times ``B_quot`` while ``p``, ``B_quot`` and ``kappa_exact`` do not move.

    Args:
        W: the classifier, shape (K, d), K >= 2.
        direction: the direction of the shift, a nonzero vector of shape (d,) (normalised here).
        factor: the wanted ratio ``||W + 1 v^T||_F^2 / ||W||_F^2``, ``>= 1``.

    Returns:
        the shift ``v = t u``, shape (d,).

    Raises:
        ValueError: if ``direction`` is zero or of the wrong shape, or ``factor < 1``.
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


def _shift_vector(v: torch.Tensor, d: int) -> torch.Tensor:
    if not isinstance(v, torch.Tensor):
        raise TypeError(f"v must be a torch.Tensor of shape ({d},), got {type(v).__name__}")
    if v.shape != (d,):
        raise ValueError(f"v must have shape ({d},) to match W's d = {d}, got {tuple(v.shape)}")
    return _float64("v", v)


def max_probability_gap(W: torch.Tensor, W_other: torch.Tensor, h: torch.Tensor, tol: float) -> float:
    """Largest ``|p(W) - p(W_other)|`` on features ``h``; raises if it exceeds ``tol`` (> 0).

    The functional check behind a gauge comparison: two classifiers are compared as
    representatives of one predictor only if their probabilities agree to ``tol``.

    Args:
        W: a classifier, shape (K, d), K >= 2.
        W_other: another classifier of the same shape.
        h: one feature (d,) or a batch (n, d).
        tol: the largest gap allowed (positive).

    Returns:
        ``max |p(W) - p(W_other)|`` over classes and examples, a float ``<= tol``.

    Raises:
        ValueError: if the shapes differ or the gap exceeds ``tol``.
    """
    tol = positive("tol", tol)
    W, W_other = _classifier(W), _classifier(W_other)
    if W.shape != W_other.shape:
        raise ValueError(f"W and W_other must have the same shape, got {tuple(W.shape)} and {tuple(W_other.shape)}")
    with torch.no_grad():
        gap = float((probabilities(W, h) - probabilities(W_other, h)).abs().max())
    if gap > tol:
        raise ValueError(
            f"W and W_other are not the same predictor on h: probability gap {gap:.3g} exceeds tol {tol:.3g}"
        )
    return gap


def row_shift_symmetry(v: torch.Tensor, name: str = "weight") -> Symmetry:
    """The common-row shift ``W -> W + 1 v^T`` of ``params[name]``, audited on the outputs as given.

    The transform is :func:`lossgeom.symmetries.softmax_row_shift` (where every symmetry
    of the book lives) with ``invariant=False``: the audit compares the outputs
    themselves, which suits a forward that returns probabilities or log-probabilities.
    Use ``softmax_row_shift`` directly to compare logits centred over classes or to shift
    a bias as well.

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
        raise ValueError(
            f"v must be a 1-D torch.Tensor of shape (d,), got "
            f"{tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__}"
        )
    v = _float64("v", v)
    shift = softmax_row_shift(name, v, invariant=False)
    return Symmetry(f"common-row shift W -> W + 1 v^T on {name!r}, |v| = {float(v.norm()):.4g}", shift.transform)

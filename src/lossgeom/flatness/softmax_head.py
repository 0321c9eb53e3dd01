"""Last-layer relative flatness of a softmax classifier: ``kappa_exact``, ``B_raw``, ``B_quot``.

A classifier ``W`` (K x d) on features ``h`` with ``p = softmax(W h)``; the three measures
satisfy ``kappa_exact <= B_quot <= B_raw``:

- :func:`kappa_exact`: ``||h||^2 Tr(W^T P(p) W)``, the relative flatness of
  ``petzka2021relative`` restricted to the last layer; invariant under
  ``W -> W + 1 v^T``.
- :func:`b_raw`: ``||W||_F^2 ||h||^2 (1 - ||p||^2)``, the operational upper bound used
  for certificates (``walter2026flatness``) and as a regulariser (``han2025flatness``);
  not invariant, unbounded along the orbit.
- :func:`b_quot`: ``||W_c||_F^2 ||h||^2 (1 - ||p||^2)``, ``B_raw`` at the centred
  representative, its orbit minimum (``opazo2026flatness``).

The operations that move a classifier along its orbit (centring, mean rows, common-row
shifts, the covariance ``P(p) = Diag(p) - p p^T``) live in
:mod:`lossgeom.flatness.softmax_gauge`; this module only measures. All functions take and
return float64 torch tensors and are differentiable in ``W`` and ``h``; ``h`` may be one
feature ``(d,)`` or a batch ``(n, d)``; with a batch, ``reduction="mean"`` averages over
examples and ``reduction="none"`` returns ``(n,)``. Citation keys refer to the book's
``references.bib``.
"""

from __future__ import annotations

import torch

from lossgeom.flatness.softmax_gauge import (
    _features,
    centre,
    probabilities,
)
from lossgeom.symmetries.layers import _classifier

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


def _prepare(W: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    W = _classifier(W)
    h = _features(h, W.shape[1])
    return W, h, probabilities(W, h)


# ----------------------------------------------------------------- last-layer relative flatness


def kappa_exact(W: torch.Tensor, h: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """The last-layer relative flatness ``kappa_exact = ||h||^2 Tr(W^T P(p) W)``.

    The trace of the cross-entropy Hessian in ``W`` (``P(p) kron h h^T``) contracted with
    ``W``, after ``petzka2021relative``.
    Computed as ``||h||^2 sum_k p_k ||w_k - W^T p||^2``, i.e. ``||h||^2`` times the
    variance of the row ``w_C`` under ``C ~ Cat(p)`` (no cancellation), on the centred
    ``W_c`` (``P = Pi P Pi``); invariant under common-row shifts.

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


def b_raw(W: torch.Tensor, h: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """The operational proxy ``B_raw = ||W||_F^2 ||h||^2 (1 - ||p||^2)``.

    An upper bound of :func:`kappa_exact` (``Tr(W^T P W) <= ||W||_F^2 Tr P``), used for
    curvature certificates (``walter2026flatness``) and as a flatness regulariser
    (``han2025flatness``). Not invariant under common-row shifts: it grows without bound
    along the orbit ``W + 1 v^T``.

    Args:
        W: the classifier, shape (K, d).
        h: one feature (d,) or a batch (n, d).
        reduction: ``"mean"`` or ``"none"``.

    Returns:
        A scalar tensor, or (n,) with ``reduction="none"``.
    """
    W, h, p = _prepare(W, h)
    return _reduce((W**2).sum() * _norm_sq(h) * _trace_cov(p), reduction)


def b_quot(W: torch.Tensor, h: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """The quotient proxy ``B_quot = ||W_c||_F^2 ||h||^2 (1 - ||p||^2)``: ``B_raw`` at ``W_c``.

    Equal to ``inf_v B_raw(W + 1 v^T, h)`` (the orbit minimum, ``opazo2026flatness``)
    and invariant under common-row shifts; ``kappa_exact <= B_quot`` since
    ``Tr(W_c^T P W_c) <= ||W_c||_F^2 Tr P``.

    Args:
        W: the classifier, shape (K, d).
        h: one feature (d,) or a batch (n, d).
        reduction: ``"mean"`` or ``"none"``.

    Returns:
        A scalar tensor, or (n,) with ``reduction="none"``.
    """
    W, h, p = _prepare(W, h)
    return _reduce((centre(W) ** 2).sum() * _norm_sq(h) * _trace_cov(p), reduction)

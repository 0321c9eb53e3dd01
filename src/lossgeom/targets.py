"""The targets a loss module reads: shapes, class indices, probabilities and masked entries.

Shared by :class:`lossgeom.risk.EmpiricalRisk` and :func:`lossgeom.models.loss_closure`: every
target is checked to have exactly the shape the loss expects (nothing broadcasts), class
indices in range, soft targets that are probabilities, and no masked (``ignore_index``)
entries, each refused with the argument named.
"""

from __future__ import annotations

import torch
from torch import nn


def check_class_probabilities(y: torch.Tensor, where: str = "y") -> None:
    """Refuse soft cross-entropy targets that are not probabilities along the class axis 1.

    The output Hessian of the cross-entropy with targets ``y`` is
    ``(sum_c y_c) (diag p - p p^T)``; the GGN and the true Fisher use ``diag p - p p^T``,
    so a row that does not sum to one (or has a negative entry) would give a silently
    wrong matrix. The tolerance is ``max(1e-6, 100 eps)`` of the targets' dtype.

    Args:
        y: the soft targets, a floating tensor with the classes on axis 1.
        where: the name of the targets, used in error messages.

    Raises:
        ValueError: on a negative or non-finite entry, or a row whose sum is not 1.
    """
    if not bool(torch.isfinite(y).all()):
        raise ValueError(f"{where} (class probabilities) must be finite")
    if y.numel() == 0:
        return
    if float(y.min()) < 0:
        raise ValueError(f"{where} (class probabilities) must be non-negative, got a minimum of {float(y.min()):.3g}")
    tol = max(1e-6, 100 * torch.finfo(y.dtype).eps)
    worst = float((y.sum(dim=1) - 1).abs().max())
    if worst > tol:
        raise ValueError(
            f"{where} (class probabilities) must sum to 1 over the class axis 1 (within {tol:.0e}); "
            f"a row is off by {worst:.3g} (the cross-entropy's curvature scales with the row sum)"
        )


def check_targets(loss: nn.Module, out: torch.Tensor, y: torch.Tensor, where: str = "y") -> int:
    """Check targets against the outputs; return the number of loss terms of the batch.

    The squared error needs ``y.shape == out.shape`` exactly (broadcasting would silently
    change the loss). The cross-entropy needs integer class indices of shape
    ``out.shape[:1] + out.shape[2:]`` with values in ``[0, C)``, ``C = out.shape[1]``, or
    class probabilities (soft targets) of the outputs' shape and dtype, non-negative and
    summing to one over axis 1 (see :func:`check_class_probabilities`).

    Args:
        loss: the loss module, ``nn.MSELoss`` or (otherwise) the cross-entropy.
        out: the batch's outputs (``(N, C)`` or ``(N, C, d_1, ...)`` logits for the cross-entropy).
        y: the batch's targets.
        where: the name of the targets, used in error messages.

    Returns:
        The number of loss terms ``t_b``: ``out.numel()`` for the squared error, the number of
        positions (``out.numel() // C``) for the cross-entropy.

    Raises:
        ValueError: on targets of the wrong shape or dtype, class indices outside ``[0, C)``,
            soft targets that are not probabilities, or cross-entropy outputs with fewer than 2 axes.
    """
    if isinstance(loss, nn.MSELoss):
        if y.shape != out.shape:
            raise ValueError(
                f"for the squared error (loss='mse') {where} must have the output's shape "
                f"{tuple(out.shape)}, got {tuple(y.shape)} (it would broadcast)"
            )
        if y.dtype != out.dtype:
            raise ValueError(f"{where} must have the outputs' dtype {out.dtype}, got {y.dtype}")
        return out.numel()
    if out.ndim < 2:
        raise ValueError(
            f"for the cross-entropy the outputs must be (N, C) or (N, C, d1, ...) logits, got shape {tuple(out.shape)}"
        )
    expected = out.shape[:1] + out.shape[2:]
    if torch.is_floating_point(y):
        # class probabilities (soft targets), as torch's cross_entropy takes them
        if y.shape != out.shape:
            raise ValueError(
                f"for the cross-entropy {where} must hold integer class indices of shape "
                f"{tuple(expected)} or class probabilities of the outputs' shape {tuple(out.shape)}, "
                f"got a floating tensor of shape {tuple(y.shape)}"
            )
        if y.dtype != out.dtype:
            raise ValueError(f"{where} (class probabilities) must have the outputs' dtype {out.dtype}, got {y.dtype}")
        check_class_probabilities(y, where)
        return out.numel() // out.shape[1]
    if y.shape != expected:
        raise ValueError(
            f"for the cross-entropy with outputs of shape {tuple(out.shape)} (classes on axis 1) "
            f"{where} must have shape {tuple(expected)}, got {tuple(y.shape)}"
        )
    n_classes = out.shape[1]
    ignored = getattr(loss, "ignore_index", None)
    if ignored is not None and bool((y == ignored).any()):
        raise ValueError(
            f"{where} holds the loss's ignore_index {ignored} at {int((y == ignored).sum())} entries (masked "
            "targets, e.g. padding): ignored targets are not supported by the curvature (it would count them); "
            "drop them from the data"
        )
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= n_classes):
        raise ValueError(
            f"{where} must hold class indices in [0, {n_classes}), got values in [{int(y.min())}, {int(y.max())}]"
        )
    return y.numel()


__all__ = ["check_class_probabilities", "check_targets"]

"""Dense references for small models: gradient, Hessian, GGN and Fisher as full matrices.

Each reference is built by the simplest computation that is correct on every model the
tests use (MLPs, CNNs, LayerNorm, ``nn.LSTM``, ``nn.TransformerEncoderLayer``, sequence
taggers with ``(N, C, T)`` logits), so that the operators of
:mod:`lossgeom.curvature.hessian`, :mod:`~lossgeom.curvature.ggn` and
:mod:`~lossgeom.curvature.fisher` can be checked against it (as curvlinops checks its
operators against ``functorch_hessian``-style dense references):

- :func:`closure_hessian` (a closure ``loss_fn(params)``) and :func:`dense_hessian` (a
  model, a loss module and data; likewise :func:`closure_gradient` and
  :func:`dense_gradient`): column ``j`` is ``H e_j``, by reverse-over-reverse autograd (a
  backward pass through the graph of the gradient, batched over columns). Not
  ``torch.func.hessian``: its nested reverse transforms return a wrong, asymmetric matrix
  for ``nn.LayerNorm`` in torch 2.x (about 10% off against finite differences).
- :func:`dense_ggn`: ``sum J^T Lambda J`` from the full output Jacobian and the closed-form
  output Hessian ``Lambda`` of the loss.
- :func:`dense_fisher`: one example at a time, by autograd on that example alone.
- :func:`closure_taylor_remainders`: the first- and second-order Taylor remainders along a
  direction, whose log-log slopes 2 and 3 check a gradient and an HVP (pymanopt's check).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from numpy.typing import ArrayLike
from torch import nn

from lossgeom._validation import finite_array
from lossgeom.curvature.base import MAX_BLOCK_COLUMNS, OperatorLike, quiet_torch_warnings
from lossgeom.curvature.fisher import check_kind, fisher_scores, output_jacobian
from lossgeom.curvature.hessian import HessianOperator
from lossgeom.risk import EmpiricalRisk, closure_risk_pieces, math_attention
from lossgeom.types import Data, LossFn, Params


def _closure_scalars(loss_fn: LossFn, params: Params) -> tuple[torch.Tensor, list[Callable]]:
    """``(point, [scalar])`` of the closure form."""
    point, _, scalar = closure_risk_pieces(loss_fn, params)
    return point, [scalar]


def _risk_scalars(risk: EmpiricalRisk) -> tuple[torch.Tensor, list[Callable]]:
    """``(point, [scalar_b])``: the risk's point and its batches' shares of the loss."""
    return risk.point, [lambda v, b=b: risk.batch_value(v, b) for b in range(risk.n_batches)]


def _gradient(point: torch.Tensor, scalars: Sequence[Callable[[torch.Tensor], torch.Tensor]]) -> torch.Tensor:
    """``sum_b grad scalar_b(point)``."""
    total = torch.zeros_like(point)
    with math_attention(), quiet_torch_warnings():
        for scalar in scalars:
            total += torch.func.grad(scalar)(point)
    return total.detach()


def _hessian(point: torch.Tensor, scalars: Sequence[Callable[[torch.Tensor], torch.Tensor]]) -> torch.Tensor:
    """``sum_b d^2 scalar_b``: column ``j`` is ``H e_j`` by a backward pass through the gradient's graph."""
    n = point.numel()
    hessian = torch.zeros(n, n, dtype=point.dtype, device=point.device)
    eye = torch.eye(n, dtype=point.dtype, device=point.device)
    for scalar in scalars:
        leaf = point.clone().requires_grad_(True)
        with torch.enable_grad(), math_attention(), quiet_torch_warnings():
            value = scalar(leaf)
            if not value.requires_grad:
                continue
            (grad,) = torch.autograd.grad(value, leaf, create_graph=True)
            if not grad.requires_grad:
                continue
            for j in range(0, n, MAX_BLOCK_COLUMNS):
                block = eye[j : j + MAX_BLOCK_COLUMNS]
                (rows,) = torch.autograd.grad(
                    grad, leaf, block, retain_graph=True, is_grads_batched=True, materialize_grads=True
                )
                hessian[:, j : j + block.shape[0]] += rows.T
    return hessian.detach()


def closure_gradient(loss_fn: LossFn, params: Params) -> torch.Tensor:
    """The gradient ``dL/d theta`` of a closure as one flat vector (same order as :func:`closure_hessian`).

    Args:
        loss_fn: ``loss_fn(params) -> scalar tensor``.
        params: the point, a dict of tensors (rows follow its order, see
            :func:`lossgeom.parameters.flatten_params`).

    Returns:
        The ``(n,)`` gradient in the parameters' dtype.

    Raises:
        TypeError: if ``loss_fn`` is an ``nn.Module`` or not callable.
        ValueError: if ``params`` is empty or ``loss_fn`` is not a finite scalar at it.
    """
    return _gradient(*_closure_scalars(loss_fn, params))


def closure_hessian(loss_fn: LossFn, params: Params) -> torch.Tensor:
    """The full Hessian ``d^2 L / d theta^2`` of a closure as an ``(n, n)`` tensor in the parameters' dtype.

    Column ``j`` is ``H e_j`` by a backward pass through the graph of the gradient (batched
    over blocks of columns); the matrix is returned as computed, not symmetrised. Rows
    follow the dict's order (see :func:`lossgeom.parameters.flatten_params`).

    Args:
        loss_fn: ``loss_fn(params) -> scalar tensor``.
        params: the point, a dict of tensors.

    Returns:
        The ``(n, n)`` Hessian.

    Raises:
        TypeError: if ``loss_fn`` is an ``nn.Module`` or not callable.
        ValueError: if ``params`` is empty or ``loss_fn`` does not return a finite scalar at it.
    """
    return _hessian(*_closure_scalars(loss_fn, params))


def dense_gradient(model: nn.Module, loss: nn.Module, data: Data, *, params: Params | None = None) -> torch.Tensor:
    """The gradient of a model's empirical risk as one flat vector (same order as :func:`dense_hessian`).

    ``dL/d theta`` with ``L = sum_b w_b loss(f(x_b; theta), y_b)`` (see
    :class:`~lossgeom.risk.EmpiricalRisk`). For a closure use :func:`closure_gradient`.

    Args:
        model: the network.
        loss: ``nn.CrossEntropyLoss()`` or ``nn.MSELoss()``.
        data: an ``(x, y)`` pair or an iterable of batches.
        params: the point (``None``: the model's own trainable parameters).

    Returns:
        The ``(n,)`` gradient.

    Raises:
        TypeError, ValueError: as :class:`~lossgeom.risk.EmpiricalRisk`.
    """
    return _gradient(*_risk_scalars(EmpiricalRisk(model, loss, data, params=params)))


def dense_hessian(model: nn.Module, loss: nn.Module, data: Data, *, params: Params | None = None) -> torch.Tensor:
    """The full Hessian ``d^2 L / d theta^2`` of a model's empirical risk as an ``(n, n)`` tensor.

    Summed over the batches of ``data``, by the computation of :func:`closure_hessian`
    (column ``j`` is ``H e_j`` by reverse-over-reverse autograd, not symmetrised).

    Args:
        model: the network.
        loss: ``nn.CrossEntropyLoss()`` or ``nn.MSELoss()``.
        data: an ``(x, y)`` pair or an iterable of batches.
        params: the point (``None``: the model's own trainable parameters).

    Returns:
        The ``(n, n)`` Hessian in the parameters' dtype.

    Raises:
        TypeError, ValueError: as :class:`~lossgeom.risk.EmpiricalRisk`.
    """
    return _hessian(*_risk_scalars(EmpiricalRisk(model, loss, data, params=params)))


def dense_ggn(model: nn.Module, loss: nn.Module, data: Data, *, params: Params | None = None) -> torch.Tensor:
    """Dense reference ``G = sum J^T Lambda J`` from the full output Jacobian.

    For the cross-entropy ``Lambda = c (diag p - p p^T)`` at every example and position
    (classes on axis 1), for the squared error ``2 c I``.

    Args:
        model: the network.
        loss: ``nn.CrossEntropyLoss()`` or ``nn.MSELoss()``.
        data: an ``(x, y)`` pair or an iterable of batches.
        params: the point (``None``: the model's own trainable parameters); all four as
            :func:`lossgeom.curvature.ggn.ggn_operator`.

    Returns:
        The ``(n, n)`` GGN.

    Raises:
        TypeError, ValueError: as :class:`~lossgeom.risk.EmpiricalRisk`.
    """
    risk = EmpiricalRisk(model, loss, data, params=params)
    ggn = torch.zeros(risk.n, risk.n, dtype=risk.dtype, device=risk.device)
    for b in range(risk.n_batches):

        def outputs(v: torch.Tensor, b: int = b) -> torch.Tensor:
            return risk.outputs(v, b)

        with torch.no_grad():
            out = outputs(risk.point)
        jac = output_jacobian(outputs, risk.point, out)  # (out.numel(), n)
        c = risk.term_weights[b]
        if isinstance(risk.loss, nn.MSELoss):
            ggn += 2.0 * c * (jac.T @ jac)
            continue
        n_classes = out.shape[1]
        jac_positions = jac.reshape(*out.shape, risk.n).movedim(1, -2).reshape(-1, n_classes, risk.n)
        p = torch.softmax(out.movedim(1, -1).reshape(-1, n_classes), dim=1)
        lam = c * (torch.diag_embed(p) - p[:, :, None] * p[:, None, :])
        ggn += jac_positions.reshape(-1, risk.n).T @ torch.einsum("pcd,pdn->pcn", lam, jac_positions).reshape(
            -1, risk.n
        )
    return ggn.detach()


def dense_fisher(
    model: nn.Module, loss: nn.Module, data: Data, *, params: Params | None = None, kind: str = "empirical"
) -> torch.Tensor:
    """Dense reference of :func:`lossgeom.curvature.fisher_operator`, one example at a time.

    ``kind="empirical"``: ``sum_i a_i g_i g_i^T`` with ``g_i`` the gradient of the loss
    module on example ``i`` alone (its mean over the example's terms under mean
    reduction) and ``a_i`` its share of the risk (``1/N`` for N examples of equal size).
    ``kind="true"`` (cross-entropy): ``sum_positions c sum_c p_c grad log p_c grad log p_c^T``,
    from the Jacobian of the log-probabilities of each example.

    Args:
        model: the network.
        loss: ``nn.CrossEntropyLoss()`` or ``nn.MSELoss()``.
        data: an ``(x, y)`` pair or an iterable of batches.
        params: the point (``None``: the model's own trainable parameters); all four as
            :func:`lossgeom.curvature.fisher.fisher_operator`.
        kind: ``"empirical"`` or ``"true"``.

    Returns:
        The ``(n, n)`` Fisher.

    Raises:
        ValueError: on an unknown ``kind``, ``kind="true"`` with the squared error, or as
            :class:`~lossgeom.risk.EmpiricalRisk`.
    """
    check_kind(kind)
    risk = EmpiricalRisk(model, loss, data, params=params)
    if kind == "true" and not isinstance(risk.loss, nn.CrossEntropyLoss):
        raise ValueError(
            "kind='true' is implemented for the cross-entropy; for a Gaussian likelihood "
            "(mse) the true Fisher is proportional to the GGN: use dense_ggn"
        )
    fisher = torch.zeros(risk.n, risk.n, dtype=risk.dtype, device=risk.device)
    reduction = risk.loss.reduction
    for b, (x_b, y_b) in enumerate(risk.batches):
        shares = risk.example_shares(b)
        for i in range(x_b.shape[0]):
            leaf = risk.point.clone().requires_grad_(True)
            with torch.enable_grad(), math_attention(), quiet_torch_warnings():
                out = torch.func.functional_call(risk.model, risk.unflatten(leaf), (x_b[i : i + 1],))
                if kind == "empirical":
                    if isinstance(risk.loss, nn.MSELoss):
                        squares = (out - y_b[i : i + 1]) ** 2
                        example_loss = squares.mean() if reduction == "mean" else squares.sum()
                    else:
                        example_loss = nn.functional.cross_entropy(out, y_b[i : i + 1], reduction=reduction)
                    (g,) = torch.autograd.grad(example_loss, leaf)
                    fisher += shares[i] * torch.outer(g, g)
                    continue
                log_p = torch.log_softmax(out, dim=1).movedim(1, -1).reshape(-1)  # (positions * C,)
                rows = torch.eye(log_p.numel(), dtype=log_p.dtype, device=log_p.device)
                (jac,) = torch.autograd.grad(log_p, leaf, rows, is_grads_batched=True)
            p = log_p.detach().exp()
            fisher += risk.term_weights[b] * (jac.T * p) @ jac
    return fisher.detach()


def closure_taylor_remainders(
    loss_fn: LossFn, params: Params, direction: ArrayLike, steps: ArrayLike
) -> tuple[np.ndarray, np.ndarray]:
    """Remainders of the first- and second-order Taylor models along ``direction``.

    ``r1(t) = abs(L(theta + t d) - L - t g.d)`` (order t^2) and
    ``r2(t) = abs(L(theta + t d) - L - t g.d - t^2/2 d.H d)`` (order t^3, ``H d`` one HVP):
    the log-log slopes 2 and 3 check the gradient and the HVP (the Taylor check of
    Absil, Mahony and Sepulchre 2008, section 4.8, as pymanopt's ``check_gradient``).

    Args:
        loss_fn: the closure ``loss_fn(params) -> scalar``.
        params: the point.
        direction: the direction ``d``, one entry per parameter (flattened order).
        steps: the step sizes ``t``.

    Returns:
        ``(r1, r2)``, one value per step each.

    Raises:
        ValueError: if ``direction`` does not have one entry per parameter.
    """
    op = HessianOperator.from_closure(loss_fn, params)
    flat, _, scalar = closure_risk_pieces(loss_fn, params)
    d = torch.as_tensor(finite_array("direction", direction, ndim=1))
    if d.numel() != flat.numel():
        raise ValueError(f"direction must have {flat.numel()} entries, got {d.numel()}")
    steps = finite_array("steps", steps, ndim=1)
    d_native = d.to(flat.dtype)
    base = float(scalar(flat))
    slope = float(torch.as_tensor(op.gradient()) @ d)
    curv = float(d @ torch.as_tensor(op.matvec(d.numpy())))
    with torch.no_grad():
        values = np.array([float(scalar(flat + t * d_native)) for t in steps])
    r1 = np.abs(values - base - steps * slope)
    r2 = np.abs(values - base - steps * slope - 0.5 * steps**2 * curv)
    return r1, r2


def relative_operator_difference(reference: OperatorLike, other: OperatorLike, probes: int | np.ndarray) -> float:
    """``max |(A - B) V| / max |A V|`` over the columns of ``probes`` (a Freivalds-type check).

    Compares two symmetric operators (arrays, ``LinearOperator``s, or anything with ``@``)
    on a few random vectors instead of forming them: if ``A != B`` a random ``V`` sees the
    difference with probability one (Freivalds' check). It compares a matrix-free
    operator with a dense reference or with another library's operator (curvlinops).

    Args:
        reference: the operator ``A`` the difference is measured against.
        other: the operator ``B``.
        probes: an ``(n, m)`` array of probe vectors (a 1-D array is one probe).

    Returns:
        The relative difference ``max |(A - B) V| / max |A V|``, a float >= 0.

    Raises:
        ValueError: if ``probes`` is not finite, has the wrong number of rows, or
            ``A V`` is zero (no scale to compare with).
    """
    probes = finite_array("probes", probes)
    if probes.ndim == 1:
        probes = probes[:, None]
    if probes.ndim != 2:
        raise ValueError(f"probes must be an (n, m) array, got shape {probes.shape}")
    n = np.shape(reference)[0] if hasattr(reference, "shape") else None
    if n is not None and probes.shape[0] != n:
        raise ValueError(f"probes must have {n} rows (the operator's size), got {probes.shape[0]}")
    a_v = np.asarray(reference @ probes, dtype=np.float64)
    b_v = np.asarray(other @ probes, dtype=np.float64)
    scale = np.abs(a_v).max()
    if scale == 0:
        raise ValueError("reference @ probes is zero: there is no scale to compare the difference with")
    return float(np.abs(a_v - b_v).max() / scale)


def dense_fisher_factor(model: nn.Module, loss: nn.Module, data: Data, *, params: Params | None = None) -> torch.Tensor:
    """A factor ``S`` of the true Fisher of a cross-entropy risk, ``F = S^T S`` (equal to the GGN).

    One row per example, position and class, ``sqrt(c p_c) J^T (e_c - p)`` (``c`` the risk's
    weight of the position). The singular values of ``S`` are the square roots of the
    eigenvalues of ``F``, and an SVD finds them to about ``eps * sigma_max``: eigenvalues of
    ``F`` are then resolved down to about ``eps^2 lambda_max``, where a dense eigensolver on
    ``F`` itself stops at about ``eps lambda_max``.

    Args:
        model: the network.
        loss: ``nn.CrossEntropyLoss()`` (the only loss accepted).
        data: an ``(x, y)`` pair or an iterable of batches.
        params: the point (``None``: the model's own trainable parameters); all four as
            :func:`lossgeom.curvature.ggn.ggn_operator`.

    Returns:
        The ``(rows, n)`` factor ``S``.

    Raises:
        ValueError: if the loss is not the cross-entropy, or as
            :class:`~lossgeom.risk.EmpiricalRisk`.
    """
    risk = EmpiricalRisk(model, loss, data, params=params)
    if not isinstance(risk.loss, nn.CrossEntropyLoss):
        raise ValueError(
            "dense_fisher_factor is implemented for the cross-entropy (the true Fisher of "
            "a softmax likelihood); got loss " + type(risk.loss).__name__
        )
    return fisher_scores(risk, "true")


__all__ = [
    "closure_gradient",
    "closure_hessian",
    "dense_fisher",
    "dense_fisher_factor",
    "dense_ggn",
    "dense_gradient",
    "dense_hessian",
    "relative_operator_difference",
    "closure_taylor_remainders",
]

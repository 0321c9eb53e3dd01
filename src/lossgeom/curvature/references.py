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

import functools
from collections.abc import Callable, Sequence

import numpy as np
import torch
from numpy.typing import ArrayLike
from torch import nn

from lossgeom._validation import finite_array
from lossgeom.batches import ModelBatch
from lossgeom.curvature.base import MAX_BLOCK_COLUMNS, OperatorLike, quiet_torch_warnings
from lossgeom.curvature.fisher import check_kind, fisher_scores, output_jacobian
from lossgeom.curvature.hessian import HessianOperator
from lossgeom.losses import check_likelihood_targets, likelihood
from lossgeom.risk import EmpiricalRisk, closure_risk_pieces, math_attention
from lossgeom.types import Data, LossFn, Output, Params


def _closure_scalars(loss_fn: LossFn, params: Params) -> tuple[torch.Tensor, list[Callable]]:
    """``(point, [scalar])`` of the closure form."""
    point, _, scalar = closure_risk_pieces(loss_fn, params)
    return point, [scalar]


def _risk_scalars(risk: EmpiricalRisk) -> tuple[torch.Tensor, list[Callable]]:
    """``(point, [scalar_b])``: the risk's point and its batches' shares of the loss."""
    return risk.point, [functools.partial(risk.batch_value, batch=batch) for batch in risk.batches()]


def _dense_output_hessian(risk: EmpiricalRisk, out: torch.Tensor, batch: ModelBatch) -> torch.Tensor:
    """``Lambda_b`` as an ``(E, E)`` matrix: ``torch.autograd.functional.hessian`` of ``w_b loss`` on the outputs."""

    def weighted(o: torch.Tensor) -> torch.Tensor:
        return risk.loss(o.reshape(out.shape), batch.y) * batch.weight

    return torch.autograd.functional.hessian(weighted, out.detach().reshape(-1))


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
                hessian[:, j : j + block.shape[0]] += _columns(grad, leaf, block).T
    return hessian.detach()


def _columns(grad: torch.Tensor, leaf: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
    """``H e_j`` for the rows ``e_j`` of ``block``: one batched backward pass, or one per row.

    Torch's batched double backward fails on some layers (``nn.GroupNorm``); the rows are
    then taken one backward pass at a time, the same derivative.
    """
    try:
        (rows,) = torch.autograd.grad(
            grad, leaf, block, retain_graph=True, is_grads_batched=True, materialize_grads=True
        )
        return rows
    except RuntimeError:
        return torch.stack(
            [torch.autograd.grad(grad, leaf, e, retain_graph=True, materialize_grads=True)[0] for e in block]
        )


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


def dense_gradient(
    model: nn.Module, loss: nn.Module, data: Data, *, params: Params | None = None, output: Output = None
) -> torch.Tensor:
    """The gradient of a model's empirical risk as one flat vector (same order as :func:`dense_hessian`).

    ``dL/d theta`` with ``L = sum_b w_b loss(f(x_b; theta), y_b)`` (see
    :class:`~lossgeom.risk.EmpiricalRisk`). For a closure use :func:`closure_gradient`.

    Args:
        model: the network.
        loss: the loss module (called for every value and derivative; see :mod:`lossgeom.losses`).
        data: one batch or an iterable of batches (see :mod:`lossgeom.batches`).
        params: the point (``None``: the model's own trainable parameters).
        output: selects the tensor of outputs from what the model returns (see :mod:`lossgeom.outputs`).

    Returns:
        The ``(n,)`` gradient.

    Raises:
        TypeError, ValueError: as :class:`~lossgeom.risk.EmpiricalRisk`.
    """
    return _gradient(*_risk_scalars(EmpiricalRisk(model, loss, data, params=params, output=output)))


def dense_hessian(
    model: nn.Module, loss: nn.Module, data: Data, *, params: Params | None = None, output: Output = None
) -> torch.Tensor:
    """The full Hessian ``d^2 L / d theta^2`` of a model's empirical risk as an ``(n, n)`` tensor.

    Summed over the batches of ``data``, by the computation of :func:`closure_hessian`
    (column ``j`` is ``H e_j`` by reverse-over-reverse autograd, not symmetrised).

    Args:
        model: the network.
        loss: the loss module (called for every value and derivative; see :mod:`lossgeom.losses`).
        data: one batch or an iterable of batches (see :mod:`lossgeom.batches`).
        params: the point (``None``: the model's own trainable parameters).
        output: selects the tensor of outputs from what the model returns (see :mod:`lossgeom.outputs`).

    Returns:
        The ``(n, n)`` Hessian in the parameters' dtype.

    Raises:
        TypeError, ValueError: as :class:`~lossgeom.risk.EmpiricalRisk`.
    """
    return _hessian(*_risk_scalars(EmpiricalRisk(model, loss, data, params=params, output=output)))


def dense_ggn(
    model: nn.Module, loss: nn.Module, data: Data, *, params: Params | None = None, output: Output = None
) -> torch.Tensor:
    """Dense reference ``G = sum J^T Lambda J`` from the full output Jacobian.

    ``Lambda`` is the dense Hessian of the weighted loss module with respect to the
    outputs (``torch.autograd.functional.hessian``): for the cross-entropy
    ``c (diag p - p p^T)`` at every kept position, for the squared error ``2 c I``.

    Args:
        model: the network.
        loss: the loss module (called for every value and derivative; see :mod:`lossgeom.losses`).
        data: one batch or an iterable of batches (see :mod:`lossgeom.batches`).
        params: the point (``None``: the model's own trainable parameters); all four as
            :func:`lossgeom.curvature.ggn.ggn_operator`.
        output: selects the tensor of outputs from what the model returns (see :mod:`lossgeom.outputs`).

    Returns:
        The ``(n, n)`` GGN.

    Raises:
        TypeError, ValueError: as :class:`~lossgeom.risk.EmpiricalRisk`.
    """
    risk = EmpiricalRisk(model, loss, data, params=params, output=output)
    ggn = torch.zeros(risk.n, risk.n, dtype=risk.dtype, device=risk.device)
    for batch in risk.batches():

        def outputs(v: torch.Tensor, batch: ModelBatch = batch) -> torch.Tensor:
            return risk.outputs(v, batch)

        with torch.no_grad():
            out = outputs(risk.point)
        jac = output_jacobian(outputs, risk.point, out)  # (out.numel(), n)
        ggn += jac.T @ _dense_output_hessian(risk, out, batch) @ jac
    return ggn.detach()


def dense_fisher(
    model: nn.Module,
    loss: nn.Module,
    data: Data,
    *,
    params: Params | None = None,
    output: Output = None,
    kind: str = "empirical",
) -> torch.Tensor:
    """Dense reference of :func:`lossgeom.curvature.fisher_operator`, one example at a time.

    ``kind="empirical"``: ``sum_i a_i g_i g_i^T`` with ``g_i`` the gradient of the loss
    module on example ``i`` alone (its mean over the example's terms under mean
    reduction) and ``a_i`` its share of the risk (``1/N`` for N examples of equal size).
    ``kind="true"``: ``J^T M J`` with ``M`` the Fisher of the likelihood with respect to
    the outputs (see :func:`lossgeom.losses.likelihood`): the dense output Hessian of the
    loss module for a canonical likelihood, ``c diag(exp(out))`` at the kept positions for
    ``nn.NLLLoss`` on log-probabilities.

    Args:
        model: the network.
        loss: the loss module (called for every value and derivative; see :mod:`lossgeom.losses`).
        data: one batch or an iterable of batches (see :mod:`lossgeom.batches`).
        params: the point (``None``: the model's own trainable parameters); all four as
            :func:`lossgeom.curvature.fisher.fisher_operator`.
        output: selects the tensor of outputs from what the model returns (see :mod:`lossgeom.outputs`).
        kind: ``"empirical"`` or ``"true"``.

    Returns:
        The ``(n, n)`` Fisher.

    Raises:
        ValueError: on an unknown ``kind``, ``kind="true"`` for a loss without a known likelihood, or as
            :class:`~lossgeom.risk.EmpiricalRisk`.
    """
    check_kind(kind)
    risk = EmpiricalRisk(model, loss, data, params=params, output=output)
    law = likelihood(risk.loss, "the true Fisher (kind='true')") if kind == "true" else None
    fisher = torch.zeros(risk.n, risk.n, dtype=risk.dtype, device=risk.device)
    for batch in risk.batches():
        if law is not None:

            def outputs(v: torch.Tensor, batch: ModelBatch = batch) -> torch.Tensor:
                return risk.outputs(v, batch)

            with torch.no_grad():
                out = outputs(risk.point)
            check_likelihood_targets(law, risk.loss, out, batch.y)
            jac = output_jacobian(outputs, risk.point, out)
            if law == "canonical":
                metric = _dense_output_hessian(risk, out, batch)
            else:
                kept = (batch.y != risk.loss.ignore_index).unsqueeze(1).expand_as(out)
                c = batch.weight / float(kept[:, 0].sum()) if risk.loss.reduction == "mean" else batch.weight
                metric = torch.diag((c * kept * out.exp()).reshape(-1))
            fisher += jac.T @ metric @ jac
            continue
        shares = risk.example_shares(batch)
        for i in range(batch.n_examples):
            if float(shares[i]) == 0:
                continue  # every target of the example is ignored: no term of the loss
            one = ModelBatch(
                i,
                tuple(_row(a, i) for a in batch.args),
                {k: _row(v, i) for k, v in batch.kwargs.items()},
                batch.y[i : i + 1],
            )
            leaf = risk.point.clone().requires_grad_(True)
            with torch.enable_grad(), math_attention(), quiet_torch_warnings():
                example_loss = risk.loss(risk.outputs(leaf, one), one.y)
                (g,) = torch.autograd.grad(example_loss, leaf)
            fisher += shares[i] * torch.outer(g, g)
    return fisher.detach()


def _row(value: object, i: int) -> object:
    """Example ``i`` of a batch entry (a tensor's row ``i``, kept as a batch of one); other entries as they are."""
    return value[i : i + 1] if isinstance(value, torch.Tensor) and value.ndim else value


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


def dense_fisher_factor(
    model: nn.Module, loss: nn.Module, data: Data, *, params: Params | None = None, output: Output = None
) -> torch.Tensor:
    """A factor ``S`` of the true Fisher of a risk, ``F = S^T S`` (see :func:`lossgeom.curvature.fisher.fisher_scores`).

    For the cross-entropy with class indices, one row per kept position and class,
    ``sqrt(c p_c) J^T (e_c - p)`` (``c`` the risk's weight of the position). The
    singular values of ``S`` are the square roots of the eigenvalues of ``F``, and an SVD
    finds them to about ``eps * sigma_max``: eigenvalues of
    ``F`` are then resolved down to about ``eps^2 lambda_max``, where a dense eigensolver on
    ``F`` itself stops at about ``eps lambda_max``.

    Args:
        model: the network.
        loss: a loss module with a likelihood (see :func:`lossgeom.losses.likelihood`).
        data: one batch or an iterable of batches (see :mod:`lossgeom.batches`).
        params: the point (``None``: the model's own trainable parameters); all four as
            :func:`lossgeom.curvature.ggn.ggn_operator`.
        output: selects the tensor of outputs from what the model returns (see :mod:`lossgeom.outputs`).

    Returns:
        The ``(rows, n)`` factor ``S``.

    Raises:
        ValueError: if the loss has no likelihood the library knows, or as
            :class:`~lossgeom.risk.EmpiricalRisk`.
    """
    return fisher_scores(EmpiricalRisk(model, loss, data, params=params, output=output), "true")


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

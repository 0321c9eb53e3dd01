r"""The sharpness :math:`\lambda_{\max}(H)` at a point and along a training run.

Gradient descent with step :math:`\eta` on the local quadratic model is stable iff
:math:`\eta\, \lambda_{\max} < 2` (Wu, Ma and E 2018; Cohen et al. 2021);
:func:`lambda_max` measures :math:`\lambda_{\max}` of a model's risk by Lanczos with a
residual check, and :func:`closure_sharpness_during_training` records it at chosen steps of a run
of :func:`lossgeom.training.loop.train`. For any other operator (a closure's
``HessianOperator.from_closure(loss_fn, params)``) use :func:`lossgeom.curvature.spectra.top_eigenpairs`
with ``k=1``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import ArrayLike
from torch import nn

from lossgeom._validation import positive_int
from lossgeom.curvature.base import CurvatureOperator
from lossgeom.curvature.hessian import HessianOperator, hessian_operator
from lossgeom.curvature.spectra import EIGENSOLVERS, EigenResult, top_eigenpairs
from lossgeom.training.loop import train
from lossgeom.training.rules import Optimiser
from lossgeom.types import Data, Group, IndexedLoss, LossFn, Output, Params


def _checked_eigenpair(
    operator: CurvatureOperator,
    tol: float = 1e-8,
    seed: int = 0,
    eigensolver: str = "lanczos",
    v0: ArrayLike | None = None,
) -> EigenResult:
    """The top eigenpair of a symmetric operator by Lanczos, its residual checked.

    :func:`~lossgeom.curvature.spectra.top_eigenpairs` (``k = 1``, its default stop on the
    eigenvalue error bound); the residual ``||A v - lambda v||``, computed by one more
    product, must be at most ``10`` times the residual bound the eigensolver stopped with
    plus ``100 * tol * |lambda|``, so that the bound behind the eigenvalue's guarantee is
    confirmed by a product. Shared by :func:`lambda_max` and
    :func:`closure_sharpness_during_training`.

    Args:
        operator: what :func:`~lossgeom.curvature.spectra.top_eigenpairs` takes.
        tol: the relative tolerance on the eigenvalue (see :func:`~lossgeom.curvature.spectra.top_eigenpairs`).
        seed: seed of the start vector.
        eigensolver: ``"lanczos"`` or ``"arpack"`` (``top_eigenpairs``' ``method``).
        v0: a start vector (warm start), or ``None``.

    Returns:
        The :class:`~lossgeom.curvature.spectra.EigenResult`.

    Raises:
        ValueError: if Lanczos returns a pair whose residual is above that check, or as
            :func:`~lossgeom.curvature.spectra.top_eigenpairs`.
    """
    result = top_eigenpairs(operator, k=1, which="largest", tol=tol, seed=seed, method=eigensolver, v0=v0)
    value = float(result.values[0])
    if not result.residuals[0] <= 10 * float(result.residual_bounds[0]) + 100 * tol * max(abs(value), 1e-300):
        raise ValueError(
            f"Lanczos did not converge: residual {result.residuals[0]:.3g} for eigenvalue {value:.6g} (tol {tol:g})"
        )
    return result


def _checked_lambda_max(operator: CurvatureOperator, tol: float = 1e-8, seed: int = 0) -> float:
    """``lambda_max`` of :func:`_checked_eigenpair` (Lanczos, a cold start)."""
    return float(_checked_eigenpair(operator, tol, seed).values[0])


def lambda_max(
    model: nn.Module,
    loss: nn.Module,
    data: Data,
    *,
    params: Params | None = None,
    group: Group = None,
    output: Output = None,
    tol: float = 1e-8,
    seed: int = 0,
    method: str = "auto",
) -> float:
    r"""The sharpness :math:`\lambda_{\max}(H)`: the largest Hessian eigenvalue of a model's risk, by Lanczos.

    :func:`~lossgeom.curvature.spectra.top_eigenpairs` (``k = 1``) on
    :func:`~lossgeom.curvature.hessian.hessian_operator`, stopped once the eigenvalue's
    error bound is at most :math:`\mathrm{tol}\, |\lambda|`; the eigenpair's residual
    :math:`\lVert H v - \lambda v \rVert` is then computed by one more product and checked
    against the residual bound that guarantee rests on.
    Gradient descent with step :math:`\eta` on the local quadratic model is stable iff
    :math:`\eta\, \lambda_{\max} < 2` (Wu, Ma and E 2018; Cohen et al. 2021). For a closure
    ``loss_fn(params)`` use :func:`closure_lambda_max`.

    A linear model :math:`f(x) = w^\top x` under the summed squared error has
    :math:`H = 2 X^\top X`; with :math:`X = \operatorname{diag}(1, 2, 3)` its largest
    eigenvalue is :math:`2 \cdot 3^2 = 18`:

    >>> import torch
    >>> from torch import nn
    >>> from lossgeom.curvature import lambda_max
    >>> model = nn.Linear(3, 1, bias=False).double()
    >>> x = torch.diag(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    >>> y = -torch.ones(3, 1, dtype=torch.float64)
    >>> round(lambda_max(model, nn.MSELoss(reduction="sum"), (x, y)), 8)
    18.0

    Args:
        model: the network.
        loss: the loss module (called for every value and derivative; see :mod:`lossgeom.losses`).
        data: one batch or an iterable of batches (see :mod:`lossgeom.batches`).
        params: the point (``None``: the model's own trainable parameters).
        output: selects the tensor of outputs from what the model returns (see :mod:`lossgeom.outputs`).
        group: a ``torch.distributed`` process group (``data`` is then this rank's shard;
            every rank returns the same value), or ``None`` for one process.
        tol: the relative tolerance on the eigenvalue (see :func:`~lossgeom.curvature.spectra.top_eigenpairs`).
        seed: seed of the Lanczos start vector.
        method: how an HVP is differentiated (see
            :class:`~lossgeom.curvature.hessian.HessianOperator`).

    Returns:
        ``lambda_max(H)``.

    Raises:
        ValueError: on a bad model/loss/data/``method``/``tol`` (as the functions called),
            fewer than two parameters, or if Lanczos returns a pair whose residual is
            above that check.
    """
    operator = hessian_operator(model, loss, data, params=params, group=group, output=output, method=method)
    return _checked_lambda_max(operator, tol, seed)


def closure_lambda_max(
    loss_fn: LossFn, params: Params, *, tol: float = 1e-8, seed: int = 0, method: str = "auto"
) -> float:
    r""":func:`lambda_max` in the closure form: the largest eigenvalue of the Hessian of ``loss_fn``.

    :func:`~lossgeom.curvature.spectra.top_eigenpairs` (``k = 1``) on
    :class:`~lossgeom.curvature.hessian.HessianOperator` ``(loss_fn, params)``, with the same
    residual check as :func:`lambda_max`.

    Args:
        loss_fn: the loss as a function of a parameter dict, ``loss_fn(params) -> scalar tensor``.
        params: the parameter dict at which the Hessian is taken.
        tol: the relative tolerance on the eigenvalue (positive).
        seed: seed of the Lanczos start vector.
        method: the Hessian-vector product, as for :class:`~lossgeom.curvature.hessian.HessianOperator`.

    Returns:
        ``lambda_max(H)``.

    Raises:
        ValueError: as :func:`lambda_max`.
    """
    return _checked_lambda_max(HessianOperator.from_closure(loss_fn, params, method=method), tol, seed)


@dataclass(frozen=True)
class SharpnessRun:
    """A training run with the sharpness measured at chosen steps.

    Attributes:
        measured_at: the steps at which the sharpness was measured (ascending).
        sharpness: ``lambda_max(H)`` at those steps (before the update of that step; the
            value at ``steps`` is after the last update).
        losses: the loss before each update, ``steps`` values.
        params: the final parameters.
        n_hvp: the products each measurement's eigensolver used (its residual check excluded).
    """

    measured_at: np.ndarray
    sharpness: np.ndarray
    losses: np.ndarray
    params: dict[str, torch.Tensor]
    n_hvp: np.ndarray | None = None


def closure_sharpness_during_training(
    loss_fn: IndexedLoss,
    params: Params,
    optimiser: Optimiser,
    steps: int,
    measure_at: ArrayLike,
    *,
    tol: float = 1e-8,
    seed: int = 0,
    eigensolver: str = "lanczos",
    warm_start: bool = False,
) -> SharpnessRun:
    r"""Train with :func:`lossgeom.training.loop.train` and measure :math:`\lambda_{\max}(H)` at given steps.

    ``loss_fn(params, indices)`` is an indexed loss (:func:`lossgeom.training.loop.indexed_loss`);
    the sharpness is that of the full-batch loss ``loss_fn(params, None)``, the largest
    eigenvalue of ``HessianOperator.from_closure(lambda p: loss_fn(p, None), point)`` by Lanczos with the
    residual check of :func:`lambda_max`. ``measure_at`` lists steps in ``0..steps``; only
    those cost a Lanczos run, so a late phase (the edge of stability, Cohen et al. 2021)
    can be sampled densely and the rest sparsely.

    With ``warm_start=True`` every measurement after the first starts from the previous
    measurement's top eigenvector instead of a random vector: between nearby steps the
    top eigenvector moves little, so it costs fewer products, most of all with
    ``eigensolver="lanczos"``, which tests for convergence after every product. Lanczos
    mixes a seeded random unit vector of equal weight into that start and takes at least
    a few steps (see :mod:`lossgeom.curvature.lanczos`), so that where two eigenvalues
    cross, and the previous top eigenvector is now another eigenvector, the new top one
    is still found. The defaults are Lanczos and cold starts.

    Args:
        loss_fn: the indexed loss.
        params: the starting point.
        optimiser: an update rule of :mod:`lossgeom.training.rules`.
        steps: the number of updates.
        measure_at: the steps at which ``lambda_max`` is measured.
        tol: the relative tolerance on the eigenvalue, as :func:`lambda_max`.
        seed: seed of the Lanczos start vector, as :func:`lambda_max` (when warm-started: of
            the first measurement's start and of the random part of every later one).
        eigensolver: ``"lanczos"`` or ``"arpack"`` (see
            :func:`~lossgeom.curvature.spectra.top_eigenpairs`' ``method``).
        warm_start: whether each measurement starts from the previous one's eigenvector.

    Returns:
        A :class:`SharpnessRun`, with the products of each measurement.

    Raises:
        TypeError: if ``warm_start`` is not a bool.
        ValueError: if ``measure_at`` is empty or holds a step outside ``0..steps``, or
            ``eigensolver`` is unknown.
    """
    steps = positive_int("steps", steps)
    if eigensolver not in EIGENSOLVERS:
        raise ValueError(f"eigensolver must be one of {list(EIGENSOLVERS)}, got {eigensolver!r}")
    if not isinstance(warm_start, (bool, np.bool_)):
        raise TypeError(f"warm_start must be a bool, got {type(warm_start).__name__}")
    wanted = sorted({int(s) for s in np.asarray(measure_at).reshape(-1)})
    if not wanted or wanted[0] < 0 or wanted[-1] > steps:
        raise ValueError(f"measure_at must list steps between 0 and steps = {steps}, got {list(measure_at)}")
    wanted_set, calls, previous, products = set(wanted), [0], [None], []

    def monitor(point: Params) -> float | None:
        step = calls[0]  # train calls the monitor at every step, then once after the last
        calls[0] += 1
        if step not in wanted_set:
            return None
        operator = HessianOperator.from_closure(lambda p: loss_fn(p, None), point)
        result = _checked_eigenpair(operator, tol, seed, eigensolver, previous[0] if warm_start else None)
        previous[0] = result.vectors[:, 0]
        products.append(result.n_hvp)
        return float(result.values[0])

    run = train(loss_fn, params, optimiser, steps, monitor=monitor, monitor_every=1)
    measured = [(s, v) for s, v in run.monitored if v is not None]
    return SharpnessRun(
        np.array([s for s, _ in measured]),
        np.array([v for _, v in measured]),
        run.losses,
        run.params,
        np.array(products, dtype=int),
    )


__all__ = ["SharpnessRun", "closure_lambda_max", "lambda_max", "closure_sharpness_during_training"]

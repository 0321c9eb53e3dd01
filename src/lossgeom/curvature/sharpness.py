"""The sharpness ``lambda_max(H)`` at a point and along a training run.

Gradient descent on the local quadratic model is stable iff ``eta * lambda_max < 2`` (the
chapter "Step size meets curvature"); :func:`sharpness` measures ``lambda_max`` by Lanczos
with a residual check, and :func:`sharpness_during_training` records it at chosen steps of
a run of :func:`lossgeom.optimisers.train`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lossgeom._validation import positive_int
from lossgeom.curvature.operators import hessian_operator
from lossgeom.curvature.references import LossFn
from lossgeom.curvature.spectra import top_eigenpairs
from lossgeom.parameters import Params


def sharpness(loss_fn: LossFn, params: Params, tol: float = 1e-8, seed: int = 0,
              method: str = "reverse-over-reverse") -> float:
    """The sharpness ``lambda_max(H)``: the largest Hessian eigenvalue, by Lanczos.

    :func:`top_eigenpairs` (``k = 1``) on :func:`hessian_operator`; the eigenpair's
    residual ``||H v - lambda v||`` is checked against ``100 * tol * |lambda|``. Gradient
    descent on the local quadratic model is stable iff ``eta * lambda_max < 2`` (chapter
    "Step size meets curvature"). ``method`` is how an HVP is differentiated (see
    :class:`HessianOperator`); reverse-over-reverse is fastest for many products at a point.

    Raises:
        ValueError: on a bad ``loss_fn``/``params``/``method``/``tol`` (as the functions
            called), or if Lanczos returns a pair whose residual is above that check.
    """
    result = top_eigenpairs(hessian_operator(loss_fn, params, method), k=1, which="largest",
                            tol=tol, seed=seed)
    value = float(result.values[0])
    if not result.residuals[0] <= 100 * tol * max(abs(value), 1e-300):
        raise ValueError(f"Lanczos did not converge: residual {result.residuals[0]:.3g} for "
                         f"eigenvalue {value:.6g} (tol {tol:g})")
    return value


@dataclass(frozen=True)
class SharpnessRun:
    """A training run with the sharpness measured at chosen steps.

    Attributes:
        measured_at: the steps at which the sharpness was measured (ascending).
        sharpness: ``lambda_max(H)`` at those steps (before the update of that step; the
            value at ``steps`` is after the last update).
        losses: the loss before each update, ``steps`` values.
        params: the final parameters.
    """

    measured_at: np.ndarray
    sharpness: np.ndarray
    losses: np.ndarray
    params: dict[str, torch.Tensor]


def sharpness_during_training(loss_fn, params: Params, optimiser, steps: int, measure_at,
                              tol: float = 1e-8, seed: int = 0) -> SharpnessRun:
    """Train with :func:`lossgeom.optimisers.train` and measure :func:`sharpness` at given steps.

    ``loss_fn(params, indices)`` is an indexed loss (:func:`lossgeom.optimisers.indexed_loss`);
    the sharpness is that of the full-batch loss ``loss_fn(params, None)``. ``measure_at``
    lists steps in ``0..steps``; only those cost a Lanczos run, so a chapter can sample a
    late phase densely and the rest sparsely (chapter "Step size meets curvature").

    Raises:
        ValueError: if ``measure_at`` is empty or holds a step outside ``0..steps``.
    """
    from lossgeom.optimisers import train

    steps = positive_int("steps", steps)
    wanted = sorted({int(s) for s in np.asarray(measure_at).reshape(-1)})
    if not wanted or wanted[0] < 0 or wanted[-1] > steps:
        raise ValueError(f"measure_at must list steps between 0 and steps = {steps}, got {list(measure_at)}")
    wanted_set, calls = set(wanted), [0]

    def monitor(point):
        step = calls[0]  # train calls the monitor at every step, then once after the last
        calls[0] += 1
        if step not in wanted_set:
            return None
        return sharpness(lambda p: loss_fn(p, None), point, tol=tol, seed=seed)

    run = train(loss_fn, params, optimiser, steps, monitor=monitor, monitor_every=1)
    measured = [(s, v) for s, v in run.monitored if v is not None]
    return SharpnessRun(np.array([s for s, _ in measured]), np.array([v for _, v in measured]),
                        run.losses, run.params)

"""Paths between parameter points: straight lines and trained Bezier curves between solutions.

:func:`linear_point` and :func:`interpolate` evaluate metrics along the straight line,
:func:`loss_barrier` is its height above the chord (Frankle et al. 2020), and
:func:`bezier_point`, :func:`closure_bezier_curve_loss` and :func:`closure_fit_bezier_curve` train a
quadratic Bezier curve between two solutions (Garipov et al. 2018) with the package's
training loop, :func:`lossgeom.training.train`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch
from numpy.typing import ArrayLike

from lossgeom._validation import as_real, finite_array, positive_int
from lossgeom.landscape.directions import _check_params
from lossgeom.training.loop import TrainRun, train
from lossgeom.training.rules import Optimiser
from lossgeom.types import LossFn, Params


def _check_pair(start: Params, end: Params) -> tuple[dict, dict]:
    start, end = _check_params(start, "start"), _check_params(end, "end")
    if set(start) != set(end) or any(start[k].shape != end[k].shape for k in start):
        raise ValueError("start and end must have the same parameter names and shapes")
    return start, end


def linear_point(start: Params, end: Params, alpha: float) -> dict[str, torch.Tensor]:
    """(1 - alpha) start + alpha end, name by name.

    Args:
        start: the parameter dict at alpha = 0.
        end: the parameter dict at alpha = 1 (the names of ``start``).
        alpha: the line coordinate, a finite real number.

    Returns:
        The parameter dict ``{k: (1 - alpha) start[k] + alpha end[k]}``.
    """
    alpha = as_real("alpha", alpha)
    return {k: (1 - alpha) * start[k] + alpha * end[k] for k in start}


def interpolate(metrics: Mapping[str, LossFn], start: Params, end: Params, alphas: ArrayLike) -> dict[str, np.ndarray]:
    """Evaluate each metric along the straight line (1 - alpha) start + alpha end.

    Args:
        metrics: name -> ``metric(params)`` returning a scalar (loss, accuracy, ...).
        start: the parameter dict at alpha = 0.
        end: the parameter dict at alpha = 1 (same names and shapes as ``start``).
        alphas: the line coordinates (alpha = 0 is ``start``, 1 is ``end``).

    Returns:
        ``{"alpha": alphas, name: values, ...}``.

    Raises:
        ValueError: if ``start`` and ``end`` differ in names or shapes, ``alphas`` is not a finite
            1-D array, or ``metrics`` is empty.
    """
    start, end = _check_pair(start, end)
    alphas = finite_array("alphas", alphas, ndim=1)
    if not metrics:
        raise ValueError("metrics must name at least one function of the parameters")
    out = {"alpha": alphas}
    with torch.no_grad():
        for name, fn in metrics.items():
            out[name] = np.array([float(fn(linear_point(start, end, a))) for a in alphas])
    return out


def loss_barrier(alphas: ArrayLike, values: ArrayLike) -> float:
    """The barrier of a path: max over alpha of L(alpha) - ((1 - alpha) L(0) + alpha L(1)).

    The height above the straight line between the endpoint values (Frankle et al. 2020);
    ``alphas`` must run from 0 to 1. Zero when the path never rises above that chord.

    Args:
        alphas: the path coordinates, a finite 1-D array increasing from 0 to 1.
        values: the loss ``L(alpha)`` at each coordinate, of the shape of ``alphas``.

    Returns:
        ``max(0, max_alpha L(alpha) - ((1 - alpha) L(0) + alpha L(1)))``.

    Raises:
        ValueError: if ``alphas`` does not increase from 0 to 1 or the arrays are not finite
            or differ in shape.
    """
    alphas = finite_array("alphas", alphas, ndim=1)
    values = finite_array("values", values, shape=alphas.shape)
    if alphas[0] != 0.0 or alphas[-1] != 1.0 or np.any(np.diff(alphas) <= 0):
        raise ValueError("alphas must increase from 0 to 1")
    chord = (1 - alphas) * values[0] + alphas * values[-1]
    return float(max(0.0, np.max(values - chord)))


def bezier_point(start: Params, control: Params, end: Params, t: float) -> dict[str, torch.Tensor]:
    """The quadratic Bezier curve (1 - t)^2 start + 2 t (1 - t) control + t^2 end (Garipov et al. 2018).

    Args:
        start: the parameter dict at t = 0.
        control: the control point (the names of ``start``).
        end: the parameter dict at t = 1.
        t: the curve position, a finite real number.

    Returns:
        The parameter dict of the curve point at ``t``, name by name.
    """
    t = as_real("t", t)
    return {k: (1 - t) ** 2 * start[k] + 2 * t * (1 - t) * control[k] + t**2 * end[k] for k in start}


def closure_bezier_curve_loss(
    loss_fn: LossFn, start: Params, end: Params
) -> Callable[[Params, torch.Tensor | None], torch.Tensor]:
    """``curve_loss(control, ts)``: the mean of ``loss_fn`` at the curve points t in ``ts``.

    The endpoints are fixed; only the control point is a free parameter dict. The shape
    ``curve_loss(params, batch)`` is that of :func:`lossgeom.training.train`, whose
    ``batches`` rows then hold the curve positions t sampled for each step, so the curve
    is trained by the package's ordinary training loop. ``loss_fn`` is evaluated through
    ``torch.func.functional_call`` when it comes from :func:`lossgeom.models.loss_closure`.

    Args:
        loss_fn: the closure ``loss_fn(params) -> scalar``.
        start: the fixed endpoint at t = 0.
        end: the fixed endpoint at t = 1 (same names and shapes as ``start``).

    Returns:
        ``curve_loss(control, ts) -> scalar``, which raises ``ValueError`` when ``ts`` is None.

    Raises:
        ValueError: if ``start`` and ``end`` differ in names or shapes.
    """
    start, end = _check_pair(start, end)

    def curve_loss(control: Params, ts: torch.Tensor | None = None) -> torch.Tensor:
        if ts is None:
            raise ValueError("curve_loss needs the curve positions t of the step (a 1-D tensor)")
        return torch.stack([loss_fn(bezier_point(start, control, end, float(t))) for t in ts]).mean()

    return curve_loss


def closure_fit_bezier_curve(
    loss_fn: LossFn,
    start: Params,
    end: Params,
    optimiser: Optimiser,
    steps: int,
    points_per_step: int = 4,
    seed: int = 0,
    control: Params | None = None,
) -> TrainRun:
    """Train the control point of a quadratic Bezier curve between two solutions.

    Minimises E_{t ~ U(0, 1)} L(bezier_point(start, control, end, t)) (Garipov et al.
    2018) with :func:`lossgeom.training.train`: each step averages the loss at
    ``points_per_step`` positions t drawn by ``numpy.random.default_rng(seed)``. The
    control point starts at the midpoint of the endpoints unless ``control`` is given.

    Args:
        loss_fn: the closure ``loss_fn(params) -> scalar``.
        start: the first solution (the endpoint at t = 0).
        end: the second solution (t = 1; same names and shapes as ``start``).
        optimiser: the :class:`~lossgeom.training.Optimiser` of the control point.
        steps: the number of training steps, an int >= 1.
        points_per_step: the number of positions t per step, an int >= 1.
        seed: the seed of ``numpy.random.default_rng`` drawing the positions.
        control: the starting control point; ``None`` means the midpoint of the endpoints.

    Returns:
        The :class:`~lossgeom.training.loop.TrainRun`; its ``params`` is the trained control
        point.
    """
    start, end = _check_pair(start, end)
    steps, points_per_step = positive_int("steps", steps), positive_int("points_per_step", points_per_step)
    ts = torch.from_numpy(np.random.default_rng(seed).uniform(0.0, 1.0, size=(steps, points_per_step)))
    init = linear_point(start, end, 0.5) if control is None else _check_pair(start, control)[1]
    return train(closure_bezier_curve_loss(loss_fn, start, end), init, optimiser, steps, batches=ts)

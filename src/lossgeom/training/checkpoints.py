"""Checkpoints of a training run: record them, pick the first below a target, trace the path.

:func:`closure_checkpoint_monitor` is a :func:`~lossgeom.training.loop.train` monitor that records
the full-batch loss with a copy of the parameters, :func:`first_checkpoint_below` is the
endpoint rule of a matched comparison, and :func:`closure_parameter_path` returns the flattened
parameters after every update.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lossgeom._validation import as_real
from lossgeom.training.loop import TrainRun, train
from lossgeom.training.rules import Optimiser, OptimiserState
from lossgeom.types import IndexedLoss, Params


def closure_checkpoint_monitor(loss_fn: IndexedLoss) -> Callable[[dict], tuple[float, dict]]:
    """A :func:`~lossgeom.training.loop.train` monitor recording ``(full-batch loss, copy of the parameters)``.

    Args:
        loss_fn: the indexed loss ``loss_fn(params, indices)``; it is called with ``indices=None``.

    Returns:
        ``snapshot(params) -> (loss_fn(params, None).item(), {name: tensor.clone()})``.

    Raises:
        TypeError: if ``loss_fn`` is not callable.
    """
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")

    def snapshot(params: dict) -> tuple[float, dict]:
        with torch.no_grad():
            value = loss_fn(params, None).item()
        return value, {k: v.clone() for k, v in params.items()}

    return snapshot


def first_checkpoint_below(run: TrainRun, target: float) -> tuple[int, float, dict]:
    """The endpoint rule of a matched comparison: the first checkpoint with loss <= target.

    ``run.monitored`` must hold ``(step, (loss, params))`` pairs (from
    :func:`closure_checkpoint_monitor`). Returns ``(step, loss, params)``.

    Args:
        run: the :class:`~lossgeom.training.loop.TrainRun` with checkpoints in ``monitored``.
        target: the target loss, a finite real number.

    Returns:
        ``(step, loss, params)`` of the first checkpoint whose loss is <= ``target``.

    Raises:
        ValueError: if no checkpoint reaches ``target``.
    """
    target = as_real("target", target)
    for step, (value, params) in run.monitored:
        if value <= target:
            return step, value, params
    raise ValueError(f"no checkpoint reaches the target loss {target:g} (last {run.monitored[-1][1][0]:g})")


def closure_parameter_path(
    loss_fn: IndexedLoss,
    params: Params,
    optimiser: Optimiser,
    batches: torch.Tensor,
    state: OptimiserState | None = None,
) -> torch.Tensor:
    """Flattened parameters after 0, 1, ..., ``len(batches)`` updates, shape ``(steps + 1, p)``.

    A thin wrapper over :func:`~lossgeom.training.loop.train` with a monitor at every step, for comparing two
    continuations of one checkpoint (claim M15).

    Args:
        loss_fn: the indexed loss ``loss_fn(params, indices)``.
        params: the starting parameters.
        optimiser: the :class:`~lossgeom.training.rules.Optimiser` of the updates.
        batches: the example indices of each step, one row per step (``steps = batches.shape[0]``).
        state: the optimiser state to continue from; ``None`` starts fresh.

    Returns:
        A ``(steps + 1, p)`` tensor: row ``k`` holds the flattened parameters after ``k`` updates.
    """
    steps = int(batches.shape[0])
    run = train(
        loss_fn,
        params,
        optimiser,
        steps,
        batches=batches,
        state=state,
        monitor=lambda p: torch.cat([v.reshape(-1) for v in p.values()]),
    )
    return torch.stack([m for _, m in run.monitored])

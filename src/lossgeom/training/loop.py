"""The training loop of ``lossgeom``, its hooks and its result.

:func:`train` is the package's one training loop: it runs any update rule of
:mod:`lossgeom.training.rules` on a loss of a parameter dict (:func:`indexed_loss` makes
one from a module and data), full-batch or on seeded mini-batches (:func:`batch_schedule`),
with hooks that record quantities at chosen steps (:class:`Monitor`), hold a constraint
after every update (:class:`Projection`), end a run that diverges and record where
(:class:`DivergenceStop`) or end it when a condition holds (:class:`StopWhen`); it returns
one :class:`TrainRun`. The training functions of the book's experiments
(``lossgeom_book.classifiers``, ``regularisers``, ``tasks``, ``relu_students``) are thin
wrappers of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from lossgeom._validation import finite_tensor, model_inputs, positive_int
from lossgeom.losses import check_loss
from lossgeom.parameters import check_parameter_names
from lossgeom.training.gradients import _value_and_grad
from lossgeom.training.rules import Optimiser, OptimiserState, closure_sam_gradient
from lossgeom.types import Batch, IndexedLoss, Params


def indexed_loss(model: nn.Module, loss: nn.Module, data: Batch) -> IndexedLoss:
    """``loss_fn(params, indices)``: ``loss(model(x[indices]; params), y[indices])`` (all if ``None``).

    The loss of a mini-batch as a function of the parameters and of the batch's indices
    into ``data = (x, y)``, computed by ``torch.func.functional_call`` with the loss
    module's own reduction and options (the mean over the batch for ``reduction="mean"``).

    Args:
        model: the model, called through ``torch.func.functional_call``.
        loss: the loss module, called as ``loss(outputs, y)`` (see :mod:`lossgeom.losses`).
        data: the pair ``(x, y)``: inputs, finite, examples along axis 0, and targets with
            as many examples.

    Returns:
        ``loss_fn(params, indices=None) -> scalar``, the loss of ``model`` with ``params``
        on ``(x[indices], y[indices])``.

    Raises:
        TypeError: if ``model`` is not an ``nn.Module``, ``loss`` is not a supported loss
            module (a name such as ``"mse"`` is refused) or ``data`` is not a pair.
        ValueError: if the inputs and targets hold different numbers of examples.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    fn = check_loss(loss)
    if not (isinstance(data, (tuple, list)) and len(data) == 2):
        raise TypeError(f"data must be one (x, y) pair of tensors, got {type(data).__name__}")
    x, y = model_inputs("x", data[0]), data[1]
    if y.shape[0] != x.shape[0]:
        raise ValueError(f"x and y must hold the same number of examples, got {x.shape[0]} and {y.shape[0]}")

    known = {name for name, _ in model.named_parameters()} | {name for name, _ in model.named_buffers()}

    def loss_fn(params: Params, indices: torch.Tensor | None = None) -> torch.Tensor:
        if not known.issuperset(params):  # torch would ignore a misspelt name silently
            check_parameter_names(model, params, allow_buffers=True)
        xb, yb = (x, y) if indices is None else (x[indices], y[indices])
        return fn(torch.func.functional_call(model, dict(params), (xb,)), yb)

    return loss_fn


def batch_schedule(n_examples: int, batch_size: int, steps: int, seed: int = 0) -> torch.Tensor:
    """Mini-batch indices for ``steps`` updates, shape ``(steps, batch_size)``.

    Epochs of a seeded random permutation (``numpy.random.default_rng(seed)``), cut into
    batches; a batch never straddles two epochs (the remainder of an epoch is dropped).

    Args:
        n_examples: the number of examples ``n``, an int >= 1.
        batch_size: the examples per batch, an int in ``[1, n]``.
        steps: the number of updates, an int >= 1.
        seed: the seed of ``numpy.random.default_rng``.

    Returns:
        An integer tensor of shape ``(steps, batch_size)``; row ``t`` holds the indices of step ``t``.

    Raises:
        ValueError: if ``batch_size > n_examples`` or a count is < 1.
    """
    n, b, steps = (
        positive_int("n_examples", n_examples),
        positive_int("batch_size", batch_size),
        positive_int("steps", steps),
    )
    if b > n:
        raise ValueError(f"batch_size must be <= n_examples ({n}), got {b}")
    rng, per_epoch, rows = np.random.default_rng(seed), n // b, []
    while len(rows) < steps:
        order = rng.permutation(n)
        rows.extend(order[i * b : (i + 1) * b] for i in range(per_epoch))
    return torch.from_numpy(np.stack(rows[:steps]))


# --------------------------------------------------------------------------- the training loop


@dataclass(frozen=True)
class Monitor:
    """A hook of :func:`train`: record ``fn(step, params)`` at chosen steps.

    By default at steps ``0, every, 2 every, ...`` and at the end of the run (after the last
    update, or where a :class:`StopWhen` ended it); with ``at`` exactly at the listed steps.
    ``fn`` sees the parameters *before* the update of that step, so step ``t`` holds the
    point after ``t`` updates. ``TrainRun.records[name]`` holds the ``(step, value)`` pairs.
    """

    name: str
    fn: Callable[[int, dict], Any]
    every: int = 1
    at: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError("Monitor name must be a non-empty string")
        if not callable(self.fn):
            raise TypeError(f"Monitor fn must be callable as fn(step, params), got {type(self.fn).__name__}")
        if self.at is None:
            positive_int("every", self.every)
        else:
            object.__setattr__(self, "at", tuple(sorted({int(s) for s in self.at})))

    def due(self, step: int, last: bool) -> bool:
        """Whether to record at ``step`` (``last``: the run ends there).

        Args:
            step: the step (the number of updates taken so far).
            last: whether the run ends at ``step``.

        Returns:
            ``step in at`` when ``at`` is given, else ``step % every == 0 or last``.
        """
        if self.at is not None:
            return step in self.at
        return step % self.every == 0 or last


@dataclass(frozen=True)
class Projection:
    """A hook of :func:`train`: replace the parameters by ``fn(params)`` after every update.

    For example holding a norm or a ratio fixed. ``at_start`` also applies it once before
    the first update. ``fn`` must return the same names and shapes it was given.
    """

    fn: Callable[[dict], Mapping[str, torch.Tensor]]
    at_start: bool = False

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"Projection fn must be callable as fn(params) -> params, got {type(self.fn).__name__}")

    def __call__(self, params: dict) -> dict:
        """The projected parameters ``fn(params)``, checked to keep the names and shapes."""
        with torch.no_grad():
            new = dict(self.fn(dict(params)))
        if set(new) != set(params) or any(tuple(new[k].shape) != tuple(params[k].shape) for k in params):
            raise ValueError("the projection must return the same parameter names and shapes it was given")
        return new


@dataclass(frozen=True)
class DivergenceStop:
    """A hook of :func:`train`: end the run when the loss is non-finite or above ``bound``.

    The run then records the event (:class:`StopEvent`, its step and loss) instead of
    raising ``FloatingPointError`` (what :func:`train` does on a non-finite loss without
    this hook). No update is taken from the diverged point.
    """

    bound: float = math.inf

    def __post_init__(self) -> None:
        if isinstance(self.bound, bool) or not isinstance(self.bound, (int, float)) or not self.bound > 0:
            raise ValueError(f"bound must be a number > 0 (math.inf: only non-finite losses), got {self.bound!r}")

    def reason(self, loss: float) -> str | None:
        """Why ``loss`` ends the run, if it does.

        Args:
            loss: the loss at the current step.

        Returns:
            ``"non-finite loss"``, ``"loss above {bound}"``, or None when the run goes on.
        """
        if not math.isfinite(loss):
            return "non-finite loss"
        if loss > self.bound:
            return f"loss above {self.bound:g}"
        return None


@dataclass(frozen=True)
class StopWhen:
    """A hook of :func:`train`: end the run at the first step where ``predicate(step, params)`` holds.

    Checked at every step after the monitors have recorded (so a monitor can update what
    the predicate reads), before the update.
    """

    predicate: Callable[[int, dict], bool]
    reason: str = "stop condition met"

    def __post_init__(self) -> None:
        if not callable(self.predicate):
            raise TypeError("StopWhen predicate must be callable as predicate(step, params) -> bool")


@dataclass(frozen=True)
class StopEvent:
    """Why and where a run of :func:`train` ended early: after ``step`` updates.

    ``diverged`` marks a :class:`DivergenceStop` (``loss`` is then the offending loss).
    """

    step: int
    reason: str
    loss: float | None = None
    diverged: bool = False


@dataclass(frozen=True)
class TrainRun:
    """The result of :func:`train`.

    Attributes:
        params: the parameters at the end (after ``steps_taken`` updates).
        state: the optimiser state there.
        losses: the (mini-batch) loss at the parameters before each update taken.
        records: ``{monitor name: [(step, value), ...]}`` of every :class:`Monitor`.
        stop: the :class:`StopEvent` of a run that ended early, else ``None``.
    """

    params: dict[str, torch.Tensor]
    state: OptimiserState
    losses: np.ndarray
    records: dict[str, list[tuple[int, Any]]] = field(default_factory=dict)
    stop: StopEvent | None = None

    @property
    def monitored(self) -> list[tuple[int, Any]]:
        """The records of ``train``'s ``monitor`` argument."""
        return self.records.get("monitor", [])

    @property
    def steps_taken(self) -> int:
        """The number of updates taken (the run may stop before ``steps``)."""
        return int(self.losses.shape[0])

    @property
    def diverged_at(self) -> int | None:
        """The step where a :class:`DivergenceStop` ended the run, else ``None``."""
        return self.stop.step if self.stop is not None and self.stop.diverged else None


def train(
    loss_fn: IndexedLoss,
    params: Params,
    optimiser: Optimiser,
    steps: int,
    batches: torch.Tensor | None = None,
    state: OptimiserState | None = None,
    monitor: Callable[[dict], Any] | None = None,
    monitor_every: int = 1,
    *,
    hooks: Sequence[Monitor | Projection | DivergenceStop | StopWhen] = (),
) -> TrainRun:
    """Run ``steps`` updates of ``optimiser`` on ``loss_fn(params, indices)``: the package's training loop.

    Every step ``t``: the monitors record, the stop conditions are checked, the loss and
    its gradient are taken at the current parameters (on ``batches[t]``), the optimiser
    updates, and the projections are applied. ``batches`` (from :func:`batch_schedule`)
    gives the indices of each step; ``None`` means full-batch (``loss_fn(params, None)``).
    ``state`` continues a previous run (``None``: a fresh state). ``monitor`` is a shortcut
    for ``Monitor("monitor", lambda t, p: monitor(p), monitor_every)`` (steps 0,
    ``monitor_every``, ... and after the last step), read back as ``run.monitored``.
    ``hooks`` adds :class:`Monitor`, :class:`Projection`, :class:`DivergenceStop` and
    :class:`StopWhen` hooks. ``losses[t]`` is the loss before update ``t``. An optimiser
    built with :func:`~lossgeom.training.rules.sam` takes its gradient at the SAM ascent point (same mini-batch).

    Args:
        loss_fn: the indexed loss ``loss_fn(params, indices) -> scalar``.
        params: the starting parameters (copied; finite).
        optimiser: the update rule, an :class:`~lossgeom.training.rules.Optimiser`.
        steps: the number of updates, >= 0.
        batches: the indices of each step, at least ``steps`` rows; ``None`` means full-batch.
        state: the optimiser state to continue from; ``None`` means a fresh state.
        monitor: ``monitor(params)``, recorded as ``run.monitored``.
        monitor_every: the step interval of ``monitor``, an int >= 1.
        hooks: :class:`Monitor`, :class:`Projection`, :class:`DivergenceStop` and :class:`StopWhen` hooks.

    Returns:
        The :class:`TrainRun`: final parameters and state, the losses, the monitors' records
        and the :class:`StopEvent` of a run that ended early.

    Raises:
        TypeError: if ``optimiser`` is not an :class:`~lossgeom.training.rules.Optimiser` or a
            hook is of an unknown kind.
        ValueError: if ``steps < 0``, ``batches`` has fewer than ``steps`` rows, ``state`` is not
            a state of this optimiser for these params, or two monitors share a name.
        FloatingPointError: if the loss becomes non-finite and no :class:`DivergenceStop`
            is given (never a silent NaN).
    """
    steps = _checked_steps(optimiser, steps, batches)
    sorted_hooks = _Hooks.sort(hooks, monitor, monitor_every)
    params, state = _starting_point(optimiser, params, state, sorted_hooks.projections)
    records: dict[str, list] = {m.name: [] for m in sorted_hooks.monitors}
    losses: list[float] = []
    stop, t = None, 0
    while True:
        last = t == steps
        sorted_hooks.record(records, t, params, last)
        if last:
            break
        stop = sorted_hooks.stop_event(t, params)
        if stop is not None:
            sorted_hooks.record_at_stop(records, t, params)
            break
        idx = None if batches is None else batches[t]
        value, grads = _value_and_grad(loss_fn, params, idx)
        loss = value.item()
        stop = sorted_hooks.divergence_event(t, loss)
        if stop is not None:
            break
        if not math.isfinite(loss):
            raise FloatingPointError(f"the loss became non-finite at step {t}")
        losses.append(loss)
        if optimiser.sam_radius:
            grads = closure_sam_gradient(loss_fn, params, optimiser.sam_radius, idx, grads)
        params, state = optimiser.update(params, grads, state)
        for projection in sorted_hooks.projections:
            params = projection(params)
        t += 1
    return TrainRun(params, state, np.array(losses, dtype=np.float64), records, stop)


def _checked_steps(optimiser: Optimiser, steps: int, batches: torch.Tensor | None) -> int:
    """``steps`` as an int, after checking the optimiser, the count and the batches."""
    if not isinstance(optimiser, Optimiser):
        raise TypeError(f"optimiser must be an Optimiser (from sgd(), adam() or sam()), got {type(optimiser).__name__}")
    steps = int(steps)
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    if batches is not None and batches.shape[0] < steps:
        raise ValueError(f"batches must hold at least steps={steps} rows, got {batches.shape[0]}")
    return steps


def _starting_point(
    optimiser: Optimiser, params: Params, state: OptimiserState | None, projections: Sequence[Projection]
) -> tuple[dict, OptimiserState]:
    """Copies of the starting parameters (projected where asked) and the starting state."""
    params = {n: finite_tensor(f"params[{n!r}]", p).detach().clone() for n, p in params.items()}
    if state is not None and not optimiser.accepts(state, params):
        raise ValueError(f"state must be an OptimiserState of this optimiser ({optimiser.kind}) for these params")
    state = optimiser.init(params) if state is None else state.clone()
    for projection in projections:
        if projection.at_start:
            params = projection(params)
    return params, state


@dataclass(frozen=True)
class _Hooks:
    """The hooks of one :func:`train` call, sorted by kind."""

    monitors: list[Monitor]
    projections: list[Projection]
    stops: list[StopWhen]
    divergence: DivergenceStop | None

    @classmethod
    def sort(cls, hooks: Sequence, monitor: Callable[[dict], Any] | None, monitor_every: int) -> _Hooks:
        hooks = list(hooks)
        if monitor is not None:
            every = positive_int("monitor_every", monitor_every)
            hooks.insert(0, Monitor("monitor", lambda step, p: monitor(p), every))
        kinds = (Monitor, Projection, DivergenceStop, StopWhen)
        if not all(isinstance(h, kinds) for h in hooks):
            raise TypeError("hooks must be Monitor, Projection, DivergenceStop or StopWhen objects")
        monitors = [h for h in hooks if isinstance(h, Monitor)]
        if len({m.name for m in monitors}) != len(monitors):
            raise ValueError("every Monitor needs its own name")
        return cls(
            monitors,
            [h for h in hooks if isinstance(h, Projection)],
            [h for h in hooks if isinstance(h, StopWhen)],
            next((h for h in hooks if isinstance(h, DivergenceStop)), None),
        )

    def record(self, records: dict[str, list], t: int, params: dict, last: bool) -> None:
        for m in self.monitors:
            if m.due(t, last):
                records[m.name].append((t, m.fn(t, params)))

    def record_at_stop(self, records: dict[str, list], t: int, params: dict) -> None:
        """A :class:`StopWhen` ended the run at ``t``: the step-based monitors record the end."""
        for m in self.monitors:
            if m.at is None and not m.due(t, False):
                records[m.name].append((t, m.fn(t, params)))

    def stop_event(self, t: int, params: dict) -> StopEvent | None:
        return next((StopEvent(t, s.reason) for s in self.stops if s.predicate(t, params)), None)

    def divergence_event(self, t: int, loss: float) -> StopEvent | None:
        reason = self.divergence.reason(loss) if self.divergence is not None else None
        return None if reason is None else StopEvent(t, reason, loss, diverged=True)

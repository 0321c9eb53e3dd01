"""Functional optimisers with explicit state, the training loop and gradient-noise probes.

The update rules are those of ``torch.optim`` (the tests compare them step by step with
``torch.optim.SGD``, ``Adam`` and ``AdamW``), written functionally so that the optimiser
state is an explicit value a chapter can copy, reset or inspect (claim M15 of the chapter
"Saddles, plateaus and optimisers", which uses every function below):

- :func:`sgd`: ``v <- mu v + g'``, ``w <- w - eta v`` (``mu = 0``: plain SGD);
- :func:`adam`: bias-corrected first and second moments (Kingma and Ba 2015);

where weight decay ``lambda`` enters either *coupled* (L2: ``g' = g + lambda w``, the
gradient of ``L + lambda/2 |w|^2``) or *decoupled* (``w <- (1 - eta lambda) w`` before the
step, Loshchilov and Hutter 2019, as in ``torch.optim.AdamW``). That chapter derives when the
two coincide. :func:`sam` wraps any of them in sharpness-aware minimisation (Foret et al.
2021): the gradient is taken at the ascent point ``w + rho g / |g|`` (:func:`sam_gradient`).
Each rule can also be computed by ``torch.optim`` itself
(``arithmetic="torch"``), which differs from the formulas at rounding level.

:func:`train` is the package's one training loop: it runs any of them on a loss of a
parameter dict, full-batch or on seeded mini-batches, with hooks that record quantities
at chosen steps (:class:`Monitor`), hold a constraint after every update
(:class:`Projection`), end a run that diverges and record where (:class:`DivergenceStop`)
or end it when a condition holds (:class:`StopWhen`); it returns one :class:`TrainRun`.
The training functions of :mod:`lossgeom.softmax`, :mod:`lossgeom_book.regularisers`,
:mod:`lossgeom_book.tasks` and :mod:`lossgeom.quotient` are thin wrappers of it.
:func:`per_example_gradients` and :func:`projected_noise` measure
mini-batch gradient noise in a chosen subspace, :func:`sampled_batch_noise` samples it,
and :func:`heavy_ball_velocity` and :func:`adam_preconditioner` show how momentum and
adaptive scaling reshape it. Checkpoints: :func:`checkpoint_monitor`,
:func:`first_checkpoint_below` (the endpoint rule of a matched comparison),
:func:`parameter_path` and :func:`stored_at_precision`. :func:`natural_gradient_direction`
is steepest descent in a declared metric.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from lossgeom._validation import as_real, finite_array, finite_tensor, positive, positive_int
from lossgeom.types import Params

IndexedLoss = Callable[[Params, "torch.Tensor | None"], torch.Tensor]


@dataclass(frozen=True)
class OptimiserState:
    """The optimiser's memory: the number of updates taken and its per-parameter buffers."""

    step: int
    buffers: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)

    def clone(self) -> OptimiserState:
        return OptimiserState(self.step, {k: {n: t.clone() for n, t in b.items()} for k, b in self.buffers.items()})


#: How an :class:`Optimiser` computes its update: ``"book"`` evaluates the formulas of this
#: module's docstring as written; ``"torch"`` runs ``torch.optim``'s own kernels (which fuse
#: multiply-adds, so the two differ at rounding level, about 1e-16 per step).
ARITHMETICS = ("book", "torch")
_TORCH_BUFFERS = {"sgd": {"momentum_buffer"}, "adam": {"step", "exp_avg", "exp_avg_sq"}}


@dataclass(frozen=True)
class Optimiser:
    """An update rule with its hyperparameters; build one with :func:`sgd` or :func:`adam`.

    ``arithmetic="book"`` (the default) computes the update with the formulas stated in
    :func:`sgd` and :func:`adam`; ``arithmetic="torch"`` computes the same rule with
    ``torch.optim.SGD``, ``Adam`` or ``AdamW`` (the state is still an explicit
    :class:`OptimiserState`, loaded into a fresh ``torch.optim`` object at every step).
    The chapters whose runs were first recorded with ``torch.optim`` train with the latter,
    so that their numbers are reproduced bit for bit.
    ``sam_radius > 0`` (set by :func:`sam`) makes :func:`train` feed the update the SAM
    gradient (:func:`sam_gradient`) instead of the plain one; :meth:`update` itself is the
    base step on whatever gradient it is given.
    """

    kind: str
    learning_rate: float
    momentum: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    decoupled: bool = False
    arithmetic: str = "book"
    sam_radius: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ("sgd", "adam"):
            raise ValueError(f"kind must be 'sgd' or 'adam' (build optimisers with sgd() or adam()), got {self.kind!r}")
        if self.arithmetic not in ARITHMETICS:
            raise ValueError(f"arithmetic must be one of {ARITHMETICS}, got {self.arithmetic!r}")
        if self.arithmetic == "torch" and self.kind == "sgd" and self.decoupled and self.weight_decay:
            raise ValueError("arithmetic='torch' has no decoupled weight decay for SGD (torch.optim.SGD couples it)")
        if not self.sam_radius >= 0:
            raise ValueError(f"sam_radius must be >= 0 (0: no SAM), got {self.sam_radius}")

    def init(self, params: Params) -> OptimiserState:
        """A fresh state (zero buffers, step 0) for ``params``.

        With ``arithmetic="torch"`` the buffers start empty: ``torch.optim`` creates them
        at the first step, as it does for a new optimiser.
        """
        if self.arithmetic == "torch":
            return OptimiserState(0, {})
        zeros = {n: torch.zeros_like(p) for n, p in params.items()}
        if self.kind == "adam":
            return OptimiserState(0, {"m": zeros, "v": {n: z.clone() for n, z in zeros.items()}})
        return OptimiserState(0, {"velocity": zeros})

    def accepts(self, state: OptimiserState, params: Params) -> bool:
        """Whether ``state`` is a state of this optimiser for parameters named like ``params``."""
        if not isinstance(state, OptimiserState) or any(set(b) != set(params) for b in state.buffers.values()):
            return False
        if self.arithmetic == "torch":
            return set(state.buffers) <= _TORCH_BUFFERS[self.kind]
        return set(state.buffers) == set(self.init(params).buffers)

    def update(self, params: Params, grads: Params, state: OptimiserState) -> tuple[dict, OptimiserState]:
        """One step: return the new parameters and the new state (inputs are not modified)."""
        if set(grads) != set(params):
            raise ValueError("grads must have the same keys as params")
        if self.arithmetic == "torch":
            return self._torch_update(params, grads, state)
        eta, lam, t = self.learning_rate, self.weight_decay, state.step + 1
        new_params, new_buffers = {}, {k: {} for k in state.buffers}
        for name, w in params.items():
            g = grads[name]
            if lam and not self.decoupled:
                g = g + lam * w
            if lam and self.decoupled:
                w = w * (1.0 - eta * lam)
            if self.kind == "sgd":
                v = self.momentum * state.buffers["velocity"][name] + g if self.momentum else g
                new_buffers["velocity"][name] = v
                new_params[name] = w - eta * v
            else:
                beta1, beta2 = self.betas
                m = beta1 * state.buffers["m"][name] + (1 - beta1) * g
                v = beta2 * state.buffers["v"][name] + (1 - beta2) * g * g
                new_buffers["m"][name], new_buffers["v"][name] = m, v
                m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
                new_params[name] = w - eta * m_hat / (torch.sqrt(v_hat) + self.eps)
        return new_params, OptimiserState(t, new_buffers)

    def torch_optimizer(self, tensors: Sequence[torch.Tensor]) -> torch.optim.Optimizer:
        """The ``torch.optim`` optimiser of this rule over ``tensors``."""
        if self.kind == "sgd":
            return torch.optim.SGD(tensors, lr=self.learning_rate, momentum=self.momentum,
                                   weight_decay=self.weight_decay)
        cls = torch.optim.AdamW if self.decoupled else torch.optim.Adam
        return cls(tensors, lr=self.learning_rate, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay)

    def _torch_update(self, params: Params, grads: Params, state: OptimiserState) -> tuple[dict, OptimiserState]:
        names = list(params)
        leaves = [params[n].detach().clone() for n in names]
        optimizer = self.torch_optimizer(leaves)
        for name, leaf in zip(names, leaves):
            leaf.grad = grads[name]
            if state.buffers:
                optimizer.state[leaf] = {k: b[name].clone() for k, b in state.buffers.items()}
        optimizer.step()
        buffers: dict[str, dict[str, torch.Tensor]] = {}
        for name, leaf in zip(names, leaves):
            leaf.grad = None
            for key, value in optimizer.state[leaf].items():
                buffers.setdefault(key, {})[name] = value
        return dict(zip(names, leaves)), OptimiserState(state.step + 1, buffers)


def _weight_decay(weight_decay: float) -> float:
    value = as_real("weight_decay", weight_decay)
    if value < 0:
        raise ValueError(f"weight_decay must be >= 0, got {value}")
    return value


def sgd(learning_rate: float, momentum: float = 0.0, weight_decay: float = 0.0, decoupled: bool = False,
        arithmetic: str = "book") -> Optimiser:
    """(Heavy-ball) SGD as ``torch.optim.SGD``: ``v <- mu v + g'``, ``w <- w - eta v``."""
    mu = as_real("momentum", momentum)
    if not 0.0 <= mu < 1.0:
        raise ValueError(f"momentum must lie in [0, 1), got {mu}")
    return Optimiser("sgd", positive("learning_rate", learning_rate), momentum=mu,
                     weight_decay=_weight_decay(weight_decay), decoupled=bool(decoupled), arithmetic=arithmetic)


def adam(learning_rate: float, betas: Sequence[float] = (0.9, 0.999), eps: float = 1e-8,
         weight_decay: float = 0.0, decoupled: bool = True, arithmetic: str = "book") -> Optimiser:
    """Adam (``decoupled=False``, L2 in the gradient) or AdamW (``decoupled=True``).

    ``m <- b1 m + (1-b1) g'``, ``v <- b2 v + (1-b2) g'^2``,
    ``w <- w - eta (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)``.
    """
    b1, b2 = (as_real("betas[0]", betas[0]), as_real("betas[1]", betas[1]))
    if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
        raise ValueError(f"betas must lie in [0, 1), got {tuple(betas)}")
    return Optimiser("adam", positive("learning_rate", learning_rate), betas=(b1, b2), eps=positive("eps", eps),
                     weight_decay=_weight_decay(weight_decay), decoupled=bool(decoupled), arithmetic=arithmetic)


def sam(base: Optimiser, radius: float) -> Optimiser:
    """Sharpness-aware minimisation (Foret et al. 2021) with ``base`` as the outer step.

    Each step of :func:`train` evaluates ``g = grad L(w)``, moves to the ascent point
    ``w + rho g / |g|`` (``|g|`` the Euclidean norm over all parameters), and hands the
    gradient there to ``base``'s update; decoupled weight decay still shrinks ``w`` itself.
    This is the first-order solution of ``min_w max_{|e| <= rho} L(w + e)``.

    Raises:
        TypeError: if ``base`` is not an :class:`Optimiser`.
        ValueError: if ``radius`` is not > 0.
    """
    if not isinstance(base, Optimiser):
        raise TypeError(f"base must be an Optimiser (from sgd() or adam()), got {type(base).__name__}")
    return replace(base, sam_radius=positive("radius", radius))


def sam_gradient(loss_fn: IndexedLoss, params: Params, radius: float, indices: torch.Tensor | None = None,
                 grads: Params | None = None) -> dict[str, torch.Tensor]:
    """The SAM gradient ``grad L(w + rho g / |g|)`` with ``g = grad L(w)`` (``grads`` if given).

    At a point with ``g = 0`` the ascent direction is undefined and ``g`` is returned.
    """
    radius = positive("radius", radius)
    if grads is None:
        _, grads = _value_and_grad(loss_fn, params, indices)
        if grads is None:
            raise FloatingPointError("the loss is not finite at params: no SAM gradient")
    norm = torch.sqrt(sum((g * g).sum() for g in grads.values()))
    if norm == 0:
        return dict(grads)
    ascent = {n: p + (radius / norm) * grads[n] for n, p in params.items()}
    ascent_grads = _value_and_grad(loss_fn, ascent, indices)[1]
    if ascent_grads is None:
        raise FloatingPointError(f"the loss is not finite at the SAM ascent point (radius {radius:g})")
    return ascent_grads


def indexed_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str = "cross_entropy") -> IndexedLoss:
    """``loss_fn(params, indices)``: mean loss on the examples ``indices`` (all if ``None``)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    x = finite_tensor("x", x)
    if y.shape[0] != x.shape[0]:
        raise ValueError(f"x and y must hold the same number of examples, got {x.shape[0]} and {y.shape[0]}")
    fns = {"cross_entropy": nn.functional.cross_entropy, "mse": nn.functional.mse_loss}
    if loss not in fns:
        raise ValueError(f"loss must be 'cross_entropy' or 'mse', got {loss!r}")
    fn = fns[loss]

    def loss_fn(params: Params, indices: torch.Tensor | None = None) -> torch.Tensor:
        xb, yb = (x, y) if indices is None else (x[indices], y[indices])
        return fn(torch.func.functional_call(model, dict(params), (xb,)), yb)

    return loss_fn


def batch_schedule(n_examples: int, batch_size: int, steps: int, seed: int = 0) -> torch.Tensor:
    """Mini-batch indices for ``steps`` updates, shape ``(steps, batch_size)``.

    Epochs of a seeded random permutation (``numpy.random.default_rng(seed)``), cut into
    batches; a batch never straddles two epochs (the remainder of an epoch is dropped).
    """
    n, b, steps = (positive_int("n_examples", n_examples), positive_int("batch_size", batch_size),
                   positive_int("steps", steps))
    if b > n:
        raise ValueError(f"batch_size must be <= n_examples ({n}), got {b}")
    rng, per_epoch, rows = np.random.default_rng(seed), n // b, []
    while len(rows) < steps:
        order = rng.permutation(n)
        rows.extend(order[i * b:(i + 1) * b] for i in range(per_epoch))
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
        """Whether to record at ``step`` (``last``: the run ends there)."""
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
        return int(self.losses.shape[0])

    @property
    def diverged_at(self) -> int | None:
        """The step where a :class:`DivergenceStop` ended the run, else ``None``."""
        return self.stop.step if self.stop is not None and self.stop.diverged else None


def train(loss_fn: IndexedLoss, params: Params, optimiser: Optimiser, steps: int,
          batches: torch.Tensor | None = None, state: OptimiserState | None = None,
          monitor: Callable[[dict], Any] | None = None, monitor_every: int = 1, *,
          hooks: Sequence[Monitor | Projection | DivergenceStop | StopWhen] = ()) -> TrainRun:
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
    built with :func:`sam` takes its gradient at the SAM ascent point (same mini-batch).

    Raises:
        FloatingPointError: if the loss becomes non-finite and no :class:`DivergenceStop`
            is given (never a silent NaN).
    """
    if not isinstance(optimiser, Optimiser):
        raise TypeError(f"optimiser must be an Optimiser (from sgd(), adam() or sam()), got {type(optimiser).__name__}")
    steps = int(steps)
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    if batches is not None and batches.shape[0] < steps:
        raise ValueError(f"batches must hold at least steps={steps} rows, got {batches.shape[0]}")
    hooks = list(hooks)
    if monitor is not None:
        hooks.insert(0, Monitor("monitor", lambda step, p: monitor(p), positive_int("monitor_every", monitor_every)))
    kinds = (Monitor, Projection, DivergenceStop, StopWhen)
    if not all(isinstance(h, kinds) for h in hooks):
        raise TypeError("hooks must be Monitor, Projection, DivergenceStop or StopWhen objects")
    monitors = [h for h in hooks if isinstance(h, Monitor)]
    if len({m.name for m in monitors}) != len(monitors):
        raise ValueError("every Monitor needs its own name")
    projections = [h for h in hooks if isinstance(h, Projection)]
    stops = [h for h in hooks if isinstance(h, StopWhen)]
    divergence = next((h for h in hooks if isinstance(h, DivergenceStop)), None)
    params = {n: finite_tensor(f"params[{n!r}]", p).detach().clone() for n, p in params.items()}
    if state is not None and not optimiser.accepts(state, params):
        raise ValueError(f"state must be an OptimiserState of this optimiser ({optimiser.kind}) for these params")
    state = optimiser.init(params) if state is None else state.clone()
    for projection in projections:
        if projection.at_start:
            params = projection(params)
    records: dict[str, list] = {m.name: [] for m in monitors}
    losses: list[float] = []
    stop, t = None, 0
    while True:
        last = t == steps
        for m in monitors:
            if m.due(t, last):
                records[m.name].append((t, m.fn(t, params)))
        if last:
            break
        stop = next((StopEvent(t, s.reason) for s in stops if s.predicate(t, params)), None)
        if stop is not None:
            for m in monitors:
                if m.at is None and not m.due(t, False):
                    records[m.name].append((t, m.fn(t, params)))
            break
        idx = None if batches is None else batches[t]
        value, grads = _value_and_grad(loss_fn, params, idx)
        loss = value.item()
        reason = divergence.reason(loss) if divergence is not None else None
        if reason is not None:
            stop = StopEvent(t, reason, loss, diverged=True)
            break
        if not math.isfinite(loss):
            raise FloatingPointError(f"the loss became non-finite at step {t}")
        losses.append(loss)
        if optimiser.sam_radius:
            grads = sam_gradient(loss_fn, params, optimiser.sam_radius, idx, grads)
        params, state = optimiser.update(params, grads, state)
        for projection in projections:
            params = projection(params)
        t += 1
    return TrainRun(params, state, np.array(losses, dtype=np.float64), records, stop)


def _value_and_grad(loss_fn: IndexedLoss, params: Params, idx) -> tuple[torch.Tensor, dict | None]:
    """Loss and its gradient by reverse-mode autograd (much cheaper per call than torch.func here).

    The gradient is not taken (``None``) where the loss is not finite.
    """
    leaves = {n: p.detach().requires_grad_(True) for n, p in params.items()}
    value = loss_fn(leaves, idx)
    if not torch.isfinite(value):
        return value.detach(), None
    grads = torch.autograd.grad(value, list(leaves.values()))
    return value.detach(), {n: g for n, g in zip(leaves, grads)}


def per_example_gradients(loss_fn: IndexedLoss, params: Params, n_examples: int) -> torch.Tensor:
    """The gradients of the loss on each single example, flattened: shape ``(n, p)``.

    One reverse-mode pass per example (cheap for the book's small networks, and free of
    ``torch.func.vmap``'s one-off start-up cost); the tests compare it with ``vmap``.
    """
    n = positive_int("n_examples", n_examples)
    rows = []
    for i in range(n):
        value, grads = _value_and_grad(loss_fn, params, torch.tensor([i]))
        if grads is None:
            raise FloatingPointError(f"the loss of example {i} is not finite")
        rows.append(torch.cat([grads[k].reshape(-1) for k in params]))
    return torch.stack(rows)


def projected_noise(per_example: torch.Tensor, basis: torch.Tensor, batch_size: int,
                    preconditioner: torch.Tensor | None = None) -> float:
    """Mean variance of the mini-batch mean gradient along the orthonormal columns of ``basis``.

    For batches of ``B`` drawn without replacement from ``n`` examples with per-example
    covariance ``Sigma`` (normalised by ``n``), ``Cov(mean) = (n - B)/(n - 1) Sigma / B``;
    the result is ``tr(U^T Cov U) / k`` for ``basis = U`` of shape ``(p, k)``.
    With a diagonal ``preconditioner`` ``d`` (shape ``(p,)``, e.g. from
    :func:`adam_preconditioner`) it is the same for the preconditioned noise ``D g_B``:
    ``tr(U^T D Cov D U) / k``.
    """
    G, U = _noise_inputs(per_example, basis)
    n, b = G.shape[0], positive_int("batch_size", batch_size)
    if b > n:
        raise ValueError(f"batch_size must be <= n ({n}), got {b}")
    centred = G - G.mean(0)
    if preconditioner is not None:
        d = finite_tensor("preconditioner", preconditioner)
        if d.shape != (G.shape[1],):
            raise ValueError(f"preconditioner must have shape ({G.shape[1]},), got {tuple(d.shape)}")
        centred = centred * d
    P = centred @ U
    sigma = (P * P).sum(0) / n
    factor = (n - b) / (n - 1) / b if n > 1 else 0.0
    return float(sigma.mean() * factor)


# --------------------------------------------------------------------------- checkpoints


def checkpoint_monitor(loss_fn: IndexedLoss) -> Callable[[dict], tuple[float, dict]]:
    """A :func:`train` monitor recording ``(full-batch loss, copy of the parameters)``."""
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
    :func:`checkpoint_monitor`). Returns ``(step, loss, params)``.

    Raises:
        ValueError: if no checkpoint reaches ``target``.
    """
    target = as_real("target", target)
    for step, (value, params) in run.monitored:
        if value <= target:
            return step, value, params
    raise ValueError(f"no checkpoint reaches the target loss {target:g} (last {run.monitored[-1][1][0]:g})")


def parameter_path(loss_fn: IndexedLoss, params: Params, optimiser: Optimiser, batches: torch.Tensor,
                   state: OptimiserState | None = None) -> torch.Tensor:
    """Flattened parameters after 0, 1, ..., ``len(batches)`` updates, shape ``(steps + 1, p)``.

    A thin wrapper over :func:`train` with a monitor at every step, for comparing two
    continuations of one checkpoint (claim M15).
    """
    steps = int(batches.shape[0])
    run = train(loss_fn, params, optimiser, steps, batches=batches, state=state,
                monitor=lambda p: torch.cat([v.reshape(-1) for v in p.values()]))
    return torch.stack([m for _, m in run.monitored])


def stored_at_precision(params: Params, state: OptimiserState, dtype: torch.dtype) -> tuple[dict, OptimiserState]:
    """A checkpoint written at ``dtype`` and read back as float64: rounded params and state.

    ``float64 -> dtype -> float64`` rounds every entry to the nearest ``dtype`` value (an
    exact, machine-independent operation), as saving weights and optimiser buffers in
    single or half precision does.
    """
    if not isinstance(state, OptimiserState):
        raise TypeError(f"state must be an OptimiserState, got {type(state).__name__}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")

    def trip(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype).to(torch.float64)

    buffers = {k: {n: trip(t) for n, t in b.items()} for k, b in state.buffers.items()}
    return {n: trip(p) for n, p in params.items()}, OptimiserState(state.step, buffers)


# --------------------------------------------------------------------------- noise and metrics


def sampled_batch_noise(per_example: torch.Tensor, basis: torch.Tensor, batch_size: int, n_batches: int,
                        seed: int = 0) -> np.ndarray:
    """Projected noise of sampled mini-batches: ``U^T (g_B - g)`` for ``n_batches`` draws.

    Each batch is ``batch_size`` distinct examples (without replacement within a batch,
    batches independent of each other, ``numpy.random.default_rng(seed)``); ``g_B`` is its
    mean gradient and ``g`` the full-data mean. Shape ``(n_batches, k)``. Its variance per
    column is what :func:`projected_noise` predicts exactly.
    """
    G, U = _noise_inputs(per_example, basis)
    n, b = G.shape[0], positive_int("batch_size", batch_size)
    if b > n:
        raise ValueError(f"batch_size must be <= n ({n}), got {b}")
    count = positive_int("n_batches", n_batches)
    projected = ((G - G.mean(0)) @ U).numpy()
    draws = np.random.default_rng(seed).random((count, n)).argsort(axis=1)[:, :b]
    return projected[draws].mean(axis=1)


def heavy_ball_velocity(gradients, momentum: float) -> np.ndarray:
    """The heavy-ball buffer ``v_t = mu v_{t-1} + g_t`` (``v_{-1} = 0``) along axis 0.

    For independent gradient noise of covariance ``C`` the stationary covariance of ``v``
    is ``C / (1 - mu^2)`` and its lag-``k`` autocorrelation ``mu^k``; computed
    with ``scipy.signal.lfilter``.
    """
    from scipy.signal import lfilter

    mu = as_real("momentum", momentum)
    if not 0.0 <= mu < 1.0:
        raise ValueError(f"momentum must lie in [0, 1), got {mu}")
    return lfilter([1.0], [1.0, -mu], finite_tensor("gradients", gradients).numpy(), axis=0)


def adam_preconditioner(per_example: torch.Tensor, batch_size: int, eps: float = 1e-8) -> torch.Tensor:
    """Adam's per-coordinate scaling ``1 / (sqrt(E[g_B^2]) + eps)`` at a fixed point.

    Adam's second-moment buffer averages squared mini-batch gradients; held at one point
    it tends to ``E[g_B^2] = g^2 + Var(g_B)`` coordinate-wise, with the variance of
    :func:`projected_noise`'s formula ``(n - B)/(n - 1) sigma^2 / B``. Its update noise is
    this diagonal times the mini-batch noise.
    """
    G = finite_tensor("per_example", per_example)
    if G.ndim != 2:
        raise ValueError(f"per_example must have shape (n, p), got {tuple(G.shape)}")
    n, b = G.shape[0], positive_int("batch_size", batch_size)
    if b > n:
        raise ValueError(f"batch_size must be <= n ({n}), got {b}")
    mean = G.mean(0)
    factor = (n - b) / (n - 1) / b if n > 1 else 0.0
    second_moment = mean**2 + ((G - mean) ** 2).mean(0) * factor
    return 1.0 / (second_moment.sqrt() + positive("eps", eps))


def natural_gradient_direction(gradient, metric, damping: float = 0.0) -> np.ndarray:
    """``(F + damping I)^+ g``: the steepest-descent direction in the metric ``F``.

    With ``F`` the Fisher information (for a Gaussian likelihood of unit variance, the
    Gauss-Newton matrix ``J_f^T J_f``) the step ``-eta F^+ g`` changes the model's outputs by
    ``-eta`` times the residual to first order, whatever the coordinates (Amari 1998; the
    worked example of "Saddles, plateaus and optimisers"). A singular ``F`` (a symmetry, as
    for the product model) uses the Moore-Penrose pseudo-inverse, ``numpy.linalg.pinv``.
    """
    g = finite_array("gradient", gradient, ndim=1)
    F = finite_array("metric", metric, ndim=2, shape=(g.size, g.size))
    if not np.allclose(F, F.T, rtol=0, atol=1e-12 * max(1.0, np.abs(F).max())):
        raise ValueError("metric must be a symmetric matrix")
    delta = as_real("damping", damping)
    if delta < 0:
        raise ValueError(f"damping must be >= 0, got {delta}")
    return np.linalg.pinv(F + delta * np.eye(g.size), hermitian=True) @ g


def _noise_inputs(per_example: torch.Tensor, basis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    G = finite_tensor("per_example", per_example)
    U = finite_tensor("basis", basis)
    if G.ndim != 2 or U.ndim != 2 or U.shape[0] != G.shape[1]:
        raise ValueError(f"per_example must be (n, p) and basis (p, k), got {tuple(G.shape)} and {tuple(U.shape)}")
    return G, U

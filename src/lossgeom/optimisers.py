"""Functional optimisers with explicit state, training loops and gradient-noise probes.

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
:func:`train` runs any of them on a loss of a parameter dict, full-batch or
on seeded mini-batches; :func:`per_example_gradients` and :func:`projected_noise` measure
mini-batch gradient noise in a chosen subspace, :func:`sampled_batch_noise` samples it,
and :func:`heavy_ball_velocity` and :func:`adam_preconditioner` show how momentum and
adaptive scaling reshape it. Checkpoints: :func:`checkpoint_monitor`,
:func:`first_checkpoint_below` (the endpoint rule of a matched comparison),
:func:`parameter_path` and :func:`stored_at_precision`. :func:`natural_gradient_direction`
is steepest descent in a declared metric.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from lossgeom._checks import as_real, finite_array, finite_tensor, positive, positive_int

Params = Mapping[str, torch.Tensor]
IndexedLoss = Callable[[Params, "torch.Tensor | None"], torch.Tensor]


@dataclass(frozen=True)
class OptimiserState:
    """The optimiser's memory: the number of updates taken and its per-parameter buffers."""

    step: int
    buffers: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)

    def clone(self) -> "OptimiserState":
        return OptimiserState(self.step, {k: {n: t.clone() for n, t in b.items()} for k, b in self.buffers.items()})


@dataclass(frozen=True)
class Optimiser:
    """An update rule with its hyperparameters; build one with :func:`sgd` or :func:`adam`.

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
    sam_radius: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ("sgd", "adam"):
            raise ValueError(f"kind must be 'sgd' or 'adam' (build optimisers with sgd() or adam()), got {self.kind!r}")
        if not self.sam_radius >= 0:
            raise ValueError(f"sam_radius must be >= 0 (0: no SAM), got {self.sam_radius}")

    def init(self, params: Params) -> OptimiserState:
        """A fresh state (zero buffers, step 0) for ``params``."""
        zeros = {n: torch.zeros_like(p) for n, p in params.items()}
        if self.kind == "adam":
            return OptimiserState(0, {"m": zeros, "v": {n: z.clone() for n, z in zeros.items()}})
        return OptimiserState(0, {"velocity": zeros})

    def update(self, params: Params, grads: Params, state: OptimiserState) -> tuple[dict, OptimiserState]:
        """One step: return the new parameters and the new state (inputs are not modified)."""
        if set(grads) != set(params):
            raise ValueError("grads must have the same keys as params")
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


def _weight_decay(weight_decay: float) -> float:
    value = as_real("weight_decay", weight_decay)
    if value < 0:
        raise ValueError(f"weight_decay must be >= 0, got {value}")
    return value


def sgd(learning_rate: float, momentum: float = 0.0, weight_decay: float = 0.0, decoupled: bool = False) -> Optimiser:
    """(Heavy-ball) SGD as ``torch.optim.SGD``: ``v <- mu v + g'``, ``w <- w - eta v``."""
    mu = as_real("momentum", momentum)
    if not 0.0 <= mu < 1.0:
        raise ValueError(f"momentum must lie in [0, 1), got {mu}")
    return Optimiser("sgd", positive("learning_rate", learning_rate), momentum=mu,
                     weight_decay=_weight_decay(weight_decay), decoupled=bool(decoupled))


def adam(learning_rate: float, betas: Sequence[float] = (0.9, 0.999), eps: float = 1e-8,
         weight_decay: float = 0.0, decoupled: bool = True) -> Optimiser:
    """Adam (``decoupled=False``, L2 in the gradient) or AdamW (``decoupled=True``).

    ``m <- b1 m + (1-b1) g'``, ``v <- b2 v + (1-b2) g'^2``,
    ``w <- w - eta (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)``.
    """
    b1, b2 = (as_real("betas[0]", betas[0]), as_real("betas[1]", betas[1]))
    if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
        raise ValueError(f"betas must lie in [0, 1), got {tuple(betas)}")
    return Optimiser("adam", positive("learning_rate", learning_rate), betas=(b1, b2), eps=positive("eps", eps),
                     weight_decay=_weight_decay(weight_decay), decoupled=bool(decoupled))


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
    norm = torch.sqrt(sum((g * g).sum() for g in grads.values()))
    if norm == 0:
        return dict(grads)
    ascent = {n: p + (radius / norm) * grads[n] for n, p in params.items()}
    return _value_and_grad(loss_fn, ascent, indices)[1]


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


@dataclass(frozen=True)
class TrainRun:
    """The result of :func:`train`: final parameters and state, loss before each update, monitor values."""

    params: dict[str, torch.Tensor]
    state: OptimiserState
    losses: np.ndarray
    monitored: list[tuple[int, Any]]


def train(loss_fn: IndexedLoss, params: Params, optimiser: Optimiser, steps: int,
          batches: torch.Tensor | None = None, state: OptimiserState | None = None,
          monitor: Callable[[dict], Any] | None = None, monitor_every: int = 1) -> TrainRun:
    """Run ``steps`` updates of ``optimiser`` on ``loss_fn(params, indices)``.

    ``batches`` (from :func:`batch_schedule`) gives the indices of each step; ``None`` means
    full-batch. ``state`` continues a previous run (``None``: a fresh state). ``monitor``
    is called on the parameters at steps 0, ``monitor_every``, ... and after the last step.
    ``losses[t]`` is the mini-batch loss at the parameters before update ``t``. An optimiser
    built with :func:`sam` takes its gradient at the SAM ascent point (same mini-batch).
    """
    if not isinstance(optimiser, Optimiser):
        raise TypeError(f"optimiser must be an Optimiser (from sgd(), adam() or sam()), got {type(optimiser).__name__}")
    steps, every = positive_int("steps", steps), positive_int("monitor_every", monitor_every)
    if batches is not None and batches.shape[0] < steps:
        raise ValueError(f"batches must hold at least steps={steps} rows, got {batches.shape[0]}")
    params = {n: finite_tensor(f"params[{n!r}]", p).detach().clone() for n, p in params.items()}
    fresh = optimiser.init(params)
    if state is not None and (not isinstance(state, OptimiserState) or set(state.buffers) != set(fresh.buffers)
                              or any(set(b) != set(params) for b in state.buffers.values())):
        raise ValueError(f"state must be an OptimiserState of this optimiser ({optimiser.kind}) for these params")
    state = fresh if state is None else state.clone()
    losses, monitored = np.empty(steps), []
    for t in range(steps):
        if monitor is not None and t % every == 0:
            monitored.append((t, monitor(params)))
        idx = None if batches is None else batches[t]
        value, grads = _value_and_grad(loss_fn, params, idx)
        if not torch.isfinite(value):
            raise FloatingPointError(f"the loss became non-finite at step {t}")
        losses[t] = value.item()
        if optimiser.sam_radius:
            grads = sam_gradient(loss_fn, params, optimiser.sam_radius, idx, grads)
        params, state = optimiser.update(params, grads, state)
    if monitor is not None:
        monitored.append((steps, monitor(params)))
    return TrainRun(params, state, losses, monitored)


def _value_and_grad(loss_fn: IndexedLoss, params: Params, idx) -> tuple[torch.Tensor, dict]:
    """Loss and its gradient by reverse-mode autograd (much cheaper per call than torch.func here)."""
    leaves = {n: p.detach().requires_grad_(True) for n, p in params.items()}
    value = loss_fn(leaves, idx)
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
        _, grads = _value_and_grad(loss_fn, params, torch.tensor([i]))
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

"""Functional optimisers with explicit state, training loops and gradient-noise probes.

The update rules are those of ``torch.optim`` (the tests compare them step by step with
``torch.optim.SGD``, ``Adam`` and ``AdamW``), written functionally so that the optimiser
state is an explicit value a chapter can copy, reset or inspect (Chapter 6, claim M15):

- :func:`sgd`: ``v <- mu v + g'``, ``w <- w - eta v`` (``mu = 0``: plain SGD);
- :func:`adam`: bias-corrected first and second moments (Kingma and Ba 2015);

where weight decay ``lambda`` enters either *coupled* (L2: ``g' = g + lambda w``, the
gradient of ``L + lambda/2 |w|^2``) or *decoupled* (``w <- (1 - eta lambda) w`` before the
step, Loshchilov and Hutter 2019, as in ``torch.optim.AdamW``). Chapter 6 derives when the
two coincide. :func:`sam` wraps any of them in sharpness-aware minimisation (Foret et al.
2021): the gradient is taken at the ascent point ``w + rho g / |g|`` (:func:`sam_gradient`).
:func:`train` runs any of them on a loss of a parameter dict, full-batch or on seeded
mini-batches; :func:`per_example_gradients` and :func:`projected_noise` measure
mini-batch gradient noise in a chosen subspace.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from lossgeom._checks import as_real, finite_tensor, positive, positive_int

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


def projected_noise(per_example: torch.Tensor, basis: torch.Tensor, batch_size: int) -> float:
    """Mean variance of the mini-batch mean gradient along the orthonormal columns of ``basis``.

    For batches of ``B`` drawn without replacement from ``n`` examples with per-example
    covariance ``Sigma`` (normalised by ``n``), ``Cov(mean) = (n - B)/(n - 1) Sigma / B``;
    the result is ``tr(U^T Cov U) / k`` for ``basis = U`` of shape ``(p, k)`` (Chapter 6).
    """
    G = finite_tensor("per_example", per_example)
    U = finite_tensor("basis", basis)
    if G.ndim != 2 or U.ndim != 2 or U.shape[0] != G.shape[1]:
        raise ValueError(f"per_example must be (n, p) and basis (p, k), got {tuple(G.shape)} and {tuple(U.shape)}")
    n, b = G.shape[0], positive_int("batch_size", batch_size)
    if b > n:
        raise ValueError(f"batch_size must be <= n ({n}), got {b}")
    P = (G - G.mean(0)) @ U
    sigma = (P * P).sum(0) / n
    factor = (n - b) / (n - 1) / b if n > 1 else 0.0
    return float(sigma.mean() * factor)

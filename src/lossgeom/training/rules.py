"""Functional optimisers with explicit state: the update rules of :mod:`lossgeom.training`.

The update rules are those of ``torch.optim`` (the tests compare them step by step with
``torch.optim.SGD``, ``Adam`` and ``AdamW``), written functionally so that the optimiser
state is an explicit value that can be copied, reset or inspected:

- :func:`sgd`: ``v <- mu v + g'``, ``w <- w - eta v`` (``mu = 0``: plain SGD);
- :func:`adam`: bias-corrected first and second moments (Kingma and Ba 2015);

where weight decay ``lambda`` enters either *coupled* (L2: ``g' = g + lambda w``, the
gradient of ``L + lambda/2 |w|^2``) or *decoupled* (``w <- (1 - eta lambda) w`` before the
step, Loshchilov and Hutter 2019, as in ``torch.optim.AdamW``); for SGD without momentum the
two coincide, for Adam they do not. :func:`sam` wraps any of them in sharpness-aware minimisation (Foret et al.
2021): the gradient is taken at the ascent point ``w + rho g / |g|`` (:func:`closure_sam_gradient`).
Each rule can also be computed by ``torch.optim`` itself
(``arithmetic="torch"``), which differs from the formulas at rounding level. The loop that
runs them is :func:`lossgeom.training.loop.train`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from lossgeom._validation import as_real, positive
from lossgeom.training.gradients import _value_and_grad
from lossgeom.types import IndexedLoss, Params


@dataclass(frozen=True)
class OptimiserState:
    """The optimiser's memory: the number of updates taken and its per-parameter buffers."""

    step: int
    buffers: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)

    def clone(self) -> OptimiserState:
        """A copy of the state whose buffers are cloned tensors.

        Returns:
            An :class:`OptimiserState` with the same step and cloned buffers.
        """
        return OptimiserState(self.step, {k: {n: t.clone() for n, t in b.items()} for k, b in self.buffers.items()})


#: The two ways an :class:`Optimiser` can compute its update. ``"book"`` evaluates the
#: formulas of this module's docstring as written; ``"torch"`` runs ``torch.optim``'s own
#: kernels (which fuse multiply-adds, so the two differ at rounding level, about 1e-16 per step).
ARITHMETICS = ("book", "torch")
_TORCH_BUFFERS = {"sgd": {"momentum_buffer"}, "adam": {"step", "exp_avg", "exp_avg_sq"}}


@dataclass(frozen=True)
class Optimiser:
    """An update rule with its hyperparameters; build one with :func:`sgd` or :func:`adam`.

    ``arithmetic="book"`` (the default) computes the update with the formulas stated in
    :func:`sgd` and :func:`adam`; ``arithmetic="torch"`` computes the same rule with
    ``torch.optim.SGD``, ``Adam`` or ``AdamW`` (the state is still an explicit
    :class:`OptimiserState`, loaded into a fresh ``torch.optim`` object at every step).
    Runs first recorded with ``torch.optim`` are reproduced bit for bit with the latter.
    ``sam_radius > 0`` (set by :func:`sam`) makes :func:`~lossgeom.training.loop.train` feed the update the SAM
    gradient (:func:`closure_sam_gradient`) instead of the plain one; :meth:`update` itself is the
    base step on whatever gradient it is given.
    """

    kind: str
    lr: float
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
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a finite number > 0 (a step downhill), got {self.lr!r}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum!r}")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay!r}")

    def init(self, params: Params) -> OptimiserState:
        """A fresh state (zero buffers, step 0) for ``params``.

        With ``arithmetic="torch"`` the buffers start empty: ``torch.optim`` creates them
        at the first step, as it does for a new optimiser.

        Args:
            params: the parameters the state is for (names, shapes, dtypes).

        Returns:
            An :class:`OptimiserState` at step 0: buffers ``"m"`` and ``"v"`` (Adam) or
            ``"velocity"`` (SGD) of zeros, or no buffers with ``arithmetic="torch"``.
        """
        if self.arithmetic == "torch":
            return OptimiserState(0, {})
        zeros = {n: torch.zeros_like(p) for n, p in params.items()}
        if self.kind == "adam":
            return OptimiserState(0, {"m": zeros, "v": {n: z.clone() for n, z in zeros.items()}})
        return OptimiserState(0, {"velocity": zeros})

    def accepts(self, state: OptimiserState, params: Params) -> bool:
        """Whether ``state`` is a state of this optimiser for parameters named like ``params``.

        Args:
            state: the candidate state.
            params: the parameters it should be for.

        Returns:
            True if ``state`` is an :class:`OptimiserState` whose buffers are named like ``params``
            and are those this optimiser's kind and arithmetic keep.
        """
        if not isinstance(state, OptimiserState) or any(set(b) != set(params) for b in state.buffers.values()):
            return False
        if self.arithmetic == "torch":
            return set(state.buffers) <= _TORCH_BUFFERS[self.kind]
        return set(state.buffers) == set(self.init(params).buffers)

    def update(self, params: Params, grads: Params, state: OptimiserState) -> tuple[dict, OptimiserState]:
        """One step: return the new parameters and the new state (inputs are not modified).

        Args:
            params: the current parameters ``w``.
            grads: the gradient ``g`` at ``w`` (the keys of ``params``).
            state: the current :class:`OptimiserState`.

        Returns:
            ``(new_params, new_state)``: the updated parameter dict and the state after the step.

        Raises:
            ValueError: if ``grads`` and ``params`` have different keys.
        """
        if set(grads) != set(params):
            raise ValueError("grads must have the same keys as params")
        if self.arithmetic == "torch":
            return self._torch_update(params, grads, state)
        eta, lam, t = self.lr, self.weight_decay, state.step + 1
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

    def torch_optimiser(self, tensors: Sequence[torch.Tensor]) -> torch.optim.Optimizer:
        """The ``torch.optim`` optimiser of this rule over ``tensors``.

        Args:
            tensors: the leaf tensors the optimiser updates.

        Returns:
            ``torch.optim.SGD``, ``torch.optim.Adam`` or (decoupled) ``torch.optim.AdamW`` with
            this rule's hyperparameters.
        """
        if self.kind == "sgd":
            return torch.optim.SGD(tensors, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)
        cls = torch.optim.AdamW if self.decoupled else torch.optim.Adam
        return cls(tensors, lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay)

    def _torch_update(self, params: Params, grads: Params, state: OptimiserState) -> tuple[dict, OptimiserState]:
        names = list(params)
        leaves = [params[n].detach().clone() for n in names]
        optimiser = self.torch_optimiser(leaves)
        for name, leaf in zip(names, leaves):
            leaf.grad = grads[name]
            if state.buffers:
                optimiser.state[leaf] = {k: b[name].clone() for k, b in state.buffers.items()}
        optimiser.step()
        buffers: dict[str, dict[str, torch.Tensor]] = {}
        for name, leaf in zip(names, leaves):
            leaf.grad = None
            for key, value in optimiser.state[leaf].items():
                buffers.setdefault(key, {})[name] = value
        return dict(zip(names, leaves)), OptimiserState(state.step + 1, buffers)


def _weight_decay(weight_decay: float) -> float:
    value = as_real("weight_decay", weight_decay)
    if value < 0:
        raise ValueError(f"weight_decay must be >= 0, got {value}")
    return value


def sgd(
    lr: float,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    decoupled: bool = False,
    arithmetic: str = "book",
) -> Optimiser:
    """(Heavy-ball) SGD as ``torch.optim.SGD``: ``v <- mu v + g'``, ``w <- w - eta v``.

    Args:
        lr: the step size ``eta`` (> 0).
        momentum: the momentum ``mu``, in ``[0, 1)``.
        weight_decay: the weight decay ``lambda`` (>= 0).
        decoupled: whether the weight decay is decoupled (``w <- (1 - eta lambda) w``) rather than
            coupled (``g' = g + lambda w``).
        arithmetic: ``"book"`` or ``"torch"`` (see :data:`ARITHMETICS`).

    Returns:
        The :class:`Optimiser` of kind ``"sgd"``.

    Raises:
        ValueError: if ``momentum`` is outside ``[0, 1)``, ``lr <= 0``, ``weight_decay < 0``,
            ``arithmetic`` is unknown, or ``arithmetic="torch"`` with decoupled weight decay.
    """
    mu = as_real("momentum", momentum)
    if not 0.0 <= mu < 1.0:
        raise ValueError(f"momentum must lie in [0, 1), got {mu}")
    return Optimiser(
        "sgd",
        positive("lr", lr),
        momentum=mu,
        weight_decay=_weight_decay(weight_decay),
        decoupled=bool(decoupled),
        arithmetic=arithmetic,
    )


def adam(
    lr: float,
    betas: Sequence[float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    decoupled: bool = True,
    arithmetic: str = "book",
) -> Optimiser:
    """Adam (``decoupled=False``, L2 in the gradient) or AdamW (``decoupled=True``).

    ``m <- b1 m + (1-b1) g'``, ``v <- b2 v + (1-b2) g'^2``,
    ``w <- w - eta (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)``.

    Args:
        lr: the step size ``eta`` (> 0).
        betas: ``(b1, b2)``, each in ``[0, 1)``.
        eps: the denominator's ``eps`` (> 0).
        weight_decay: the weight decay ``lambda`` (>= 0).
        decoupled: AdamW's decoupled weight decay (True) or L2 in the gradient (False).
        arithmetic: ``"book"`` or ``"torch"`` (see :data:`ARITHMETICS`).

    Returns:
        The :class:`Optimiser` of kind ``"adam"``.

    Raises:
        ValueError: if a beta is outside ``[0, 1)``, ``lr`` or ``eps`` is not > 0,
            ``weight_decay < 0`` or ``arithmetic`` is unknown.
    """
    b1, b2 = (as_real("betas[0]", betas[0]), as_real("betas[1]", betas[1]))
    if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
        raise ValueError(f"betas must lie in [0, 1), got {tuple(betas)}")
    return Optimiser(
        "adam",
        positive("lr", lr),
        betas=(b1, b2),
        eps=positive("eps", eps),
        weight_decay=_weight_decay(weight_decay),
        decoupled=bool(decoupled),
        arithmetic=arithmetic,
    )


def sam(base: Optimiser, radius: float) -> Optimiser:
    """Sharpness-aware minimisation (Foret et al. 2021) with ``base`` as the outer step.

    Each step of :func:`~lossgeom.training.loop.train` evaluates ``g = grad L(w)``, moves to the ascent point
    ``w + rho g / |g|`` (``|g|`` the Euclidean norm over all parameters), and hands the
    gradient there to ``base``'s update; decoupled weight decay still shrinks ``w`` itself.
    This is the first-order solution of ``min_w max_{|e| <= rho} L(w + e)``.

    Args:
        base: the :class:`Optimiser` of the outer step.
        radius: the SAM radius ``rho`` (> 0).

    Returns:
        A copy of ``base`` with ``sam_radius = radius``.

    Raises:
        TypeError: if ``base`` is not an :class:`Optimiser`.
        ValueError: if ``radius`` is not > 0.
    """
    if not isinstance(base, Optimiser):
        raise TypeError(f"base must be an Optimiser (from sgd() or adam()), got {type(base).__name__}")
    return replace(base, sam_radius=positive("radius", radius))


def closure_sam_gradient(
    loss_fn: IndexedLoss,
    params: Params,
    radius: float,
    indices: torch.Tensor | None = None,
    grads: Params | None = None,
) -> dict[str, torch.Tensor]:
    """The SAM gradient ``grad L(w + rho g / |g|)`` with ``g = grad L(w)`` (``grads`` if given).

    At a point with ``g = 0`` the ascent direction is undefined and ``g`` is returned.

    Args:
        loss_fn: the indexed loss ``loss_fn(params, indices)``.
        params: the point ``w``.
        radius: the SAM radius ``rho`` (> 0).
        indices: the examples of the mini-batch; ``None`` means all of them.
        grads: the gradient ``g`` at ``w`` if already computed; ``None`` computes it.

    Returns:
        The gradient dict at the ascent point ``w + rho g / |g|`` (``g`` itself where ``g = 0``).

    Raises:
        FloatingPointError: if the loss is not finite at ``w`` or at the ascent point.
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

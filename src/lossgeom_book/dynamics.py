"""Optimisation dynamics on small, exactly understood objectives.

Each piece is derived in a chapter, named here by its title (chapter numbers shift):

- gradient descent on a quadratic ("Step size meets curvature"): along an eigenvector of
  the Hessian with eigenvalue ``lambda`` the error is multiplied by ``1 - eta * lambda`` at every step,
  so the iteration is stable iff ``0 < eta * lambda < 2`` (:func:`gd_quadratic`,
  :func:`contraction_factors`);
- the optimiser lab of seed 001 ("Saddles, plateaus and optimisers"): gradient descent,
  heavy-ball momentum and Adam on a ravine, a strict saddle and a quartic plateau in two dimensions
  (:class:`LabConfig`, :func:`lab_objective`, :func:`run_lab`);
- perturbed gradient descent (same chapter, Jin et al. 2017): gradient descent that adds a
  small uniform-ball perturbation whenever the gradient is small, so that it leaves a
  strict saddle it would otherwise converge to (:func:`perturbed_gradient_descent`);
- an independent reference for the lab, built from ``torch.optim`` and autograd
  (:func:`run_lab_torch_optim`, :func:`trajectory_discrepancy`), and the second-order
  stationarity test of a network loss (:func:`second_order_stationarity`), which a
  point can pass while being a useless predictor (same chapter).

Everything here is plain float64 numpy / Python arithmetic; the network-scale
optimisers and training loops live in :mod:`lossgeom.training`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from lossgeom.curvature import HessianOperator, top_eigenpairs
from lossgeom_book.checks import as_real, finite_array, positive, positive_int

#: Update rules of the optimiser lab.
LAB_OPTIMISERS = ("gd", "momentum", "adam")
#: Objectives of the optimiser lab.
LAB_OBJECTIVES = ("ravine", "saddle", "plateau")


# --------------------------------------------------------------------------- quadratic


def contraction_factors(eigenvalues, learning_rate: float) -> np.ndarray:
    """The per-step factor ``1 - eta * lambda`` of gradient descent along each eigenvector.

    On ``L(w) = 1/2 (w - w*)^T H (w - w*)`` one step maps the error ``e`` to
    ``(I - eta H) e``; in the eigenbasis of ``H`` that is a multiplication by
    ``1 - eta * lambda_i`` ("Step size meets curvature").
    ``|1 - eta lambda| < 1`` iff ``0 < eta lambda < 2``.
    """
    lam = finite_array("eigenvalues", eigenvalues)
    eta = positive("learning_rate", learning_rate)
    return 1.0 - eta * lam


def gd_quadratic(hessian, start, learning_rate: float, steps: int, minimiser=None) -> np.ndarray:
    """Iterates of gradient descent on ``1/2 (w - w*)^T H (w - w*)``, shape ``(steps + 1, d)``.

    ``w_{t+1} = w_t - eta H (w_t - w*)`` ("Step size meets curvature"). ``hessian`` must be
    a symmetric ``(d, d)`` array; ``minimiser`` defaults to the origin.
    """
    H = finite_array("hessian", hessian, ndim=2)
    d = H.shape[0]
    if H.shape != (d, d) or not np.allclose(H, H.T, rtol=0, atol=1e-12 * max(1.0, np.abs(H).max())):
        raise ValueError(f"hessian must be a symmetric square matrix, got shape {H.shape}")
    w = finite_array("start", start, ndim=1, shape=(d,)).copy()
    w_star = np.zeros(d) if minimiser is None else finite_array("minimiser", minimiser, ndim=1, shape=(d,))
    eta = positive("learning_rate", learning_rate)
    steps = positive_int("steps", steps)
    path = np.empty((steps + 1, d))
    path[0] = w
    for t in range(steps):
        w = w - eta * (H @ (w - w_star))
        path[t + 1] = w
    return path


# --------------------------------------------------------------------------- the lab


@dataclass(frozen=True)
class LabConfig:
    """One run of the optimiser lab (defaults are seed 001's).

    Attributes:
        optimiser: ``"gd"``, ``"momentum"`` (heavy ball, ``v <- mu v + g``, step ``eta v``)
            or ``"adam"`` (``beta1 = momentum``, bias-corrected, ``eps`` added after the root).
        objective: ``"ravine"`` ``1/2 (x^2 + kappa y^2)`` from (4, 4); ``"saddle"``
            ``1/2 x^2 - 1/2 y^2 + 1/4 y^4`` or ``"plateau"`` ``1/2 x^2 + 1/4 y^4``, both
            from (0, perturbation).
        learning_rate: step size ``eta`` (> 0).
        steps: number of updates (>= 1); the trajectory holds ``steps + 1`` points.
        momentum: heavy-ball coefficient, also Adam's ``beta1``; in [0, 1).
        kappa: curvature ratio of the ravine (> 0).
        perturbation: starting ``y`` on the saddle and the plateau.
        beta2: Adam's second-moment decay, in [0, 1).
        epsilon: Adam's denominator offset (>= 0).
    """

    optimiser: str = "gd"
    objective: str = "ravine"
    learning_rate: float = 0.04
    steps: int = 120
    momentum: float = 0.9
    kappa: float = 20.0
    perturbation: float = 1e-3
    beta2: float = 0.999
    epsilon: float = 1e-8

    def __post_init__(self) -> None:
        if self.optimiser not in LAB_OPTIMISERS:
            raise ValueError(f"optimiser must be one of {LAB_OPTIMISERS}, got {self.optimiser!r}")
        if self.objective not in LAB_OBJECTIVES:
            raise ValueError(f"objective must be one of {LAB_OBJECTIVES}, got {self.objective!r}")
        positive("learning_rate", self.learning_rate)
        positive_int("steps", self.steps)
        for name in ("momentum", "beta2"):
            value = as_real(name, getattr(self, name))
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must lie in [0, 1), got {value}")
        positive("kappa", self.kappa)
        as_real("perturbation", self.perturbation)
        if as_real("epsilon", self.epsilon) < 0:
            raise ValueError(f"epsilon must be >= 0, got {self.epsilon}")


def lab_objective(name: str, x: float, y: float, kappa: float = 20.0) -> tuple[float, tuple[float, float]]:
    """Loss and gradient of one lab objective at ``(x, y)``.

    ravine ``1/2 (x^2 + kappa y^2)``; saddle ``1/2 x^2 - 1/2 y^2 + 1/4 y^4`` (a strict
    saddle at the origin, minima at ``y = +-1`` with loss ``-1/4``); plateau
    ``1/2 x^2 + 1/4 y^4`` (a minimum at the origin whose curvature in ``y`` vanishes).
    """
    if name == "ravine":
        return 0.5 * (x * x + kappa * y * y), (x, kappa * y)
    if name == "saddle":
        return 0.5 * x * x - 0.5 * y * y + 0.25 * y**4, (x, y**3 - y)
    if name == "plateau":
        return 0.5 * x * x + 0.25 * y**4, (x, y**3)
    raise ValueError(f"objective must be one of {LAB_OBJECTIVES}, got {name!r}")


def lab_start(config: LabConfig) -> tuple[float, float]:
    """The lab's starting point: (4, 4) on the ravine, (0, perturbation) elsewhere."""
    if config.objective == "ravine":
        return 4.0, 4.0
    return 0.0, float(config.perturbation)


@dataclass(frozen=True)
class LabTrajectory:
    """A lab run: step index, position, loss and gradient norm at each of ``steps + 1`` points."""

    config: LabConfig
    t: np.ndarray
    x: np.ndarray
    y: np.ndarray
    loss: np.ndarray
    grad_norm: np.ndarray = field(repr=False)

    @property
    def final(self) -> dict[str, float]:
        """The last point as a dict with keys ``loss``, ``x`` and ``y``."""
        return {"loss": float(self.loss[-1]), "x": float(self.x[-1]), "y": float(self.y[-1])}


def run_lab(config: LabConfig) -> LabTrajectory:
    """Run one lab configuration and return its trajectory (the lab of seed 001).

    Per step, with gradient ``g_t`` at step ``t = 0, 1, ...``:
    gd ``w -= eta g``; momentum ``v = mu v + g, w -= eta v``; adam
    ``m = b1 m + (1-b1) g, s = b2 s + (1-b2) g^2,
    w -= eta (m / (1 - b1^(t+1))) / (sqrt(s / (1 - b2^(t+1))) + eps)``, coordinate-wise.
    """
    if not isinstance(config, LabConfig):
        raise TypeError(f"config must be a LabConfig, got {type(config).__name__}")
    eta, kind = float(config.learning_rate), config.optimiser
    beta1, beta2, eps = float(config.momentum), float(config.beta2), float(config.epsilon)
    w = list(lab_start(config))
    velocity = [0.0, 0.0]
    first = [0.0, 0.0]
    second = [0.0, 0.0]
    record = np.empty((config.steps + 1, 4))
    for t in range(config.steps + 1):
        loss, grad = lab_objective(config.objective, w[0], w[1], config.kappa)
        record[t] = (w[0], w[1], loss, math.hypot(*grad))
        if t == config.steps:
            break
        for i in range(2):
            g = grad[i]
            if kind == "gd":
                direction = g
            elif kind == "momentum":
                velocity[i] = beta1 * velocity[i] + g
                direction = velocity[i]
            else:
                first[i] = beta1 * first[i] + (1 - beta1) * g
                second[i] = beta2 * second[i] + (1 - beta2) * g * g
                m_hat = first[i] / (1 - beta1 ** (t + 1))
                v_hat = second[i] / (1 - beta2 ** (t + 1))
                direction = m_hat / (math.sqrt(v_hat) + eps)
            w[i] -= eta * direction
    return LabTrajectory(config, np.arange(config.steps + 1), record[:, 0], record[:, 1], record[:, 2], record[:, 3])


# --------------------------------------------------------------------------- saddles


@dataclass(frozen=True)
class PerturbedRun:
    """Iterates of (perturbed) gradient descent and the steps at which noise was added."""

    path: np.ndarray
    loss: np.ndarray
    perturbed_at: tuple[int, ...]


def perturbed_gradient_descent(
    loss_and_grad: Callable[[np.ndarray], tuple[float, np.ndarray]],
    start,
    learning_rate: float,
    steps: int,
    radius: float = 0.0,
    gradient_threshold: float = 1e-3,
    wait: int = 10,
    seed: int = 0,
) -> PerturbedRun:
    """Gradient descent that adds uniform-ball noise when the gradient is small (Jin et al. 2017).

    At step ``t``, if ``|grad| <= gradient_threshold`` and no perturbation happened in the
    last ``wait`` steps, ``w`` is replaced by ``w + xi`` with ``xi`` uniform in the ball
    of radius ``radius``; then ``w -= eta grad(w)``. With ``radius = 0`` this is plain
    gradient descent. Noise comes from ``numpy.random.default_rng(seed)``.

    Args:
        loss_and_grad: maps a float64 vector to ``(loss, gradient)``.
        start: starting point, shape ``(d,)``.
        learning_rate: step size (> 0). steps: number of updates (>= 1).
        radius: perturbation radius (>= 0). gradient_threshold: (> 0). wait: (>= 1).
    """
    w = finite_array("start", start, ndim=1).copy()
    eta = positive("learning_rate", learning_rate)
    steps = positive_int("steps", steps)
    radius = as_real("radius", radius)
    if radius < 0:
        raise ValueError(f"radius must be >= 0, got {radius}")
    threshold = positive("gradient_threshold", gradient_threshold)
    wait = positive_int("wait", wait)
    rng = np.random.default_rng(seed)
    d = w.shape[0]
    path, losses, kicks = [w.copy()], [], []
    last_kick = -wait - 1
    for t in range(steps):
        loss, grad = loss_and_grad(w)
        losses.append(float(loss))
        if radius > 0 and np.linalg.norm(grad) <= threshold and t - last_kick > wait:
            direction = rng.standard_normal(d)
            direction /= np.linalg.norm(direction)
            w = w + radius * rng.uniform() ** (1.0 / d) * direction
            kicks.append(t)
            last_kick = t
            loss, grad = loss_and_grad(w)
        w = w - eta * np.asarray(grad, dtype=np.float64)
        path.append(w.copy())
    losses.append(float(loss_and_grad(w)[0]))
    return PerturbedRun(np.array(path), np.array(losses), tuple(kicks))


def saddle_loss_and_grad(w: np.ndarray) -> tuple[float, np.ndarray]:
    """The lab's strict saddle ``1/2 x^2 - 1/2 y^2 + 1/4 y^4`` as a vector function (for PGD)."""
    loss, grad = lab_objective("saddle", float(w[0]), float(w[1]))
    return loss, np.array(grad)


# --------------------------------------------------------------------------- lab reference


def run_lab_torch_optim(config: LabConfig) -> LabTrajectory:
    """The same lab run with ``torch.optim`` and torch autograd: an independent reference.

    Gradients come from autograd of the objective (not from :func:`lab_objective`'s
    hand-written gradient) and the updates from ``torch.optim.SGD`` (``momentum=0`` for
    gd; heavy ball ``v <- mu v + g``, step ``eta v`` with ``dampening=0``) and
    ``torch.optim.Adam`` (``betas=(momentum, beta2)``, ``eps`` added after the root, bias
    correction). These are the update rules :func:`run_lab` states, computed by other code
    ("Saddles, plateaus and optimisers" compares the two at every step, claim M8).
    """
    if not isinstance(config, LabConfig):
        raise TypeError(f"config must be a LabConfig, got {type(config).__name__}")
    import torch

    w = torch.tensor(lab_start(config), dtype=torch.float64, requires_grad=True)
    eta = float(config.learning_rate)
    if config.optimiser == "adam":
        opt = torch.optim.Adam([w], lr=eta, betas=(config.momentum, config.beta2), eps=config.epsilon)
    else:
        opt = torch.optim.SGD([w], lr=eta, momentum=config.momentum if config.optimiser == "momentum" else 0.0)
    record = np.empty((config.steps + 1, 4))
    for t in range(config.steps + 1):
        opt.zero_grad()
        loss, _ = lab_objective(config.objective, w[0], w[1], config.kappa)
        loss.backward()
        record[t] = (w[0].item(), w[1].item(), loss.item(), w.grad.norm().item())
        if t < config.steps:
            opt.step()
    return LabTrajectory(config, np.arange(config.steps + 1), record[:, 0], record[:, 1], record[:, 2], record[:, 3])


def run_lab_grid(
    learning_rates=(0.04, 0.1), steps: int = 120, runner: Callable[[LabConfig], LabTrajectory] = run_lab
) -> dict[tuple, LabTrajectory]:
    """Every lab optimiser on every lab objective at each learning rate (seed 001's grid).

    Returns ``{(optimiser, objective, learning_rate): trajectory}``, one gradient
    evaluation per step for every run (a matched budget). ``runner`` is :func:`run_lab`
    or the reference :func:`run_lab_torch_optim`.
    """
    rates = [positive("learning_rates", lr) for lr in np.atleast_1d(finite_array("learning_rates", learning_rates))]
    return {
        (o, ob, lr): runner(LabConfig(o, ob, lr, steps=steps))
        for ob in LAB_OBJECTIVES
        for o in LAB_OPTIMISERS
        for lr in rates
    }


def trajectory_discrepancy(first: LabTrajectory, second: LabTrajectory) -> float:
    """Largest pointwise relative difference of ``x``, ``y`` and loss between two runs.

    ``max |u - v| / max(|u|, |v|)`` over every step and the three quantities, with
    ``0/0 = 0`` (points where both runs are exactly zero agree). Two implementations of
    the same update rule differ only by rounding, amplified at most modestly.
    """
    for name, run in (("first", first), ("second", second)):
        if not isinstance(run, LabTrajectory):
            raise TypeError(f"{name} must be a LabTrajectory, got {type(run).__name__}")
    if first.t.shape != second.t.shape:
        raise ValueError(f"the runs must have the same number of points, got {first.t.size} and {second.t.size}")
    a = np.column_stack([first.x, first.y, first.loss])
    b = np.column_stack([second.x, second.y, second.loss])
    scale = np.maximum(np.abs(a), np.abs(b))
    gap = np.abs(a - b)
    return float(np.max(np.where(scale > 0, gap / np.where(scale > 0, scale, 1.0), 0.0)))


def first_step_below(values, level: float) -> int | None:
    """The first index ``t`` with ``values[t] < level``, or ``None`` if there is none."""
    arr = finite_array("values", values, ndim=1)
    hits = np.flatnonzero(arr < as_real("level", level))
    return int(hits[0]) if hits.size else None


# --------------------------------------------------------------------------- stationarity


@dataclass(frozen=True)
class StationarityReport:
    """First- and second-order stationarity of a loss at a point.

    Used in "Saddles, plateaus and optimisers" to show that passing this test says nothing
    about the predictor.

    Attributes:
        gradient_norm: ``||grad L||`` (Euclidean, flattened parameters).
        smallest_eigenvalue: the most negative (smallest) Hessian eigenvalue, by Lanczos.
        largest_eigenvalue: the largest Hessian eigenvalue, by Lanczos.
        loss: the loss at the point.
    """

    gradient_norm: float
    smallest_eigenvalue: float
    largest_eigenvalue: float
    loss: float

    def is_second_order_stationary(self, gradient_tol: float, curvature_tol: float) -> bool:
        """``||g|| <= gradient_tol`` and ``lambda_min >= -curvature_tol``.

        Jin et al. (2017) call such a point an approximate second-order stationary point
        (with ``curvature_tol = sqrt(rho * gradient_tol)`` for a rho-Hessian-Lipschitz
        loss). It is a statement about the objective near the point, not about how good
        the predictor is.
        """
        return bool(
            self.gradient_norm <= positive("gradient_tol", gradient_tol)
            and self.smallest_eigenvalue >= -positive("curvature_tol", curvature_tol)
        )


def second_order_stationarity(loss_fn: Callable, params, seed: int = 0) -> StationarityReport:
    """Gradient norm and extreme Hessian eigenvalues of ``loss_fn`` at ``params``.

    The eigenvalues come from Lanczos on Hessian-vector products
    (:func:`lossgeom.curvature.top_eigenpairs` on :class:`lossgeom.curvature.HessianOperator`,
    i.e. ``scipy.sparse.linalg.eigsh``), so the check scales to networks.

    Args:
        loss_fn: maps a parameter dict to a scalar tensor.
        params: the point, a dict of float64 tensors.
        seed: seed of the Lanczos start vectors.
    """
    operator = HessianOperator.from_closure(loss_fn, params)
    largest = top_eigenpairs(operator, k=1, which="largest", seed=seed).values[0]
    smallest = top_eigenpairs(operator, k=1, which="smallest", seed=seed).values[0]
    return StationarityReport(
        float(np.linalg.norm(operator.gradient())), float(smallest), float(largest), float(loss_fn(params).item())
    )


# --------------------------------------------------------------------------- edge of stability


@dataclass(frozen=True)
class EdgeOfStabilitySummary:
    """Late-phase statistics of a gradient-descent run whose sharpness was tracked.

    The *stability ratio* is ``lambda_max * eta / 2``: the sharpness in units of the
    quadratic stability limit ``2 / eta`` (chapter "Step size meets curvature").

    Attributes:
        learning_rate: the step size ``eta``.
        late_from: first step of the late phase.
        n_late: number of sharpness measurements in the late phase.
        median_ratio, min_ratio, max_ratio: the stability ratio over those measurements.
        late_rise_fraction: fraction of late updates after which the loss was higher.
        loss_rose_late: whether the loss rose at any late update (``late_rise_fraction > 0``).
        loss_start, loss_late_start, loss_end: the loss at step 0, at ``late_from`` and
            before the last update.
        start_step, start_ratio: the first measured step and the stability ratio there.
        rose: whether the late median lies above ``start_ratio`` (``None`` when the first
            measurement is already in the late phase, so there is nothing to rise from).
    """

    learning_rate: float
    late_from: int
    n_late: int
    median_ratio: float
    min_ratio: float
    max_ratio: float
    late_rise_fraction: float
    loss_rose_late: bool
    loss_start: float
    loss_late_start: float
    loss_end: float
    start_step: int
    start_ratio: float
    rose: bool | None

    @property
    def can_show_rise(self) -> bool:
        """Whether the run was measured before its late phase *below* the edge (ratio < 1).

        Only such a run can show the sharpness rising to ``2 / eta``: a run that starts at
        or above the edge can at most fall back to it.
        """
        return self.rose is not None and self.start_ratio < 1


def edge_of_stability_summary(
    measured_at, sharpness, losses, learning_rate: float, late_from: int
) -> EdgeOfStabilitySummary:
    """Summarise a run's late phase: sharpness against ``2 / eta`` and loss increases.

    Args:
        measured_at: the steps at which the sharpness was measured.
        sharpness: ``lambda_max`` at those steps.
        losses: the loss before each update (``losses[t]`` at step ``t``).
        learning_rate: the step size ``eta`` (> 0).
        late_from: the late phase is every step ``>= late_from``; it must hold at least
            one sharpness measurement and two losses.

    Raises:
        ValueError: on mismatched lengths, non-finite values, or an empty late phase.
    """
    steps = finite_array("measured_at", measured_at, ndim=1)
    values = finite_array("sharpness", sharpness, ndim=1)
    loss = finite_array("losses", losses, ndim=1)
    eta = positive("learning_rate", learning_rate)
    if steps.shape != values.shape:
        raise ValueError(f"measured_at and sharpness must have the same length, got {steps.size} and {values.size}")
    if isinstance(late_from, bool) or not isinstance(late_from, (int, np.integer)) or late_from < 0:
        raise ValueError(f"late_from must be an int >= 0, got {late_from!r}")
    late = values[steps >= late_from] * eta / 2
    if late.size == 0 or loss.size - late_from < 2:
        raise ValueError(
            f"the late phase from step {late_from} must hold at least one sharpness "
            f"measurement and two losses (got {late.size} and {max(loss.size - late_from, 0)})"
        )
    rises = np.diff(loss[late_from:]) > 0
    first = int(np.argmin(steps))
    start_step, start_ratio = int(steps[first]), float(values[first] * eta / 2)
    median = float(np.median(late))
    rose = None if start_step >= late_from else bool(median > start_ratio)
    return EdgeOfStabilitySummary(
        eta,
        int(late_from),
        int(late.size),
        median,
        float(late.min()),
        float(late.max()),
        float(rises.mean()),
        bool(rises.any()),
        float(loss[0]),
        float(loss[late_from]),
        float(loss[-1]),
        start_step,
        start_ratio,
        rose,
    )

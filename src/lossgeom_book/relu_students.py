"""Chapter 11's experiment (*Quotient flatness*): two-layer ReLU students of a ReLU teacher.

The library side (:mod:`lossgeom.flatness.relu_quotient`, :mod:`lossgeom.flatness.stability`)
computes the quotient coordinates, ``Flat^Q`` and SGD stability of any two-layer ReLU
network; this module runs the chapter's experiment on them:

- the teacher-student task (:func:`teacher_student`);
- :func:`train_students`: many small students trained at once by
  :func:`lossgeom.training.loop.train`, each frozen at the first check where its loss is
  below its target; :func:`fit_students` does the same with any update rule of
  :mod:`lossgeom.training.rules` on closed-form gradients (:func:`student_gradients`), faster;
- what to read off such runs: :func:`first_check_below`, :func:`stable_counts` (stable pairs
  along a run), :func:`loss_pace` and :func:`steps_at_recent_pace`, :func:`fitting_profile`
  (how a measure moves while the loss falls);
- two-dimensional loss slices in raw and quotient coordinates (:func:`slice_directions`,
  :func:`slice_cross_entropy`).

The generalisation bound and the kink lemma are in :mod:`lossgeom_book.relu_generalisation`.
Shapes follow :mod:`lossgeom.flatness.relu_quotient`: ``a (S, M)``, ``W (S, M, d)`` for ``S``
students padded with absent neurons to a common width ``M``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from lossgeom.flatness.relu_quotient import (
    quotient_coordinates,
    quotient_flatness,
    raw_hessian_trace,
    two_layer_weights,
)
from lossgeom.flatness.stability import stable_pair_grid
from lossgeom.training.loop import Monitor, StopWhen, train
from lossgeom.training.rules import Optimiser, sgd
from lossgeom_book.checks import finite_tensor, positive, positive_int
from lossgeom_book.models import checked_inputs, checked_weights, regression_loss, relu_network, two_layer_relu

# ---------------------------------------------------------------------------------------
# The teacher-student task
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TeacherStudentTask:
    """Inputs on the unit sphere, a two-layer ReLU teacher and its noise-free labels."""

    x: torch.Tensor
    y: torch.Tensor
    teacher_a: torch.Tensor
    teacher_W: torch.Tensor
    description: str


def teacher_student(n: int = 25, d: int = 4, m_teacher: int = 4, seed: int = 0) -> TeacherStudentTask:
    """``n`` inputs uniform on ``S^{d-1}``; teacher rows ``w_r`` uniform on ``S^{d-1}``, ``a_r ~ N(0, 1/m_t)``."""
    n, d, m_t = positive_int("n", n), positive_int("d", d), positive_int("m_teacher", m_teacher)
    g = torch.Generator().manual_seed(int(seed))
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    W_t = torch.randn(m_t, d, generator=g, dtype=torch.float64)
    a_t = torch.randn(m_t, generator=g, dtype=torch.float64) / math.sqrt(m_t)
    x, W_t = x / x.norm(dim=1, keepdim=True), W_t / W_t.norm(dim=1, keepdim=True)
    desc = (
        f"teacher-student: n = {n} inputs uniform on S^{d - 1}, teacher width {m_t} "
        f"(unit w_r, a_r ~ N(0, 1/{m_t})), noise-free labels, seed {seed}"
    )
    return TeacherStudentTask(x, relu_network(a_t, W_t, x), a_t, W_t, desc)


# ---------------------------------------------------------------------------------------
# Two-dimensional slices in raw and quotient coordinates
# ---------------------------------------------------------------------------------------


def slice_directions(
    a: torch.Tensor, W: torch.Tensor, seed: int, coordinates: str = "raw"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The centre and two seeded random directions of a 2-D loss slice, as flat vectors ``[a, W]``.

    ``coordinates="raw"``: the centre is ``(a, W)``; each direction is Gaussian, filter-normalised
    (Li et al. 2018): row r of the ``W`` part gets the norm of ``w_r`` and output unit j's weights
    (column j of ``a``) the norm of ``a[:, j]``. ``coordinates="quotient"``: the centre is
    ``(alpha, U)``; the ``alpha_r`` part of a direction gets the norm of ``alpha_r`` and the ``u_r``
    part is projected onto the tangent space at ``u_r`` and given unit norm (the norm of ``u_r``).
    Both directions use the same Gaussian draws for the same seed and shapes.
    """
    if coordinates not in ("raw", "quotient"):
        raise ValueError(f"coordinates must be 'raw' or 'quotient', got {coordinates!r}")
    a, W, vector = checked_weights(a, W)
    if W.ndim != 2:
        raise ValueError(f"slice_directions takes one network: W must be (m, d), got {tuple(W.shape)}")
    a2 = a if vector else a[:, None]
    if coordinates == "quotient":
        alpha, U = quotient_coordinates(a2, W)
        centre_a, centre_W = alpha, U
    else:
        centre_a, centre_W = a2, W
    g = torch.Generator().manual_seed(int(seed))
    directions = []
    for _ in range(2):
        da = torch.randn(a2.shape, generator=g, dtype=torch.float64)
        dW = torch.randn(W.shape, generator=g, dtype=torch.float64)
        if coordinates == "raw":
            da = da / da.norm(dim=0, keepdim=True) * centre_a.norm(dim=0, keepdim=True)
            dW = dW / dW.norm(dim=1, keepdim=True) * centre_W.norm(dim=1, keepdim=True)
        else:
            da = da / da.norm(dim=1, keepdim=True) * centre_a.norm(dim=1, keepdim=True)
            dW = dW - (dW * centre_W).sum(1, keepdim=True) * centre_W
            dW = dW / dW.norm(dim=1, keepdim=True)
        directions.append(torch.cat([da.reshape(-1), dW.reshape(-1)]).numpy())
    centre = torch.cat([centre_a.reshape(-1), centre_W.reshape(-1)]).numpy()
    return centre, directions[0], directions[1]


def slice_cross_entropy(
    points, x: torch.Tensor, y: torch.Tensor, m: int, k: int, coordinates: str = "raw"
) -> np.ndarray:
    """Mean cross-entropy of ``x -> sum_r a_r ReLU(w_r^T x)`` at every flat point ``[a (m, k), W (m, d)]``.

    ``points`` has shape ``(..., m k + m d)`` (e.g. from :func:`lossgeom.landscape.plane_grid`).
    With ``coordinates="quotient"`` a point is ``[alpha, U]`` and each ``u_r`` is normalised
    first, so the loss is that of the quotient point (a retraction onto the spheres).
    """
    if coordinates not in ("raw", "quotient"):
        raise ValueError(f"coordinates must be 'raw' or 'quotient', got {coordinates!r}")
    x = finite_tensor("x", x)
    m, k = positive_int("m", m), positive_int("k", k)
    P = torch.as_tensor(np.asarray(points, dtype=np.float64))
    d = x.shape[1]
    if P.shape[-1] != m * k + m * d:
        raise ValueError(f"points must end in m k + m d = {m * k + m * d} coordinates, got {tuple(P.shape)}")
    flat = P.reshape(-1, P.shape[-1])
    A, Wb = flat[:, : m * k].reshape(-1, m, k), flat[:, m * k :].reshape(-1, m, d)
    if coordinates == "quotient":
        Wb = Wb / Wb.norm(dim=-1, keepdim=True)
    losses = []
    for start in range(0, flat.shape[0], 64):  # blocks of 64 points keep memory small
        logits = torch.relu(x @ Wb[start : start + 64].transpose(1, 2)) @ A[start : start + 64]
        losses.append(
            torch.nn.functional.cross_entropy(
                logits.transpose(1, 2), y.expand(logits.shape[0], -1), reduction="none"
            ).mean(-1)
        )
    return torch.cat(losses).reshape(P.shape[:-1]).numpy()


# ---------------------------------------------------------------------------------------
# Many students at once
# ---------------------------------------------------------------------------------------


def init_students(
    d: int, widths: Sequence[int], seeds: Sequence[int], init_scales: Sequence[float] = (1.0,)
) -> tuple[torch.Tensor, torch.Tensor, list[tuple[float, int, int]]]:
    """Initial ``(a, W)`` of every (init scale, width, seed), padded with absent neurons to the largest width.

    Each student is :func:`two_layer_relu` ``(d, m, seed=seed, init_scale=scale)``, so one seed
    gives the same directions at every scale. Returns ``a (S, M)``, ``W (S, M, d)`` and the labels.
    """
    width = max(positive_int("width", m) for m in widths)
    rows, labels = [], []
    for scale in init_scales:
        for m in widths:
            for seed in seeds:
                a, W = two_layer_weights(two_layer_relu(d, m, seed=seed, init_scale=scale))
                rows.append((torch.cat([a, a.new_zeros(width - m)]), torch.cat([W, W.new_zeros(width - m, d)])))
                labels.append((float(scale), int(m), int(seed)))
    return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows]), labels


@dataclass(frozen=True)
class StudentFits:
    """Every student's parameters at each check, whether it reached its target, and its history.

    ``a[:, j]`` and ``W[:, j]`` are the parameters after ``steps[j]`` updates (a frozen
    student keeps its last ones); ``history[key][:, j]`` holds the loss, ``Flat^Q``, its
    Gauss-Newton part and the raw Hessian trace there. ``final`` gives the last ``(a, W)``.
    """

    a: torch.Tensor
    W: torch.Tensor
    converged: torch.Tensor
    steps: np.ndarray
    history: dict[str, np.ndarray]

    @property
    def final(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.a[:, -1], self.W[:, -1]


def train_students(
    a: torch.Tensor,
    W: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    learning_rate: float,
    target_loss,
    max_steps: int,
    check_every: int = 100,
) -> StudentFits:
    """Full-batch gradient descent on every student's ``L`` at once, with :func:`lossgeom.training.loop.train`.

    The students' losses are summed, so each one's gradient is its own. A monitor checks
    every ``check_every`` steps (and after the last): it records the history and freezes
    each student whose loss is below its ``target_loss`` (a number or one per student;
    its loss drops out of the sum, so it stops moving); a stop hook ends the run when all
    are frozen, else it ends after ``max_steps`` updates.
    """
    a, W, vector = checked_weights(a, W)
    if vector or W.ndim != 3:
        raise ValueError("train_students takes a batch of one-output students: a (S, M), W (S, M, d)")
    x, y = checked_inputs(x, W.shape[-1]), finite_tensor("y", y)
    if y.shape != (x.shape[0],):
        raise ValueError(f"y must have shape ({x.shape[0]},), got {tuple(y.shape)}")
    targets = torch.as_tensor(target_loss, dtype=torch.float64).expand(W.shape[0]).clone()
    if not (targets > 0).all():
        raise ValueError("target_loss must be > 0")
    max_steps, every = positive_int("max_steps", max_steps), positive_int("check_every", check_every)

    x_t, running = x.T.contiguous(), torch.ones(W.shape[0], dtype=torch.float64)

    def loss_fn(params, indices=None):  # the summed losses of the running students, without input checks
        F = (params["a"].unsqueeze(-2) @ torch.relu(params["W"] @ x_t)).squeeze(-2)
        return 0.5 * (running * ((F - y) ** 2).mean(-1)).sum()

    def check(step: int, params: dict) -> tuple[dict, tuple]:
        nonlocal running
        record = {
            "loss": regression_loss(params["a"], params["W"], x, y),
            "flatness": quotient_flatness(params["a"], params["W"], x, y),
            "gauss_newton": quotient_flatness(params["a"], params["W"], x, y, part="gauss_newton"),
            "raw": raw_hessian_trace(params["a"], params["W"], x),
        }
        running = torch.where(record["loss"] < targets, 0.0, running)
        return {k: v.numpy().copy() for k, v in record.items()}, (params["a"], params["W"])

    run = train(
        loss_fn,
        {"a": a, "W": W},
        sgd(learning_rate),
        max_steps,
        hooks=[
            Monitor("check", check, every=every),
            StopWhen(lambda step, params: not running.any(), "every student reached its target"),
        ],
    )
    checks = run.records["check"]
    history = {k: np.stack([record[k] for _, (record, _) in checks], axis=1) for k in checks[0][1][0]}
    return StudentFits(
        torch.stack([s[0] for _, (_, s) in checks], 1),
        torch.stack([s[1] for _, (_, s) in checks], 1),
        running == 0,
        np.array([step for step, _ in checks]),
        history,
    )


# ---------------------------------------------------------------------------------------
# Many students with any update rule, and what to read off their runs
# ---------------------------------------------------------------------------------------


def student_gradients(
    a: torch.Tensor, W: torch.Tensor, x: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each student's ``L = (1/2n) sum_i r_i^2`` and its gradient in closed form, ``r_i = F(x_i) - y_i``.

    ``dL/da_r = (1/n) sum_i r_i ReLU(w_r^T x_i)`` and ``dL/dw_r = (1/n) sum_i r_i a_r 1[w_r^T x_i > 0] x_i``
    (the derivative of ReLU at 0 taken as 0, as torch's autograd takes it). Returns
    ``(loss (...,), grad_a (..., m), grad_W (..., m, d))``.
    """
    a, W, vector = checked_weights(a, W)
    if vector:
        raise ValueError("student_gradients needs one-output networks (a of shape (..., m))")
    x, y = checked_inputs(x, W.shape[-1]), finite_tensor("y", y)
    if y.shape != (x.shape[0],):
        raise ValueError(f"y must have shape ({x.shape[0]},), got {tuple(y.shape)}")
    return _student_gradients(a, W, x, y)


def _student_gradients(a, W, x, y):
    z = W @ x.T  # (..., m, n)
    hidden = torch.relu(z)
    r = (a.unsqueeze(-1) * hidden).sum(-2) - y  # (..., n)
    n = x.shape[0]
    grad_a = (hidden * r.unsqueeze(-2)).sum(-1) / n
    grad_W = ((z > 0).to(x.dtype) * (a.unsqueeze(-1) * r.unsqueeze(-2))) @ x / n
    return 0.5 * (r**2).mean(-1), grad_a, grad_W


def fit_students(
    a: torch.Tensor,
    W: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    optimiser,
    *,
    target_loss,
    max_steps: int,
    check_every: int = 100,
) -> StudentFits:
    """Full-batch training of every student by ``optimiser``, each frozen at the first check below its target.

    ``optimiser`` is any update rule of :mod:`lossgeom.training.rules` (:func:`~lossgeom.training.rules.sgd`
    with or without momentum, :func:`~lossgeom.training.rules.adam`); its ``update`` is applied
    to the closed-form gradients of :func:`student_gradients`, so the rule is the package's
    own and only the gradient is computed without autograd. Every ``check_every`` steps (and
    after the last) the loss, ``Flat^Q``, its Gauss-Newton part and the raw Hessian trace are
    recorded, as in :func:`train_students`; a student whose loss is below its ``target_loss``
    (a number or one per student) is frozen: its parameters and optimiser buffers stop
    changing. The run ends when all are frozen or after ``max_steps`` updates.
    With ``sgd(eta)`` the result equals :func:`train_students` ``(learning_rate=eta)`` to rounding.
    """
    if not isinstance(optimiser, Optimiser):
        raise TypeError(
            f"optimiser must be an Optimiser (from lossgeom.training.rules.sgd or adam), got {type(optimiser).__name__}"
        )
    if optimiser.sam_radius:
        raise ValueError(
            "fit_students takes plain update rules; SAM needs a loss closure (use lossgeom.training.loop.train)"
        )
    a, W, vector = checked_weights(a, W)
    if vector or W.ndim != 3:
        raise ValueError("fit_students takes a batch of one-output students: a (S, M), W (S, M, d)")
    x, y = checked_inputs(x, W.shape[-1]), finite_tensor("y", y)
    if y.shape != (x.shape[0],):
        raise ValueError(f"y must have shape ({x.shape[0]},), got {tuple(y.shape)}")
    targets = torch.as_tensor(target_loss, dtype=torch.float64).expand(W.shape[0]).clone()
    if not (targets > 0).all():
        raise ValueError("target_loss must be > 0")
    max_steps, every = positive_int("max_steps", max_steps), positive_int("check_every", check_every)
    # One packed tensor theta = [a_r, w_r] per neuron: the update rules act elementwise, so this is
    # the same arithmetic with half the tensor operations per step.
    params = {"theta": torch.cat([a.unsqueeze(-1), W], -1)}
    state = optimiser.init(params)
    running = torch.ones(W.shape[0], dtype=torch.bool)
    steps, records, snapshots = [], [], []
    with torch.inference_mode():  # no autograd bookkeeping in the loop
        for step in range(max_steps + 1):
            theta = params["theta"]
            if step % every == 0 or step == max_steps:
                if not bool(torch.isfinite(theta).all()):
                    raise FloatingPointError(f"a student's parameters became non-finite by step {step}")
                a_now, W_now = theta[..., 0], theta[..., 1:]
                record = {
                    "loss": regression_loss(a_now, W_now, x, y),
                    "flatness": quotient_flatness(a_now, W_now, x, y),
                    "gauss_newton": quotient_flatness(a_now, W_now, x, y, part="gauss_newton"),
                    "raw": raw_hessian_trace(a_now, W_now, x),
                }
                running = running & ~(record["loss"] < targets)
                all_running = bool(running.all())
                steps.append(step)
                records.append({k: v.numpy().copy() for k, v in record.items()})
                snapshots.append(theta)
                if not running.any():
                    break
            if step == max_steps:
                break
            _, grad_a, grad_W = _student_gradients(theta[..., 0], theta[..., 1:], x, y)
            new_params, new_state = optimiser.update(
                params, {"theta": torch.cat([grad_a.unsqueeze(-1), grad_W], -1)}, state
            )
            if not all_running:  # frozen students keep their parameters and buffers
                new_params = {"theta": _where_running(running, new_params["theta"], theta)}
                new_state = type(new_state)(
                    new_state.step,
                    {
                        key: {
                            k: (
                                _where_running(running, t, state.buffers[key][k])
                                if key in state.buffers and t.shape == theta.shape
                                else t
                            )
                            for k, t in b.items()
                        }
                        for key, b in new_state.buffers.items()
                    },
                )
            params, state = new_params, new_state
    history = {k: np.stack([r[k] for r in records], axis=1) for k in records[0]}
    stacked = torch.stack(snapshots, 1).clone()  # an ordinary tensor again, outside inference mode
    return StudentFits(stacked[..., 0].clone(), stacked[..., 1:].clone(), ~running, np.array(steps), history)


def _where_running(running: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    return torch.where(running.reshape(-1, *([1] * (new.ndim - 1))), new, old)


def first_check_below(fits: StudentFits, thresholds: Sequence[float]) -> np.ndarray:
    """Index of each student's first check with loss ``< threshold``, for every threshold: ``(S, T)``, -1 if never."""
    levels = [positive("threshold", t) for t in thresholds]
    losses = fits.history["loss"]
    below = losses[:, None, :] < np.array(levels)[None, :, None]  # (S, T, checks)
    return np.where(below.any(-1), below.argmax(-1), -1)


def stable_counts(
    fits: StudentFits,
    x: torch.Tensor,
    learning_rates: Sequence[float],
    batch_sizes: Sequence[int],
    checks,
    replacement: bool = True,
) -> np.ndarray:
    """Number of stable ``(eta, B)`` pairs (:func:`stable_pair_grid`) of student i at check ``checks[i, t]``.

    ``checks`` is an integer array ``(S, T)`` of check indices (as from :func:`first_check_below`);
    -1 marks a student that never got there and gives ``nan``. Returns a float array ``(S, T)``.
    """
    index = np.asarray(checks)
    if index.ndim != 2 or index.shape[0] != fits.a.shape[0] or not np.issubdtype(index.dtype, np.integer):
        raise ValueError(f"checks must be an integer array of shape ({fits.a.shape[0]}, T), got {index.shape}")
    if (index >= fits.a.shape[1]).any() or (index < -1).any():
        raise ValueError(f"checks must lie in [-1, {fits.a.shape[1] - 1}] (-1: never reached)")
    counts = np.full(index.shape, np.nan)
    for (i, t), j in np.ndenumerate(index):
        if j >= 0:
            counts[i, t] = stable_pair_grid(
                fits.a[i, j], fits.W[i, j], x, learning_rates, batch_sizes, replacement
            ).sum()
    return counts


def loss_pace(fits: StudentFits, window: int, end_step: int | None = None) -> np.ndarray:
    """Each student's geometric pace ``log(L(t - window) / L(t)) / window`` per step, ``t = end_step``.

    ``t`` defaults to the last check; both ``t`` and ``t - window`` must be check steps. A
    positive pace means the loss fell; e-folds of the loss per step.
    """
    span = positive_int("window", window)
    end = int(fits.steps[-1]) if end_step is None else int(end_step)
    position = {int(step): j for j, step in enumerate(fits.steps)}
    if end not in position or end - span not in position:
        raise ValueError(
            f"window must be a multiple of the check interval, with end_step - window and end_step "
            f"check steps in [0, {int(fits.steps[-1])}], got window {span}, end_step {end}"
        )
    losses = fits.history["loss"]
    return np.log(losses[:, position[end - span]] / losses[:, position[end]]) / span


def steps_at_recent_pace(fits: StudentFits, target: float, window: int) -> np.ndarray:
    """Steps each student still needs to reach ``target`` at the geometric pace of its last ``window`` steps.

    With ``L_end`` the last recorded loss and :func:`loss_pace` ``p`` over the last ``window``
    steps, the answer is ``log(L_end / target) / p``: 0 for a student already below ``target``,
    ``inf`` for one whose loss did not fall. A loss whose pace keeps dropping needs more.
    """
    level = positive("target", target)
    pace = loss_pace(fits, window)
    loss_end = fits.history["loss"][:, -1]
    with np.errstate(divide="ignore"):
        needed = np.where(pace > 0, np.log(loss_end / level) / np.where(pace > 0, pace, 1.0), np.inf)
    return np.where(loss_end < level, 0.0, needed)


@dataclass(frozen=True)
class FittingProfile:
    """How a measure ``M`` (e.g. ``Flat^Q``) moves while the loss ``L`` falls, over one recorded run.

    ``co_moving``: share of the recorded intervals in which ``L`` fell and ``M`` rose.
    ``peak_position``: where ``M`` is largest, as a fraction of the run (0 start, 1 end).
    ``loss_share_before_peak``: ``(L_0 - L_peak) / (L_0 - L_end)``, the share of the loss decrease
    made before the peak; ``decades_before_peak`` the same share of ``log L``.
    ``fall_after_peak``: ``(M_peak - M_end) / |M_peak|``. ``loss_monotone``: ``L`` never rose.
    """

    co_moving: float
    peak_position: float
    loss_share_before_peak: float
    decades_before_peak: float
    fall_after_peak: float
    loss_monotone: bool


def fitting_profile(loss, measure) -> FittingProfile:
    """The :class:`FittingProfile` of one run from its recorded losses and measure values.

    Trailing records after the loss stopped changing (a frozen student) are dropped; the
    co-moving share counts only the intervals in which the loss changed.
    """
    L = np.asarray(loss, dtype=np.float64)
    M = np.asarray(measure, dtype=np.float64)
    if L.ndim != 1 or L.shape != M.shape or L.size < 2:
        raise ValueError(f"loss and measure must be 1-D of one length >= 2, got {L.shape} and {M.shape}")
    if not (np.isfinite(L).all() and np.isfinite(M).all()) or (L <= 0).any():
        raise ValueError("loss must be positive and finite and measure finite")
    moving = np.flatnonzero(np.diff(L) != 0)
    if moving.size == 0 or L[moving[-1] + 1] >= L[0]:
        raise ValueError("the loss must fall over the run")
    end = moving[-1] + 1
    L, M = L[: end + 1], M[: end + 1]
    falls, rises = np.diff(L)[moving] < 0, np.diff(M)[moving] > 0
    peak = int(np.argmax(M))
    return FittingProfile(
        co_moving=float((falls & rises).mean()),
        peak_position=peak / end,
        loss_share_before_peak=float((L[0] - L[peak]) / (L[0] - L[-1])),
        decades_before_peak=float(np.log(L[0] / L[peak]) / np.log(L[0] / L[-1])),
        fall_after_peak=float((M[peak] - M[-1]) / abs(M[peak])) if M[peak] != 0 else 0.0,
        loss_monotone=bool((np.diff(L) <= 0).all()),
    )

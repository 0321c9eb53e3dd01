"""The teacher-student tree committee machine: data, students, minimisers, Hessian spectra.

A *tree committee machine* with ``K`` hidden units reads an input ``x`` in ``R^N`` cut into
``K`` disjoint blocks ``x_k`` of ``d = N / K`` coordinates; its ``N`` weights ``w`` are cut
the same way, so the number of parameters equals the input dimension::

    f(w; x) = K^(-1/2) sum_k g(h_k),   h_k = w_k . x_k / sqrt(d),   g(z) = erf(z / sqrt 2).

A teacher ``w* ~ N(0, I_N)`` labels Gaussian inputs ``x ~ N(0, I_N)``: ``y = f(w*; x)``
(regression) or ``y = sign f(w*; x)`` (classification, still fitted with the square
loss). A student of the same architecture minimises the ridge-regularised square loss::

    L(w) = 1/2 sum_mu (f(w; x_mu) - y_mu)^2 + lambda/2 |w|^2

on ``n = alpha N`` samples, the set-up whose Hessian spectra the seed (003) studies in the
proportional limit ``N, n -> infinity`` at fixed ``alpha``. The chapter
``ch12_high_dimensions`` runs it at a reduced ``N``:

- :func:`committee_problem` draws teacher and data; :func:`committee_loss` is ``L``;
- :func:`train_student` (one student) and :func:`train_students` (several problems of one
  shape at once) run full-batch heavy-ball gradient descent to a stationary point, on the
  closed-form gradient :func:`committee_gradient` or through :func:`lossgeom.training.train`;
- :func:`committee_hessian` is the exact Hessian in closed form (the tests and the
  chapter compare it with autograd's :func:`lossgeom.curvature.closure_hessian`);
- :func:`generalisation_error` is the population error, exact for regression
  (:func:`generalisation_errors` scores many students on one Monte Carlo sample);
- :func:`spectral_statistics` gives the spectral mean and the left and right edges, and
  :func:`normalise_spectrum` rescales them (:data:`NORMALISATIONS`: summed, per sample,
  data part per sample with the ridge removed or fixed);
- :func:`spectra_sweep` repeats all of it over sample ratios and seeds, and
  :func:`check_findings` reads the source's five findings (:data:`SOURCE_FINDINGS`) off the
  Spearman correlations, on the seed means and seed by seed, and decides each by sign
  consistency across seeds (both in :mod:`lossgeom_book.committee_spectra`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from lossgeom import training
from lossgeom_book.checks import as_real, finite_tensor, positive, positive_int

#: The two tasks of the spectra sweep, each with its own source findings.
TASKS = ("regression", "classification")


def _blocks(n_inputs: int, n_hidden: int) -> int:
    n_inputs, n_hidden = positive_int("n_inputs", n_inputs), positive_int("n_hidden", n_hidden)
    if n_inputs % n_hidden:
        raise ValueError(f"n_inputs must be a multiple of n_hidden (disjoint blocks), got {n_inputs} and {n_hidden}")
    return n_inputs // n_hidden


def preactivations(w: torch.Tensor, x: torch.Tensor, n_hidden: int) -> torch.Tensor:
    """``h_{mu k} = w_k . x_{mu k} / sqrt(d)`` for every sample and hidden unit, shape ``(n, K)``."""
    if not isinstance(w, torch.Tensor) or w.ndim != 1:
        raise ValueError(
            f"w must be a 1-D tensor of N weights, got "
            f"{tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__}"
        )
    if not isinstance(x, torch.Tensor) or x.ndim != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(
            f"x must have shape (n, {w.shape[0]}) to match w, got "
            f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}"
        )
    d = _blocks(w.shape[0], n_hidden)
    return torch.einsum("nkd,kd->nk", x.reshape(x.shape[0], n_hidden, d), w.reshape(n_hidden, d)) / math.sqrt(d)


def committee_output(w: torch.Tensor, x: torch.Tensor, n_hidden: int) -> torch.Tensor:
    """The tree committee ``f(w; x) = K^(-1/2) sum_k erf(h_k / sqrt 2)`` on each row of ``x``."""
    h = preactivations(w, x, n_hidden)
    return torch.erf(h / math.sqrt(2.0)).sum(dim=1) / math.sqrt(n_hidden)


@dataclass(frozen=True)
class CommitteeProblem:
    """Teacher, training data and objective of one teacher-student instance.

    Attributes:
        x: training inputs, shape ``(n, N)``.
        y: labels, shape ``(n,)`` (teacher outputs, or their signs for classification).
        teacher: the teacher's weights ``w*``, shape ``(N,)``.
        n_hidden: ``K``.
        task: ``"regression"`` or ``"classification"``.
        ridge: ``lambda``.
        seed: the seed that drew teacher and data.
    """

    x: torch.Tensor
    y: torch.Tensor
    teacher: torch.Tensor
    n_hidden: int
    task: str
    ridge: float
    seed: int

    @property
    def n_inputs(self) -> int:
        return int(self.x.shape[1])

    @property
    def n_samples(self) -> int:
        return int(self.x.shape[0])

    @property
    def alpha(self) -> float:
        return self.n_samples / self.n_inputs


def committee_problem(
    n_inputs: int, n_hidden: int, alpha: float, task: str = "regression", ridge: float = 0.01, seed: int = 0
) -> CommitteeProblem:
    """Draw a teacher ``w* ~ N(0, I_N)`` and ``n = round(alpha N)`` inputs ``x ~ N(0, I_N)``.

    Raises:
        ValueError: if ``n_inputs`` is not a multiple of ``n_hidden``, ``alpha`` gives no
            sample, ``task`` is unknown or ``ridge`` is negative.
    """
    _blocks(n_inputs, n_hidden)
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    n_samples = int(round(positive("alpha", alpha) * n_inputs))
    if n_samples < 1:
        raise ValueError(f"alpha * n_inputs must round to at least one sample, got alpha = {alpha}")
    ridge = as_real("ridge", ridge)
    if ridge < 0:
        raise ValueError(f"ridge must be >= 0, got {ridge}")
    gen = torch.Generator().manual_seed(int(seed))
    teacher = torch.randn(n_inputs, generator=gen, dtype=torch.float64)
    x = torch.randn(n_samples, n_inputs, generator=gen, dtype=torch.float64)
    y = committee_output(teacher, x, n_hidden)
    if task == "classification":
        y = torch.sign(y)
    return CommitteeProblem(x, y, teacher, int(n_hidden), task, ridge, int(seed))


def committee_loss(problem: CommitteeProblem):
    """``L(w) = 1/2 sum_mu (f(w; x_mu) - y_mu)^2 + lambda/2 |w|^2`` as ``loss_fn(params, indices=None)``.

    ``params`` holds the student's weights under ``"w"``; ``indices`` selects samples (all
    if ``None``), so the same closure serves :func:`lossgeom.training.train` and
    :func:`lossgeom.curvature.closure_hessian`.
    """
    if not isinstance(problem, CommitteeProblem):
        raise TypeError(f"problem must be a CommitteeProblem, got {type(problem).__name__}")

    def loss_fn(params: Mapping[str, torch.Tensor], indices: torch.Tensor | None = None) -> torch.Tensor:
        if "w" not in params:
            raise ValueError(f"params must hold the student's weights under 'w', got {sorted(params)}")
        x, y = (problem.x, problem.y) if indices is None else (problem.x[indices], problem.y[indices])
        residual = committee_output(params["w"], x, problem.n_hidden) - y
        return 0.5 * (residual**2).sum() + 0.5 * problem.ridge * (params["w"] ** 2).sum()

    return loss_fn


def committee_gradient(problem: CommitteeProblem, w: torch.Tensor) -> torch.Tensor:
    """The gradient of :func:`committee_loss` at ``w`` in closed form: ``J^T r + lambda w``.

    ``r_mu = f(w; x_mu) - y_mu`` and row ``mu`` of ``J`` holds ``g'(h_{mu k}) x_{mu k} / sqrt(K d)``
    in block ``k``, with ``g'(z) = sqrt(2/pi) exp(-z^2/2)`` (the tests compare it with autograd).
    """
    if not isinstance(problem, CommitteeProblem):
        raise TypeError(f"problem must be a CommitteeProblem, got {type(problem).__name__}")
    w = finite_tensor("w", w)
    K, n, N = problem.n_hidden, problem.n_samples, problem.n_inputs
    if w.shape != (N,):
        raise ValueError(f"w must have shape ({N},), got {tuple(w.shape)}")
    d = N // K
    xb = problem.x.reshape(n, K, d)
    h = torch.einsum("nkd,kd->nk", xb, w.reshape(K, d)) / math.sqrt(d)
    residual = torch.erf(h / math.sqrt(2.0)).sum(dim=1) / math.sqrt(K) - problem.y
    weights = math.sqrt(2.0 / math.pi) * torch.exp(-0.5 * h**2) * residual[:, None]
    return torch.einsum("nk,nkd->kd", weights, xb).reshape(N) / math.sqrt(K * d) + problem.ridge * w


@dataclass(frozen=True)
class StudentFit:
    """A trained student: its weights, the gradient norm and loss there, and the budget used."""

    weights: torch.Tensor
    gradient_norm: float
    loss: float
    steps: int


def default_learning_rate(alpha: float) -> float:
    """``2 / (1 + alpha)``: the curvature of ``L`` grows about linearly with ``alpha``."""
    return 2.0 / (1.0 + positive("alpha", alpha))


ENGINES = ("closed_form", "autograd")


def _start(problem: CommitteeProblem, init_scale: float, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(int(seed) + 7919)
    return init_scale * torch.randn(problem.n_inputs, generator=gen, dtype=torch.float64)


def _fit(problem: CommitteeProblem, end: torch.Tensor, steps: int) -> StudentFit:
    """The end point with its loss and its gradient norm, both by autograd."""
    w = end.detach().clone().requires_grad_(True)
    value = committee_loss(problem)({"w": w})
    (grad,) = torch.autograd.grad(value, w)
    return StudentFit(w.detach(), float(grad.norm()), float(value.detach()), int(steps))


def _erf(z: np.ndarray) -> np.ndarray:
    """``erf`` of a float64 array through torch (twice as fast as scipy's on one thread)."""
    return torch.erf(torch.from_numpy(z)).numpy()


def train_students(
    problems: Sequence[CommitteeProblem],
    steps: int = 500,
    learning_rate: float | None = None,
    momentum: float = 0.9,
    init_scale: float = 0.01,
    seeds: Sequence[int] | None = None,
    engine: str = "closed_form",
    tol: float | None = None,
) -> list[StudentFit]:
    """:func:`train_student` for several problems of one shape at once (one student each).

    Full-batch heavy-ball gradient descent, ``v <- momentum v + grad L(w)``,
    ``w <- w - learning_rate v`` from ``v = 0`` and ``w = init_scale * N(0, I_N)`` drawn
    with each student's seed (``seeds``, default each problem's own seed): the rule of
    :func:`lossgeom.training.sgd`, so the fixed points are the stationary points of ``L``.
    ``engine="closed_form"`` stacks the problems and takes every gradient from the closed
    form of :func:`committee_gradient` in one batched loop (no autograd, no cross-problem
    sums); ``engine="autograd"`` runs :func:`lossgeom.training.train` on
    :func:`committee_loss`, one problem at a time. The two give the same iterates to
    rounding (a test checks it). Each fit's ``gradient_norm`` (autograd, at the end point)
    says how close to a stationary point the budget got.

    With ``tol`` (closed-form engine only), ``steps`` is a budget: a student stops at the
    first iterate whose closed-form gradient norm is at most ``tol`` (that iterate is its end
    point and ``StudentFit.steps`` counts the updates it took), and leaves the batch, so the
    students still moving run on alone. Each student's iterates are those of the fixed-step
    run up to its stopping step. ``tol=None`` (the default) runs every student ``steps`` steps.

    Raises:
        ValueError: if the problems differ in shape or ridge, ``engine`` is unknown, a step
            setting is out of range, or ``tol`` is given with ``engine="autograd"``.
    """
    problems = list(problems)
    if not problems or not all(isinstance(q, CommitteeProblem) for q in problems):
        raise TypeError("problems must be a non-empty sequence of CommitteeProblem")
    first = problems[0]
    if any(
        (q.n_samples, q.n_inputs, q.n_hidden, q.ridge) != (first.n_samples, first.n_inputs, first.n_hidden, first.ridge)
        for q in problems
    ):
        raise ValueError("problems must share n_samples, n_inputs, n_hidden and ridge to be trained together")
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if tol is not None:
        tol = positive("tol", tol)
        if engine != "closed_form":
            raise ValueError("tol (stopping at a gradient norm) needs engine='closed_form'")
    lr = default_learning_rate(first.alpha) if learning_rate is None else positive("learning_rate", learning_rate)
    momentum = as_real("momentum", momentum)
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must lie in [0, 1), got {momentum}")
    init_scale, steps = positive("init_scale", init_scale), positive_int("steps", steps)
    seeds = [q.seed for q in problems] if seeds is None else [int(s) for s in seeds]
    if len(seeds) != len(problems):
        raise ValueError(f"seeds must give one seed per problem, got {len(seeds)} for {len(problems)}")
    starts = [_start(q, init_scale, s) for q, s in zip(problems, seeds)]
    if engine == "autograd":
        rule = training.sgd(lr, momentum=momentum)
        ends = [
            training.train(committee_loss(q), {"w": w0}, rule, steps).params["w"] for q, w0 in zip(problems, starts)
        ]
        return [_fit(q, w, steps) for q, w in zip(problems, ends)]
    ends, used = _heavy_ball(problems, starts, steps, lr, momentum, tol)
    return [_fit(q, ends[i], int(used[i])) for i, q in enumerate(problems)]


def _heavy_ball(
    problems: list[CommitteeProblem],
    starts: list[torch.Tensor],
    steps: int,
    lr: float,
    momentum: float,
    tol: float | None,
) -> tuple[torch.Tensor, np.ndarray]:
    """The closed-form loop of :func:`train_students`: end points ``(S, N)`` and steps taken."""
    first = problems[0]
    S, K, n, N = len(problems), first.n_hidden, first.n_samples, first.n_inputs
    d = N // K
    # one (n, d) block per (student, unit): h_{s mu k} = x_{s mu k} . w_{s k} / sqrt(d) is a batched matvec
    xb = np.stack([q.x.numpy().reshape(n, K, d).transpose(1, 0, 2) for q in problems]).reshape(S * K, n, d)
    xb_t = np.ascontiguousarray(xb.transpose(0, 2, 1))
    y = np.stack([q.y.numpy() for q in problems])  # (S, n)
    w = np.stack([w0.numpy() for w0 in starts]).reshape(S * K, d, 1)
    velocity = np.zeros_like(w)
    c_h, c_g = 1.0 / math.sqrt(d), math.sqrt(2.0 / math.pi) / math.sqrt(K * d)
    active = np.arange(S)  # the students still moving, in batch order
    ends, used = np.empty((S, N)), np.full(S, steps)
    for step in range(steps):
        m = active.size
        h = (xb @ w)[:, :, 0].reshape(m, K, n) * c_h
        residual = _erf(h / math.sqrt(2.0)).sum(axis=1) / math.sqrt(K) - y
        weights = (np.exp(-0.5 * h**2) * residual[:, None, :]).reshape(m * K, n, 1)
        gradient = (xb_t @ weights) * c_g + first.ridge * w
        if tol is not None:
            done = np.sqrt((gradient.reshape(m, N) ** 2).sum(axis=1)) <= tol
            if done.any():
                ends[active[done]], used[active[done]] = w.reshape(m, N)[done], step
                keep, rows = ~done, np.repeat(~done, K)
                active, y, w, velocity, gradient = active[keep], y[keep], w[rows], velocity[rows], gradient[rows]
                xb, xb_t = xb[rows], xb_t[rows]
                if not active.size:
                    break
        velocity = momentum * velocity + gradient
        w = w - lr * velocity
    ends[active] = w.reshape(active.size, N)
    if not np.isfinite(ends).all():
        raise FloatingPointError("a student's weights became non-finite (learning rate too large?)")
    return torch.from_numpy(ends), used


def train_student(
    problem: CommitteeProblem,
    steps: int = 500,
    learning_rate: float | None = None,
    momentum: float = 0.9,
    init_scale: float = 0.01,
    seed: int = 0,
    engine: str = "closed_form",
    tol: float | None = None,
) -> StudentFit:
    """Full-batch heavy-ball gradient descent on :func:`committee_loss` from a small random start.

    One student of :func:`train_students`: the start is ``init_scale * N(0, I_N)`` drawn
    with ``seed``, the step ``learning_rate`` (default :func:`default_learning_rate`) with
    heavy-ball ``momentum``; ``engine`` chooses the closed-form gradient loop or
    :func:`lossgeom.training.train` on autograd (same iterates to rounding); ``tol`` stops
    at the first iterate whose gradient norm is at most ``tol``.
    """
    if not isinstance(problem, CommitteeProblem):
        raise TypeError(f"problem must be a CommitteeProblem, got {type(problem).__name__}")
    return train_students([problem], steps, learning_rate, momentum, init_scale, [seed], engine, tol)[0]


def committee_hessian(problem: CommitteeProblem, w: torch.Tensor) -> torch.Tensor:
    """The exact Hessian of :func:`committee_loss` at ``w``, in closed form, shape ``(N, N)``.

    With ``r_mu = f_mu - y_mu``, ``g'(z) = sqrt(2/pi) exp(-z^2/2)`` and ``g''(z) = -z g'(z)``:

        H = J^T J + blockdiag_k( sum_mu r_mu g''(h_{mu k}) x_{mu k} x_{mu k}^T / (sqrt(K) d) ) + lambda I,

    where row ``mu`` of ``J`` holds ``g'(h_{mu k}) x_{mu k} / sqrt(K d)`` in block ``k``: the
    Gauss-Newton part (rank at most ``n``), the residual part and the ridge.
    """
    if not isinstance(problem, CommitteeProblem):
        raise TypeError(f"problem must be a CommitteeProblem, got {type(problem).__name__}")
    w = finite_tensor("w", w)
    K, n, N = problem.n_hidden, problem.n_samples, problem.n_inputs
    d = N // K
    h = preactivations(w, problem.x, K)
    g1 = math.sqrt(2.0 / math.pi) * torch.exp(-0.5 * h**2)
    residual = torch.erf(h / math.sqrt(2.0)).sum(dim=1) / math.sqrt(K) - problem.y
    xb = problem.x.reshape(n, K, d)
    jacobian = (g1[:, :, None] * xb).reshape(n, N) / math.sqrt(K * d)
    weights = residual[:, None] * (-h * g1) / (math.sqrt(K) * d)
    blocks = torch.einsum("nk,nki,nkj->kij", weights, xb, xb)
    return jacobian.T @ jacobian + torch.block_diag(*blocks) + problem.ridge * torch.eye(N, dtype=torch.float64)


def order_parameters(
    w: torch.Tensor, teacher: torch.Tensor, n_hidden: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per hidden unit: ``Q_k = |w_k|^2 / d``, ``R_k = w_k . w*_k / d``, ``T_k = |w*_k|^2 / d``."""
    w, teacher = finite_tensor("w", w), finite_tensor("teacher", teacher)
    if w.shape != teacher.shape or w.ndim != 1:
        raise ValueError(
            f"w and teacher must be 1-D of the same length, got {tuple(w.shape)} and {tuple(teacher.shape)}"
        )
    d = _blocks(w.shape[0], n_hidden)
    wb, tb = w.reshape(n_hidden, d), teacher.reshape(n_hidden, d)
    return ((wb * wb).sum(1) / d).numpy(), ((wb * tb).sum(1) / d).numpy(), ((tb * tb).sum(1) / d).numpy()


def generalisation_error(problem: CommitteeProblem, w: torch.Tensor, n_test: int = 200_000, seed: int = 0) -> float:
    """The population error of student ``w`` on fresh Gaussian inputs.

    Regression: ``eps_g = 1/2 E[(f(w; x) - f(w*; x))^2]``, exact. The blocks are
    independent and ``g`` is odd, so ``eps_g = 1/(2K) sum_k E[(g(u_k) - g(v_k))^2]`` with
    ``(u_k, v_k)`` centred Gaussian of covariance ``[[Q_k, R_k], [R_k, T_k]]`` and
    ``E[g(u) g(v)] = (2/pi) arcsin(C_uv / sqrt((1 + C_uu)(1 + C_vv)))``.

    Classification: ``P(sign f(w; x) != sign f(w*; x))``, by Monte Carlo over ``n_test``
    draws of the ``2K`` preactivations (not of the ``N`` inputs), seeded; its standard
    error is at most ``0.5 / sqrt(n_test)``.
    """
    if not isinstance(problem, CommitteeProblem):
        raise TypeError(f"problem must be a CommitteeProblem, got {type(problem).__name__}")
    if problem.task == "regression":
        return _regression_error(problem, w)
    return _sign_disagreement(problem, w, _preactivation_draws(problem.n_hidden, n_test, seed))


def generalisation_errors(
    problems: Sequence[CommitteeProblem], weights: Sequence[torch.Tensor], n_test: int = 200_000, seed: int = 0
) -> np.ndarray:
    """:func:`generalisation_error` of several students, drawing the Monte Carlo sample once.

    Equal, value for value, to ``[generalisation_error(p, w, n_test, seed) for p, w in ...]``:
    every classification student is scored on the same ``n_test`` draws (common random
    numbers, so differences between students carry less noise than each value), which are
    drawn once instead of once per student.

    Raises:
        ValueError: if the lengths differ or the problems differ in ``n_hidden``.
    """
    problems, weights = list(problems), list(weights)
    if not problems or not all(isinstance(q, CommitteeProblem) for q in problems):
        raise TypeError("problems must be a non-empty sequence of CommitteeProblem")
    if len(weights) != len(problems):
        raise ValueError(f"weights must give one student per problem, got {len(weights)} for {len(problems)}")
    if len({q.n_hidden for q in problems}) != 1:
        raise ValueError("problems must share n_hidden to share their Monte Carlo draws")
    draws = None
    errors = np.empty(len(problems))
    for i, (q, w) in enumerate(zip(problems, weights)):
        if q.task == "regression":
            errors[i] = _regression_error(q, w)
            continue
        if draws is None:
            draws = _preactivation_draws(q.n_hidden, n_test, seed)
        errors[i] = _sign_disagreement(q, w, draws)
    return errors


def _regression_error(problem: CommitteeProblem, w: torch.Tensor) -> float:
    Q, R, T = order_parameters(w, problem.teacher, problem.n_hidden)
    pair = lambda a, b, c: (2 / np.pi) * np.arcsin(c / np.sqrt((1 + a) * (1 + b)))
    per_unit = pair(Q, Q, Q) + pair(T, T, T) - 2 * pair(Q, T, R)
    return float(per_unit.sum() / (2 * problem.n_hidden))


def _preactivation_draws(n_hidden: int, n_test: int, seed: int) -> torch.Tensor:
    """Standard normal ``(z1, z2)``, shape ``(2, n_test, K)``, divided by ``sqrt 2`` (``g(z) = erf(z / sqrt 2)``)."""
    n_test = positive_int("n_test", n_test)
    return torch.from_numpy(np.random.default_rng(seed).standard_normal((2, n_test, n_hidden)) / math.sqrt(2.0))


def _sign_disagreement(problem: CommitteeProblem, w: torch.Tensor, draws: torch.Tensor) -> float:
    """``P(sign f(w) != sign f(w*))`` on the draws: ``u_k = sqrt(Q_k) z1_k`` and
    ``v_k = (R_k / sqrt(Q_k)) z1_k + sqrt(T_k - R_k^2 / Q_k) z2_k`` have the overlaps' covariance."""
    Q, R, T = order_parameters(w, problem.teacher, problem.n_hidden)
    sq = np.sqrt(np.maximum(Q, 1e-300))
    along, across = R / sq, np.sqrt(np.maximum(T - R**2 / np.maximum(Q, 1e-300), 0.0))
    student = torch.erf(draws[0] * torch.from_numpy(sq)).sum(1)
    teacher = torch.erf(torch.addcmul(draws[0] * torch.from_numpy(along), draws[1], torch.from_numpy(across))).sum(1)
    return float((torch.sign(student) != torch.sign(teacher)).double().mean())

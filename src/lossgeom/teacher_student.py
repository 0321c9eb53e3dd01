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
- :func:`train_student` runs full-batch (heavy-ball) gradient descent through
  :func:`lossgeom.optimisers.train` to a stationary point;
- :func:`committee_hessian` is the exact Hessian in closed form (the tests and the
  chapter compare it with autograd's :func:`lossgeom.curvature.dense_hessian`);
- :func:`generalisation_error` is the population error, exact for regression;
- :func:`spectral_statistics` gives the spectral mean and the left and right edges;
- :func:`spectra_sweep` repeats all of it over sample ratios and seeds.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from lossgeom import optimisers
from lossgeom._checks import as_real, finite_array, finite_tensor, positive, positive_int

TASKS = ("regression", "classification")


def _blocks(n_inputs: int, n_hidden: int) -> int:
    n_inputs, n_hidden = positive_int("n_inputs", n_inputs), positive_int("n_hidden", n_hidden)
    if n_inputs % n_hidden:
        raise ValueError(f"n_inputs must be a multiple of n_hidden (disjoint blocks), got {n_inputs} and {n_hidden}")
    return n_inputs // n_hidden


def preactivations(w: torch.Tensor, x: torch.Tensor, n_hidden: int) -> torch.Tensor:
    """``h_{mu k} = w_k . x_{mu k} / sqrt(d)`` for every sample and hidden unit, shape ``(n, K)``."""
    if not isinstance(w, torch.Tensor) or w.ndim != 1:
        raise ValueError(f"w must be a 1-D tensor of N weights, got "
                         f"{tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__}")
    if not isinstance(x, torch.Tensor) or x.ndim != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(f"x must have shape (n, {w.shape[0]}) to match w, got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
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


def committee_problem(n_inputs: int, n_hidden: int, alpha: float, task: str = "regression",
                      ridge: float = 0.01, seed: int = 0) -> CommitteeProblem:
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
    if ``None``), so the same closure serves :func:`lossgeom.optimisers.train` and
    :func:`lossgeom.curvature.dense_hessian`.
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


def train_student(problem: CommitteeProblem, steps: int = 500, learning_rate: float | None = None,
                  momentum: float = 0.9, init_scale: float = 0.01, seed: int = 0) -> StudentFit:
    """Full-batch heavy-ball gradient descent on :func:`committee_loss` from a small random start.

    The start is ``init_scale * N(0, I_N)`` drawn with ``seed``; the run is
    :func:`lossgeom.optimisers.train` with ``sgd(learning_rate, momentum)`` and no mini-batches,
    so its fixed points are the stationary points of ``L``. The returned
    ``gradient_norm`` says how close to one the budget got.
    """
    if not isinstance(problem, CommitteeProblem):
        raise TypeError(f"problem must be a CommitteeProblem, got {type(problem).__name__}")
    lr = default_learning_rate(problem.alpha) if learning_rate is None else positive("learning_rate", learning_rate)
    init_scale = positive("init_scale", init_scale)
    gen = torch.Generator().manual_seed(int(seed) + 7919)
    start = {"w": init_scale * torch.randn(problem.n_inputs, generator=gen, dtype=torch.float64)}
    loss_fn = committee_loss(problem)
    run = optimisers.train(loss_fn, start, optimisers.sgd(lr, momentum=momentum), positive_int("steps", steps))
    w = run.params["w"].detach().requires_grad_(True)
    value = loss_fn({"w": w})
    (grad,) = torch.autograd.grad(value, w)
    return StudentFit(w.detach(), float(grad.norm()), float(value.detach()), int(steps))


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


def order_parameters(w: torch.Tensor, teacher: torch.Tensor,
                     n_hidden: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per hidden unit: ``Q_k = |w_k|^2 / d``, ``R_k = w_k . w*_k / d``, ``T_k = |w*_k|^2 / d``."""
    w, teacher = finite_tensor("w", w), finite_tensor("teacher", teacher)
    if w.shape != teacher.shape or w.ndim != 1:
        raise ValueError(f"w and teacher must be 1-D of the same length, got {tuple(w.shape)} "
                         f"and {tuple(teacher.shape)}")
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
    Q, R, T = order_parameters(w, problem.teacher, problem.n_hidden)
    if problem.task == "regression":
        pair = lambda a, b, c: (2 / np.pi) * np.arcsin(c / np.sqrt((1 + a) * (1 + b)))
        per_unit = pair(Q, Q, Q) + pair(T, T, T) - 2 * pair(Q, T, R)
        return float(per_unit.sum() / (2 * problem.n_hidden))
    n_test = positive_int("n_test", n_test)
    rng = np.random.default_rng(seed)
    z1, z2 = rng.standard_normal((2, n_test, problem.n_hidden))
    sq = np.sqrt(np.maximum(Q, 1e-300))
    u = sq * z1
    v = (R / sq) * z1 + np.sqrt(np.maximum(T - R**2 / np.maximum(Q, 1e-300), 0.0)) * z2
    from scipy.special import erf

    student, teacher = erf(u / np.sqrt(2)).sum(1), erf(v / np.sqrt(2)).sum(1)
    return float(np.mean(np.sign(student) != np.sign(teacher)))


@dataclass(frozen=True)
class SpectralStatistics:
    """Flatness observables of one Hessian spectrum (the seed's three, plus bookkeeping).

    Attributes:
        mean: the spectral mean ``tr(H) / N`` over all ``N`` eigenvalues.
        left_edge: the smallest eigenvalue of the data bulk: with ``n < N`` samples the
            Gauss-Newton part ``J^T J`` has rank at most ``n``, so the ``N - n`` smallest
            eigenvalues sit near the ridge ``lambda`` (the null cluster) and are excluded;
            the left edge is the ``(N - n + 1)``-th smallest eigenvalue. With ``n >= N``
            it is the smallest eigenvalue.
        right_edge: the largest eigenvalue.
        smallest: the smallest eigenvalue of all (negative at a saddle).
        n_null: ``max(N - n, 0)``, the size of the excluded null cluster.
        null_top: the largest eigenvalue of the null cluster (``nan`` if there is none).
    """

    mean: float
    left_edge: float
    right_edge: float
    smallest: float
    n_null: int
    null_top: float


def spectral_statistics(eigenvalues, n_samples: int) -> SpectralStatistics:
    """Spectral mean, left edge (null cluster excluded) and right edge of a Hessian spectrum."""
    ev = np.sort(finite_array("eigenvalues", eigenvalues, ndim=1))
    if ev.size == 0:
        raise ValueError("eigenvalues must not be empty")
    n_null = max(ev.size - positive_int("n_samples", n_samples), 0)
    return SpectralStatistics(float(ev.mean()), float(ev[n_null]), float(ev[-1]), float(ev[0]), n_null,
                              float(ev[n_null - 1]) if n_null else float("nan"))


@dataclass(frozen=True)
class SweepResult:
    """A sweep over sample ratios (rows) and seeds (columns) for one task.

    Arrays have shape ``(len(alphas), len(seeds))``; ``spectra[i][j]`` holds the sorted
    eigenvalues of the Hessian at the minimiser of run ``(i, j)``.
    """

    task: str
    alphas: np.ndarray
    seeds: tuple[int, ...]
    n_inputs: int
    n_hidden: int
    ridge: float
    error: np.ndarray
    mean: np.ndarray
    left_edge: np.ndarray
    right_edge: np.ndarray
    smallest: np.ndarray
    null_top: np.ndarray
    gradient_norm: np.ndarray
    spectra: list

    def statistic(self, name: str, per_sample: bool = False) -> np.ndarray:
        """One of ``"mean"``, ``"left_edge"``, ``"right_edge"``; divided by ``alpha`` if
        ``per_sample`` (the spectrum of ``L / alpha``, whose data part is an average)."""
        if name not in ("mean", "left_edge", "right_edge"):
            raise ValueError(f"name must be 'mean', 'left_edge' or 'right_edge', got {name!r}")
        values = getattr(self, name)
        return values / self.alphas[:, None] if per_sample else values

    def rank_correlation(self, name: str, regime: str, per_sample: bool = False) -> float:
        """Spearman correlation, over the sample ratios of one regime, between the seed-mean
        statistic and the seed-mean generalisation error.

        ``regime`` is ``"over"`` (``alpha < 1``: more parameters than samples) or ``"under"``
        (``alpha > 1``). A positive value means the statistic falls as the error falls: the
        flatter the minimiser, the better it generalises, as the flatness hypothesis says.
        """
        from scipy.stats import spearmanr

        if regime not in ("over", "under"):
            raise ValueError(f"regime must be 'over' or 'under', got {regime!r}")
        rows = self.alphas < 1 if regime == "over" else self.alphas > 1
        if rows.sum() < 3:
            raise ValueError(f"the {regime}-parametrised regime needs at least 3 sample ratios, got {int(rows.sum())}")
        statistic = self.statistic(name, per_sample)[rows].mean(axis=1)
        return float(spearmanr(statistic, self.error[rows].mean(axis=1)).statistic)

    def steps_against_error(self, name: str, regime: str, per_sample: bool = False) -> int:
        """How many steps between consecutive sample ratios of ``regime`` move the seed-mean
        statistic in the opposite direction from the seed-mean error (local reversals)."""
        if regime not in ("over", "under"):
            raise ValueError(f"regime must be 'over' or 'under', got {regime!r}")
        rows = self.alphas < 1 if regime == "over" else self.alphas > 1
        statistic = np.diff(self.statistic(name, per_sample)[rows].mean(axis=1))
        error = np.diff(self.error[rows].mean(axis=1))
        return int(np.sum(np.sign(statistic) != np.sign(error)))

    def summary(self, per_sample: bool = True, sig: int = 3) -> str:
        """A text table of seed means: alpha, error, spectral mean, left and right edges."""
        from lossgeom.display import fmt

        scale = "H / alpha" if per_sample else "H"
        lines = [f"{self.task}: seed means over {len(self.seeds)} seeds, spectra of {scale}",
                 f"{'alpha':>6} {'error':>9} {'mean':>9} {'left':>9} {'right':>9}"]
        columns = [self.error] + [self.statistic(k, per_sample) for k in ("mean", "left_edge", "right_edge")]
        for i, alpha in enumerate(self.alphas):
            lines.append(f"{fmt(alpha, 3):>6} " + " ".join(f"{fmt(c[i].mean(), sig):>9}" for c in columns))
        return "\n".join(lines)


def spectra_sweep(task: str, alphas: Sequence[float], seeds: Sequence[int], n_inputs: int = 160,
                  n_hidden: int = 4, ridge: float = 0.01, steps: int = 500) -> SweepResult:
    """Train a student for every (alpha, seed), diagonalise its exact Hessian, measure.

    Each run draws a :func:`committee_problem`, trains with :func:`train_student`, takes
    :func:`committee_hessian` and ``numpy.linalg.eigvalsh``, and records
    :func:`generalisation_error` and :func:`spectral_statistics`.
    """
    alphas = finite_array("alphas", alphas, ndim=1)
    seeds = tuple(int(s) for s in seeds)
    if alphas.size == 0 or not seeds:
        raise ValueError("alphas and seeds must not be empty")
    shape = (alphas.size, len(seeds))
    table = {k: np.empty(shape) for k in ("error", "mean", "left_edge", "right_edge", "smallest", "null_top",
                                           "gradient_norm")}
    spectra = []
    for i, alpha in enumerate(alphas):
        row = []
        for j, seed in enumerate(seeds):
            problem = committee_problem(n_inputs, n_hidden, float(alpha), task, ridge, seed)
            fit = train_student(problem, steps=steps, seed=seed)
            eigenvalues = np.linalg.eigvalsh(committee_hessian(problem, fit.weights).numpy())
            stats = spectral_statistics(eigenvalues, problem.n_samples)
            table["error"][i, j] = generalisation_error(problem, fit.weights, seed=seed)
            table["gradient_norm"][i, j] = fit.gradient_norm
            for name in ("mean", "left_edge", "right_edge", "smallest", "null_top"):
                table[name][i, j] = getattr(stats, name)
            row.append(eigenvalues)
        spectra.append(row)
    return SweepResult(task, alphas, seeds, int(n_inputs), int(n_hidden), float(ridge), spectra=spectra, **table)

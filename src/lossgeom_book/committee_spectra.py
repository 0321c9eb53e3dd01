"""The committee machine's Hessian spectra across sample ratios, and the source's findings checked on them.

Chapter *High dimensions* (claim T1): :func:`spectra_sweep` trains students at each sample
ratio and seed (:mod:`lossgeom_book.teacher_student`), takes their Hessian spectra, and
:func:`check_findings` reads the source's five findings from the sweep, on the seed means
and seed by seed, and decides each by sign consistency across seeds
(:func:`sign_test_threshold`, :func:`finding_verdict`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from lossgeom_book.checks import as_real, finite_array, positive, positive_int
from lossgeom_book.teacher_student import (
    TASKS,
    committee_hessian,
    committee_problem,
    generalisation_errors,
    train_students,
)


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
    return SpectralStatistics(
        float(ev.mean()),
        float(ev[n_null]),
        float(ev[-1]),
        float(ev[0]),
        n_null,
        float(ev[n_null - 1]) if n_null else float("nan"),
    )


#: How a spectrum is normalised before its statistics are compared across sample ratios:
#: ``"summed"``: ``H`` itself, the Hessian of the summed loss ``L``;
#: ``"per_sample"``: ``H / alpha = N grad^2 (L / n)``, ridge included (it becomes ``lambda / alpha``);
#: ``"data"``: ``(H - lambda I) / alpha``, the per-sample Hessian of the data term alone;
#: ``"fixed_ridge"``: ``(H - lambda I) / alpha + lambda I``, the data term per sample plus a ridge
#: that does not shrink with ``alpha``. ``"data"`` and ``"fixed_ridge"`` differ by ``lambda I``,
#: which shifts every eigenvalue by the same amount and so leaves every rank correlation unchanged.
NORMALISATIONS = ("summed", "per_sample", "data", "fixed_ridge")
STATISTICS = ("mean", "left_edge", "right_edge")
REGIMES = ("over", "under")


def normalise_spectrum(values, alpha: float, ridge: float, normalisation: str) -> np.ndarray:
    """Eigenvalues (or statistics read off them) of ``H`` mapped to one of :data:`NORMALISATIONS`.

    Each map is affine and increasing, ``mu -> (mu - c) / a + b``, so it acts on the spectral
    mean, the left edge and the right edge exactly as on the eigenvalues themselves.
    """
    if normalisation not in NORMALISATIONS:
        raise ValueError(f"normalisation must be one of {NORMALISATIONS}, got {normalisation!r}")
    alpha, ridge = positive("alpha", alpha), as_real("ridge", ridge)
    values = np.asarray(values, dtype=np.float64)
    if normalisation == "summed":
        return values.copy()
    if normalisation == "per_sample":
        return values / alpha
    data = (values - ridge) / alpha
    return data + ridge if normalisation == "fixed_ridge" else data


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


@dataclass(frozen=True)
class SweepResult:
    """A sweep over sample ratios (rows) and seeds (columns) for one task.

    Arrays have shape ``(len(alphas), len(seeds))``; ``spectra[i][j]`` holds the sorted
    eigenvalues of the Hessian ``H`` of the summed loss at the minimiser of run ``(i, j)``,
    and ``steps[i, j]`` the gradient steps that run took (``None`` if not recorded).
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
    steps: np.ndarray | None = None

    def statistic(self, name: str, normalisation: str = "summed") -> np.ndarray:
        """One of ``"mean"``, ``"left_edge"``, ``"right_edge"``, for the spectrum normalised
        as ``normalisation`` says (:data:`NORMALISATIONS`, :func:`normalise_spectrum`)."""
        if name not in STATISTICS:
            raise ValueError(f"name must be 'mean', 'left_edge' or 'right_edge', got {name!r}")
        if normalisation not in NORMALISATIONS:
            raise ValueError(f"normalisation must be one of {NORMALISATIONS}, got {normalisation!r}")
        values = getattr(self, name)
        return np.stack([normalise_spectrum(row, a, self.ridge, normalisation) for row, a in zip(values, self.alphas)])

    def _rows(self, regime: str) -> np.ndarray:
        if regime not in REGIMES:
            raise ValueError(f"regime must be 'over' or 'under', got {regime!r}")
        rows = self.alphas < 1 if regime == "over" else self.alphas > 1
        if rows.sum() < 3:
            raise ValueError(f"the {regime}-parametrised regime needs at least 3 sample ratios, got {int(rows.sum())}")
        return rows

    def rank_correlation(self, name: str, regime: str, normalisation: str = "summed") -> float:
        """Spearman correlation, over the sample ratios of one regime, between the seed-mean
        statistic and the seed-mean generalisation error.

        ``regime`` is ``"over"`` (``alpha < 1``: more parameters than samples) or ``"under"``
        (``alpha > 1``). A positive value means the statistic falls as the error falls: the
        flatter the minimiser, the better it generalises, as the flatness hypothesis says.
        """
        rows = self._rows(regime)
        statistic = self.statistic(name, normalisation)[rows].mean(axis=1)
        return _spearman(statistic, self.error[rows].mean(axis=1))

    def seed_rank_correlations(self, name: str, regime: str, normalisation: str = "summed") -> np.ndarray:
        """The same Spearman correlation within each seed (its own statistic against its own
        error over the sample ratios of ``regime``): one value per seed, the spread that the
        seed means hide."""
        rows = self._rows(regime)
        statistic, error = self.statistic(name, normalisation)[rows], self.error[rows]
        return np.array([_spearman(statistic[:, j], error[:, j]) for j in range(len(self.seeds))])

    def steps_against_error(self, name: str, regime: str, normalisation: str = "summed") -> int:
        """How many steps between consecutive sample ratios of ``regime`` move the seed-mean
        statistic in the opposite direction from the seed-mean error (local reversals)."""
        rows = self._rows(regime)
        statistic = np.diff(self.statistic(name, normalisation)[rows].mean(axis=1))
        error = np.diff(self.error[rows].mean(axis=1))
        return int(np.sum(np.sign(statistic) != np.sign(error)))

    def summary(self, normalisation: str = "per_sample", sig: int = 3) -> str:
        """A text table of seed means: alpha, error, spectral mean, left and right edges."""
        from lossgeom.formatting import fmt

        labels = {
            "summed": "H",
            "per_sample": "H / alpha",
            "data": "(H - lambda I) / alpha",
            "fixed_ridge": "(H - lambda I) / alpha + lambda I",
        }
        if normalisation not in NORMALISATIONS:
            raise ValueError(f"normalisation must be one of {NORMALISATIONS}, got {normalisation!r}")
        lines = [
            f"{self.task}: seed means over {len(self.seeds)} seeds, spectra of {labels[normalisation]}",
            f"{'alpha':>6} {'error':>9} {'mean':>9} {'left':>9} {'right':>9}",
        ]
        columns = [self.error] + [self.statistic(k, normalisation) for k in STATISTICS]
        for i, alpha in enumerate(self.alphas):
            lines.append(f"{fmt(alpha, 3):>6} " + " ".join(f"{fmt(c[i].mean(), sig):>9}" for c in columns))
        return "\n".join(lines)


#: The source's five findings (seed 003's abstract) as predicates on Spearman correlations
#: ``rho[(task, statistic, regime)]`` between a flatness statistic and the error (> 0: the
#: statistic falls as the error falls, "correlates"; <= 0: it does not; < 0: it reverses).
SOURCE_FINDINGS = {
    "regression: mean and right edge correlate in both regimes": lambda rho: (
        min(rho["regression", n, r] for n in ("mean", "right_edge") for r in REGIMES) > 0
    ),
    "regression: left edge correlates when overparametrised": lambda rho: rho["regression", "left_edge", "over"] > 0,
    "regression: left edge does not correlate when underparametrised": lambda rho: (
        rho["regression", "left_edge", "under"] <= 0
    ),
    "classification: all three correlate when overparametrised": lambda rho: (
        min(rho["classification", n, "over"] for n in STATISTICS) > 0
    ),
    "classification: some correlation reverses when underparametrised": lambda rho: (
        min(rho["classification", n, "under"] for n in STATISTICS) < 0
    ),
}


#: Each of the five findings as the signs it names, a tuple ``(quantifier, sign, keys)``, where
#: ``"all"`` means that every named correlation has ``sign`` and ``"any"`` that at least one does.
#: "Does not correlate" is read as a negative sign (a Spearman correlation over six distinct
#: points is never exactly zero).
FINDING_SIGNS = {
    "regression: mean and right edge correlate in both regimes": (
        "all",
        1,
        tuple(("regression", n, r) for n in ("mean", "right_edge") for r in REGIMES),
    ),
    "regression: left edge correlates when overparametrised": ("all", 1, (("regression", "left_edge", "over"),)),
    "regression: left edge does not correlate when underparametrised": (
        "all",
        -1,
        (("regression", "left_edge", "under"),),
    ),
    "classification: all three correlate when overparametrised": (
        "all",
        1,
        tuple(("classification", n, "over") for n in STATISTICS),
    ),
    "classification: some correlation reverses when underparametrised": (
        "any",
        -1,
        tuple(("classification", n, "under") for n in STATISTICS),
    ),
}

#: The verdicts of :func:`finding_verdict`.
VERDICTS = ("holds", "unsettled", "contradicted")


def sign_test_threshold(n_seeds: int, level: float = 0.05) -> int | None:
    """The fewest seeds out of ``n_seeds`` that must share a sign to settle it.

    The smallest ``k`` for which ``k`` of ``n_seeds`` signs alike reject "each seed's sign is a
    fair coin" in a two-sided sign test (exact binomial, ``scipy.stats.binomtest``) at
    ``level``; ``None`` if even ``n_seeds`` of ``n_seeds`` cannot (five seeds or fewer at 5%).
    For 10 seeds at 5% it is 9 (p = 0.021; 8 of 10 gives p = 0.11).
    """
    from scipy.stats import binomtest

    n_seeds, level = positive_int("n_seeds", n_seeds), positive("level", level)
    for k in range(n_seeds // 2 + 1, n_seeds + 1):
        if binomtest(k, n_seeds, 0.5).pvalue <= level:
            return k
    return None


def finding_verdict(finding: str, per_seed: Mapping, min_agree: int | None) -> tuple[str, int]:
    """Decide one finding of :data:`FINDING_SIGNS` from per-seed correlations, by sign consistency.

    A named correlation has *settled* sign ``s`` when at least ``min_agree`` seeds give it
    sign ``s``. An ``"all"`` finding holds when every named sign is settled as it says, and is
    contradicted when one is settled the other way; an ``"any"`` finding holds when one is
    settled as it says, and is contradicted when all are settled the other way. Otherwise it is
    unsettled (always, if ``min_agree`` is ``None``).

    Returns:
        The verdict (one of :data:`VERDICTS`) and the deciding count: the number of seeds with
        the finding's sign for its weakest named correlation (``"all"``) or its strongest
        (``"any"``).
    """
    if finding not in FINDING_SIGNS:
        raise ValueError(f"finding must be one of the keys of FINDING_SIGNS, got {finding!r}")
    quantifier, sign, keys = FINDING_SIGNS[finding]
    agree = [int((np.sign(np.asarray(per_seed[k])) == sign).sum()) for k in keys]
    against = [int((np.sign(np.asarray(per_seed[k])) == -sign).sum()) for k in keys]
    pick = min if quantifier == "all" else max
    count = pick(agree)
    if min_agree is None:
        return "unsettled", count
    if count >= min_agree:
        return "holds", count
    if (max if quantifier == "all" else min)(against) >= min_agree:
        return "contradicted", count
    return "unsettled", count


@dataclass(frozen=True)
class FindingsCheck:
    """The source's findings checked on one normalisation of a pair of sweeps.

    Attributes:
        normalisation: one of :data:`NORMALISATIONS`.
        seed_mean: ``rho[(task, statistic, regime)]`` over the seed means.
        per_seed: the same, one array entry per seed.
        on_means: finding -> whether it holds on the seed means.
        seed_share: finding -> the fraction of seeds in which it holds on that seed alone.
        min_agree: the seeds that must share a sign to settle it (:func:`sign_test_threshold`).
        verdicts: finding -> ``(verdict, deciding count)`` (:func:`finding_verdict`).
    """

    normalisation: str
    seed_mean: dict
    per_seed: dict
    on_means: dict
    seed_share: dict
    min_agree: int | None = None
    verdicts: dict | None = None

    @property
    def n_on_means(self) -> int:
        return int(sum(self.on_means.values()))

    @property
    def n_hold(self) -> int:
        """How many findings hold under the sign-consistency rule."""
        return sum(v[0] == "holds" for v in self.verdicts.values())


def check_findings(sweeps: Mapping[str, SweepResult], normalisation: str, level: float = 0.05) -> FindingsCheck:
    """Evaluate the source's findings on the seed means, seed by seed, and by sign consistency.

    ``sweeps`` maps each task of :data:`TASKS` to its :class:`SweepResult`; both must share
    their seeds, so that seed ``j`` of one task can be read with seed ``j`` of the other.
    :data:`SOURCE_FINDINGS` are read on the seed means and on each seed alone;
    :data:`FINDING_SIGNS` are decided by :func:`finding_verdict`, a sign being settled when
    :func:`sign_test_threshold` ``(n_seeds, level)`` seeds share it.
    """
    if set(sweeps) != set(TASKS):
        raise ValueError(f"sweeps must hold one SweepResult per task {TASKS}, got {sorted(sweeps)}")
    seeds = {s.seeds for s in sweeps.values()}
    if len(seeds) != 1:
        raise ValueError("sweeps must share their seeds")
    keys = [(t, n, r) for t in TASKS for n in STATISTICS for r in REGIMES]
    seed_mean = {k: sweeps[k[0]].rank_correlation(k[1], k[2], normalisation) for k in keys}
    per_seed = {k: sweeps[k[0]].seed_rank_correlations(k[1], k[2], normalisation) for k in keys}
    n_seeds = len(next(iter(seeds)))
    on_means = {f: bool(test(seed_mean)) for f, test in SOURCE_FINDINGS.items()}
    seed_share = {
        f: sum(bool(test({k: v[j] for k, v in per_seed.items()})) for j in range(n_seeds)) / n_seeds
        for f, test in SOURCE_FINDINGS.items()
    }
    min_agree = sign_test_threshold(n_seeds, level)
    verdicts = {f: finding_verdict(f, per_seed, min_agree) for f in FINDING_SIGNS}
    return FindingsCheck(normalisation, seed_mean, per_seed, on_means, seed_share, min_agree, verdicts)


def spectra_sweep(
    task: str,
    alphas: Sequence[float],
    seeds: Sequence[int],
    n_inputs: int = 160,
    n_hidden: int = 4,
    ridge: float = 0.01,
    steps: int = 500,
    tol: float | None = None,
    n_test: int = 200_000,
) -> SweepResult:
    """Train a student for every (alpha, seed), diagonalise its exact Hessian, measure.

    Each run draws a :func:`committee_problem`, trains with
    :func:`~lossgeom_book.teacher_student.train_students` (all seeds
    of one ratio at once; ``steps`` is the number of steps, or with ``tol`` the budget of a
    run that stops at gradient norm ``tol``), takes :func:`committee_hessian` and
    ``numpy.linalg.eigvalsh``, and records :func:`spectral_statistics` and the population
    error (:func:`lossgeom_book.teacher_student.generalisation_errors`: within one seed every
    ratio is scored on the same ``n_test`` Monte Carlo draws, those
    :func:`~lossgeom_book.teacher_student.generalisation_error` takes with that seed).
    """
    alphas = finite_array("alphas", alphas, ndim=1)
    seeds = tuple(int(s) for s in seeds)
    if alphas.size == 0 or not seeds:
        raise ValueError("alphas and seeds must not be empty")
    shape = (alphas.size, len(seeds))
    table = {
        k: np.empty(shape)
        for k in ("error", "mean", "left_edge", "right_edge", "smallest", "null_top", "gradient_norm", "steps")
    }
    spectra, problems, fits = [], [], []
    for i, alpha in enumerate(alphas):
        row = []
        problems.append([committee_problem(n_inputs, n_hidden, float(alpha), task, ridge, seed) for seed in seeds])
        fits.append(train_students(problems[i], steps=steps, seeds=seeds, tol=tol))
        for j in range(len(seeds)):
            problem, fit = problems[i][j], fits[i][j]
            eigenvalues = np.linalg.eigvalsh(committee_hessian(problem, fit.weights).numpy())
            stats = spectral_statistics(eigenvalues, problem.n_samples)
            table["gradient_norm"][i, j], table["steps"][i, j] = fit.gradient_norm, fit.steps
            for name in ("mean", "left_edge", "right_edge", "smallest", "null_top"):
                table[name][i, j] = getattr(stats, name)
            row.append(eigenvalues)
        spectra.append(row)
    for j, seed in enumerate(seeds):
        column = [problems[i][j] for i in range(alphas.size)]
        table["error"][:, j] = generalisation_errors(
            column, [fits[i][j].weights for i in range(alphas.size)], n_test, seed
        )
    steps_used = table.pop("steps").astype(int)
    return SweepResult(
        task, alphas, seeds, int(n_inputs), int(n_hidden), float(ridge), spectra=spectra, steps=steps_used, **table
    )

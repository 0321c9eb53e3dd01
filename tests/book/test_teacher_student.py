"""Tests of lossgeom_book.teacher_student: the committee, its exact Hessian, errors, statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lossgeom import curvature
from lossgeom_book import committee_spectra as cs
from lossgeom_book import teacher_student as ts

from conftest import assert_close


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_committee_output_matches_the_unit_by_unit_sum():
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(12, generator=g), torch.randn(5, 12, generator=g)
    K, d = 3, 4
    by_hand = sum(
        torch.erf((x[:, k * d : (k + 1) * d] @ w[k * d : (k + 1) * d]) / math.sqrt(d) / math.sqrt(2)) for k in range(K)
    ) / math.sqrt(K)
    assert_close(ts.committee_output(w, x, K), by_hand, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("task", ts.TASKS)
@pytest.mark.parametrize("alpha", [0.5, 2.0])
def test_closed_form_hessian_matches_autograd(task, alpha):
    problem = ts.committee_problem(24, 3, alpha, task, ridge=0.05, seed=1)
    w = torch.randn(24, generator=torch.Generator().manual_seed(2))  # away from any minimiser
    H = ts.committee_hessian(problem, w)
    reference = curvature.closure_hessian(ts.committee_loss(problem), {"w": w})
    assert_close(H, reference, rtol=1e-12, atol=1e-12)


def test_regression_error_matches_monte_carlo_on_inputs():
    problem = ts.committee_problem(40, 4, 1.0, seed=3)
    w = problem.teacher + 0.8 * torch.randn(40, generator=torch.Generator().manual_seed(4))
    exact = ts.generalisation_error(problem, w)
    x = torch.randn(100_000, 40, generator=torch.Generator().manual_seed(5))
    samples = 0.5 * (ts.committee_output(w, x, 4) - ts.committee_output(problem.teacher, x, 4)) ** 2
    assert exact == pytest.approx(float(samples.mean()), abs=4 * float(samples.std()) / math.sqrt(100_000))
    assert ts.generalisation_error(problem, problem.teacher) == pytest.approx(0.0, abs=1e-14)


def test_classification_error_matches_monte_carlo_on_inputs():
    problem = ts.committee_problem(40, 4, 1.0, "classification", seed=3)
    w = problem.teacher + 1.5 * torch.randn(40, generator=torch.Generator().manual_seed(6))
    estimate = ts.generalisation_error(problem, w, n_test=100_000)
    x = torch.randn(100_000, 40, generator=torch.Generator().manual_seed(7))
    direct = float(
        (torch.sign(ts.committee_output(w, x, 4)) != torch.sign(ts.committee_output(problem.teacher, x, 4)))
        .double()
        .mean()
    )
    assert estimate == pytest.approx(direct, abs=0.01)
    assert ts.generalisation_error(problem, problem.teacher) == 0.0


@pytest.mark.parametrize("task", ts.TASKS)
def test_training_reaches_a_stationary_point(task):
    problem = ts.committee_problem(40, 4, 1.5, task, seed=2)
    fit = ts.train_student(problem, steps=500)
    assert fit.gradient_norm <= 1e-8
    eigenvalues = np.linalg.eigvalsh(ts.committee_hessian(problem, fit.weights).numpy())
    assert eigenvalues[0] > 0  # a minimum, not a saddle


def test_spectral_statistics_excludes_the_null_cluster():
    eigenvalues = np.concatenate([np.full(6, 0.01), [0.5, 1.0, 3.0, 7.0]])[::-1]
    stats = cs.spectral_statistics(eigenvalues, n_samples=4)
    assert (stats.n_null, stats.left_edge, stats.right_edge, stats.smallest) == (6, 0.5, 7.0, 0.01)
    assert stats.null_top == 0.01
    assert stats.mean == pytest.approx(eigenvalues.mean())
    full = cs.spectral_statistics(eigenvalues, n_samples=20)
    assert full.n_null == 0 and full.left_edge == 0.01 and math.isnan(full.null_top)


def test_null_cluster_sits_at_the_ridge_when_the_student_interpolates():
    problem = ts.committee_problem(60, 3, 0.3, seed=0, ridge=1e-3)
    fit = ts.train_student(problem, steps=1500)
    eigenvalues = np.linalg.eigvalsh(ts.committee_hessian(problem, fit.weights).numpy())
    stats = cs.spectral_statistics(eigenvalues, problem.n_samples)
    assert stats.n_null == 60 - problem.n_samples
    assert stats.null_top < 5 * problem.ridge < stats.left_edge


def test_sweep_shapes_statistics_and_correlations():
    sweep = cs.spectra_sweep("regression", [0.3, 0.5, 0.7, 1.5, 2.0, 3.0], [0, 1], n_inputs=24, n_hidden=3)
    assert sweep.error.shape == (6, 2) and len(sweep.spectra) == 6 and len(sweep.spectra[0][1]) == 24
    assert_close(sweep.statistic("mean", "per_sample"), sweep.mean / sweep.alphas[:, None], rtol=0, atol=0)
    for regime in ("over", "under"):
        assert -1.0 <= sweep.rank_correlation("right_edge", regime, "per_sample") <= 1.0
    # the summed Hessian grows with alpha while the error falls: rank correlation -1
    assert sweep.rank_correlation("mean", "under") == pytest.approx(-1.0)
    text = sweep.summary()
    assert text.startswith("regression: seed means over 2 seeds, spectra of H / alpha") and "alpha" in text


@pytest.mark.parametrize("task", ts.TASKS)
def test_closed_form_gradient_matches_autograd(task):
    problem = ts.committee_problem(30, 3, 1.3, task, ridge=0.07, seed=4)
    w = torch.randn(30, generator=torch.Generator().manual_seed(9))
    leaf = w.clone().requires_grad_(True)
    (reference,) = torch.autograd.grad(ts.committee_loss(problem)({"w": leaf}), leaf)
    assert_close(ts.committee_gradient(problem, w), reference, rtol=1e-12, atol=1e-12)


def test_closed_form_training_follows_the_autograd_loop_and_keeps_students_apart():
    problems = [ts.committee_problem(24, 3, 0.7, "classification", seed=s) for s in (1, 2, 3)]
    together = ts.train_students(problems, steps=200)
    by_loop = ts.train_students(problems, steps=200, engine="autograd")
    alone = [ts.train_student(q, steps=200, seed=q.seed) for q in problems]
    for a, b, c in zip(together, by_loop, alone):
        assert_close(a.weights, b.weights, rtol=1e-11, atol=1e-13)
        assert_close(a.weights, c.weights, rtol=1e-11, atol=1e-13)
        assert a.loss == pytest.approx(b.loss, rel=1e-11) and a.steps == 200
    assert not torch.allclose(together[0].weights, together[1].weights)  # each has its own problem
    # a different start seed gives a different run on the same problem
    other = ts.train_students(problems[:1], steps=5, seeds=[11])[0]
    assert not torch.allclose(other.weights, ts.train_students(problems[:1], steps=5)[0].weights)


@pytest.mark.parametrize("task", ts.TASKS)
def test_training_to_a_tolerance_stops_each_student_on_its_fixed_step_path(task):
    problems = [ts.committee_problem(24, 3, a, task, seed=s) for a, s in ((0.7, 1), (0.7, 2), (0.7, 3))]
    fits = ts.train_students(problems, steps=3000, tol=1e-9)
    assert len({f.steps for f in fits}) > 1  # the students stop at different steps
    for q, fit in zip(problems, fits):
        assert 0 < fit.steps < 3000 and fit.gradient_norm <= 1.01e-9
        assert float(ts.committee_gradient(q, fit.weights).norm()) <= 1e-9
        fixed = ts.train_students([q], steps=fit.steps)[0]  # the same run, alone, for that many steps
        assert torch.equal(fixed.weights, fit.weights)
        earlier = ts.train_students([q], steps=fit.steps - 1)[0]
        assert float(ts.committee_gradient(q, earlier.weights).norm()) > 1e-9  # it stopped at the first one
    budget = ts.train_students(problems[:1], steps=50, tol=1e-12)[0]  # too few steps: runs the budget
    assert budget.steps == 50 and budget.gradient_norm > 1e-12
    assert torch.equal(budget.weights, ts.train_students(problems[:1], steps=50)[0].weights)


def test_generalisation_errors_equal_one_call_per_student():
    problems = [ts.committee_problem(24, 3, a, t, seed=5) for a in (0.5, 2.0) for t in ts.TASKS]
    weights = [torch.randn(24, generator=torch.Generator().manual_seed(i)) for i in range(len(problems))]
    together = ts.generalisation_errors(problems, weights, n_test=20_000, seed=3)
    one_by_one = [ts.generalisation_error(q, w, n_test=20_000, seed=3) for q, w in zip(problems, weights)]
    assert together.tolist() == one_by_one
    assert ts.generalisation_errors(problems[1:2], weights[1:2], n_test=20_000, seed=4)[0] != one_by_one[1]
    with pytest.raises(ValueError, match="one student per problem"):
        ts.generalisation_errors(problems, weights[:2])
    with pytest.raises(ValueError, match="must share n_hidden"):
        ts.generalisation_errors([problems[0], ts.committee_problem(24, 4, 1.0)], weights[:2])


def test_sweep_with_a_tolerance_records_steps_and_scores_each_seed_on_its_draws():
    alphas, seeds = [0.4, 2.0], (0, 3)
    sweep = cs.spectra_sweep(
        "classification", alphas, seeds, n_inputs=24, n_hidden=3, steps=3000, tol=1e-9, n_test=5000
    )
    assert sweep.steps.shape == (2, 2) and (sweep.steps < 3000).all() and (sweep.gradient_norm <= 1.01e-9).all()
    for i, alpha in enumerate(alphas):
        for j, seed in enumerate(seeds):
            problem = ts.committee_problem(24, 3, alpha, "classification", seed=seed)
            fit = ts.train_students([problem], steps=int(sweep.steps[i, j]), seeds=[seed])[0]
            assert sweep.error[i, j] == ts.generalisation_error(problem, fit.weights, n_test=5000, seed=seed)
    assert cs.spectra_sweep("regression", alphas, seeds, n_inputs=24, n_hidden=3, steps=20).steps.tolist() == [
        [20, 20],
        [20, 20],
    ]


@pytest.mark.parametrize("normalisation", cs.NORMALISATIONS)
def test_normalised_statistics_are_those_of_the_normalised_spectrum(normalisation):
    sweep = cs.spectra_sweep("classification", [0.4, 2.0], [0, 1], n_inputs=24, n_hidden=3, steps=100)
    for i, alpha in enumerate(sweep.alphas):
        for j in range(2):
            ev = cs.normalise_spectrum(sweep.spectra[i][j], alpha, sweep.ridge, normalisation)
            stats = cs.spectral_statistics(ev, round(alpha * 24))
            for name in cs.STATISTICS:
                assert sweep.statistic(name, normalisation)[i, j] == pytest.approx(
                    getattr(stats, name), rel=1e-12, abs=1e-15
                )


def test_normalise_spectrum_maps():
    ev = np.array([0.01, 0.5, 2.0])
    assert_close(cs.normalise_spectrum(ev, 2.0, 0.01, "summed"), ev, rtol=0, atol=0)
    assert_close(cs.normalise_spectrum(ev, 2.0, 0.01, "per_sample"), ev / 2, rtol=1e-15, atol=0)
    assert_close(cs.normalise_spectrum(ev, 2.0, 0.01, "data"), (ev - 0.01) / 2, rtol=1e-15, atol=1e-18)
    assert_close(cs.normalise_spectrum(ev, 2.0, 0.01, "fixed_ridge"), (ev - 0.01) / 2 + 0.01, rtol=1e-15, atol=1e-18)


def _synthetic_sweep(task, left_under_sign, seeds=4, flip_seed=None):
    """A sweep whose statistics move with known signs against an error that falls with alpha.

    ``flip_seed`` (an index or a list of them) reverses those seeds' left edge for alpha > 1.
    """
    alphas = np.array([0.2, 0.4, 0.6, 1.5, 2.5, 3.5])
    error = np.repeat(np.linspace(0.5, 0.1, 6)[:, None], seeds, axis=1)
    falling = np.repeat(np.linspace(3.0, 1.0, 6)[:, None], seeds, axis=1)  # moves with the error
    left = falling.copy()
    left[3:] = np.repeat((left_under_sign * np.linspace(0.1, 0.3, 3) + 1.0)[:, None], seeds, axis=1)
    for j in [] if flip_seed is None else np.atleast_1d(flip_seed):
        left[3:, j] = left[3:, j][::-1]
    zeros = np.zeros_like(error)
    return cs.SweepResult(
        task, alphas, tuple(range(seeds)), 30, 3, 0.0, error, falling, left, falling.copy(), zeros, zeros, zeros, []
    )


def test_check_findings_reads_signs_on_means_and_seed_by_seed():
    sweeps = {t: _synthetic_sweep(t, +1) for t in ts.TASKS}
    check = cs.check_findings(sweeps, "summed")
    # the left edge rises with alpha > 1 while the error falls: -1, which both tasks' findings read
    assert check.seed_mean["classification", "left_edge", "under"] == pytest.approx(-1.0)
    assert check.n_on_means == 5 and all(v == 1.0 for v in check.seed_share.values())
    assert check.per_seed["regression", "mean", "over"].shape == (4,)
    # one seed whose classification left edge falls instead: the reversal holds in 3 of 4 seeds
    sweeps["classification"] = _synthetic_sweep("classification", +1, flip_seed=2)
    check = cs.check_findings(sweeps, "summed")
    reversal = list(cs.SOURCE_FINDINGS)[-1]
    assert check.seed_share[reversal] == 0.75 and check.on_means[reversal]
    assert check.per_seed["classification", "left_edge", "under"][2] == pytest.approx(1.0)
    # a falling left edge in regression breaks the third finding only
    sweeps = {t: _synthetic_sweep(t, -1 if t == "regression" else +1) for t in ts.TASKS}
    check = cs.check_findings(sweeps, "summed")
    assert [f for f, ok in check.on_means.items() if not ok] == [list(cs.SOURCE_FINDINGS)[2]]


def test_sign_test_threshold_is_the_smallest_count_a_two_sided_sign_test_accepts():
    def two_sided_p(k, n):
        return min(1.0, 2 * sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n)

    for n in (6, 10, 12, 20, 40):
        k = cs.sign_test_threshold(n, 0.05)
        assert two_sided_p(k, n) <= 0.05 < two_sided_p(k - 1, n)
    assert cs.sign_test_threshold(10) == 9 and cs.sign_test_threshold(20) == 15
    assert cs.sign_test_threshold(5) is None  # 5 of 5 gives p = 1/16 > 0.05
    assert cs.sign_test_threshold(5, level=0.1) == 5


def test_finding_verdicts_follow_the_sign_consistency_rule():
    first, reversal = list(cs.FINDING_SIGNS)[0], list(cs.FINDING_SIGNS)[-1]
    keys = {k for _, _, ks in cs.FINDING_SIGNS.values() for k in ks}
    seeds = lambda positive: np.array([0.5] * positive + [-0.5] * (10 - positive))  # noqa: E731
    base = {k: seeds(10) for k in keys}
    # "all": every named sign settled (>= 9 of 10) its way; the weakest count decides
    assert cs.finding_verdict(first, base, 9) == ("holds", 10)
    assert cs.finding_verdict(first, {**base, ("regression", "mean", "under"): seeds(9)}, 9) == ("holds", 9)
    assert cs.finding_verdict(first, {**base, ("regression", "mean", "under"): seeds(8)}, 9) == ("unsettled", 8)
    assert cs.finding_verdict(first, {**base, ("regression", "mean", "under"): seeds(1)}, 9) == ("contradicted", 1)
    # "any": one named sign settled negative is enough; the strongest count decides
    under = [("classification", n, "under") for n in cs.STATISTICS]
    assert cs.finding_verdict(reversal, {**base, under[1]: seeds(1)}, 9) == ("holds", 9)
    assert cs.finding_verdict(reversal, {**base, under[1]: seeds(2)}, 9) == ("unsettled", 8)
    assert cs.finding_verdict(reversal, {**base, under[1]: seeds(2), under[2]: seeds(3)}, 9) == ("unsettled", 8)
    assert cs.finding_verdict(reversal, base, 9) == ("contradicted", 0)
    # a correlation of exactly zero counts for neither sign; no threshold settles nothing
    assert cs.finding_verdict(reversal, {**base, under[0]: np.zeros(10)}, 9) == ("unsettled", 0)
    assert cs.finding_verdict(reversal, {**base, under[1]: seeds(0)}, None) == ("unsettled", 10)


def test_check_findings_decides_each_finding_over_ten_seeds():
    sweeps = {t: _synthetic_sweep(t, +1, seeds=10) for t in ts.TASKS}
    reversal = list(cs.FINDING_SIGNS)[-1]
    check = cs.check_findings(sweeps, "summed")
    assert check.min_agree == 9 and check.n_hold == 5
    sweeps["classification"] = _synthetic_sweep("classification", +1, seeds=10, flip_seed=[3])
    assert cs.check_findings(sweeps, "summed").verdicts[reversal] == ("holds", 9)
    sweeps["classification"] = _synthetic_sweep("classification", +1, seeds=10, flip_seed=[3, 7])
    check = cs.check_findings(sweeps, "summed")
    # on the seed means the reversal still shows; seed by seed it does not settle
    assert check.on_means[reversal] and check.verdicts[reversal] == ("unsettled", 8) and check.n_hold == 4
    sweeps["regression"] = _synthetic_sweep("regression", -1, seeds=10)
    assert cs.check_findings(sweeps, "summed").verdicts[list(cs.FINDING_SIGNS)[2]] == ("contradicted", 0)
    # five seeds or fewer cannot settle a sign at 5%: every finding is unsettled
    small = cs.check_findings({t: _synthetic_sweep(t, +1) for t in ts.TASKS}, "summed")
    assert small.min_agree is None and {v for v, _ in small.verdicts.values()} == {"unsettled"}


def test_seed_rank_correlations_are_spearman_within_each_seed():
    from scipy.stats import spearmanr

    sweep = cs.spectra_sweep(
        "classification", [0.3, 0.5, 0.7, 1.5, 2.0, 3.0], [0, 1, 2], n_inputs=24, n_hidden=3, steps=200
    )
    per_seed = sweep.seed_rank_correlations("left_edge", "under", "data")
    rows = sweep.alphas > 1
    for j in range(3):
        expected = spearmanr(sweep.statistic("left_edge", "data")[rows, j], sweep.error[rows, j]).statistic
        assert per_seed[j] == pytest.approx(expected)
    assert_close(per_seed, sweep.seed_rank_correlations("left_edge", "under", "fixed_ridge"), rtol=0, atol=0)


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="n_inputs must be a multiple of n_hidden"):
        ts.committee_problem(10, 3, 1.0)
    with pytest.raises(ValueError, match="task must be one of"):
        ts.committee_problem(12, 3, 1.0, task="ranking")
    with pytest.raises(ValueError, match="alpha must be > 0"):
        ts.committee_problem(12, 3, 0.0)
    with pytest.raises(ValueError, match="ridge must be >= 0"):
        ts.committee_problem(12, 3, 1.0, ridge=-1.0)
    with pytest.raises(ValueError, match="must round to at least one sample"):
        ts.committee_problem(12, 3, 0.01)
    problem = ts.committee_problem(12, 3, 1.0)
    with pytest.raises(ValueError, match="params must hold the student's weights under 'w'"):
        ts.committee_loss(problem)({"v": torch.zeros(12)})
    with pytest.raises(ValueError, match=r"x must have shape \(n, 12\)"):
        ts.committee_output(torch.zeros(12), torch.zeros(4, 11), 3)
    with pytest.raises(TypeError, match="problem must be a CommitteeProblem"):
        ts.train_student("not a problem")
    with pytest.raises(ValueError, match="eigenvalues must not be empty"):
        cs.spectral_statistics([], 3)
    sweep = cs.spectra_sweep("regression", [0.5, 2.0], [0], n_inputs=12, n_hidden=3, steps=50)
    with pytest.raises(ValueError, match="needs at least 3 sample ratios"):
        sweep.rank_correlation("mean", "over")
    with pytest.raises(ValueError, match="regime must be 'over' or 'under'"):
        sweep.rank_correlation("mean", "middle")
    with pytest.raises(ValueError, match="name must be 'mean', 'left_edge' or 'right_edge'"):
        sweep.statistic("median")
    with pytest.raises(ValueError, match="normalisation must be one of"):
        sweep.statistic("mean", "average")
    with pytest.raises(ValueError, match="normalisation must be one of"):
        cs.normalise_spectrum([1.0], 1.0, 0.0, "per-sample")
    with pytest.raises(ValueError, match="engine must be one of"):
        ts.train_student(problem, engine="numpy")
    with pytest.raises(ValueError, match="must share n_samples"):
        ts.train_students([problem, ts.committee_problem(12, 3, 2.0)])
    with pytest.raises(ValueError, match="one seed per problem"):
        ts.train_students([problem], seeds=[0, 1])
    with pytest.raises(ValueError, match="momentum must lie in"):
        ts.train_student(problem, momentum=1.0)
    with pytest.raises(ValueError, match=r"w must have shape \(12,\)"):
        ts.committee_gradient(problem, torch.zeros(11))
    with pytest.raises(ValueError, match="tol .* needs engine='closed_form'"):
        ts.train_student(problem, engine="autograd", tol=1e-8)
    with pytest.raises(ValueError, match="tol must be > 0"):
        ts.train_student(problem, tol=0.0)
    with pytest.raises(ValueError, match="finding must be one of"):
        cs.finding_verdict("flatness predicts everything", {}, 9)
    with pytest.raises(ValueError, match="level must be > 0"):
        cs.sign_test_threshold(10, level=0.0)
    with pytest.raises(ValueError, match="sweeps must hold one SweepResult per task"):
        cs.check_findings({"regression": sweep}, "data")

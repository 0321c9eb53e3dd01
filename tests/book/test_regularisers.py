"""Functional velocities, paired one-step tests and regularised training (the regulariser chapter)."""

import functools

import pytest
import torch

from lossgeom import flatness
from lossgeom.flatness import softmax_gauge as softmax
from lossgeom.symmetries import Symmetry
from lossgeom_book import regulariser_checks as checks
from lossgeom_book import regularisers as reg
from lossgeom_book import tasks
from lossgeom_book.data import Split

W_NAME = tasks.CLASSIFIER


def small_problem(seed=0, n=12, d=5, K=4, hidden=(6,)):
    g = torch.Generator().manual_seed(seed)
    model = tasks.MLPClassifier(d, hidden, K, seed=seed)
    x = torch.randn(n, d, generator=g)
    y = torch.randint(0, K, (n,), generator=g)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    return functools.partial(tasks.features, model), params, x, y


@pytest.mark.parametrize("objective", ["raw", "quot", "exact"])
def test_functional_velocity_matches_dense_jacobian_times_gradient(objective, close):
    feats, params, x, y = small_problem()
    F = reg.probabilities_fn(feats, x)
    S = lambda q: reg.PROXIES[objective](q[W_NAME], feats(q, x))
    velocity = reg.functional_velocity(F, S, params)
    jac = torch.func.jacrev(F)(params)
    grad = torch.func.grad(S)(params)
    dense = sum((jac[k].reshape(*velocity.shape, -1) @ grad[k].reshape(-1)) for k in params)
    close(velocity, dense, rtol=1e-10, atol=1e-12)


def test_raw_velocity_gap_is_the_closed_form(close):
    g = torch.Generator().manual_seed(4)
    W, h, v = torch.randn(5, 3, generator=g), torch.randn(3, generator=g), torch.randn(3, generator=g)
    F = lambda q: softmax.probabilities(q["W"], h)
    S = lambda q: flatness.b_raw(q["W"], h)
    gap = reg.functional_velocity(F, S, {"W": W + v}) - reg.functional_velocity(F, S, {"W": W})
    p = softmax.probabilities(W, h)
    P = softmax.covariance(p)
    delta = ((W + v) ** 2).sum() - (W**2).sum()
    close(gap, -2 * delta * (h @ h) ** 2 * P @ P @ p, rtol=1e-10, atol=1e-12)
    for name in ("b_quot", "kappa_exact"):  # invariant proxies: no gap at all
        measure = getattr(flatness, name)
        S_inv = lambda q, f=measure: f(q["W"], h)
        close(reg.functional_velocity(F, S_inv, {"W": W + v}), reg.functional_velocity(F, S_inv, {"W": W}), atol=1e-12)


@pytest.mark.parametrize("ratio", [1.0, 10.0, 100.0])
def test_shift_for_ratio_sets_the_raw_proxy_exactly(ratio, close):
    g = torch.Generator().manual_seed(1)
    W, h = torch.randn(6, 4, generator=g), torch.randn(7, 4, generator=g)
    v = reg.shift_for_ratio(W, ratio, torch.randn(4, generator=g))
    twin = softmax.common_row_shift(softmax.centre(W), v)
    close(flatness.b_raw(twin, h) / flatness.b_quot(W, h), ratio, rtol=1e-12)
    close(softmax.probabilities(twin, h), softmax.probabilities(W, h), atol=1e-13)


def test_objective_adds_the_signed_proxy(close):
    feats, params, x, y = small_problem(seed=2)
    h = feats(params, x)
    ce = torch.nn.functional.cross_entropy(h @ params[W_NAME].T, y)
    for sign in (1, -1):
        loss = reg.objective_fn(feats, x, y, "quot", alpha=0.3, sign=sign)(params)
        close(loss, ce + sign * 0.3 * flatness.b_quot(params[W_NAME], h), rtol=1e-13)
    close(reg.objective_fn(feats, x, y, "ce")(params), ce, rtol=1e-14)


def shifted(params, seed=0, scale=20.0):
    v = scale * torch.randn(params[W_NAME].shape[1], generator=torch.Generator().manual_seed(seed))
    return softmax.row_shift_symmetry(v, W_NAME)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_paired_step_separates_raw_and_aligns_the_invariant_objectives(optimizer):
    feats, params, x, y = small_problem(seed=3)
    syms = [shifted(params, s) for s in range(3)]
    for objective in ("ce", "quot", "exact", "raw"):
        results = reg.paired_steps(
            feats, params, syms, x, y, x, objective=objective, alpha=0.1, lr=0.05, optimizer=optimizer
        )
        assert all(r.gap_before <= 1e-12 and r.step_size > 1e-6 for r in results)
        if objective == "raw":
            assert min(r.gap_after for r in results) > 1e-4
        else:
            assert max(r.gap_after for r in results) <= 1e-12 and all(r.disagreement == 0 for r in results)
    one = reg.paired_step(feats, params, syms[0], x, y, x, objective="raw", alpha=0.1, lr=0.05, optimizer=optimizer)
    assert one.gap_after == results[0].gap_after
    both = reg.paired_steps(
        feats, params, syms, x, y, x, objective=("quot", "raw"), alpha=0.1, lr=0.05, optimizer=optimizer
    )
    assert [r.objective for r in both] == ["quot"] * 3 + ["raw"] * 3
    assert [r.gap_after for r in both[3:]] == [r.gap_after for r in results]


def test_optimiser_step_matches_the_update_rules(close):
    feats, params, x, y = small_problem(seed=5)
    loss_fn = reg.objective_fn(feats, x, y, "ce")
    grad = torch.func.grad(loss_fn)(params)
    sgd = reg.optimiser_step(loss_fn, params, lr=0.1)
    adam = reg.optimiser_step(loss_fn, params, lr=0.01, optimizer="adam")
    for k in params:
        close(sgd[k], params[k] - 0.1 * grad[k], rtol=1e-13, atol=1e-14)
        close(adam[k], params[k] - 0.01 * grad[k] / (grad[k].abs() + 1e-8), rtol=1e-12, atol=1e-12)


def test_paired_step_rejects_a_pair_that_is_not_one_predictor():
    feats, params, x, y = small_problem()
    scale = Symmetry("W -> 2W", lambda q: {**q, W_NAME: 2 * q[W_NAME]})
    with pytest.raises(ValueError, match="is not a symmetry of the model"):
        reg.paired_step(feats, params, scale, x, y, x, objective="raw", alpha=0.1, lr=0.1)


@pytest.mark.parametrize("sign,weight_decay", [(-1, 0.0), (-1, 0.1), (1, 0.0), (1, 0.2)])
def test_train_mean_row_follows_the_derived_factor(sign, weight_decay, close):
    feats, params, x, y = small_problem(seed=6)
    eta, alpha = 0.05, 0.02
    _, hist = reg.train(
        feats, params, x, y, objective="raw", alpha=alpha, sign=sign, steps=30, lr=eta, weight_decay=weight_decay
    )
    factor = 1 - eta * weight_decay - 2 * sign * eta * alpha * hist["s"]
    close(hist["mean_row"][1:], factor[:, None] * hist["mean_row"][:-1], rtol=1e-10, atol=1e-13)
    _, quot = reg.train(
        feats, params, x, y, objective="quot", alpha=alpha, sign=sign, steps=30, lr=eta, weight_decay=weight_decay
    )
    close(quot["mean_row"][1:], (1 - eta * weight_decay) * quot["mean_row"][:-1], rtol=1e-10, atol=1e-13)


def test_train_records_and_s_is_the_raw_proxy_over_the_norm(close):
    feats, params, x, y = small_problem(seed=7)
    seen = []
    final, hist = reg.train(
        feats,
        params,
        x,
        y,
        objective="ce",
        alpha=0.0,
        steps=10,
        lr=0.1,
        record=lambda step, q: seen.append(step) or step,
        record_every=4,
    )
    assert seen == [0, 4, 8, 10] and hist["records"] == seen and hist["diverged_at"] is None
    h = feats(params, x)
    close(hist["s"][0], flatness.b_raw(params[W_NAME], h) / (params[W_NAME] ** 2).sum(), rtol=1e-12)
    close(reg.mean_score(feats, params, x), hist["s"][0], rtol=1e-12)


def test_train_cap_bounds_the_centred_part_only(close):
    feats, params, x, y = small_problem(seed=8)
    final, hist = reg.train(feats, params, x, y, objective="raw", alpha=0.1, sign=-1, steps=10, lr=0.5, centred_cap=1.0)
    assert float(softmax.centre(final[W_NAME]).norm()) <= 1.0 + 1e-10
    close(final[W_NAME].mean(0), hist["mean_row"][-1], rtol=1e-14)
    assert float(hist["mean_row"][-1].norm()) > float(hist["mean_row"][0].norm())


def test_train_stops_when_the_run_overflows():
    g = torch.Generator().manual_seed(9)
    probe = tasks.LinearProbe(4, 3, seed=0)
    feats, params = functools.partial(tasks.features, probe), dict(probe.named_parameters())
    x, y = torch.randn(10, 4, generator=g), torch.randint(0, 3, (10,), generator=g)
    _, hist = reg.train(feats, params, x, y, objective="raw", alpha=10.0, sign=-1, steps=400, lr=0.5, centred_cap=1.0)
    assert hist["diverged_at"] is not None and hist["diverged_at"] < 400
    assert len(hist["s"]) == hist["diverged_at"]


def test_errors_are_named():
    feats, params, x, y = small_problem()
    with pytest.raises(ValueError, match="objective must be one of"):
        reg.objective_fn(feats, x, y, "sharp")
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        reg.objective_fn(feats, x, y, "raw", alpha=-1.0)
    with pytest.raises(ValueError, match="sign must be"):
        reg.objective_fn(feats, x, y, "raw", sign=0.5)
    with pytest.raises(ValueError, match="y must be a 1-D int64"):
        reg.objective_fn(feats, x, y.double(), "raw")
    with pytest.raises(ValueError, match="same positive number of examples"):
        reg.objective_fn(feats, x, y[:-1], "raw")
    with pytest.raises(TypeError, match="features must be callable"):
        reg.objective_fn(None, x, y, "raw")
    with pytest.raises(ValueError, match="weight must name the classifier"):
        reg.train(feats, params, x, y, objective="raw", alpha=0.1, steps=1, lr=0.1, weight="head")
    with pytest.raises(ValueError, match="centred_cap must be > 0"):
        reg.train(feats, params, x, y, objective="raw", alpha=0.1, steps=1, lr=0.1, centred_cap=0.0)
    with pytest.raises(ValueError, match="optimizer must be one of"):
        reg.optimiser_step(reg.objective_fn(feats, x, y, "ce"), params, lr=0.1, optimizer="lbfgs")
    with pytest.raises(ValueError, match="lr must be > 0"):
        reg.optimiser_step(reg.objective_fn(feats, x, y, "ce"), params, lr=0.0)
    with pytest.raises(ValueError, match="ratio must be >= 1"):
        reg.shift_for_ratio(params[W_NAME], 0.5, torch.ones(6))
    with pytest.raises(ValueError, match="direction must be a nonzero vector"):
        reg.shift_for_ratio(params[W_NAME], 2.0, torch.zeros(6))
    with pytest.raises(ValueError, match="score_fn must return a scalar"):
        reg.functional_velocity(reg.probabilities_fn(feats, x), lambda q: feats(q, x), params)
    with pytest.raises(TypeError, match="symmetry must be a lossgeom Symmetry"):
        reg.paired_step(feats, params, lambda q: q, x, y, x, objective="raw", alpha=0.1, lr=0.1)
    with pytest.raises(ValueError, match="objective must be one of"):
        reg.paired_steps(feats, params, [shifted(params)], x, y, x, objective=("raw", "sam"), alpha=0.1, lr=0.1)
    with pytest.raises(TypeError, match="non-empty list of lossgeom Symmetry"):
        reg.paired_steps(feats, params, [], x, y, x, objective="raw", alpha=0.1, lr=0.1)
    with pytest.raises(ValueError, match=r"features must return \(n, 6\)"):
        reg.logits_and_features(lambda q, inp: inp, params, x, W_NAME)


def test_identification_checklist_recomputes_each_requirement(close):
    g = torch.Generator().manual_seed(11)
    W, h, v = torch.randn(5, 3, generator=g), torch.randn(8, 3, generator=g), torch.randn(3, generator=g)
    check = checks.identification_checklist(W, h, v)
    twin = softmax.common_row_shift(W, v)
    # value gap of B_raw is |Delta_v| / ||W||^2 exactly, since s is shift invariant
    close(check["raw"]["value_gap"], abs(float((twin**2).sum() - (W**2).sum())) / float((W**2).sum()), rtol=1e-10)
    close(check["raw"]["slack"], 1 - float(flatness.kappa_exact(W, h) / flatness.b_raw(W, h)), rtol=1e-12)
    assert check["raw"]["velocity_gap"] > 1e-3
    for name in ("quot", "exact"):
        assert check[name]["slack"] >= -1e-15 and check[name]["value_gap"] < 1e-12
        assert check[name]["velocity_gap"] < 1e-10
    assert check["exact"]["slack"] == 0.0


def test_gradient_gap_ratio_scales_the_feature_gradient():
    feats, params, x, y = small_problem(seed=12)
    centred = {**params, W_NAME: softmax.centre(params[W_NAME])}
    v = reg.shift_for_ratio(params[W_NAME], 100.0, torch.ones(6))
    twin = {**centred, W_NAME: softmax.common_row_shift(centred[W_NAME], v)}
    raw = lambda q: flatness.b_raw(q[W_NAME], feats(q, x))
    grad_c, grad_t = torch.func.grad(raw)(centred), torch.func.grad(raw)(twin)
    for k in params:  # non-classifier parameters: exactly 100 times the centred gradient
        if k != W_NAME:
            assert torch.allclose(grad_t[k], 100 * grad_c[k], rtol=1e-9, atol=1e-12)
    ratio = checks.gradient_gap_ratio(raw, centred, twin)
    assert 50 < ratio < 110
    quot = lambda q: flatness.b_quot(q[W_NAME], feats(q, x))
    assert checks.gradient_gap_ratio(quot, centred, twin) < 1e-10
    with pytest.raises(ValueError, match="twin must have the same parameter names"):
        checks.gradient_gap_ratio(raw, centred, {W_NAME: twin[W_NAME]})


def test_calibration_and_paired_one_step_test(close):
    feats, params, x, y = small_problem(seed=13)
    alpha = checks.calibrate_alpha(feats, params, x, y, 0.1, weight=W_NAME)
    h = feats(params, x)
    close(
        alpha * flatness.b_quot(params[W_NAME], h),
        0.1 * torch.nn.functional.cross_entropy(h @ params[W_NAME].T, y),
        rtol=1e-12,
    )
    rows = checks.paired_one_step_test(
        feats, params, x, y, x, ratios=(10.0, 100.0), n_directions=2, seed=1, weight=W_NAME
    )
    assert [r["ratio"] for r in rows] == [10.0, 10.0, 100.0, 100.0]
    for r in rows:
        close(r["raw_ratio"], r["ratio"], rtol=1e-9)
        assert r["quot_change"] < 1e-12 and r["exact_change"] < 1e-12 and r["before"] < 1e-12
        assert r["raw"] > 1e3 * max(r["quot"], r["exact"], r["ce"], 1e-16)
        close(r["alpha"], alpha, rtol=1e-12)
        assert r["quot_over_exact"] >= 1.0
    assert rows[2]["raw"] > rows[0]["raw"]  # the gap grows with the shift


def test_fix_raw_ratio_moves_only_the_common_row(close):
    g = torch.Generator().manual_seed(14)
    W, h = torch.randn(4, 3, generator=g), torch.randn(6, 3, generator=g)
    params = {W_NAME: W, "other": torch.ones(2)}
    held = checks.fix_raw_ratio(30.0, torch.randn(3, generator=g), W_NAME)(params)
    close(flatness.b_raw(held[W_NAME], h) / flatness.b_quot(W, h), 30.0, rtol=1e-12)
    close(softmax.probabilities(held[W_NAME], h), softmax.probabilities(W, h), atol=1e-13)
    assert held["other"] is params["other"]
    centred = checks.fix_raw_ratio(1.0, torch.ones(3), W_NAME)(params)[W_NAME]
    close(centred.sum(0), torch.zeros(3), atol=1e-14)
    with pytest.raises(ValueError, match="ratio must be >= 1"):
        checks.fix_raw_ratio(0.5, torch.ones(3))


def test_runaway_deviation_detects_a_wrong_factor():
    feats, params, x, y = small_problem(seed=15)
    _, hist = reg.train(feats, params, x, y, objective="raw", alpha=0.05, sign=-1, steps=20, lr=0.1)
    assert checks.runaway_factor_deviation(hist, 0.1, 0.05, sign=-1) < 1e-12
    assert checks.runaway_factor_deviation(hist, 0.1, 0.05, sign=1) > 1e-4
    with pytest.raises(ValueError, match="one more mean row than scores"):
        checks.runaway_factor_deviation({"mean_row": hist["mean_row"], "s": hist["s"][:-1]}, 0.1, 0.05)


def test_train_then_remove_records_both_phases():
    feats, params, x, y = small_problem(seed=16)
    rec = lambda step, q: step
    out = checks.train_then_remove(
        feats, params, x, y, objective="quot", alpha=0.01, steps_on=6, steps_off=4, lr=0.1, record=rec, record_every=3
    )
    assert out["on"] == [0, 3, 6] and out["off"] == [0, 3, 4] and out["diverged_at"] is None
    assert out["common_row_norm"].shape == (7,)
    assert torch.allclose(out["common_row_norm"], out["common_row_norm"][0].expand(7), rtol=1e-12)
    with pytest.raises(ValueError, match="steps_off must be >= 0"):
        checks.train_then_remove(feats, params, x, y, objective="ce", alpha=0.0, steps_on=1, steps_off=-1, lr=0.1)


def test_velocity_minor_matches_the_exact_value():
    import math

    p = [0.5, 0.3, 0.2]
    assert float(checks.velocity_minor(p)) == pytest.approx(9 / 25000 * math.log(640 / 6561), rel=1e-12)
    assert abs(float(checks.velocity_minor([1 / 3] * 3))) < 1e-15
    batch = checks.velocity_minor([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]])
    assert batch.shape == (2,) and batch[0] == pytest.approx(float(checks.velocity_minor(p)), rel=1e-14)
    with pytest.raises(ValueError, match="strictly positive probabilities that sum to one"):
        checks.velocity_minor([0.5, 0.6, -0.1])
    with pytest.raises(ValueError, match=r"p must have shape \(K,\) or \(n, K\)"):
        checks.velocity_minor([1.0])


@pytest.mark.parametrize("ratio", [1.0, 30.0])
def test_twin_at_ratio_is_the_centred_classifier_plus_the_sized_shift(ratio, close):
    g = torch.Generator().manual_seed(17)
    W, h, u = torch.randn(5, 4, generator=g), torch.randn(9, 4, generator=g), torch.randn(4, generator=g)
    twin = reg.twin_at_ratio(W, ratio, u)
    close(twin, softmax.common_row_shift(softmax.centre(W), reg.shift_for_ratio(W, ratio, u)), rtol=0, atol=0)
    close(twin - twin.mean(0), softmax.centre(W), atol=1e-14)  # the centred part is W's
    close(flatness.b_raw(twin, h) / flatness.b_quot(W, h), ratio, rtol=1e-12)
    close(softmax.probabilities(twin, h), softmax.probabilities(W, h), atol=1e-13)
    with pytest.raises(ValueError, match=r"W must be the \(K, d\) classifier"):
        reg.twin_at_ratio(W[0], ratio, u)


def test_checklist_report_states_each_requirement():
    made_up = {
        "raw": {"slack": 0.5, "value_gap": 2.0, "velocity_gap": 3.0},
        "bad": {"slack": -0.25, "value_gap": 1e-15, "velocity_gap": 0.0},
    }
    assert checks.checklist_report(made_up).splitlines() == [
        "raw  : validity yes, slack 0.5 | value identification no, gap 2 | interventional identification no, gap 3",
        "bad  : validity no, slack -0.25 | value identification yes, gap below 1e-12 (rounding level) | "
        "interventional identification yes, gap below 1e-12 (rounding level)",
    ]
    assert "value identification no, gap 1e-15" in checks.checklist_report(made_up, floor=1e-16)
    g = torch.Generator().manual_seed(18)
    W, h, v = torch.randn(4, 3, generator=g), torch.randn(6, 3, generator=g), torch.randn(3, generator=g)
    lines = checks.checklist_report(checks.identification_checklist(W, h, v)).splitlines()
    assert [line[:5] for line in lines] == ["raw  ", "quot ", "exact"]
    assert "identification no" in lines[0] and "identification no" not in " ".join(lines[1:])
    with pytest.raises(ValueError, match="floor must be > 0"):
        checks.checklist_report(made_up, floor=0.0)


def test_velocity_gap_is_the_closed_form_for_raw_and_zero_for_the_invariant_scores(close):
    g = torch.Generator().manual_seed(19)
    W, h, v = torch.randn(6, 4, generator=g), torch.randn(4, generator=g), 2 * torch.randn(4, generator=g)
    p = softmax.probabilities(W, h)
    P = softmax.covariance(p)
    delta = ((W + v) ** 2).sum() - (W**2).sum()
    close(checks.velocity_gap(flatness.b_raw, W, h, v), -2 * delta * (h @ h) ** 2 * P @ P @ p, rtol=1e-10)
    for score in (flatness.b_quot, flatness.kappa_exact):
        close(checks.velocity_gap(score, W, h, v), torch.zeros(6), atol=1e-13)
    with pytest.raises(TypeError, match="score must be callable"):
        checks.velocity_gap("b_raw", W, h, v)


def test_gradient_gap_at_ratio_centres_and_shifts_the_classifier():
    feats, params, x, y = small_problem(seed=20)
    raw = lambda q: flatness.b_raw(q[W_NAME], feats(q, x))
    centred = {**params, W_NAME: softmax.centre(params[W_NAME])}
    v = reg.shift_for_ratio(params[W_NAME], 100.0, torch.ones(6))
    twin = {**centred, W_NAME: softmax.common_row_shift(centred[W_NAME], v)}
    ratio = checks.gradient_gap_at_ratio(raw, params, 100.0)
    assert ratio == checks.gradient_gap_ratio(raw, centred, twin)
    assert ratio == checks.gradient_gap_at_ratio(raw, params, 100.0, torch.ones(6))
    assert checks.gradient_gap_at_ratio(raw, params, 100.0, torch.arange(1.0, 7.0)) != ratio
    quot = lambda q: flatness.b_quot(q[W_NAME], feats(q, x))
    assert checks.gradient_gap_at_ratio(quot, params, 100.0) < 1e-10


def test_paired_test_on_model_uses_the_classifier_inputs_and_the_split():
    model = tasks.MLPClassifier(5, (6,), 4, seed=21)
    g = torch.Generator().manual_seed(21)
    x, x_test = torch.randn(12, 5, generator=g), torch.randn(7, 5, generator=g)
    y, y_test = torch.randint(0, 4, (12,), generator=g), torch.randint(0, 4, (7,), generator=g)
    split = Split(x, y, x_test, y_test, "random")
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    kwargs = dict(ratios=(100.0,), n_directions=2, seed=3, objectives=("raw", "quot"))
    rows = checks.paired_test_on_model(model, split, params, **kwargs)
    feats = functools.partial(tasks.features, model)
    assert rows == checks.paired_one_step_test(feats, params, x, y, x_test, **kwargs)
    assert len(rows) == 2 and all(r["raw"] > 1e3 * max(r["quot"], 1e-16) for r in rows)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        checks.paired_test_on_model(feats, split, params, **kwargs)


def test_compare_null_runs_sees_one_predictor_at_two_raw_values(close):
    task = tasks.modular_arithmetic(5, "add", train_fraction=0.8, seed=0)
    split = Split(task.x_train, task.y_train, task.x_train, task.y_train, "the training set as test set")
    direction = torch.randn(16, generator=torch.Generator().manual_seed(0))

    def run(ratio):
        model = tasks.MLPClassifier(None, (16,), 5, modulus=5, seed=0)
        project = checks.fix_raw_ratio(ratio, direction)
        return model, tasks.fit(model, split, 40, lr=0.05, weight_decay=1.0, snapshot_every=10, project=project)

    (model, control), (_, twin) = run(1.0), run(30.0)
    out = checks.compare_null_runs(model, split, control, twin, onset_level=0.8)
    close(out["raw_ratio"], 30.0, rtol=1e-8)
    assert len(out["gaps"]) == 4 and max(out["gaps"]) < 1e-10
    curve = tasks.accuracy_curve(model, control, split.x_test, split.y_test)
    assert out["onsets"] == [20, 20] and out["memorised"] == 30  # a run that reaches both, at different steps
    assert [acc >= 0.8 for _, acc in curve] == [False, True, True, True]
    assert [acc == 1.0 for _, acc in curve] == [False, False, True, True]
    with pytest.raises(ValueError, match="checkpoints at the same"):
        checks.compare_null_runs(model, split, control, tasks.FitResult(1.0, 1.0, twin.snapshots[:2]))

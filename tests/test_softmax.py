"""The softmax gauge: autograd references, shift invariance, orbit minimum, errors."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from conftest import assert_close
from lossgeom import flatness
from lossgeom import softmax as sm
from lossgeom.curvature import dense_hessian
from lossgeom.symmetries import audit_symmetry

CASES = [
    {"id": "K2-d1", "K": 2, "d": 1, "n": 3, "scale": 1.0, "seed": 0},
    {"id": "K3-d4", "K": 3, "d": 4, "n": 5, "scale": 1.0, "seed": 1},
    {"id": "K10-d6-large", "K": 10, "d": 6, "n": 7, "scale": 3.0, "seed": 2},
    {"id": "K5-d2-small", "K": 5, "d": 2, "n": 4, "scale": 0.1, "seed": 3},
]


def make(case):
    gen = torch.Generator().manual_seed(case["seed"])
    W = case["scale"] * torch.randn(case["K"], case["d"], generator=gen, dtype=torch.float64)
    W = W + torch.randn(1, case["d"], generator=gen, dtype=torch.float64)  # a nonzero mean row
    h = torch.randn(case["n"], case["d"], generator=gen, dtype=torch.float64)
    v = torch.randn(case["d"], generator=gen, dtype=torch.float64)
    return W, h, v


@pytest.fixture(params=CASES, ids=[c["id"] for c in CASES])
def case(request):
    return make(request.param)


def test_covariance_is_softmax_jacobian_and_label_covariance(case):
    W, h, _ = case
    z = h[0] @ W.T
    jac = torch.autograd.functional.jacobian(lambda t: torch.softmax(t, dim=0), z)
    p = torch.softmax(z, dim=0)
    assert_close(sm.covariance(p), jac, rtol=1e-13, atol=1e-15)
    onehots = torch.eye(len(p))
    label_cov = (p[:, None, None] * (onehots - p)[:, :, None] * (onehots - p)[:, None, :]).sum(0)
    assert_close(sm.covariance(p), label_cov, rtol=1e-13, atol=1e-15)
    batch = sm.covariance(torch.softmax(h @ W.T, dim=-1))
    assert batch.shape == (h.shape[0], W.shape[0], W.shape[0])
    assert_close(batch.sum(-1), torch.zeros(h.shape[0], W.shape[0]), atol=1e-15)


def test_classifier_hessian_is_P_kron_hhT(case):
    W, h, _ = case
    x, y = h[0], torch.tensor(0)
    loss = lambda params: torch.nn.functional.cross_entropy((params["W"] @ x).unsqueeze(0), y.unsqueeze(0))
    hess = dense_hessian(loss, {"W": W})
    expected = torch.kron(sm.covariance(sm.probabilities(W, x)), torch.outer(x, x))
    assert_close(hess, expected, rtol=1e-12, atol=1e-14)


def test_kappa_exact_equals_dense_trace_and_bounds_order(case):
    W, h, _ = case
    dense = torch.stack([(x @ x) * torch.trace(W.T @ sm.covariance(sm.probabilities(W, x)) @ W) for x in h])
    assert_close(flatness.kappa_exact(W, h, reduction="none"), dense, rtol=1e-11, atol=1e-14)
    assert_close(flatness.kappa_exact(W, h), dense.mean(), rtol=1e-11, atol=1e-14)
    assert_close(flatness.kappa_exact(W, h[0]), dense[0], rtol=1e-11, atol=1e-14)
    k, q, r = (f(W, h, reduction="none") for f in (flatness.kappa_exact, flatness.b_quot, flatness.b_raw))
    assert torch.all(k <= q * (1 + 1e-12)) and torch.all(q <= r * (1 + 1e-12))
    # B_raw and B_quot in closed form
    trace_p = 1 - (sm.probabilities(W, h) ** 2).sum(-1)
    assert_close(r, (W**2).sum() * (h**2).sum(-1) * trace_p, rtol=1e-13)
    assert_close(q, (sm.centre(W) ** 2).sum() * (h**2).sum(-1) * trace_p, rtol=1e-13)


def test_shift_keeps_p_kappa_bquot_and_moves_braw(case):
    W, h, v = case
    for t in (-10.0, 0.5, 100.0):
        Wt = sm.common_row_shift(W, t * v)
        assert_close(sm.probabilities(Wt, h), sm.probabilities(W, h), rtol=0, atol=1e-12)
        assert_close(flatness.kappa_exact(Wt, h), flatness.kappa_exact(W, h), rtol=1e-9)
        assert_close(flatness.b_quot(Wt, h), flatness.b_quot(W, h), rtol=1e-9)
    # B_raw is quadratic in t with leading coefficient K ||v||^2 (times the invariant factor)
    factor = flatness.b_raw(W, h) / (W**2).sum()
    for t in (-3.0, 2.0, 1e3):
        quadratic = (W**2).sum() + 2 * t * (W.sum(0) @ v) + t**2 * W.shape[0] * (v @ v)
        assert_close(flatness.b_raw(sm.common_row_shift(W, t * v), h), factor * quadratic, rtol=1e-9)


def test_shift_invariant_gradients_of_kappa_and_bquot(case):
    W, h, v = case
    Wt = sm.common_row_shift(W, 5 * v)
    for f in (flatness.kappa_exact, flatness.b_quot):
        g0 = torch.func.grad(lambda w: f(w, h))(W)
        g1 = torch.func.grad(lambda w: f(w, h))(Wt)
        assert_close(g1, g0, rtol=1e-8, atol=1e-10)
    g0 = torch.func.grad(lambda w: flatness.b_raw(w, h))(W)
    g1 = torch.func.grad(lambda w: flatness.b_raw(w, h))(Wt)
    assert (g1 - g0).abs().max() > 1e-3  # the raw proxy's gradient is not gauge invariant


def test_gradients_in_h_match_finite_differences():
    W, h, _ = make(CASES[1])
    for f in (flatness.kappa_exact, flatness.b_raw, flatness.b_quot):
        g = torch.func.grad(lambda x: f(W, x))(h[0])
        e = torch.zeros_like(h[0])
        e[1] = 1e-6
        fd = (f(W, h[0] + e) - f(W, h[0] - e)) / 2e-6
        assert abs(float(g[1] - fd)) <= 1e-7 * max(1.0, abs(float(fd)))


def test_bquot_is_the_numerical_orbit_minimum_of_braw(case):
    W, h, _ = case
    minimum, shift = flatness.orbit_minimum(W, h, gtol=1e-12)
    assert minimum == pytest.approx(float(flatness.b_quot(W, h)), rel=1e-8)
    assert_close(shift, -sm.mean_row(W), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="gtol must be > 0"):
        flatness.orbit_minimum(W, h, gtol=0.0)


def test_centre_is_unique_minimum_norm_representative(case):
    W, _, v = case
    Wc = sm.centre(W)
    assert_close(Wc.sum(0), torch.zeros(W.shape[1]), atol=1e-13)
    assert_close((W**2).sum(), (Wc**2).sum() + W.shape[0] * (sm.mean_row(W) ** 2).sum(), rtol=1e-13)
    assert_close(sm.centre(sm.common_row_shift(W, v)), Wc, rtol=1e-13, atol=1e-13)
    for t in (1e-3, 1.0):
        assert (sm.common_row_shift(Wc, t * v) ** 2).sum() > (Wc**2).sum()
    share = sm.mean_row_share(W)
    assert_close(flatness.b_raw(W, torch.ones(W.shape[1])) / flatness.b_quot(W, torch.ones(W.shape[1])), 1 / (1 - share), rtol=1e-12)


def test_reference_class_rows_and_mean_ratio_two(case):
    W, h, _ = case
    K = W.shape[0]
    ratios = []
    for r in range(K):
        Wr = sm.reference_class(W, r)
        assert torch.all(Wr[r] == 0)
        assert_close(sm.probabilities(Wr, h), sm.probabilities(W, h), atol=1e-12, rtol=0)
        ratio = flatness.b_raw(Wr, h) / flatness.b_quot(W, h)
        Wc = sm.centre(W)
        assert_close(ratio, 1 + K * (Wc[r] ** 2).sum() / (Wc**2).sum(), rtol=1e-11)
        assert_close(flatness.reference_ratio(W, r), ratio, rtol=1e-11)
        ratios.append(float(ratio))
    assert np.mean(ratios) == pytest.approx(2.0, rel=1e-12)


@settings(max_examples=40, deadline=None, database=None)
@given(K=st.integers(2, 6), d=st.integers(1, 5), seed=st.integers(0, 2**31 - 1),
       scale=st.floats(0.05, 5.0), shift=st.floats(-50.0, 50.0))
def test_property_invariance_and_ordering(K, d, seed, scale, shift):
    gen = torch.Generator().manual_seed(seed)
    W = scale * torch.randn(K, d, generator=gen, dtype=torch.float64)
    h = torch.randn(3, d, generator=gen, dtype=torch.float64)
    v = shift * torch.randn(d, generator=gen, dtype=torch.float64)
    Wv = sm.common_row_shift(W, v)
    k, q, r = flatness.kappa_exact(Wv, h), flatness.b_quot(Wv, h), flatness.b_raw(Wv, h)
    assert k <= q * (1 + 1e-10) + 1e-12 and q <= r * (1 + 1e-10) + 1e-12
    assert float(abs(k - flatness.kappa_exact(W, h))) <= 1e-8 * (1 + float(k))
    assert float(abs(q - flatness.b_quot(W, h))) <= 1e-8 * (1 + float(q))
    ratios = [float(flatness.reference_ratio(W, r_)) for r_ in range(K)]
    assert np.mean(ratios) == pytest.approx(2.0, rel=1e-10)


def test_row_shift_symmetry_passes_the_audit_and_moves_braw():
    W, h, v = make(CASES[2])
    forward = lambda params, x: x @ params["weight"].T
    measure = lambda params: float(flatness.b_raw(params["weight"], h))
    report = audit_symmetry(lambda p, x: torch.softmax(forward(p, x), -1), {"weight": W},
                            sm.row_shift_symmetry(10 * v), h, tol=1e-12, measure=measure, measure_name="B_raw")
    assert report.is_symmetry and report.measure_ratio > 1.5
    with pytest.raises(ValueError, match=r"needs params\['last'\]"):
        sm.row_shift_symmetry(v, name="last")({"weight": W})
    with pytest.raises(ValueError, match="v must be a 1-D"):
        sm.row_shift_symmetry(torch.zeros(2, 2))
    with pytest.raises(TypeError, match="name must be"):
        sm.row_shift_symmetry(v, name="")


def test_max_probability_gap_checks_the_function():
    W, h, v = make(CASES[1])
    assert sm.max_probability_gap(W, sm.common_row_shift(W, v), h, tol=1e-12) <= 1e-12
    with pytest.raises(ValueError, match="not the same predictor"):
        sm.max_probability_gap(W, 2 * W, h, tol=1e-6)
    with pytest.raises(ValueError, match="tol must be > 0"):
        sm.max_probability_gap(W, W, h, tol=0.0)
    with pytest.raises(ValueError, match="same shape"):
        sm.max_probability_gap(W, W[:2], h, tol=1e-3)


def test_errors_are_named():
    W, h, v = make(CASES[1])
    with pytest.raises(ValueError, match=r"W must be 2-D"):
        flatness.b_raw(W[0], h)
    with pytest.raises(ValueError, match="K >= 2"):
        flatness.kappa_exact(W[:1], h)
    with pytest.raises(TypeError, match="W must be a torch.Tensor"):
        sm.centre(np.ones((3, 2)))
    with pytest.raises(ValueError, match=r"h must have shape \(4,\) or \(n, 4\)"):
        flatness.b_quot(W, h[:, :3])
    with pytest.raises(ValueError, match=r"h must have shape"):
        flatness.b_quot(W, h[None])
    with pytest.raises(ValueError, match="h must hold at least one example"):
        flatness.b_quot(W, h[:0])
    with pytest.raises(ValueError, match="h must contain only finite"):
        flatness.kappa_exact(W, torch.full((4,), float("nan")))
    with pytest.raises(ValueError, match="W must contain only finite"):
        flatness.b_raw(torch.full((3, 4), float("inf")), h)
    with pytest.raises(ValueError, match="logits W h must be finite"):
        flatness.b_raw(torch.full((3, 4), 1e300), torch.full((4,), 1e300))
    with pytest.raises(ValueError, match="reduction must be one of"):
        flatness.b_raw(W, h, reduction="sum")
    with pytest.raises(ValueError, match=r"v must have shape \(4,\)"):
        sm.common_row_shift(W, v[:2])
    with pytest.raises(ValueError, match=r"r must be a class index in 0..2"):
        sm.reference_class(W, 3)
    with pytest.raises(ValueError, match=r"r must be a class index"):
        sm.reference_class(W, -1)
    with pytest.raises(TypeError, match="r must be an int"):
        sm.reference_class(W, 1.0)
    with pytest.raises(ValueError, match=r"p must have shape \(K,\) or \(n, K\) with K >= 2"):
        sm.covariance(torch.ones(1))
    with pytest.raises(ValueError, match="W must be nonzero"):
        sm.mean_row_share(torch.zeros(3, 2))
    with pytest.raises(ValueError, match="centred part is zero"):
        flatness.reference_ratio(torch.ones(3, 2), 0)


def test_float32_inputs_are_promoted_to_float64():
    W, h, _ = make(CASES[1])
    out = flatness.b_raw(W.float(), h.float())
    assert out.dtype == torch.float64


def test_init_classifier_and_features():
    params = sm.init_classifier([5, 4, 3], seed=1, init_scale=2.0)
    assert set(params) == {"hidden.0.weight", "hidden.0.bias", "weight"}
    assert params["weight"].shape == (3, 4) and params["weight"].abs().max() <= 2.0 / 4**0.5
    again = sm.init_classifier([5, 4, 3], seed=1, init_scale=2.0)
    assert all(torch.equal(params[k], again[k]) for k in params)
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    h = sm.classifier_features(params, x)
    assert_close(h, torch.relu(x @ params["hidden.0.weight"].T + params["hidden.0.bias"]), rtol=1e-15)
    assert_close(sm.classifier_logits(params, x), h @ params["weight"].T, rtol=1e-15)
    linear = sm.init_classifier([5, 3], seed=0)
    assert set(linear) == {"weight"} and torch.equal(sm.classifier_features(linear, x), x)
    with pytest.raises(ValueError, match="sizes must list"):
        sm.init_classifier([5, 1])
    with pytest.raises(ValueError, match="init_scale must be > 0"):
        sm.init_classifier([5, 3], init_scale=0.0)
    with pytest.raises(ValueError, match="features of width 5 but W expects 4"):
        sm.classifier_features({"weight": torch.zeros(3, 4)}, x)
    with pytest.raises(ValueError, match="params must hold the classifier"):
        sm.classifier_features({}, x)


def test_sgd_keeps_the_mean_row_and_weight_decay_shrinks_it():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(20, 4, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (20,), generator=gen)
    params = sm.init_classifier([4, 3], seed=0)
    trained, hist = sm.train_classifier(params, x, y, steps=30, lr=0.1, record_every=10,
                                        record=lambda s, q: (s, float(sm.mean_row_share(q["weight"]))))
    assert [s for s, _ in hist] == [0, 10, 20, 30]
    assert_close(sm.mean_row(trained["weight"]), sm.mean_row(params["weight"]), rtol=1e-12, atol=1e-14)
    decayed, _ = sm.train_classifier(params, x, y, steps=30, lr=0.1, weight_decay=0.1)
    assert sm.mean_row(decayed["weight"]).norm() < 0.5 * sm.mean_row(params["weight"]).norm()
    adam, _ = sm.train_classifier(params, x, y, steps=30, lr=0.01, optimizer="adam")
    assert (sm.mean_row(adam["weight"]) - sm.mean_row(params["weight"])).norm() > 1e-4
    loss = lambda q: torch.nn.functional.cross_entropy(sm.classifier_logits(q, x), y)
    assert loss(trained) < loss(params)
    with pytest.raises(ValueError, match="optimizer must be"):
        sm.train_classifier(params, x, y, steps=1, lr=0.1, optimizer="lbfgs")
    with pytest.raises(ValueError, match="lr must be > 0"):
        sm.train_classifier(params, x, y, steps=1, lr=0.0)
    with pytest.raises(ValueError, match="weight_decay must be >= 0"):
        sm.train_classifier(params, x, y, steps=1, lr=0.1, weight_decay=-1.0)
    with pytest.raises(ValueError, match="steps must be >= 0"):
        sm.train_classifier(params, x, y, steps=-1, lr=0.1)


def test_shift_for_norm_factor_reaches_the_factor_and_keeps_probabilities():
    import lossgeom.softmax as sm_

    gen = torch.Generator().manual_seed(5)
    W = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    h = torch.randn(6, 3, generator=gen, dtype=torch.float64)
    for factor in (1.0, 10.0, 100.0):
        v = sm_.shift_for_norm_factor(W, sm_.mean_row(W), factor)
        shifted = sm_.common_row_shift(W, v)
        assert torch.allclose((shifted**2).sum(), factor * (W**2).sum(), rtol=1e-12)
        assert sm_.max_probability_gap(W, shifted, h, tol=1e-12) <= 1e-12
    Wc = sm_.centre(W)
    v = sm_.shift_for_norm_factor(Wc, torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64), 10.0)
    assert torch.allclose(flatness.b_raw(sm_.common_row_shift(Wc, v), h), 10 * flatness.b_quot(W, h), rtol=1e-12)
    with pytest.raises(ValueError, match="factor must be >= 1"):
        sm_.shift_for_norm_factor(W, sm_.mean_row(W), 0.5)
    with pytest.raises(ValueError, match="direction must be a nonzero vector"):
        sm_.shift_for_norm_factor(W, torch.zeros(3, dtype=torch.float64), 2.0)


def test_kappa_exact_by_trace_is_the_variance_form(case):
    W, h, v = case
    assert_close(flatness.kappa_exact_by_trace(W, h, reduction="none"), flatness.kappa_exact(W, h, reduction="none"),
                 rtol=1e-11, atol=1e-14)
    assert_close(flatness.kappa_exact_by_trace(W, h[0]), flatness.kappa_exact(W, h[0]), rtol=1e-11, atol=1e-14)
    # the dense trace on the shifted classifier: same value (P 1 = 0), computed with no centring
    assert_close(flatness.kappa_exact_by_trace(sm.common_row_shift(W, v), h), flatness.kappa_exact(W, h), rtol=1e-9)


def test_raw_quotient_ratio_is_braw_over_bquot_for_every_feature(case):
    W, h, _ = case
    ratio = flatness.raw_quotient_ratio(W)
    assert_close(flatness.b_raw(W, h, reduction="none") / flatness.b_quot(W, h, reduction="none"),
                 ratio.expand(h.shape[0]), rtol=1e-12)
    assert_close(ratio, 1 / (1 - sm.mean_row_share(W)), rtol=1e-12)
    assert_close(flatness.raw_quotient_ratio(sm.centre(W)), 1.0, rtol=1e-12)
    with pytest.raises(ValueError, match="centred part is zero"):
        flatness.raw_quotient_ratio(torch.ones(3, 2))


def test_initial_ratio_quantiles_match_gaussian_draws():
    K, d, n = 4, 3, 4000
    gen = torch.Generator().manual_seed(11)
    draws = np.array([float(flatness.raw_quotient_ratio(torch.randn(K, d, generator=gen, dtype=torch.float64)))
                      for _ in range(n)])
    probs = [0.1, 0.5, 0.9]
    law = flatness.initial_ratio_quantiles(K, d, probs)
    # sampling error of a quantile from 4000 draws is about 2% of the spread here
    assert np.max(np.abs(np.quantile(draws, probs) - law)) <= 0.03 * (law[-1] - law[0])
    assert draws.mean() == pytest.approx(1 + d / ((K - 1) * d - 2), rel=0.03)
    assert stats.kstest(draws, lambda x: stats.f(d, (K - 1) * d).cdf((x - 1) * (K - 1))).pvalue > 1e-3
    wide = flatness.initial_ratio_quantiles(10, 4096, [0.5])
    assert wide[0] == pytest.approx(10 / 9, rel=1e-3)
    with pytest.raises(ValueError, match="K must be >= 2"):
        flatness.initial_ratio_quantiles(1, 3, [0.5])
    with pytest.raises(ValueError, match=r"quantiles must be probabilities in \(0, 1\)"):
        flatness.initial_ratio_quantiles(3, 3, [0.0, 0.5])
    with pytest.raises(TypeError, match="d must be an int"):
        flatness.initial_ratio_quantiles(3, 2.5, [0.5])


def test_reference_class_ratios_match_closed_form_and_average_two(case):
    W, h, _ = case
    ratios = flatness.reference_class_ratios(W, h)
    closed = torch.stack([flatness.reference_ratio(W, r) for r in range(W.shape[0])])
    assert_close(ratios, closed, rtol=1e-11)
    assert float(ratios.mean()) == pytest.approx(2.0, rel=1e-12)
    assert_close(flatness.reference_class_ratios(sm.common_row_shift(W, h[0]), h), ratios, rtol=1e-10)


def test_pair_distance_ratio_gives_the_quotient_looseness(case):
    W, h, _ = case
    K = W.shape[0]
    per_example = flatness.b_quot(W, h, reduction="none") / flatness.kappa_exact(W, h, reduction="none")
    assert_close((K - 1) * flatness.pair_distance_ratio(W, h), per_example, rtol=1e-10)
    assert_close(flatness.quotient_looseness(W, h[0]), per_example[0], rtol=1e-12)
    assert_close(flatness.quotient_looseness(W, h), flatness.b_quot(W, h) / flatness.kappa_exact(W, h), rtol=1e-12)


def test_looseness_is_exactly_K_minus_1_at_uniform_probabilities():
    gen = torch.Generator().manual_seed(4)
    for K in (2, 3, 7):
        W = torch.zeros(K, 3, dtype=torch.float64)
        W[:, :2] = torch.randn(K, 2, generator=gen, dtype=torch.float64)  # rows in the plane e1, e2
        h = torch.tensor([0.0, 0.0, 2.5], dtype=torch.float64)  # orthogonal to every row: p uniform
        assert_close(sm.probabilities(W, h), torch.full((K,), 1 / K), rtol=1e-15)
        assert_close(flatness.pair_distance_ratio(W, h), 1.0, rtol=1e-13)
        assert_close(flatness.quotient_looseness(W, h), K - 1.0, rtol=1e-13)


def test_pair_distance_ratio_and_looseness_errors():
    with pytest.raises(ValueError, match="at least two different rows"):
        flatness.pair_distance_ratio(torch.ones(3, 2, dtype=torch.float64), torch.ones(2, dtype=torch.float64))
    W = torch.tensor([[1000.0], [0.0], [0.0]], dtype=torch.float64)
    with pytest.raises(ValueError, match="all its mass on one class"):
        flatness.pair_distance_ratio(W, torch.ones(1, dtype=torch.float64))
    with pytest.raises(ValueError, match="kappa_exact must be > 0"):
        flatness.quotient_looseness(torch.eye(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64))


def test_invariance_gaps_vanish_for_invariant_proxies_only(case):
    W, h, v = case
    shifted = sm.common_row_shift(W, 3 * v)
    for proxy in (flatness.kappa_exact, flatness.b_quot):
        value_gap, gradient_gap = flatness.invariance_gaps(proxy, W, shifted, h)
        assert value_gap <= 1e-9 and gradient_gap <= 1e-8
    value_gap, gradient_gap = flatness.invariance_gaps(flatness.b_raw, W, shifted, h)
    expected = float((shifted**2).sum() / (W**2).sum()) - 1  # B_raw scales with ||W||_F^2
    assert value_gap == pytest.approx(abs(expected), rel=1e-9) and gradient_gap > 1e-3
    with pytest.raises(ValueError, match="not the same predictor"):
        flatness.invariance_gaps(flatness.b_quot, W, 2 * W, h)
    with pytest.raises(TypeError, match="proxy must be a function"):
        flatness.invariance_gaps("b_quot", W, shifted, h)

"""Flatness measures: kappa_exact, B_raw, B_quot and their ratios against references and closed forms."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from cases import CLASSIFIER_CASES as CASES
from cases import ids
from cases import make_classifier as make
from conftest import assert_close
from lossgeom import flatness
from lossgeom import softmax as sm


@pytest.fixture(params=CASES, ids=ids(CASES))
def case(request):
    return make(request.param)


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


def test_float32_inputs_are_promoted_to_float64():
    W, h, _ = make(CASES[1])
    out = flatness.b_raw(W.float(), h.float())
    assert out.dtype == torch.float64


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

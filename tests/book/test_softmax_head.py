"""The book's measurements of the softmax proxies: orbit minimum, ratios, looseness, invariance gaps."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from lossgeom import flatness
from lossgeom.flatness import softmax_gauge as sm
from lossgeom_book import softmax_head as sh

from cases import CLASSIFIER_CASES as CASES
from cases import ids
from cases import make_classifier as make
from conftest import assert_close


@pytest.fixture(params=CASES, ids=ids(CASES))
def case(request):
    return make(request.param)


def test_bquot_is_the_numerical_orbit_minimum_of_braw(case):
    W, h, _ = case
    # tighter than this BFGS can end in precision loss on some kernels
    minimum, shift = sh.orbit_minimum(W, h, gtol=1e-10)
    assert minimum == pytest.approx(float(flatness.b_quot(W, h)), rel=1e-8)
    assert_close(shift, -sm.mean_row(W), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="gtol must be > 0"):
        sh.orbit_minimum(W, h, gtol=0.0)


def test_kappa_exact_by_trace_is_the_variance_form(case):
    W, h, v = case
    assert_close(
        sh.kappa_exact_by_trace(W, h, reduction="none"),
        flatness.kappa_exact(W, h, reduction="none"),
        rtol=1e-11,
        atol=1e-14,
    )
    assert_close(sh.kappa_exact_by_trace(W, h[0]), flatness.kappa_exact(W, h[0]), rtol=1e-11, atol=1e-14)
    # the dense trace on the shifted classifier: same value (P 1 = 0), computed with no centring
    assert_close(sh.kappa_exact_by_trace(sm.common_row_shift(W, v), h), flatness.kappa_exact(W, h), rtol=1e-9)


def test_raw_quotient_ratio_is_braw_over_bquot_for_every_feature(case):
    W, h, _ = case
    ratio = sh.raw_quotient_ratio(W)
    assert_close(
        flatness.b_raw(W, h, reduction="none") / flatness.b_quot(W, h, reduction="none"),
        ratio.expand(h.shape[0]),
        rtol=1e-12,
    )
    assert_close(ratio, 1 / (1 - sm.mean_row_share(W)), rtol=1e-12)
    assert_close(sh.raw_quotient_ratio(sm.centre(W)), 1.0, rtol=1e-12)
    with pytest.raises(ValueError, match="centred part is zero"):
        sh.raw_quotient_ratio(torch.ones(3, 2))


def test_initial_ratio_quantiles_match_gaussian_draws():
    K, d, n = 4, 3, 4000
    gen = torch.Generator().manual_seed(11)
    draws = np.array(
        [float(sh.raw_quotient_ratio(torch.randn(K, d, generator=gen, dtype=torch.float64))) for _ in range(n)]
    )
    probs = [0.1, 0.5, 0.9]
    law = sh.initial_ratio_quantiles(K, d, probs)
    # sampling error of a quantile from 4000 draws is about 2% of the spread here
    assert np.max(np.abs(np.quantile(draws, probs) - law)) <= 0.03 * (law[-1] - law[0])
    assert draws.mean() == pytest.approx(1 + d / ((K - 1) * d - 2), rel=0.03)
    assert stats.kstest(draws, lambda x: stats.f(d, (K - 1) * d).cdf((x - 1) * (K - 1))).pvalue > 1e-3
    wide = sh.initial_ratio_quantiles(10, 4096, [0.5])
    assert wide[0] == pytest.approx(10 / 9, rel=1e-3)
    with pytest.raises(ValueError, match="K must be >= 2"):
        sh.initial_ratio_quantiles(1, 3, [0.5])
    with pytest.raises(ValueError, match=r"quantiles must be probabilities in \(0, 1\)"):
        sh.initial_ratio_quantiles(3, 3, [0.0, 0.5])
    with pytest.raises(TypeError, match="d must be an int"):
        sh.initial_ratio_quantiles(3, 2.5, [0.5])


def test_reference_class_ratios_match_closed_form_and_average_two(case):
    W, h, _ = case
    ratios = sh.reference_class_ratios(W, h)
    closed = torch.stack([sh.reference_ratio(W, r) for r in range(W.shape[0])])
    assert_close(ratios, closed, rtol=1e-11)
    assert float(ratios.mean()) == pytest.approx(2.0, rel=1e-12)
    assert_close(sh.reference_class_ratios(sm.common_row_shift(W, h[0]), h), ratios, rtol=1e-10)


def test_pair_distance_ratio_gives_the_quotient_looseness(case):
    W, h, _ = case
    K = W.shape[0]
    per_example = flatness.b_quot(W, h, reduction="none") / flatness.kappa_exact(W, h, reduction="none")
    assert_close((K - 1) * sh.pair_distance_ratio(W, h), per_example, rtol=1e-10)
    assert_close(sh.quotient_looseness(W, h[0]), per_example[0], rtol=1e-12)
    assert_close(sh.quotient_looseness(W, h), flatness.b_quot(W, h) / flatness.kappa_exact(W, h), rtol=1e-12)


def test_looseness_is_exactly_K_minus_1_at_uniform_probabilities():
    gen = torch.Generator().manual_seed(4)
    for K in (2, 3, 7):
        W = torch.zeros(K, 3, dtype=torch.float64)
        W[:, :2] = torch.randn(K, 2, generator=gen, dtype=torch.float64)  # rows in the plane e1, e2
        h = torch.tensor([0.0, 0.0, 2.5], dtype=torch.float64)  # orthogonal to every row: p uniform
        assert_close(sm.probabilities(W, h), torch.full((K,), 1 / K), rtol=1e-15)
        assert_close(sh.pair_distance_ratio(W, h), 1.0, rtol=1e-13)
        assert_close(sh.quotient_looseness(W, h), K - 1.0, rtol=1e-13)


def test_pair_distance_ratio_and_looseness_errors():
    with pytest.raises(ValueError, match="at least two different rows"):
        sh.pair_distance_ratio(torch.ones(3, 2, dtype=torch.float64), torch.ones(2, dtype=torch.float64))
    W = torch.tensor([[1000.0], [0.0], [0.0]], dtype=torch.float64)
    with pytest.raises(ValueError, match="all its mass on one class"):
        sh.pair_distance_ratio(W, torch.ones(1, dtype=torch.float64))
    with pytest.raises(ValueError, match="kappa_exact must be > 0"):
        sh.quotient_looseness(torch.eye(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64))


def test_invariance_gaps_vanish_for_invariant_proxies_only(case):
    W, h, v = case
    shifted = sm.common_row_shift(W, 3 * v)
    for proxy in (flatness.kappa_exact, flatness.b_quot):
        value_gap, gradient_gap = sh.invariance_gaps(proxy, W, shifted, h)
        assert value_gap <= 1e-9 and gradient_gap <= 1e-8
    value_gap, gradient_gap = sh.invariance_gaps(flatness.b_raw, W, shifted, h)
    expected = float((shifted**2).sum() / (W**2).sum()) - 1  # B_raw scales with ||W||_F^2
    assert value_gap == pytest.approx(abs(expected), rel=1e-9) and gradient_gap > 1e-3
    with pytest.raises(ValueError, match="not the same predictor"):
        sh.invariance_gaps(flatness.b_quot, W, 2 * W, h)
    with pytest.raises(TypeError, match="proxy must be a function"):
        sh.invariance_gaps("b_quot", W, shifted, h)


def test_reference_ratio_is_the_closed_form_and_refuses_a_pure_common_row_matrix(case):
    W, h, _ = case
    K, Wc = W.shape[0], sm.centre(W)
    for r in range(K):
        assert_close(sh.reference_ratio(W, r), 1 + K * (Wc[r] ** 2).sum() / (Wc**2).sum(), rtol=1e-11)
    assert np.mean([float(sh.reference_ratio(W, r)) for r in range(K)]) == pytest.approx(2.0, rel=1e-10)
    with pytest.raises(ValueError, match="centred part is zero"):
        sh.reference_ratio(torch.ones(3, 2), 0)

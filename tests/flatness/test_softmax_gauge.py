"""The softmax gauge: the covariance P(p), centring, shifts and the symmetry."""

import numpy as np
import pytest
import torch

from lossgeom import flatness
from lossgeom.curvature import closure_hessian
from lossgeom.flatness import softmax_gauge as sm
from lossgeom.symmetries import audit_symmetry
from lossgeom.symmetries.layers import reference_class

from cases import CLASSIFIER_CASES as CASES
from cases import ids
from cases import make_classifier as make
from conftest import assert_close


@pytest.fixture(params=CASES, ids=ids(CASES))
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
    hess = closure_hessian(loss, {"W": W})
    expected = torch.kron(sm.covariance(sm.probabilities(W, x)), torch.outer(x, x))
    assert_close(hess, expected, rtol=1e-12, atol=1e-14)


def test_centre_is_unique_minimum_norm_representative(case):
    W, _, v = case
    Wc = sm.centre(W)
    assert_close(Wc.sum(0), torch.zeros(W.shape[1]), atol=1e-13)
    assert_close((W**2).sum(), (Wc**2).sum() + W.shape[0] * (sm.mean_row(W) ** 2).sum(), rtol=1e-13)
    assert_close(sm.centre(sm.common_row_shift(W, v)), Wc, rtol=1e-13, atol=1e-13)
    for t in (1e-3, 1.0):
        assert (sm.common_row_shift(Wc, t * v) ** 2).sum() > (Wc**2).sum()
    share = sm.mean_row_share(W)
    ones = torch.ones(W.shape[1])
    assert_close(flatness.b_raw(W, ones) / flatness.b_quot(W, ones), 1 / (1 - share), rtol=1e-12)


def test_reference_class_rows_and_mean_ratio_two(case):
    W, h, _ = case
    K = W.shape[0]
    ratios = []
    for r in range(K):
        Wr = reference_class(W, r)
        assert torch.all(Wr[r] == 0)
        assert_close(sm.probabilities(Wr, h), sm.probabilities(W, h), atol=1e-12, rtol=0)
        ratio = flatness.b_raw(Wr, h) / flatness.b_quot(W, h)
        Wc = sm.centre(W)
        assert_close(ratio, 1 + K * (Wc[r] ** 2).sum() / (Wc**2).sum(), rtol=1e-11)
        ratios.append(float(ratio))
    assert np.mean(ratios) == pytest.approx(2.0, rel=1e-12)


def test_row_shift_symmetry_passes_the_audit_and_moves_braw():
    W, h, v = make(CASES[2])
    forward = lambda params, x: x @ params["weight"].T
    measure = lambda params: float(flatness.b_raw(params["weight"], h))
    report = audit_symmetry(
        lambda p, x: torch.softmax(forward(p, x), -1),
        {"weight": W},
        sm.row_shift_symmetry(10 * v),
        h,
        tol=1e-12,
        measure=measure,
        measure_name="B_raw",
    )
    assert report.is_symmetry and report.measure_ratio > 1.5
    with pytest.raises(ValueError, match=r"needs params \['last'\]"):
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
        reference_class(W, 3)
    with pytest.raises(ValueError, match=r"r must be a class index"):
        reference_class(W, -1)
    with pytest.raises(TypeError, match="r must be an int"):
        reference_class(W, 1.0)
    with pytest.raises(ValueError, match=r"p must have shape \(K,\) or \(n, K\) with K >= 2"):
        sm.covariance(torch.ones(1))
    with pytest.raises(ValueError, match="W must be nonzero"):
        sm.mean_row_share(torch.zeros(3, 2))


def test_shift_for_norm_factor_reaches_the_factor_and_keeps_probabilities():
    gen = torch.Generator().manual_seed(5)
    W = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    h = torch.randn(6, 3, generator=gen, dtype=torch.float64)
    for factor in (1.0, 10.0, 100.0):
        v = sm.shift_for_norm_factor(W, sm.mean_row(W), factor)
        shifted = sm.common_row_shift(W, v)
        assert torch.allclose((shifted**2).sum(), factor * (W**2).sum(), rtol=1e-12)
        assert sm.max_probability_gap(W, shifted, h, tol=1e-12) <= 1e-12
    Wc = sm.centre(W)
    v = sm.shift_for_norm_factor(Wc, torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64), 10.0)
    assert torch.allclose(flatness.b_raw(sm.common_row_shift(Wc, v), h), 10 * flatness.b_quot(W, h), rtol=1e-12)
    with pytest.raises(ValueError, match="factor must be >= 1"):
        sm.shift_for_norm_factor(W, sm.mean_row(W), 0.5)
    with pytest.raises(ValueError, match="direction must be a nonzero vector"):
        sm.shift_for_norm_factor(W, torch.zeros(3, dtype=torch.float64), 2.0)

"""Trace estimators: Hutchinson and Hutch++ estimates, probe streams, calibrated errors, block products.

The calibration test is the regression test of issue 9's finding that Hutch++'s reported
standard error was too small (z-scores against the exact trace with SD 1.7): with
``m = n_probes / 3`` values the sample standard deviation makes ``error / SE`` a Student t
with ``m - 1`` degrees of freedom. The test recomputes that old standard error from the
same probes to show the check can fail.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from lossgeom import curvature as cv
from lossgeom.curvature import base as curvature_base
from lossgeom.curvature.traces import SignBlock

from conftest import assert_close


def _legacy_hutchpp(a: np.ndarray, budget: int, seed: int) -> tuple[float, float]:
    """Hutch++ as the package computed it before: estimate and sample-SD standard error."""
    n, m = a.shape[0], budget // 3
    rng = np.random.default_rng(seed)
    s = rng.choice(np.array([-1.0, 1.0]), size=(n, m))
    g = rng.choice(np.array([-1.0, 1.0]), size=(n, m))
    q, _ = np.linalg.qr(a @ s)
    g_perp = g - q @ (q.T @ g)
    samples = np.einsum("ij,ij->j", g_perp, a @ g_perp)
    return float(np.trace(q.T @ a @ q) + samples.mean()), float(samples.std(ddof=1) / np.sqrt(m))


def _mlp_hessian(seed: int = 0) -> np.ndarray:
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(8, 10), nn.Tanh(), nn.Linear(10, 8), nn.Tanh(), nn.Linear(8, 4)).double()
    x = torch.randn(64, 8, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 4, (64,), generator=generator)
    return cv.dense_hessian(model, nn.CrossEntropyLoss(), (x, y)).numpy()


def test_sign_blocks_draw_the_row_major_stream():
    reference = np.random.default_rng(3).choice(np.array([-1.0, 1.0]), size=(70_001, 3))
    block = SignBlock(np.random.default_rng(3), 70_001, 3)  # drawn in row chunks
    assert block.signs.dtype == torch.int8
    assert np.array_equal(block.columns(0, 3, torch.float64, "cpu").numpy(), reference)
    assert np.array_equal(block.columns(1, 2, torch.float32, "cpu").numpy()[:, 0], reference[:, 1])


@pytest.mark.parametrize("budget", [12, 60])
def test_hutchpp_estimate_is_the_one_computed_before(budget):
    a = _mlp_hessian()
    for seed in range(3):
        estimate, _ = _legacy_hutchpp(a, budget, seed)
        result = cv.hutchpp_trace(a, n_probes=budget, seed=seed)
        assert_close(result.estimate, estimate, rtol=1e-12, atol=1e-12 * np.abs(a).sum())
        assert result.n_hvp == 3 * (budget // 3) and result.n_probes == 2 * (budget // 3)


def test_hutchpp_standard_error_is_calibrated_where_the_sample_sd_is_not():
    a = _mlp_hessian()
    exact = float(np.trace(a))
    seeds = range(300)
    z_new, z_old = [], []
    for seed in seeds:
        result = cv.hutchpp_trace(a, n_probes=12, seed=seed)  # m = 4 values in the Hutchinson part
        z_new.append((result.estimate - exact) / result.std_error)
        _, old_se = _legacy_hutchpp(a, 12, seed)
        z_old.append((result.estimate - exact) / old_se)
    sd_new, sd_old = float(np.std(z_new)), float(np.std(z_old))
    assert 0.85 <= sd_new <= 1.15, sd_new
    assert sd_old >= 1.4, sd_old  # Student t with 3 degrees of freedom: SD sqrt(3) = 1.73
    assert abs(float(np.mean(z_new))) <= 0.2


def test_hutchpp_beats_hutchinson_where_the_spectrum_decays():
    rng = np.random.default_rng(8)
    q, _ = np.linalg.qr(rng.standard_normal((300, 300)))
    a = q @ np.diag(1.0 / np.arange(1, 301) ** 2) @ q.T
    exact = float(np.trace(a))
    errors_pp = [cv.hutchpp_trace(a, n_probes=60, seed=s).estimate - exact for s in range(40)]
    errors_h = [cv.hutchinson_trace(a, n_probes=60, seed=s).estimate - exact for s in range(40)]
    assert np.sqrt(np.mean(np.square(errors_pp))) <= 0.1 * np.sqrt(np.mean(np.square(errors_h)))


def test_trace_estimators_on_a_float32_operator_in_blocks(monkeypatch):
    monkeypatch.setattr(curvature_base, "MAX_BLOCK_COLUMNS", 4)  # several blocks per call
    generator = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3)).float()
    x, y = torch.randn(40, 6, generator=generator, dtype=torch.float32), torch.randint(0, 3, (40,), generator=generator)
    op = cv.hessian_operator(model, nn.CrossEntropyLoss(), (x, y))
    assert op.block_columns == 4
    exact = float(np.trace(op.dense()))
    op.reset_count()
    hpp = cv.hutchpp_trace(op, n_probes=30, seed=1)
    assert op.n_hvp == 30 and hpp.n_hvp == 30
    assert abs(hpp.estimate - exact) <= 4 * hpp.std_error + 1e-5 * abs(exact)
    hutch = cv.hutchinson_trace(op, n_probes=10, seed=1)
    reference = cv.hutchinson_trace(op.dense(), n_probes=10, seed=1)  # the same probes on the dense matrix
    assert_close(hutch.estimate, reference.estimate, rtol=1e-5, atol=1e-6)


def test_hutchinson_unbiased_within_se_and_target_stop():
    rng = np.random.default_rng(5)
    q, _ = np.linalg.qr(rng.standard_normal((60, 60)))
    a = q @ np.diag(rng.uniform(-1, 3, 60)) @ q.T
    exact = np.trace(a)
    est = cv.hutchinson_trace(a, n_probes=200, seed=1)
    assert est.n_hvp == 200 and est.n_probes == 200
    assert abs(est.estimate - exact) <= 4 * est.std_error
    stopped = cv.hutchinson_trace(a, n_probes=10, seed=2, target_rel_se=0.02, max_probes=5000)
    assert stopped.std_error <= 0.02 * abs(stopped.estimate)
    assert stopped.n_hvp == stopped.n_probes and abs(stopped.estimate - exact) <= 4 * stopped.std_error
    # Rademacher probes are exact for a diagonal matrix
    assert_close(cv.hutchinson_trace(np.diag(np.arange(5.0)), n_probes=3).estimate, 10.0, rtol=1e-14)


def test_hutchpp_on_low_rank_is_near_exact_and_counts():
    rng = np.random.default_rng(6)
    u = rng.standard_normal((80, 5))
    a = u @ u.T
    est = cv.hutchpp_trace(a, n_probes=30, seed=0)
    assert est.n_hvp == 30
    assert_close(est.estimate, np.trace(a), rtol=1e-10, atol=0)


def test_hutchinson_on_hessian_operator(digits_case):
    _, model, params, x, y, loss_fn, criterion = digits_case
    exact = float(np.trace(cv.closure_hessian(loss_fn, params).numpy()))
    est = cv.hutchinson_trace(cv.HessianOperator.from_closure(loss_fn, params), n_probes=100, seed=0)
    assert abs(est.estimate - exact) <= 4 * est.std_error
    module = cv.hutchinson_trace(cv.hessian_operator(model, criterion, (x, y)), n_probes=100, seed=0)
    assert_close(module.estimate, est.estimate, rtol=1e-10, atol=0)

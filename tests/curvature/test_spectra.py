"""Tests of lossgeom.curvature.spectra: Lanczos eigenpairs, power iteration, densities, summaries."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lossgeom import curvature as cv

from conftest import assert_close
from curvature_cases import DIGITS_CASES, digits_setup


def test_top_eigenpairs_match_dense(digits_case):
    _, model, params, x, y, loss_fn, _ = digits_case
    dense = np.linalg.eigvalsh(cv.closure_hessian(loss_fn, params).numpy())
    op = cv.HessianOperator.from_closure(loss_fn, params)
    top = cv.top_eigenpairs(op, k=3, which="largest", tol=1e-12, stop="residual")
    assert_close(top.values, dense[::-1][:3], rtol=1e-9, atol=0)
    assert np.all(np.diff(top.values) <= 0)
    low = cv.top_eigenpairs(op, k=2, which="smallest", tol=1e-12)
    assert_close(low.values, dense[:2], rtol=1e-8, atol=1e-12 * dense[-1])
    assert np.all(np.diff(low.values) >= 0)
    assert np.all(top.residuals <= 1e-8 * dense[-1])
    assert top.n_hvp > 0 and op.n_hvp == top.n_hvp + low.n_hvp + 5  # 5 residual products
    assert_close(top.vectors.T @ top.vectors, np.eye(3), rtol=0, atol=1e-10)


def test_top_eigenpairs_is_deterministic_and_accepts_arrays():
    a = np.diag(np.arange(1.0, 21.0))
    r1 = cv.top_eigenpairs(a, k=2, seed=4)
    r2 = cv.top_eigenpairs(torch.from_numpy(a), k=2, seed=4)
    assert_close(r1.values, [20.0, 19.0], rtol=1e-12, atol=0)
    assert r1.n_hvp == r2.n_hvp and np.array_equal(r1.values, r2.values)


def test_lanczos_beats_power_iteration_on_a_clustered_spectrum():
    ev = np.concatenate([[1.0, 0.97], np.linspace(0.0, 0.9, 198)])
    a = np.diag(ev)
    lanczos = cv.top_eigenpairs(a, k=1, tol=1e-8)
    power = cv.spectra.power_iteration(a, tol=1e-6, reference=1.0)
    assert abs(lanczos.values[0] - 1.0) <= 1e-6 and abs(power.values[0] - 1.0) <= 1e-6
    assert 3 * lanczos.n_hvp <= power.n_hvp


def test_smaller_lanczos_basis_uses_fewer_products():
    a = np.diag(np.concatenate([[2.0], np.linspace(0.0, 1.0, 99)]))
    small = cv.top_eigenpairs(a, k=1, tol=1e-10, ncv=6, method="arpack")
    default = cv.top_eigenpairs(a, k=1, tol=1e-10, method="arpack")
    assert_close(small.values, [2.0], rtol=1e-10, atol=0)
    assert small.n_hvp < default.n_hvp


def test_power_iteration_relative_change_stop():
    result = cv.spectra.power_iteration(np.diag([3.0, 1.0, 0.5]), tol=1e-12)
    assert isinstance(result, cv.spectra.EigenResult) and result.method == "power" and result.converged
    assert abs(result.values[0] - 3.0) <= 1e-10 and result.n_hvp < 100
    assert result.vectors.shape == (3, 1) and abs(abs(result.vectors[0, 0]) - 1.0) <= 1e-6
    assert result.residuals[0] <= 1e-5 * 3.0  # ||A v - lambda v|| of the unit vector returned
    capped = cv.spectra.power_iteration(np.diag([1.0, 0.999, 0.5]), tol=1e-14, max_iter=5)
    assert not capped.converged and capped.n_hvp == 5


def test_slq_density_matches_dense_reference():
    rng = np.random.default_rng(7)
    ev = np.concatenate([rng.normal(0.0, 0.05, 150), [1.0, 2.0, 3.0]])
    q, _ = np.linalg.qr(rng.standard_normal((153, 153)))
    a = q @ np.diag(ev) @ q.T
    grid = np.linspace(-0.5, 3.5, 401)
    sd = cv.spectral_density(a, grid, n_probes=30, n_lanczos=60, sigma=0.05, seed=0)
    ref = cv.spectra.dense_spectral_density(ev, grid, 0.05)
    assert sd.n_hvp <= 30 * 60
    assert abs(np.trapezoid(sd.density, grid) - 1.0) <= 1e-6
    assert np.abs(sd.density - ref).max() <= 0.1 * ref.max()
    # first moment of each probe's quadrature is its Rayleigh quotient; averaged ~ tr(A)/n
    means = np.nansum(sd.nodes * sd.weights, axis=1)
    assert abs(means.mean() - ev.mean()) <= 4 * means.std(ddof=1) / np.sqrt(30)


def test_slq_full_lanczos_reproduces_spectrum_nodes():
    a = np.diag([1.0, 2.0, 4.0, 8.0])
    sd = cv.spectral_density(a, np.linspace(0, 9, 10), n_probes=1, n_lanczos=4, sigma=0.1)
    assert_close(np.sort(sd.nodes[0]), [1.0, 2.0, 4.0, 8.0], rtol=1e-10, atol=0)
    assert_close(sd.weights[0], np.full(4, 0.25), rtol=1e-10, atol=0)  # Rademacher: equal weights


def test_spectrum_summary():
    s = cv.spectrum_summary([-0.5, -1e-9, 0.0, 1e-3, 1.0, 10.0], rel_threshold=1e-6)
    assert s.largest == 10.0 and s.most_negative == -0.5 and s.n_negative == 1
    assert_close(s.trace, 10.501 - 1e-9, rtol=1e-14)
    assert s.condition_number == pytest.approx(1e4) and s.n_near_zero == 2
    assert cv.spectrum_summary([1.0, 2.0], rel_threshold=0.9).condition_number == 1.0


def test_errors_eigen_and_estimators():
    a = np.diag([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="k must be < n = 3.*eigh"):
        cv.top_eigenpairs(a, k=3)
    with pytest.raises(ValueError, match=">= 1"):
        cv.top_eigenpairs(a, k=0)
    with pytest.raises(ValueError, match="which must be"):
        cv.top_eigenpairs(a, which="LM")
    with pytest.raises(ValueError, match="square"):
        cv.top_eigenpairs(np.ones((3, 2)))
    with pytest.raises(ValueError, match="symmetric"):
        cv.top_eigenpairs(np.array([[1.0, 2.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 3.0]]))
    with pytest.raises(ValueError, match="ncv must satisfy"):
        cv.top_eigenpairs(np.diag(np.arange(1.0, 11.0)), k=2, ncv=2, method="arpack")
    with pytest.raises(ValueError, match="n_probes must be >= 2"):
        cv.hutchinson_trace(a, n_probes=1)
    with pytest.raises(ValueError, match="n_probes must be >= 6"):
        cv.hutchpp_trace(a, n_probes=5)
    with pytest.raises(ValueError, match="n_lanczos must be <= n"):
        cv.spectral_density(a, [0.0, 1.0], n_lanczos=4)
    with pytest.raises(ValueError, match="sigma must be > 0"):
        cv.spectral_density(a, [0.0, 1.0], n_lanczos=2, sigma=0.0)
    with pytest.raises(ValueError, match="tol must be > 0"):
        cv.spectra.power_iteration(a, tol=-1.0)
    with pytest.raises(ValueError, match="must not be empty"):
        cv.spectrum_summary([])
    with pytest.raises(ValueError, match="largest eigenvalue must be > 0"):
        cv.spectrum_summary([-1.0, -2.0])
    model, params, x, y, loss_fn, _ = digits_setup(DIGITS_CASES[0])
    with pytest.raises(ValueError, match="direction must have"):
        cv.references.closure_taylor_remainders(loss_fn, params, np.ones(3), [0.1])
    with pytest.raises(TypeError, match="not a matrix: build its curvature operator first"):
        cv.factory.as_operator(model)

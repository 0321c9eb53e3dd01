"""Tests of lossgeom.curvature.lanczos: Lanczos stopped by its eigenvalue error or residual bound (issues 21, 30)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from lossgeom import curvature as cv
from lossgeom.curvature.lanczos import MIN_EXTRA_STEPS, default_max_hvp, lanczos_eigenpairs, start_vector

from conftest import assert_close

pytestmark = pytest.mark.filterwarnings("ignore:.*torch.jit.script.*:DeprecationWarning")


def symmetric_with_spectrum(eigenvalues, seed: int = 0) -> np.ndarray:
    """``Q diag(eigenvalues) Q^T`` with a seeded random orthogonal ``Q``."""
    ev = np.asarray(eigenvalues, dtype=float)
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((len(ev), len(ev))))
    a = q @ np.diag(ev) @ q.T
    return (a + a.T) / 2


def indefinite(n: int = 200, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ev = np.concatenate(
        [[12.0, 11.0, 10.5, 9.0, 8.8], rng.uniform(-6.0, 6.0, n - 10), [-7.0, -8.0, -8.5, -10.0, -11.0]]
    )
    return symmetric_with_spectrum(ev, seed)


def _small_tanh_mlp():
    generator = torch.Generator().manual_seed(0)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 12), nn.Tanh(), nn.Linear(12, 3)).to(torch.float64)
    x = torch.randn(64, 5, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 3, (64,), generator=generator)
    return model, nn.CrossEntropyLoss(), x, y


def small_tanh_mlp_hessian():
    """The float64 Hessian of a 5 -> 12 -> 3 tanh MLP (111 parameters) on 64 seeded points."""
    model, loss, x, y = _small_tanh_mlp()
    return cv.hessian_operator(model, loss, (x, y))


@pytest.mark.parametrize("which", ["largest", "smallest"])
@pytest.mark.parametrize("k", [1, 5])
def test_matches_eigh_on_an_indefinite_matrix(which, k):
    a = indefinite()
    exact = np.linalg.eigh(a)[0]
    expected = exact[::-1][:k] if which == "largest" else exact[:k]
    result = cv.top_eigenpairs(a, k=k, which=which, tol=1e-10, stop="residual")
    assert result.method == "lanczos" and result.converged
    assert_close(result.values, expected, rtol=1e-10, atol=0)
    assert_close(result.vectors.T @ result.vectors, np.eye(k), rtol=0, atol=1e-10)
    assert np.all(result.residuals <= 1e-8 * np.abs(exact).max())
    assert 0 < result.n_hvp < 200  # fewer products than the dimension
    # the default stop asks for the eigenvalues only: as accurate, fewer products, vectors to about sqrt(tol)
    fast = cv.top_eigenpairs(a, k=k, which=which, tol=1e-10)
    assert fast.converged and fast.n_hvp < result.n_hvp
    assert_close(fast.values, expected, rtol=1e-10, atol=0)
    assert np.all(np.abs(fast.values - expected) <= fast.error_bounds + 1e-13)
    assert np.all(np.abs(np.sum(fast.vectors * result.vectors, axis=0)) >= 1 - 1e-8)


@pytest.mark.parametrize("tol", [1e-3, 1e-6, 1e-10])
@pytest.mark.parametrize("seed", [0, 4])
def test_the_eigenvalue_error_bound_is_honest(tol, seed):
    a = indefinite(seed=seed)
    exact = np.linalg.eigh(a)[0][::-1]
    result = cv.top_eigenpairs(a, k=5, tol=tol)
    floor = 1e-12 * np.abs(exact).max()
    assert result.converged and np.all(result.error_bounds <= tol * np.abs(result.values) + floor)
    assert np.all(np.abs(result.values - exact[:5]) <= result.error_bounds + floor)
    # where the Ritz gap is resolved the bound is the residual's square over the gap, below the residual
    assert np.all(result.error_bounds <= result.residual_bounds + floor)
    # and the residual bound it rests on is the true residual (one more product per pair), to rounding
    assert np.all(np.abs(result.residuals - result.residual_bounds) <= 0.01 * result.residual_bounds + floor)


def test_partial_reorthogonalisation_keeps_the_basis_semi_orthogonal_and_the_values():
    a = indefinite(n=400, seed=6)
    exact = np.linalg.eigh(a)[0][::-1]
    full = lanczos_eigenpairs(a, k=5, tol=1e-12, stop="residual", reorthogonalise="full")
    partial = lanczos_eigenpairs(a, k=5, tol=1e-12, stop="residual")
    assert full.full_passes == full.n_hvp and partial.full_passes < partial.n_hvp / 2
    assert partial.n_hvp <= full.n_hvp + 2  # no spurious copies of converged values to wait out
    assert_close(partial.values, exact[:5], rtol=1e-11, atol=0)
    assert_close(partial.vectors.T @ partial.vectors, np.eye(5), rtol=0, atol=1e-8)


def test_a_float32_operator_runs_in_float32():
    model, loss, x, y = _small_tanh_mlp()
    op64 = cv.hessian_operator(model, loss, (x, y))
    op32 = cv.hessian_operator(model.float(), loss, (x.float(), y))
    exact = np.linalg.eigh(op64.dense())[0][::-1]
    result = cv.top_eigenpairs(op32, k=2, tol=1e-4)
    assert result.converged and np.all(np.abs(result.values - exact[:2]) <= 1e-4 * np.abs(exact[:2]))


@pytest.mark.parametrize("tol", [1e-3, 1e-5, 1e-8])
def test_the_residual_bound_is_honest(tol):
    a = indefinite(seed=3)
    exact = np.linalg.eigh(a)[0][::-1]
    result = cv.top_eigenpairs(a, k=5, tol=tol, stop="residual")
    assert np.all(result.residual_bounds <= tol * np.abs(result.values))  # what the stop test promised
    # the stated bound is the true residual, to rounding: within a small factor either way
    floor = 1e-12 * np.abs(exact).max()
    assert np.all(result.residuals <= 1.01 * result.residual_bounds + floor)
    assert np.all(result.residuals >= 0.99 * result.residual_bounds - floor)
    # and it bounds the eigenvalue error (a symmetric matrix has an eigenvalue within r of theta)
    assert np.all(np.abs(result.values - exact[:5]) <= result.residual_bounds + floor)


def test_stops_at_the_first_step_that_meets_tol():
    a = indefinite(seed=1)
    for stop, bound in (("gap", "error_bounds"), ("residual", "residual_bounds")):
        result = lanczos_eigenpairs(a, k=1, tol=1e-6, stop=stop)
        assert result.converged and getattr(result, bound)[0] <= 1e-6 * abs(result.values[0])
        shorter = lanczos_eigenpairs(a, k=1, tol=1e-6, max_hvp=result.n_hvp - 1, stop=stop)
        assert not shorter.converged and shorter.n_hvp == result.n_hvp - 1
        assert getattr(shorter, bound)[0] > 1e-6 * abs(shorter.values[0])


def test_fewer_products_than_arpack_on_a_tanh_mlp_hessian():
    op = small_tanh_mlp_hessian()
    exact = np.linalg.eigh(op.dense())[0][::-1]
    for k in (1, 5):
        arpack = cv.top_eigenpairs(op, k=k, tol=1e-4, method="arpack")
        lanczos = cv.top_eigenpairs(op, k=k, tol=1e-4)
        assert lanczos.n_hvp < arpack.n_hvp, (k, lanczos.n_hvp, arpack.n_hvp)
        assert np.all(np.abs(lanczos.values - exact[:k]) <= 1e-4 * np.abs(exact[:k]))
        assert np.all(lanczos.residuals <= 1.01 * lanczos.residual_bounds + 1e-12)


def test_warm_start_from_exact_eigenvectors_is_exact_and_no_dearer_than_cold():
    a = indefinite(seed=2)
    cold = cv.top_eigenpairs(a, k=1, tol=1e-8, method="lanczos")
    exact_vectors = np.linalg.eigh(a)[1][:, ::-1]
    warm = cv.top_eigenpairs(a, k=1, tol=1e-8, method="lanczos", v0=exact_vectors[:, 0])
    # the start carries a random part of equal weight, which must be explored too (see test_warm_starts.py)
    assert 1 + MIN_EXTRA_STEPS <= warm.n_hvp < cold.n_hvp
    exact = np.linalg.eigh(a)[0][::-1]
    assert np.all(np.abs(np.r_[warm.values, cold.values] - exact[0]) <= 1e-8 * exact[0])  # the tolerance asked
    block = cv.top_eigenpairs(a, k=5, tol=1e-8, method="lanczos", v0=exact_vectors[:, :5])
    assert block.n_hvp < cv.top_eigenpairs(a, k=5, tol=1e-8, method="lanczos").n_hvp
    assert_close(block.values, exact[:5], rtol=1e-8, atol=0)
    # a warm start from the previous (approximate) vectors also saves products
    cold5 = cv.top_eigenpairs(a, k=5, tol=1e-6, method="lanczos")
    again = cv.top_eigenpairs(a + 1e-3 * indefinite(seed=9), k=5, tol=1e-6, method="lanczos", v0=cold5.vectors)
    assert again.n_hvp < cold5.n_hvp


def test_arpack_accepts_a_warm_start_too():
    a = indefinite(seed=2)
    exact_vectors = np.linalg.eigh(a)[1][:, ::-1]
    cold = cv.top_eigenpairs(a, k=2, tol=1e-8, method="arpack")
    warm = cv.top_eigenpairs(a, k=2, tol=1e-8, v0=exact_vectors[:, :2], method="arpack")
    assert warm.method == "arpack" and warm.n_hvp < cold.n_hvp
    assert_close(warm.values, cold.values, rtol=1e-10, atol=0)
    assert np.all(warm.residual_bounds == 1e-8 * np.abs(warm.values))


@pytest.mark.parametrize("which", ["largest", "smallest"])
def test_an_invariant_subspace_of_a_rank_two_matrix(which):
    q = np.linalg.qr(np.random.default_rng(5).standard_normal((60, 2)))[0]
    a = q @ np.diag([3.0, -1.0]) @ q.T
    expected = {"largest": [3.0, 0.0, 0.0, 0.0], "smallest": [-1.0, 0.0, 0.0, 0.0]}[which]
    for k in (1, 2, 4):
        result = cv.top_eigenpairs(a, k=k, which=which, tol=1e-8, method="lanczos")
        assert result.converged
        assert_close(result.values, expected[:k], rtol=0, atol=1e-12)  # the zero eigenvalue k-1 times
        assert result.n_hvp <= 3 + k + 1  # 3 for the three distinct eigenvalues, then one per copy of 0
        assert np.all(result.residuals <= 1e-12)


def test_a_diagonal_matrix_whose_krylov_space_is_everything():
    result = cv.top_eigenpairs(np.diag([1.0, 2.0, 4.0, 8.0]), k=3, tol=1e-12, method="lanczos")
    assert_close(result.values, [8.0, 4.0, 2.0], rtol=1e-12, atol=0)
    assert result.n_hvp <= 4


def test_start_vector_rules():
    v = start_vector(None, 7, seed=3)
    assert_close(
        v, np.random.default_rng(3).standard_normal(7) / np.linalg.norm(np.random.default_rng(3).standard_normal(7))
    )
    block = np.eye(7)[:, :3]
    assert_close(start_vector(block, 7, 0), block.sum(1) / np.sqrt(3))
    assert default_max_hvp(1, 10_000) == 300 and default_max_hvp(50, 10_000) == 500 and default_max_hvp(1, 40) == 40


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"method": "power"}, ValueError, "method"),
        ({"which": "biggest"}, ValueError, "which"),
        ({"k": 0}, ValueError, "k must"),
        ({"k": 1.5}, TypeError, "k must"),
        ({"k": 10}, ValueError, "k must be < n"),
        ({"tol": 0.0}, ValueError, "tol"),
        ({"tol": "small"}, TypeError, "tol"),
        ({"v0": np.ones(9)}, ValueError, "v0 must have shape"),
        ({"v0": np.ones((10, 0))}, ValueError, "v0 must have shape"),
        ({"v0": np.zeros(10)}, ValueError, "v0 must not be the zero vector"),
        ({"v0": np.c_[np.ones(10), -np.ones(10)]}, ValueError, "sum to zero"),
        ({"v0": np.full(10, np.nan)}, ValueError, "v0 must contain only finite"),
        ({"v0": "start"}, TypeError, "v0"),
        ({"max_hvp": 0}, ValueError, "max_hvp"),
        ({"max_hvp": 2.0}, TypeError, "max_hvp"),
        ({"max_hvp": 1, "k": 2}, ValueError, "max_hvp must be >= k"),
        ({"ncv": 5}, ValueError, "ncv applies to method='arpack'"),
        ({"seed": -1}, ValueError, "seed"),
        ({"seed": "zero"}, TypeError, "seed"),
        ({"stop": "eigenvalue"}, ValueError, "stop must be one of"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, error, match):
    kwargs = {"method": "lanczos", **kwargs}
    with pytest.raises(error, match=match):
        cv.top_eigenpairs(np.diag(np.arange(1.0, 11.0)), **kwargs)


def test_bad_arguments_of_the_arpack_path():
    a = np.diag(np.arange(1.0, 11.0))
    with pytest.raises(ValueError, match="max_hvp applies to method='lanczos'"):
        cv.top_eigenpairs(a, max_hvp=10, method="arpack")
    with pytest.raises(ValueError, match="stop applies to method='lanczos'"):
        cv.top_eigenpairs(a, stop="residual", method="arpack")
    with pytest.raises(ValueError, match="v0 must have shape"):
        cv.top_eigenpairs(a, v0=np.ones(3), method="arpack")
    with pytest.raises(TypeError, match="operator is a model"):
        cv.top_eigenpairs(nn.Linear(2, 2), method="lanczos")

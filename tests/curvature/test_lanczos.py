"""Tests of lossgeom.curvature.lanczos: plain Lanczos stopped by its residual bound (issue 21, item 4)."""

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


def small_tanh_mlp_hessian():
    """The float64 Hessian of a 5 -> 12 -> 3 tanh MLP (111 parameters) on 64 seeded points."""
    generator = torch.Generator().manual_seed(0)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 12), nn.Tanh(), nn.Linear(12, 3)).to(torch.float64)
    x = torch.randn(64, 5, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 3, (64,), generator=generator)
    return cv.hessian_operator(model, nn.CrossEntropyLoss(), (x, y))


@pytest.mark.parametrize("which", ["largest", "smallest"])
@pytest.mark.parametrize("k", [1, 5])
def test_matches_eigh_on_an_indefinite_matrix(which, k):
    a = indefinite()
    exact = np.linalg.eigh(a)[0]
    expected = exact[::-1][:k] if which == "largest" else exact[:k]
    result = cv.top_eigenpairs(a, k=k, which=which, tol=1e-10, method="lanczos")
    assert result.method == "lanczos" and result.converged
    assert_close(result.values, expected, rtol=1e-10, atol=0)
    assert_close(result.vectors.T @ result.vectors, np.eye(k), rtol=0, atol=1e-10)
    assert np.all(result.residuals <= 1e-8 * np.abs(exact).max())
    assert 0 < result.n_hvp < 200  # fewer products than the dimension


@pytest.mark.parametrize("tol", [1e-3, 1e-5, 1e-8])
def test_the_residual_bound_is_honest(tol):
    a = indefinite(seed=3)
    exact = np.linalg.eigh(a)[0][::-1]
    result = cv.top_eigenpairs(a, k=5, tol=tol, method="lanczos")
    assert np.all(result.residual_bounds <= tol * np.abs(result.values))  # what the stop test promised
    # the stated bound is the true residual, to rounding: within a small factor either way
    floor = 1e-12 * np.abs(exact).max()
    assert np.all(result.residuals <= 1.01 * result.residual_bounds + floor)
    assert np.all(result.residuals >= 0.99 * result.residual_bounds - floor)
    # and it bounds the eigenvalue error (a symmetric matrix has an eigenvalue within r of theta)
    assert np.all(np.abs(result.values - exact[:5]) <= result.residual_bounds + floor)


def test_stops_at_the_first_step_that_meets_tol():
    a = indefinite(seed=1)
    result = lanczos_eigenpairs(a, k=1, tol=1e-6)
    assert result.converged and result.residual_bounds[0] <= 1e-6 * abs(result.values[0])
    shorter = lanczos_eigenpairs(a, k=1, tol=1e-6, max_hvp=result.n_hvp - 1)
    assert not shorter.converged and shorter.n_hvp == result.n_hvp - 1
    assert shorter.residual_bounds[0] > 1e-6 * abs(shorter.values[0])


def test_fewer_products_than_arpack_on_a_tanh_mlp_hessian():
    op = small_tanh_mlp_hessian()
    exact = np.linalg.eigh(op.dense())[0][::-1]
    for k in (1, 5):
        arpack = cv.top_eigenpairs(op, k=k, tol=1e-4)
        lanczos = cv.top_eigenpairs(op, k=k, tol=1e-4, method="lanczos")
        assert lanczos.n_hvp < arpack.n_hvp, (k, lanczos.n_hvp, arpack.n_hvp)
        assert np.all(np.abs(lanczos.values - exact[:k]) <= 1e-4 * np.abs(exact[:k]))
        assert np.all(lanczos.residuals <= 2e-4 * np.abs(lanczos.values))


def test_warm_start_from_exact_eigenvectors_is_exact_and_no_dearer_than_cold():
    a = indefinite(seed=2)
    cold = cv.top_eigenpairs(a, k=1, tol=1e-8, method="lanczos")
    exact_vectors = np.linalg.eigh(a)[1][:, ::-1]
    warm = cv.top_eigenpairs(a, k=1, tol=1e-8, method="lanczos", v0=exact_vectors[:, 0])
    # the start carries a random part of equal weight, which must be explored too (see test_warm_starts.py)
    assert 1 + MIN_EXTRA_STEPS <= warm.n_hvp < cold.n_hvp
    assert_close(warm.values, cold.values, rtol=1e-10, atol=0)
    block = cv.top_eigenpairs(a, k=5, tol=1e-8, method="lanczos", v0=exact_vectors[:, :5])
    assert block.n_hvp < cv.top_eigenpairs(a, k=5, tol=1e-8, method="lanczos").n_hvp
    assert_close(block.values, np.linalg.eigh(a)[0][::-1][:5], rtol=1e-10, atol=0)
    # a warm start from the previous (approximate) vectors also saves products
    cold5 = cv.top_eigenpairs(a, k=5, tol=1e-6, method="lanczos")
    again = cv.top_eigenpairs(a + 1e-3 * indefinite(seed=9), k=5, tol=1e-6, method="lanczos", v0=cold5.vectors)
    assert again.n_hvp < cold5.n_hvp


def test_arpack_accepts_a_warm_start_too():
    a = indefinite(seed=2)
    exact_vectors = np.linalg.eigh(a)[1][:, ::-1]
    cold = cv.top_eigenpairs(a, k=2, tol=1e-8)
    warm = cv.top_eigenpairs(a, k=2, tol=1e-8, v0=exact_vectors[:, :2])
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
    ],
)
def test_bad_arguments_name_the_argument(kwargs, error, match):
    kwargs = {"method": "lanczos", **kwargs}
    with pytest.raises(error, match=match):
        cv.top_eigenpairs(np.diag(np.arange(1.0, 11.0)), **kwargs)


def test_bad_arguments_of_the_arpack_path():
    a = np.diag(np.arange(1.0, 11.0))
    with pytest.raises(ValueError, match="max_hvp applies to method='lanczos'"):
        cv.top_eigenpairs(a, max_hvp=10)
    with pytest.raises(ValueError, match="v0 must have shape"):
        cv.top_eigenpairs(a, v0=np.ones(3))
    with pytest.raises(TypeError, match="operator is a model"):
        cv.top_eigenpairs(nn.Linear(2, 2), method="lanczos")

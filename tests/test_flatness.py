"""Tests of lossgeom.flatness: each measure recomputed another way or checked by a property."""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import torch

from conftest import assert_close
from lossgeom import curvature, flatness, models


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def random_symmetric(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, n, generator=g)
    return X + X.T


def random_spd(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 100)
    X = torch.randn(n, n, generator=g)
    return X @ X.T + 0.1 * torch.eye(n)


def small_regression_model():
    g = torch.Generator().manual_seed(3)
    model = models.mlp([3, 4, 2], activation="tanh", seed=3)
    x, y = torch.randn(20, 3, generator=g), torch.randn(20, 2, generator=g)
    return models.loss_closure(model, x, y, loss="mse"), models.params_of(model)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n", [2, 5, 12])
def test_bound_lies_above_the_largest_eigenvalue(n, seed):
    A = random_symmetric(n, seed)
    eigenvalues = torch.linalg.eigvalsh(A)
    bound = flatness.wolkowicz_styan_bound(A)
    assert bound >= float(eigenvalues[-1]) - 1e-12
    m, s = flatness.spectral_moments(A)
    assert m == pytest.approx(float(eigenvalues.mean()), abs=1e-12)
    assert s == pytest.approx(float(eigenvalues.std(unbiased=False)), rel=1e-12)


@pytest.mark.parametrize("n", [2, 3, 7])
def test_bound_is_attained_when_the_other_eigenvalues_coincide(n):
    Q, _ = torch.linalg.qr(torch.randn(n, n, generator=torch.Generator().manual_seed(n)))
    eigenvalues = torch.tensor([4.0] + [-1.5] * (n - 1))
    A = Q @ torch.diag(eigenvalues) @ Q.T
    assert flatness.wolkowicz_styan_bound(0.5 * (A + A.T)) == pytest.approx(4.0, rel=1e-12)


def test_bound_from_traces_matches_the_matrix_version():
    A = random_symmetric(6, 1)
    from_traces = flatness.wolkowicz_styan_from_traces(float(A.trace()), float((A @ A).trace()), 6)
    assert from_traces == pytest.approx(flatness.wolkowicz_styan_bound(A), rel=1e-13)


def test_matrix_gradient_matches_central_differences_along_symmetric_directions():
    A, E = random_symmetric(5, 2), random_symmetric(5, 3)
    G = flatness.wolkowicz_styan_gradient(A)
    h = 1e-6
    central = (flatness.wolkowicz_styan_bound(A + h * E) - flatness.wolkowicz_styan_bound(A - h * E)) / (2 * h)
    assert float((G * E).sum()) == pytest.approx(central, rel=1e-7)
    assert_close(G, G.T, rtol=0, atol=1e-15)


def test_hessian_bound_and_its_gradient():
    loss_fn, params = small_regression_model()
    value, grad = flatness.hessian_wolkowicz_styan(loss_fn, params)
    assert value == pytest.approx(flatness.wolkowicz_styan_bound(curvature.dense_hessian(loss_fn, params)), rel=1e-12)
    g = torch.Generator().manual_seed(5)
    direction = {k: torch.randn(v.shape, generator=g) for k, v in params.items()}
    at = lambda t: flatness.wolkowicz_styan_bound(curvature.dense_hessian(
        loss_fn, {k: v + t * direction[k] for k, v in params.items()}))
    # Taylor check: the first-order remainder falls like t^2
    slope = float(sum((grad[k] * direction[k]).sum() for k in params))
    steps = np.array([1e-2, 5e-3, 2.5e-3])
    remainders = np.array([abs(at(t) - value - t * slope) for t in steps])
    orders = np.diff(np.log(remainders)) / np.diff(np.log(steps))
    assert np.all(orders > 1.8)


def test_riemannian_sharpness_is_the_generalised_eigenvalue_for_an_invertible_fisher():
    H, F = random_symmetric(6, 4), random_spd(6, 4)
    result = flatness.fisher_riemannian_sharpness(H, F)
    reference = scipy.linalg.eigh(H.numpy(), F.numpy(), eigvals_only=True)
    assert result.value == pytest.approx(reference[-1], rel=1e-10)
    assert result.trace == pytest.approx(reference.sum(), rel=1e-10, abs=1e-10)
    assert result.rank == 6 and result.kernel_leakage == 0.0


def test_riemannian_sharpness_is_invariant_under_congruence_with_a_kernel():
    g = torch.Generator().manual_seed(7)
    basis = torch.randn(6, 4, generator=g)  # range of both matrices; a 2-dim common kernel
    H = basis @ random_symmetric(4, 8) @ basis.T
    F = basis @ random_spd(4, 8) @ basis.T
    J = torch.randn(6, 6, generator=g) + 3 * torch.eye(6)
    before = flatness.fisher_riemannian_sharpness(H, F)
    after = flatness.fisher_riemannian_sharpness(J.T @ H @ J, J.T @ F @ J)
    assert before.rank == after.rank == 4
    assert before.kernel_leakage < 1e-12 and after.kernel_leakage < 1e-12
    assert after.value == pytest.approx(before.value, rel=1e-8)
    assert after.trace == pytest.approx(before.trace, rel=1e-8)


def test_kernel_leakage_is_reported_when_the_hessian_sees_the_kernel():
    F = torch.diag(torch.tensor([1.0, 2.0, 0.0]))
    H = torch.ones(3, 3)
    assert flatness.fisher_riemannian_sharpness(H, F).kernel_leakage > 0.1


def test_diagonal_sharpness_keeps_diagonal_reparametrisations_only():
    H, F = random_symmetric(4, 9), random_spd(4, 9)
    S = torch.diag(torch.tensor([0.5, 2.0, 3.0, 0.1]))
    base = flatness.diagonal_fisher_sharpness(H, F.diagonal())
    scaled = flatness.diagonal_fisher_sharpness(S @ H @ S, (S @ F @ S).diagonal())
    assert scaled == pytest.approx(base, rel=1e-12)
    shear = torch.eye(4)
    shear[0, 1] = 2.0
    moved = flatness.diagonal_fisher_sharpness(shear.T @ H @ shear, (shear.T @ F @ shear).diagonal())
    assert abs(moved / base - 1) > 1e-3
    exact = flatness.fisher_riemannian_sharpness(shear.T @ H @ shear, shear.T @ F @ shear).value
    assert exact == pytest.approx(flatness.fisher_riemannian_sharpness(H, F).value, rel=1e-10)


def test_hessian_sharpness_matches_the_dense_spectrum():
    loss_fn, params = small_regression_model()
    dense = float(torch.linalg.eigvalsh(curvature.dense_hessian(loss_fn, params))[-1])
    assert flatness.hessian_sharpness(loss_fn, params, tol=1e-10) == pytest.approx(dense, rel=1e-8)


def test_scale_to_loss_reaches_the_target_and_keeps_predictions():
    g = torch.Generator().manual_seed(11)
    model = models.mlp([4, 6, 3], seed=1, bias=False)
    x = torch.randn(30, 4, generator=g)
    with torch.no_grad():
        y = model(x).argmax(1)  # an interpolant: every logit scale-up lowers the loss
    loss_fn, params = models.loss_closure(model, x, y), models.params_of(model)
    target = 0.5 * float(loss_fn(params))
    scaled = flatness.scale_to_loss(loss_fn, params, "2.weight", target)
    assert float(loss_fn(scaled)) == pytest.approx(target, rel=1e-9)
    before = torch.func.functional_call(model, params, (x,)).argmax(1)
    after = torch.func.functional_call(model, scaled, (x,)).argmax(1)
    assert torch.equal(before, after)


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="matrix must be symmetric"):
        flatness.wolkowicz_styan_bound(torch.tensor([[1.0, 2.0], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="matrix must be a square matrix of size >= 2"):
        flatness.wolkowicz_styan_bound(torch.ones(1, 1))
    with pytest.raises(ValueError, match="not differentiable where all eigenvalues coincide"):
        flatness.wolkowicz_styan_gradient(torch.eye(3))
    with pytest.raises(ValueError, match="trace_of_square must be >= trace"):
        flatness.wolkowicz_styan_from_traces(6.0, 1.0, 3)
    with pytest.raises(ValueError, match="n must be >= 2"):
        flatness.wolkowicz_styan_from_traces(1.0, 1.0, 1)
    with pytest.raises(ValueError, match="fisher_diagonal must be > 0"):
        flatness.diagonal_fisher_sharpness(torch.eye(2), torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match=r"fisher_diagonal must have shape \(2,\)"):
        flatness.diagonal_fisher_sharpness(torch.eye(2), torch.ones(3))
    with pytest.raises(ValueError, match="hessian and fisher must have the same shape"):
        flatness.fisher_riemannian_sharpness(torch.eye(2), torch.eye(3))
    with pytest.raises(ValueError, match="fisher must have a positive eigenvalue"):
        flatness.fisher_riemannian_sharpness(torch.eye(2), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="hessian must contain only finite values"):
        flatness.fisher_riemannian_sharpness(torch.tensor([[math.nan, 0.0], [0.0, 1.0]]), torch.eye(2))
    loss_fn, params = small_regression_model()
    with pytest.raises(ValueError, match="name must be one of the parameters"):
        flatness.scale_to_loss(loss_fn, params, "missing", 0.1)
    with pytest.raises(TypeError, match="loss_fn must be callable"):
        flatness.hessian_wolkowicz_styan(None, params)

"""The flatness measures: softmax proxies, quotient flatness, spectral bounds, Fisher-geometric sharpness."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from small_models import mlp

from lossgeom import curvature, flatness, models
from lossgeom.flatness import reparametrisation
from lossgeom.flatness import softmax_gauge as sm
from lossgeom.flatness.reparametrisation import _lower_shear_matrix
from lossgeom.parameters import params_of
from lossgeom.training.loop import indexed_loss

from cases import CLASSIFIER_CASES as CASES
from cases import ids
from cases import make_classifier as make
from conftest import assert_close


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
        g0 = torch.func.grad(lambda w, f=f: f(w, h))(W)
        g1 = torch.func.grad(lambda w, f=f: f(w, h))(Wt)
        assert_close(g1, g0, rtol=1e-8, atol=1e-10)
    g0 = torch.func.grad(lambda w: flatness.b_raw(w, h))(W)
    g1 = torch.func.grad(lambda w: flatness.b_raw(w, h))(Wt)
    assert (g1 - g0).abs().max() > 1e-3  # the raw proxy's gradient is not gauge invariant


def test_gradients_in_h_match_finite_differences():
    W, h, _ = make(CASES[1])
    for f in (flatness.kappa_exact, flatness.b_raw, flatness.b_quot):
        g = torch.func.grad(lambda x, f=f: f(W, x))(h[0])
        e = torch.zeros_like(h[0])
        e[1] = 1e-6
        fd = (f(W, h[0] + e) - f(W, h[0] - e)) / 2e-6
        assert abs(float(g[1] - fd)) <= 1e-7 * max(1.0, abs(float(fd)))


@settings(max_examples=40, deadline=None, database=None)
@given(
    K=st.integers(2, 6),
    d=st.integers(1, 5),
    seed=st.integers(0, 2**31 - 1),
    scale=st.floats(0.05, 5.0),
    shift=st.floats(-50.0, 50.0),
)
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


def test_float32_inputs_are_promoted_to_float64():
    W, h, _ = make(CASES[1])
    out = flatness.b_raw(W.float(), h.float())
    assert out.dtype == torch.float64


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
    model = mlp([3, 4, 2], activation="tanh", seed=3)
    x, y = torch.randn(20, 3, generator=g), torch.randn(20, 2, generator=g)
    return models.loss_closure(model, torch.nn.MSELoss(), (x, y)), params_of(model)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n", [2, 5, 12])
def test_bound_lies_above_the_largest_eigenvalue(n, seed):
    A = random_symmetric(n, seed)
    eigenvalues = torch.linalg.eigvalsh(A)
    bound = flatness.wolkowicz_styan_bound(A)
    assert bound >= float(eigenvalues[-1]) - 1e-12
    m, s = flatness.spectral.spectral_moments(A)
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
    from_traces = flatness.spectral.wolkowicz_styan_bound_from_traces(float(A.trace()), float((A @ A).trace()), 6)
    assert from_traces == pytest.approx(flatness.wolkowicz_styan_bound(A), rel=1e-13)


def test_matrix_gradient_matches_central_differences_along_symmetric_directions():
    A, E = random_symmetric(5, 2), random_symmetric(5, 3)
    G = flatness.spectral.wolkowicz_styan_bound_gradient(A)
    h = 1e-6
    central = (flatness.wolkowicz_styan_bound(A + h * E) - flatness.wolkowicz_styan_bound(A - h * E)) / (2 * h)
    assert float((G * E).sum()) == pytest.approx(central, rel=1e-7)
    assert_close(G, G.T, rtol=0, atol=1e-15)


def test_hessian_bound_and_its_gradient():
    loss_fn, params = small_regression_model()
    value, grad = flatness.closure_wolkowicz_styan_bound(loss_fn, params)
    assert value == pytest.approx(flatness.wolkowicz_styan_bound(curvature.closure_hessian(loss_fn, params)), rel=1e-12)
    g = torch.Generator().manual_seed(5)
    direction = {k: torch.randn(v.shape, generator=g) for k, v in params.items()}
    at = lambda t: flatness.wolkowicz_styan_bound(
        curvature.closure_hessian(loss_fn, {k: v + t * direction[k] for k, v in params.items()})
    )
    # Taylor check: the first-order remainder falls like t^2
    slope = float(sum((grad[k] * direction[k]).sum() for k in params))
    steps = np.array([1e-2, 5e-3, 2.5e-3])
    remainders = np.array([abs(at(t) - value - t * slope) for t in steps])
    orders = np.diff(np.log(remainders)) / np.diff(np.log(steps))
    assert np.all(orders > 1.8)


def test_riemannian_sharpness_is_the_generalised_eigenvalue_for_an_invertible_fisher():
    H, F = random_symmetric(6, 4), random_spd(6, 4)
    result = flatness.fisher_riemannian_sharpness_from_matrices(H, F)
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
    before = flatness.fisher_riemannian_sharpness_from_matrices(H, F)
    after = flatness.fisher_riemannian_sharpness_from_matrices(J.T @ H @ J, J.T @ F @ J)
    assert before.rank == after.rank == 4
    assert before.kernel_leakage < 1e-12 and after.kernel_leakage < 1e-12
    assert after.value == pytest.approx(before.value, rel=1e-8)
    assert after.trace == pytest.approx(before.trace, rel=1e-8)


def test_kernel_leakage_is_reported_when_the_hessian_sees_the_kernel():
    F = torch.diag(torch.tensor([1.0, 2.0, 0.0]))
    H = torch.ones(3, 3)
    assert flatness.fisher_riemannian_sharpness_from_matrices(H, F).kernel_leakage > 0.1


def test_diagonal_sharpness_keeps_diagonal_reparametrisations_only():
    H, F = random_symmetric(4, 9), random_spd(4, 9)
    S = torch.diag(torch.tensor([0.5, 2.0, 3.0, 0.1]))
    base = flatness.diagonal_fisher_sharpness_from_matrices(H, F.diagonal())
    scaled = flatness.diagonal_fisher_sharpness_from_matrices(S @ H @ S, (S @ F @ S).diagonal())
    assert scaled == pytest.approx(base, rel=1e-12)
    shear = torch.eye(4)
    shear[0, 1] = 2.0
    moved = flatness.diagonal_fisher_sharpness_from_matrices(shear.T @ H @ shear, (shear.T @ F @ shear).diagonal())
    assert abs(moved / base - 1) > 1e-3
    exact = flatness.fisher_riemannian_sharpness_from_matrices(shear.T @ H @ shear, shear.T @ F @ shear).value
    assert exact == pytest.approx(flatness.fisher_riemannian_sharpness_from_matrices(H, F).value, rel=1e-10)


def test_hessian_sharpness_matches_the_dense_spectrum():
    loss_fn, params = small_regression_model()
    dense = float(torch.linalg.eigvalsh(curvature.closure_hessian(loss_fn, params))[-1])
    assert curvature.closure_lambda_max(loss_fn, params, tol=1e-10) == pytest.approx(dense, rel=1e-8)


def test_scale_to_loss_reaches_the_target_and_keeps_predictions():
    g = torch.Generator().manual_seed(11)
    model = mlp([4, 6, 3], seed=1, bias=False)
    x = torch.randn(30, 4, generator=g)
    with torch.no_grad():
        y = model(x).argmax(1)  # an interpolant: every logit scale-up lowers the loss
    loss_fn, params = models.loss_closure(model, torch.nn.CrossEntropyLoss(), (x, y)), params_of(model)
    target = 0.5 * float(loss_fn(params))
    scaled = reparametrisation.closure_scale_to_loss(loss_fn, params, "2.weight", target)
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
        flatness.spectral.wolkowicz_styan_bound_gradient(torch.eye(3))
    with pytest.raises(ValueError, match="trace_of_square must be >= trace"):
        flatness.spectral.wolkowicz_styan_bound_from_traces(6.0, 1.0, 3)
    with pytest.raises(ValueError, match="n must be >= 2"):
        flatness.spectral.wolkowicz_styan_bound_from_traces(1.0, 1.0, 1)
    with pytest.raises(ValueError, match="fisher_diagonal must be > 0"):
        flatness.diagonal_fisher_sharpness_from_matrices(torch.eye(2), torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match=r"fisher_diagonal must have shape \(2,\)"):
        flatness.diagonal_fisher_sharpness_from_matrices(torch.eye(2), torch.ones(3))
    with pytest.raises(ValueError, match="hessian and fisher must have the same shape"):
        flatness.fisher_riemannian_sharpness_from_matrices(torch.eye(2), torch.eye(3))
    with pytest.raises(ValueError, match="fisher must have a positive eigenvalue"):
        flatness.fisher_riemannian_sharpness_from_matrices(torch.eye(2), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="hessian must contain only finite values"):
        flatness.fisher_riemannian_sharpness_from_matrices(torch.tensor([[math.nan, 0.0], [0.0, 1.0]]), torch.eye(2))
    loss_fn, params = small_regression_model()
    with pytest.raises(ValueError, match="name must be one of the parameters"):
        reparametrisation.closure_scale_to_loss(loss_fn, params, "missing", 0.1)
    with pytest.raises(TypeError, match="loss_fn must be callable"):
        flatness.closure_wolkowicz_styan_bound(None, params)


# --------------------------------------------------------------------------- reparametrisations


def _small_classifier(seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(40, 3, generator=gen)
    y = torch.randint(0, 3, (40,), generator=gen)
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
    return net, x, y


@pytest.mark.parametrize("strength", [0.3, 1.5])
def test_nonlinear_shear_inverse_and_jacobian(strength):
    change = reparametrisation.nonlinear_shear(7, strength, seed=2)
    psi = torch.randn(7, generator=torch.Generator().manual_seed(3))
    assert_close(change.inverse(change.forward(psi)), psi, rtol=1e-13, atol=1e-13)
    P = _lower_shear_matrix(7, 2)
    J = change.jacobian(psi)
    expected = torch.eye(7) + strength * (1 - torch.tanh(P @ psi) ** 2)[:, None] * P
    assert_close(J, expected, rtol=1e-13, atol=1e-14)
    assert torch.equal(J.triu(1), torch.zeros(7, 7)) and float(torch.linalg.det(J)) == pytest.approx(1.0)
    assert float((J - torch.diag(J.diagonal())).abs().max()) > 1e-3  # not diagonal


def test_elementwise_sinh_is_inverted_and_has_a_diagonal_jacobian():
    change = reparametrisation.elementwise_sinh()
    psi = torch.linspace(-2, 2, 5)
    assert_close(change.inverse(change.forward(psi)), psi, rtol=1e-14, atol=1e-14)
    assert_close(change.jacobian(psi), torch.diag(torch.cosh(psi)), rtol=1e-14, atol=1e-15)


def test_reparametrised_model_keeps_the_function_and_has_one_parameter():
    net, x, _ = _small_classifier()
    theta = {k: v.detach() + 0.1 for k, v in net.named_parameters()}
    model = reparametrisation.Reparametrised(net, reparametrisation.nonlinear_shear(31, 0.5), theta)
    assert [name for name, _ in model.named_parameters()] == ["psi"]
    assert_close(model(x), torch.func.functional_call(net, theta, (x,)), rtol=1e-13, atol=1e-13)
    for name, value in model.theta().items():
        assert_close(value, theta[name], rtol=1e-13, atol=1e-13)


def test_fisher_pulls_back_everywhere_and_hessian_gains_the_second_derivative_term():
    net, x, y = _small_classifier(1)
    theta = {k: v.detach() for k, v in net.named_parameters()}  # not a critical point
    change = reparametrisation.elementwise_sinh()
    model = reparametrisation.Reparametrised(net, change, theta)
    psi = {"psi": model.psi.detach()}
    ce = torch.nn.CrossEntropyLoss()
    F = torch.tensor(curvature.fisher_operator(net, ce, (x, y), params=theta, kind="true").dense())
    F_psi = torch.tensor(curvature.fisher_operator(model, ce, (x, y), params=psi, kind="true").dense())
    J = change.jacobian(psi["psi"])
    assert_close(F_psi, J.T @ F @ J, rtol=1e-10, atol=1e-12)
    loss, loss_psi = (
        indexed_loss(net, torch.nn.CrossEntropyLoss(), (x, y)),
        indexed_loss(model, torch.nn.CrossEntropyLoss(), (x, y)),
    )
    H, H_psi = curvature.closure_hessian(loss, theta), curvature.closure_hessian(loss_psi, psi)
    g = curvature.closure_gradient(loss, theta)
    # theta_k = sinh(psi_k): the Hessian of phi_k is sinh(psi_k) e_k e_k^T
    assert_close(H_psi, J.T @ H @ J + torch.diag(g * torch.sinh(psi["psi"])), rtol=1e-10, atol=1e-12)
    assert float(g.abs().max()) > 1e-3  # the extra term is really there


def test_reparametrisation_errors_name_the_argument():
    net, _, _ = _small_classifier()
    with pytest.raises(TypeError, match="change must be a CoordinateChange"):
        reparametrisation.Reparametrised(net, torch.sinh)
    with pytest.raises(ValueError, match="theta must hold the model's parameters"):
        reparametrisation.Reparametrised(net, reparametrisation.elementwise_sinh(), {"0.weight": torch.zeros(4, 3)})
    with pytest.raises(ValueError, match=r"theta must have shape \(5,\)"):
        reparametrisation.nonlinear_shear(5, 0.5).inverse(torch.zeros(4))
    with pytest.raises(ValueError, match="strength must be > 0"):
        reparametrisation.nonlinear_shear(5, 0.0)

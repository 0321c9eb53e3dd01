"""Tests of lossgeom.flatness.relu_quotient and .stability: the rescaling quotient of two-layer ReLU networks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from small_models import as_params, mlp, relu_network, two_layer_relu

from lossgeom import flatness
from lossgeom.curvature import closure_hessian
from lossgeom.flatness.relu_quotient import _tangent_frames
from lossgeom.symmetries import audit_symmetry, relu_neuron_rescaling

from book_extra import from_book
from conftest import assert_close

rs = from_book("lossgeom_book.relu_students")

NETWORKS = [
    {"id": "m10-default", "m": 10, "seed": 0, "scale": 1.0},
    {"id": "m6-small", "m": 6, "seed": 1, "scale": 0.3},
    {"id": "m15-large", "m": 15, "seed": 2, "scale": 4.0},
]


@pytest.fixture(autouse=True)
def one_thread():
    """These tensors are tiny: one thread avoids thread start-up costs that dominate under load."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def task():
    return rs.teacher_student(n=25, d=4, m_teacher=4, seed=0)


def _weights(case):
    network = two_layer_relu(4, case["m"], seed=case["seed"], init_scale=case["scale"])
    return flatness.relu_quotient.two_layer_weights(network)


def _random_scales(m, seed, spread=100.0):
    g = torch.Generator().manual_seed(seed)
    return torch.exp(torch.empty(m).uniform_(-np.log(spread), np.log(spread), generator=g))


# ---------------------------------------------------------------------------------------
# Quotient flatness and the raw trace
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", NETWORKS, ids=[c["id"] for c in NETWORKS])
def test_flatness_closed_form_matches_autograd_chart(case, task):
    a, W = _weights(case)
    closed = float(flatness.quotient_flatness(a, W, task.x, task.y))
    assert abs(flatness.relu_quotient.quotient_flatness_autograd(a, W, task.x, task.y) / closed - 1) <= 1e-12


@pytest.mark.parametrize("case", NETWORKS, ids=[c["id"] for c in NETWORKS])
def test_flatness_is_invariant_under_random_rescalings(case, task):
    a, W = _weights(case)
    before = float(flatness.quotient_flatness(a, W, task.x, task.y))
    for seed in range(5):
        c = _random_scales(case["m"], seed)
        after = float(flatness.quotient_flatness(a / c, W * c[:, None], task.x, task.y))
        assert abs(after / before - 1) <= 1e-10
        chart = flatness.relu_quotient.quotient_flatness_autograd(a / c, W * c[:, None], task.x, task.y)
        assert abs(chart / before - 1) <= 1e-10


@pytest.mark.parametrize("case", NETWORKS, ids=[c["id"] for c in NETWORKS])
def test_raw_trace_matches_dense_hessian_and_moves_as_c2_p_plus_q_over_c2(case, task):
    a, W = _weights(case)
    model = two_layer_relu(4, case["m"])

    def loss(p):
        out = torch.func.functional_call(model, p, (task.x,))[:, 0]
        return 0.5 * ((out - task.y) ** 2).mean()

    for c_value in (0.2, 1.0, 7.0):
        moved = (a / c_value, W * c_value)
        dense = float(closure_hessian(loss, as_params(*moved)).trace())
        assert abs(float(flatness.raw_hessian_trace(*moved, task.x)) / dense - 1) <= 1e-12
    active = (W @ task.x.T > 0).double()
    P = float((active * (W @ task.x.T) ** 2).sum(0).mean())
    Q = float((active * (a**2)[:, None] * (task.x**2).sum(1)).sum(0).mean())
    for c_value in (0.1, 3.0):
        expected = P * c_value**2 + Q / c_value**2
        assert abs(float(flatness.raw_hessian_trace(a / c_value, W * c_value, task.x)) / expected - 1) <= 1e-12


def test_audit_wires_the_rescaling_into_the_symmetry_audit(task):
    a, W = _weights(NETWORKS[0])
    model, params = two_layer_relu(4, 10), as_params(a, W)
    forward = lambda p, x: torch.func.functional_call(model, p, (x,))
    flat = lambda p: float(flatness.quotient_flatness(*flatness.relu_quotient.two_layer_weights(p), task.x, task.y))
    report = audit_symmetry(
        forward, params, relu_neuron_rescaling("0", "2", _random_scales(10, 3)), task.x, tol=1e-10, measure=flat
    )
    assert report.is_symmetry and abs(report.measure_ratio - 1) <= 1e-10
    raw = lambda p: float(flatness.raw_hessian_trace(*flatness.relu_quotient.two_layer_weights(p), task.x))
    report = audit_symmetry(
        forward, params, relu_neuron_rescaling("0", "2", [10.0] * 10), task.x, tol=1e-10, measure=raw
    )
    assert report.measure_ratio > 10


def test_gauss_newton_part_is_the_mean_squared_quotient_gradient(task):
    a, W = _weights(NETWORKS[2])
    J = flatness.relu_quotient.quotient_jacobian(a, W, task.x)
    assert_close((J**2).sum(-1).mean(), flatness.quotient_flatness(a, W, task.x, task.y, part="gauss_newton"))
    # inner products of the rows are those of the chart (alpha, v) at v = 0: compare Gram matrices
    alpha, U = flatness.quotient_coordinates(a, W)
    frames = _tangent_frames(U)

    def outputs(z):
        v = z[len(alpha) :].reshape(len(alpha), 3)
        moved = U + (frames @ v[..., None])[..., 0]
        return relu_network(z[: len(alpha)], moved / moved.norm(dim=-1, keepdim=True), task.x)

    chart_jacobian = torch.func.jacrev(outputs)(torch.cat([alpha, torch.zeros(len(alpha) * 3)]))
    assert_close(J @ J.T, chart_jacobian @ chart_jacobian.T, rtol=1e-12, atol=1e-12)


def test_batched_models_and_absent_neurons(task):
    a_pad, W_pad, labels = rs.init_students(4, [6, 10], [0, 1], (1.0, 2.0))
    for i, (scale, m, seed) in enumerate(labels):
        a, W = flatness.relu_quotient.two_layer_weights(two_layer_relu(4, m, seed=seed, init_scale=scale))
        for fn in (flatness.raw_hessian_trace, flatness.input_smoothness):
            assert_close(fn(a_pad, W_pad, task.x)[i], fn(a, W, task.x))
        padded = flatness.quotient_flatness(a_pad, W_pad, task.x, task.y)[i]
        assert_close(padded, flatness.quotient_flatness(a, W, task.x, task.y))
        assert (
            abs(
                flatness.relu_quotient.quotient_flatness_autograd(a_pad[i], W_pad[i], task.x, task.y)
                / float(flatness.quotient_flatness(a, W, task.x, task.y))
                - 1
            )
            <= 1e-12
        )


def test_quotient_coordinates_and_representative():
    a, W = _weights(NETWORKS[0])
    alpha, U = flatness.quotient_coordinates(a, W)
    assert_close(U.norm(dim=1), torch.ones(10))
    a_rep, W_rep = flatness.relu_quotient.representative(alpha, 3.0 * U)
    x = torch.randn(40, 4, generator=torch.Generator().manual_seed(0))
    assert_close(relu_network(a_rep, W_rep, x), relu_network(a, W, x))
    c = _random_scales(10, 4)
    assert_close(flatness.quotient_coordinates(a / c, W * c[:, None])[0], alpha, rtol=1e-13, atol=0)


# ---------------------------------------------------------------------------------------
# Input smoothness and its bound
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", NETWORKS, ids=[c["id"] for c in NETWORKS])
def test_input_smoothness_matches_autograd_and_obeys_its_bound(case, task):
    a, W = _weights(case)
    x = task.x.clone().requires_grad_(True)
    grads = torch.autograd.grad(relu_network(a, W, x).sum(), x)[0]
    smooth = flatness.input_smoothness(a, W, task.x)
    assert_close(smooth, (grads**2).sum(1).mean())
    constants = flatness.relu_quotient.smoothness_constants(a, W, task.x)
    _, U = flatness.quotient_coordinates(a, W)
    assert abs(float(constants.kappa) - np.linalg.norm(U.numpy(), 2) ** 2) <= 1e-12 * float(constants.kappa)
    bound = constants.factor * flatness.quotient_flatness(a, W, task.x, task.y, part="gauss_newton")
    assert float(smooth) <= float(bound)


def test_smoothness_bound_on_many_random_networks():
    g = torch.Generator().manual_seed(5)
    for _trial in range(50):
        m, d, n = int(torch.randint(1, 12, (1,), generator=g)), int(torch.randint(2, 6, (1,), generator=g)), 20
        scale = float(torch.exp(torch.randn(1, generator=g) * 2))
        a, W = scale * torch.randn(m, generator=g), torch.randn(m, d, generator=g)
        x = torch.randn(n, d, generator=g) * (0.5 + torch.rand(n, 1, generator=g))
        c = flatness.relu_quotient.smoothness_constants(a, W, x)
        bound = float(c.factor * flatness.quotient_flatness(a, W, x, torch.zeros(n), part="gauss_newton"))
        assert float(flatness.input_smoothness(a, W, x)) <= bound * (1 + 1e-12)


# ---------------------------------------------------------------------------------------
# The stability operator
# ---------------------------------------------------------------------------------------


def _random_jacobian(n, p, seed):
    return torch.randn(n, p, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("replacement", [True, False], ids=["with-replacement", "without-replacement"])
def test_batch_moments_by_exact_enumeration(replacement):
    J = _random_jacobian(5, 3, 0).numpy()
    H = [np.outer(g, g) for g in J]
    for b in (1, 2, 4, 5):
        batches = itertools.product(range(5), repeat=b) if replacement else itertools.combinations(range(5), b)
        squares = [np.linalg.matrix_power(sum(H[i] for i in batch) / b, 2) for batch in batches]
        A_bar, second = flatness.stability.batch_moments(J, b, replacement)
        assert_close(A_bar, sum(H) / 5)
        assert_close(second, np.mean(squares, axis=0), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("replacement", [True, False], ids=["with-replacement", "without-replacement"])
def test_stability_operator_against_monte_carlo_batches(replacement):
    J = _random_jacobian(8, 6, 1).numpy()
    eta, b, draws = 0.1, 5, 20_000
    rng = np.random.default_rng(0)
    squares, m_squares = np.empty((draws, 6, 6)), np.empty((draws, 6, 6))
    for k in range(draws):
        batch = rng.integers(0, 8, b) if replacement else rng.choice(8, b, replace=False)
        A = J[batch].T @ J[batch] / b
        squares[k], m_squares[k] = A @ A, (np.eye(6) - eta * A) @ (np.eye(6) - eta * A)
    for samples, exact in (
        (squares, flatness.stability.batch_moments(J, b, replacement)[1]),
        (m_squares, flatness.stability.stability_operator(J, eta, b, replacement)),
    ):
        se = samples.std(axis=0) / np.sqrt(draws)
        assert np.all(np.abs(samples.mean(axis=0) - exact) <= 5 * se + 1e-15)
    other = flatness.stability.batch_moments(J, b, not replacement)[1]
    se = squares.std(axis=0) / np.sqrt(draws)
    assert np.abs(squares.mean(axis=0) - other).max() > 10 * se.max()  # the two samplings differ


def test_critical_learning_rate_is_the_stability_edge():
    J = flatness.stability.active_jacobian(_random_jacobian(25, 40, 2))
    for b in (1, 5, 15):
        for replacement in (True, False):
            eta_c = flatness.critical_learning_rate(J, b, replacement)
            assert flatness.stability_lambda_max(J, eta_c * (1 - 1e-6), b, replacement) <= 1
            assert flatness.stability_lambda_max(J, eta_c * (1 + 1e-6), b, replacement) > 1
            grid = flatness.stability.stable_pairs(J, [eta_c * 0.5, eta_c * 1.01], [b], replacement)
            assert grid.tolist() == [[True, False]]


def test_bound_derivation_on_random_rank_one_instances():
    rng = np.random.default_rng(3)
    stable_seen, near_edge = 0, 0
    for _trial in range(300):
        n, p = int(rng.integers(1, 30)), int(rng.integers(1, 12))
        J = rng.standard_normal((n, p)) * rng.exponential(1.0, (n, 1))
        b, replacement = int(rng.integers(1, n + 1)), bool(rng.integers(0, 2))
        A_bar, second = flatness.stability.batch_moments(J, b, replacement)
        flat = np.trace(A_bar)
        assert np.trace(second) >= flat**2 / b * (1 - 1e-12)  # the trace inequality of the derivation
        active = flatness.stability.active_jacobian(J)
        eta = flatness.critical_learning_rate(active, b, replacement) * rng.uniform(0.2, 1.0)
        lam = np.linalg.eigvalsh(np.eye(p) - 2 * eta * A_bar + eta**2 * second)[-1]
        assert lam <= 1 + 1e-12
        assert eta * np.trace(second) <= 2 * flat * (1 + 1e-12)  # stability summed over a basis
        assert flat <= 2 * b / eta * (1 + 1e-12)  # the bound
        stable_seen += 1
        near_edge += flat >= 0.5 * 2 * b / eta
    assert stable_seen == 300 and near_edge > 0


def test_bound_needs_rank_one_batch_hessians():
    # with rank-two per-example Hessians the same argument fails: the bound is not free
    H = np.eye(2)
    A_bar, second = H, H @ H
    eta = 2.0  # lambda_max(I - 2 eta H + eta^2 H^2) = (1 - eta)^2 = 1: stable
    assert np.linalg.eigvalsh(np.eye(2) - 2 * eta * A_bar + eta**2 * second)[-1] <= 1
    assert np.trace(A_bar) > 2 * 1 / eta


def test_stable_pair_grid_matches_per_model_pairs(task):
    a, W, _ = rs.init_students(4, [10], [0, 1], (1.0, 4.0))
    grid = flatness.stability.stable_pair_grid(a, W, task.x, (0.1, 0.5, 1.0), (1, 5))
    assert grid.shape == (4, 2, 3)
    for i in range(4):
        J = flatness.stability.active_jacobian(flatness.relu_quotient.quotient_jacobian(a[i], W[i], task.x))
        assert (grid[i] == flatness.stability.stable_pairs(J, (0.1, 0.5, 1.0), (1, 5))).all()


# ---------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------


def test_rejects_networks_that_are_not_two_layer_relu():
    with pytest.raises(TypeError, match="two-layer ReLU"):
        flatness.relu_quotient.two_layer_weights(mlp([4, 10, 1], bias=True))
    with pytest.raises(TypeError, match="two-layer ReLU"):
        flatness.relu_quotient.two_layer_weights(mlp([4, 10, 10, 1], bias=False))
    with pytest.raises(TypeError, match="two-layer ReLU"):
        flatness.relu_quotient.two_layer_weights(mlp([4, 10, 1], activation="tanh", bias=False))
    with pytest.raises(TypeError, match="two-layer ReLU"):
        flatness.relu_quotient.two_layer_weights({"0.weight": torch.ones(3, 4)})
    with pytest.raises(TypeError, match="nn.Module or a dict"):
        flatness.relu_quotient.two_layer_weights([torch.ones(3, 4)])
    with pytest.raises(ValueError, match=r"must be \(m, d\)"):
        flatness.relu_quotient.two_layer_weights({"0.weight": torch.ones(3, 4), "2.weight": torch.ones(1, 5)})


def test_rejects_non_positive_scales_and_radii(task):
    with pytest.raises(ValueError, match="> 0"):
        relu_neuron_rescaling("0", "2", [1.0] * 9 + [0.0])
    with pytest.raises(ValueError, match="> 0"):
        relu_neuron_rescaling("0", "2", [1.0] * 9 + [-2.0])
    with pytest.raises(ValueError, match="learning_rate must be > 0"):
        flatness.stability.stability_operator(torch.ones(3, 2), -0.1, 1)


def test_rejects_batch_larger_than_n_and_bad_shapes(task):
    J = torch.ones(5, 3)
    for fn in (
        lambda: flatness.stability.batch_moments(J, 6),
        lambda: flatness.stability.stability_operator(J, 0.1, 6),
        lambda: flatness.critical_learning_rate(J, 6),
        lambda: flatness.stability.stable_pairs(J, [0.1], [6]),
    ):
        with pytest.raises(ValueError, match="batch_size must be <= n = 5"):
            fn()
    with pytest.raises(ValueError, match="singular"):
        flatness.critical_learning_rate(torch.ones(5, 3), 2)
    with pytest.raises(ValueError, match="a must have shape"):
        flatness.quotient_coordinates(torch.ones(3), torch.ones(4, 2))
    with pytest.raises(ValueError, match=r"x must have shape \(n, 2\)"):
        flatness.quotient_flatness(torch.ones(4), torch.ones(4, 2), torch.ones(5, 3), torch.ones(5))
    with pytest.raises(ValueError, match="not on the regular quotient"):
        flatness.quotient_coordinates(torch.ones(2), torch.tensor([[1.0, 0.0], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="part must be"):
        flatness.quotient_flatness(torch.ones(2), torch.eye(2), task.x[:, :2], task.y, part="raw")

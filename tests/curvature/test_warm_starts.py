"""Warm-started Lanczos cannot lock onto the wrong eigenvalue (issue 28, warm starts).

A warm start ``v0`` that is exactly an eigenvector other than the top one, or orthogonal
to the top one, used to be accepted after one or two products with the wrong eigenvalue;
so did sharpness tracking through an eigenvalue crossing. Every eigenvalue here is
compared with ``numpy.linalg.eigh`` of a dense float64 Hessian built by
``torch.autograd.functional.hessian`` of the loss module on a flat parameter vector
(independent of lossgeom's operators), on models the rest of the suite does not use: a
SiLU network under cross-entropy, a Softplus regression network and a quadratic whose two
top eigenvalues cross along training.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.sparse.linalg import LinearOperator
from torch import nn
from torch.func import functional_call

from lossgeom import curvature as cv
from lossgeom.curvature.lanczos import MIN_EXTRA_STEPS, lanczos_eigenpairs
from lossgeom.training import sgd, train

from conftest import assert_close

pytestmark = pytest.mark.filterwarnings("ignore:.*torch.jit.script.*:DeprecationWarning")


def silu_classifier():
    """A seeded 4 -> 6 -> 3 SiLU network (51 parameters), 40 points, three classes, mean cross-entropy."""
    with torch.random.fork_rng():
        torch.manual_seed(11)
        model = nn.Sequential(nn.Linear(4, 6), nn.SiLU(), nn.Linear(6, 3)).to(torch.float64)
    generator = torch.Generator().manual_seed(12)
    x = torch.randn(40, 4, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 3, (40,), generator=generator)
    return model, nn.CrossEntropyLoss(), x, y


def dense_hessian_of(model: nn.Module, loss: nn.Module, x: torch.Tensor, y: torch.Tensor, params=None) -> np.ndarray:
    """The float64 Hessian of ``loss(model(x), y)`` at ``params`` (``None``: the model's own), by autograd.

    Ordered as ``model.named_parameters()``; the model itself is only called, never changed.
    """
    point = {name: p.detach() for name, p in model.named_parameters()} if params is None else params
    names = [name for name, _ in model.named_parameters()]
    shapes = [point[name].shape for name in names]
    flat = torch.cat([point[name].detach().reshape(-1) for name in names])

    def risk(theta: torch.Tensor) -> torch.Tensor:
        pieces, start = {}, 0
        for name, shape in zip(names, shapes):
            pieces[name] = theta[start : start + shape.numel()].reshape(shape)
            start += shape.numel()
        return loss(functional_call(model, pieces, (x,)), y)

    return torch.autograd.functional.hessian(risk, flat).numpy()


def state_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def assert_bit_identical(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict()
    assert after.keys() == before.keys()
    for name, tensor in before.items():
        assert torch.equal(after[name], tensor), name


@pytest.mark.parametrize("start", ["second eigenvector", "fifth eigenvector", "orthogonal to the top"])
@pytest.mark.parametrize("tol", [1e-10, 1e-6])
def test_a_start_on_another_eigenvector_still_finds_the_top_one(start, tol):
    model, loss, x, y = silu_classifier()
    before = state_of(model)
    values, vectors = np.linalg.eigh(dense_hessian_of(model, loss, x, y))
    values, vectors = values[::-1], vectors[:, ::-1]
    assert values[0] - values[1] > 0.05 * abs(values[0])  # a clear top eigenvalue, so that "which" is unambiguous
    operator = cv.hessian_operator(model, loss, (x, y))
    if start == "orthogonal to the top":
        v0 = np.random.default_rng(3).standard_normal(len(values))
        v0 -= (v0 @ vectors[:, 0]) * vectors[:, 0]
    else:
        v0 = vectors[:, 1 if start == "second eigenvector" else 4]
        # the start is an eigenvector of the operator itself, not only of the dense reference
        assert_close(operator @ v0, values[1 if start == "second eigenvector" else 4] * v0, rtol=0, atol=1e-12)
    result = cv.top_eigenpairs(operator, k=1, tol=tol, method="lanczos", v0=v0)
    assert result.converged and result.n_hvp >= 1 + MIN_EXTRA_STEPS
    assert abs(result.values[0] - values[0]) <= tol * abs(values[0])
    assert abs(result.vectors[:, 0] @ vectors[:, 0]) > 1 - 1e-6
    assert_bit_identical(model, before)


def test_a_block_start_on_the_third_and_fourth_eigenvectors_finds_the_top_two():
    model, loss, x, y = silu_classifier()
    values, vectors = np.linalg.eigh(dense_hessian_of(model, loss, x, y))
    values, vectors = values[::-1], vectors[:, ::-1]
    result = cv.top_eigenpairs(
        cv.hessian_operator(model, loss, (x, y)), k=2, tol=1e-10, method="lanczos", v0=vectors[:, 2:4]
    )
    assert result.n_hvp >= 2 + MIN_EXTRA_STEPS
    assert_close(result.values, values[:2], rtol=1e-10, atol=0)


def test_the_start_is_mixed_with_a_seeded_random_part():
    model, loss, x, y = silu_classifier()
    operator = cv.hessian_operator(model, loss, (x, y))
    second = np.linalg.eigh(dense_hessian_of(model, loss, x, y))[1][:, -2]
    runs = [lanczos_eigenpairs(operator, 1, tol=1e-8, seed=seed, v0=second) for seed in (0, 0, 5)]
    assert_close(runs[0].vectors, runs[1].vectors, rtol=0, atol=0)  # the same seed, the same run
    assert runs[0].n_hvp == runs[1].n_hvp
    assert_close(runs[2].values, runs[0].values, rtol=1e-8, atol=0)  # another seed, the same eigenvalue
    assert not np.array_equal(runs[2].vectors, runs[0].vectors)  # ... by another random part
    # the start is given up to scale: 3 v0 starts the same run as v0
    scaled = lanczos_eigenpairs(operator, 1, tol=1e-8, seed=0, v0=3.0 * second)
    assert scaled.n_hvp == runs[0].n_hvp
    assert_close(scaled.values, runs[0].values, rtol=1e-14, atol=0)


def test_a_warm_start_is_its_unit_vector_plus_an_orthogonal_random_unit_vector_of_equal_weight():
    model, loss, x, y = silu_classifier()
    hessian = dense_hessian_of(model, loss, x, y)
    second = np.linalg.eigh(hessian)[1][:, -2]
    firsts = []
    for seed in (7, 7, 8):
        inputs = []

        def matvec(v, inputs=inputs):
            inputs.append(np.array(v, dtype=np.float64).reshape(-1))
            return hessian @ inputs[-1]

        operator = LinearOperator(hessian.shape, matvec=matvec, dtype=np.float64)
        lanczos_eigenpairs(operator, 1, tol=1e-8, seed=seed, v0=-5.0 * second)
        firsts.append(inputs[0])  # the first product is taken at the start vector
    start = firsts[0]
    random_part = np.sqrt(2.0) * start + second  # the unit start is -second
    assert_close(np.linalg.norm(start), 1.0, rtol=1e-14, atol=0)
    assert_close(start @ second, -1 / np.sqrt(2.0), rtol=1e-14, atol=0)
    assert_close(np.linalg.norm(random_part), 1.0, rtol=1e-13, atol=0)
    assert abs(random_part @ second) < 1e-13
    assert np.array_equal(firsts[1], start) and not np.allclose(firsts[2], start)  # seeded


def test_no_run_stops_before_the_minimum_krylov_dimension():
    a = np.diag(np.linspace(1.0, 2.0, 50))
    second = np.eye(50)[:, 48]
    for v0 in (second, None):
        for tol in (0.5, 0.9):  # loose enough that the first Ritz pair would pass
            run = lanczos_eigenpairs(a, 1, tol=tol, v0=v0)
            assert run.converged and run.n_hvp == 1 + 3, (tol, v0 is None, run.n_hvp)  # k + MIN_EXTRA_STEPS
    # ... nor a block of k wanted pairs before k + 3; a basis of n vectors stops at n
    assert MIN_EXTRA_STEPS == 3 and lanczos_eigenpairs(a, 3, tol=0.9, v0=np.eye(50)[:, 45:48]).n_hvp == 3 + 3
    assert lanczos_eigenpairs(np.diag([1.0, 2.0, 3.0]), 2, tol=0.9, v0=np.eye(3)[:, 0]).n_hvp == 3


# --- tracking the sharpness through an eigenvalue crossing -----------------------------------


DIM = 30
CROSSING_Q = np.linalg.qr(np.random.default_rng(21).standard_normal((DIM, DIM)))[0]
BULK = np.random.default_rng(22).uniform(-0.4, 0.9, DIM - 2)


def crossing_loss(params, indices=None):
    """``0.5 z^T diag(c(s)) z - s / 2`` with ``z = Q x``: ``c = (3 - s, 1 + s, bulk)``, so at ``x = 0``,
    where gradient descent keeps ``x``, the Hessian is ``Q^T diag(c(s)) Q`` beside a zero for ``s``, whose two
    largest eigenvalues cross at ``s = 1`` on fixed eigenvectors, while ``s`` grows by ``eta / 2`` a step."""
    s, x = params["s"], params["x"]
    c = torch.cat([torch.stack([3.0 - s, 1.0 + s]), torch.as_tensor(BULK) + 0.0 * s])
    z = torch.as_tensor(CROSSING_Q) @ x
    return 0.5 * (c * z * z).sum() - 0.5 * s


def dense_sharpness(params) -> float:
    names = sorted(params)
    sizes = [params[name].numel() for name in names]

    def flat_loss(theta):
        pieces = dict(zip(names, [t.reshape(params[n].shape) for t, n in zip(torch.split(theta, sizes), names)]))
        return crossing_loss(pieces)

    theta = torch.cat([params[name].detach().reshape(-1) for name in names])
    return float(np.linalg.eigvalsh(torch.autograd.functional.hessian(flat_loss, theta).numpy())[-1])


@pytest.mark.parametrize("eigensolver", ["lanczos", "arpack"])
def test_warm_started_tracking_through_an_eigenvalue_crossing(eigensolver):
    params = {"s": torch.tensor(0.0), "x": torch.zeros(DIM)}
    kept = {name: t.clone() for name, t in params.items()}
    steps, measure_at = 12, list(range(13))
    reference = [
        v for _, v in train(crossing_loss, params, sgd(0.5), steps, monitor=dense_sharpness, monitor_every=1).monitored
    ]
    assert_close([reference[0], min(reference), reference[-1]], [3.0, 2.0, 4.0], rtol=1e-14, atol=0)
    assert int(np.argmin(reference)) == 4  # the top pair crossed at step 4, on fixed eigenvectors
    run = cv.closure_sharpness_during_training(
        crossing_loss, params, sgd(0.5), steps, measure_at, tol=1e-10, eigensolver=eigensolver, warm_start=True
    )
    assert_close(run.sharpness, reference, rtol=1e-10, atol=0)
    assert np.all(run.n_hvp >= 1 + MIN_EXTRA_STEPS)
    for name, tensor in kept.items():
        assert torch.equal(params[name], tensor), name


# --- warm starts still save products along a smooth run ------------------------------------


def softplus_regression():
    """A seeded 6 -> 16 -> 16 -> 2 Softplus network (418 parameters), 64 points, mean squared error."""
    with torch.random.fork_rng():
        torch.manual_seed(31)
        model = nn.Sequential(nn.Linear(6, 16), nn.Softplus(), nn.Linear(16, 16), nn.Softplus(), nn.Linear(16, 2))
    model = model.to(torch.float64)
    generator = torch.Generator().manual_seed(32)
    x = torch.randn(64, 6, generator=generator, dtype=torch.float64)
    y = torch.sin(x[:, :2]) + 0.1 * torch.randn(64, 2, generator=generator, dtype=torch.float64)
    return model, nn.MSELoss(), x, y


def test_warm_starts_save_products_along_a_smooth_run_and_agree_with_dense_references():
    model, loss, x, y = softplus_regression()
    before = state_of(model)
    start = {name: p.detach().clone() for name, p in model.named_parameters()}

    def indexed(params, indices=None):
        return loss(functional_call(model, params, (x,)), y)

    def dense(params):
        return float(np.linalg.eigvalsh(dense_hessian_of(model, loss, x, y, params))[-1])

    steps, every = 15, 5
    reference = [v for _, v in train(indexed, start, sgd(0.05), steps, monitor=dense, monitor_every=every).monitored]
    runs = {
        warm: cv.closure_sharpness_during_training(
            indexed, start, sgd(0.05), steps, list(range(steps + 1)), tol=1e-6, eigensolver="lanczos", warm_start=warm
        )
        for warm in (False, True)
    }
    for run in runs.values():  # the eigenvalue to the tolerance asked (the default stop's error bound)
        assert_close(run.sharpness[::every], reference, rtol=1e-6, atol=0)
    cold, warm = runs[False].n_hvp, runs[True].n_hvp
    assert cold[0] == warm[0]  # the first measurement starts cold either way
    assert warm[1:].sum() < 0.9 * cold[1:].sum(), (warm, cold)
    assert_bit_identical(model, before)
    for name, tensor in start.items():
        assert torch.equal(tensor, before[name]), name

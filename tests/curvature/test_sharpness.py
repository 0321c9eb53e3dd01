"""Tests of lossgeom.curvature.sharpness: lambda_max at a point and along a training run.

The sharpness is compared with numpy.linalg.eigvalsh of the dense Hessian, and the
sharpness along training with a recomputation at the same steps.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from small_models import mlp
from torch import nn

from lossgeom import curvature as cv
from lossgeom.parameters import params_of
from lossgeom.training import indexed_loss, sgd, train

from book_extra import from_book
from conftest import assert_close

digits = from_book("lossgeom_book.data", "digits")

pytestmark = pytest.mark.filterwarnings("ignore:.*torch.jit.script.*:DeprecationWarning")


def _tanh_mse(seed=0):
    split = digits(40, 10, seed=seed)
    model = mlp([64, 6, 10], activation="tanh", seed=seed, init_scale=0.5)
    targets = torch.nn.functional.one_hot(split.y_train, 10).double()
    return (
        model,
        indexed_loss(model, nn.MSELoss(), (split.x_train, targets)),
        params_of(model),
        (split.x_train, targets),
    )


def test_lambda_max_is_the_largest_dense_eigenvalue():
    model, loss, params, data = _tanh_mse()
    dense = np.linalg.eigvalsh(cv.closure_hessian(lambda p: loss(p, None), params).numpy())[-1]
    assert_close(np.linalg.eigvalsh(cv.dense_hessian(model, nn.MSELoss(), data).numpy())[-1], dense, rtol=1e-12, atol=0)
    # forward-over-reverse refuses mse (torch's forward-mode rule for its double backward fails)
    for method in ("auto", "reverse-over-reverse"):
        assert_close(cv.lambda_max(model, nn.MSELoss(), data, method=method), dense, rtol=1e-9, atol=0)
    moved = {name: 1.5 * p for name, p in params.items()}
    dense_moved = np.linalg.eigvalsh(cv.dense_hessian(model, nn.MSELoss(), data, params=moved).numpy())[-1]
    assert abs(dense_moved - dense) > 1e-3 * abs(dense)  # the point matters, so params= is checked
    assert_close(cv.lambda_max(model, nn.MSELoss(), data, params=moved), dense_moved, rtol=1e-9, atol=0)


def test_sharpness_during_training_matches_a_recomputation():
    model, loss, params, data = _tanh_mse(1)
    run = cv.closure_sharpness_during_training(loss, params, sgd(1.0), 12, measure_at=[12, 0, 5, 5])
    assert run.measured_at.tolist() == [0, 5, 12] and run.losses.shape == (12,)
    for step, value in zip(run.measured_at, run.sharpness):
        point = train(loss, params, sgd(1.0), int(step)).params if step else params
        assert_close(value, cv.lambda_max(model, nn.MSELoss(), data, params=point), rtol=1e-9, atol=0)
    final = train(loss, params, sgd(1.0), 12)
    assert_close(run.losses, final.losses, rtol=0, atol=0)


def test_sharpness_errors():
    model, loss, params, data = _tanh_mse()
    with pytest.raises(ValueError, match="measure_at must list steps between 0 and steps = 3"):
        cv.closure_sharpness_during_training(loss, params, sgd(0.1), 3, measure_at=[4])
    with pytest.raises(ValueError, match="measure_at must list steps"):
        cv.closure_sharpness_during_training(loss, params, sgd(0.1), 3, measure_at=[])
    with pytest.raises(ValueError, match="method must be one of"):
        cv.lambda_max(model, nn.MSELoss(), data, method="finite differences")
    with pytest.raises(TypeError, match="'mse'"):
        cv.lambda_max(model, "mse", data)
    with pytest.raises(ValueError, match="tol must be > 0"):
        cv.lambda_max(model, nn.MSELoss(), data, tol=0.0)
    with pytest.raises(ValueError, match="eigensolver must be one of"):
        cv.closure_sharpness_during_training(loss, params, sgd(0.1), 3, measure_at=[1], eigensolver="power")
    with pytest.raises(TypeError, match="warm_start must be a bool"):
        cv.closure_sharpness_during_training(loss, params, sgd(0.1), 3, measure_at=[1], warm_start="yes")


def test_warm_started_tracking_agrees_with_cold_and_costs_fewer_products():
    _, loss, params, _ = _tanh_mse(1)
    measure_at, tol = list(range(13)), 1e-6
    cold = cv.closure_sharpness_during_training(loss, params, sgd(1.0), 12, measure_at, tol=tol, eigensolver="arpack")
    assert cold.n_hvp.shape == (len(measure_at),) and np.all(cold.n_hvp >= 20)  # ARPACK's first cycle
    for eigensolver in ("arpack", "lanczos"):
        warm = cv.closure_sharpness_during_training(
            loss, params, sgd(1.0), 12, measure_at, tol=tol, eigensolver=eigensolver, warm_start=True
        )
        assert_close(warm.sharpness, cold.sharpness, rtol=tol, atol=0)
        assert_close(warm.losses, cold.losses, rtol=0, atol=0)  # measuring does not touch training
        assert warm.n_hvp[1:].sum() <= cold.n_hvp[1:].sum()  # ARPACK: its first restart cycle, ncv products
    cold_lanczos = cv.closure_sharpness_during_training(loss, params, sgd(1.0), 12, measure_at, tol=tol)
    assert cold_lanczos.n_hvp[0] == warm.n_hvp[0]  # the first measurement starts cold either way
    # 94 against 122 (ARPACK 252): the warm start carries a random part of equal weight (see lossgeom.curvature.lanczos)
    assert warm.n_hvp[1:].sum() < 0.9 * cold_lanczos.n_hvp[1:].sum() < cold.n_hvp[1:].sum()

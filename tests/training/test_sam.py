"""Tests of sharpness-aware minimisation in lossgeom.training (sam, closure_sam_gradient, train)."""

from __future__ import annotations

import pytest
import torch

from lossgeom import training
from lossgeom.training import Optimiser

from conftest import assert_close

A = torch.diag(torch.tensor([1.0, 10.0]))


def quadratic(params, indices=None):
    return 0.5 * params["w"] @ A @ params["w"]


def test_one_sam_step_on_a_quadratic_matches_the_closed_form():
    w0, eta, rho = torch.tensor([1.0, -2.0]), 0.05, 0.3
    run = training.train(quadratic, {"w": w0}, training.sam(training.sgd(eta), rho), 1)
    g = A @ w0
    assert_close(run.params["w"], w0 - eta * A @ (w0 + rho * g / g.norm()), rtol=1e-14, atol=0)
    assert run.losses[0] == pytest.approx(float(quadratic({"w": w0})))  # the loss at w, not at the ascent point


def test_sam_feeds_the_base_update_including_decoupled_weight_decay():
    w0 = {"w": torch.tensor([0.5, 0.25])}
    base = training.adam(0.01, weight_decay=0.1)
    sam_run = training.train(quadratic, w0, training.sam(base, 0.2), 3)
    params, state = dict(w0), base.init(w0)
    for _ in range(3):
        grads = training.rules.closure_sam_gradient(quadratic, params, 0.2)
        params, state = base.update(params, grads, state)
    assert_close(sam_run.params["w"], params["w"], rtol=1e-14, atol=0)


def test_zero_gradient_and_default_are_plain_steps():
    at_minimum = {"w": torch.zeros(2)}
    assert_close(training.rules.closure_sam_gradient(quadratic, at_minimum, 0.5)["w"], torch.zeros(2), rtol=0, atol=0)
    plain = training.train(quadratic, {"w": torch.ones(2)}, training.sgd(0.1), 4)
    assert training.sgd(0.1).sam_radius == 0.0
    assert_close(plain.params["w"], torch.tensor([0.9**4, (-0.0) ** 4]), rtol=1e-14, atol=1e-15)


def test_sam_errors():
    with pytest.raises(ValueError, match="radius must be > 0"):
        training.sam(training.sgd(0.1), 0.0)
    with pytest.raises(TypeError, match="base must be an Optimiser"):
        training.sam("sgd", 0.1)
    with pytest.raises(ValueError, match="sam_radius must be >= 0"):
        training.Optimiser("sgd", 0.1, sam_radius=-1.0)


def test_an_optimiser_that_would_step_uphill_is_refused():
    with pytest.raises(ValueError, match="lr must be a finite number > 0"):
        Optimiser("sgd", -0.5)
    with pytest.raises(ValueError, match="lr must be a finite number > 0"):
        Optimiser("adam", float("nan"))
    with pytest.raises(ValueError, match="weight_decay must be >= 0"):
        Optimiser("sgd", 0.1, weight_decay=-1.0)
    assert Optimiser("sgd", 0.1).lr == 0.1


def test_training_with_a_misspelt_parameter_name_says_which():
    model = torch.nn.Linear(3, 2, dtype=torch.float64)
    x, y = torch.randn(8, 3, dtype=torch.float64), torch.randint(0, 2, (8,))
    loss = training.indexed_loss(model, torch.nn.CrossEntropyLoss(), (x, y))
    start = {"weigth": model.weight.detach().clone(), "bias": model.bias.detach().clone()}
    with pytest.raises(ValueError, match=r"'weigth' \(did you mean 'weight'\?\)"):
        training.train(loss, start, training.sgd(0.1), 3)

"""Tests of lossgeom.symmetries.relu_neuron_rescaling (Chapter 4)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from small_models import mlp

from lossgeom.curvature import closure_gradient
from lossgeom.models import loss_closure
from lossgeom.parameters import flatten_params, params_of
from lossgeom.symmetries import audit_symmetry, relu_neuron_rescaling

from book_extra import from_book
from conftest import assert_close

digits = from_book("lossgeom_book.data", "digits")


def _net(bias=True):
    model = mlp([64, 7, 10], seed=4, bias=bias)
    return model, params_of(model), digits(50, 10, seed=0).x_train


def _forward(model):
    return lambda p, x: torch.func.functional_call(model, p, (x,))


@pytest.mark.parametrize("bias", [True, False], ids=["with-bias", "no-bias"])
def test_rescaling_preserves_outputs_and_moves_params(bias):
    model, params, x = _net(bias)
    scales = np.geomspace(0.1, 10.0, 7)
    sym = relu_neuron_rescaling("0", "2", scales)
    moved = sym(params)
    assert_close(_forward(model)(moved, x), _forward(model)(params, x), rtol=1e-12, atol=1e-12)
    assert_close(moved["0.weight"], params["0.weight"] * torch.tensor(scales)[:, None], rtol=1e-15, atol=0)
    assert_close(moved["2.weight"], params["2.weight"] / torch.tensor(scales)[None, :], rtol=1e-15, atol=0)
    if bias:
        assert_close(moved["0.bias"], params["0.bias"] * torch.tensor(scales), rtol=1e-15, atol=0)
        assert torch.equal(moved["2.bias"], params["2.bias"])
    report = audit_symmetry(_forward(model), params, sym, x, tol=1e-10)
    assert report.is_symmetry


def test_negative_scale_is_not_a_symmetry_of_relu():
    # the audit must catch what positivity guards against: relu(-z) != -relu(z)
    model, params, x = _net()
    flip = dict(params)
    flip["0.weight"], flip["0.bias"], flip["2.weight"] = -params["0.weight"], -params["0.bias"], -params["2.weight"]
    gap = (_forward(model)(flip, x) - _forward(model)(params, x)).abs().max()
    assert gap > 1e-2


def test_tangent_is_orthogonal_to_the_gradient():
    model, params, _ = _net()
    split = digits(50, 10, seed=0)
    loss_fn = loss_closure(model, torch.nn.CrossEntropyLoss(), (split.x_train, split.y_train))
    grad = closure_gradient(loss_fn, params)
    for j in range(7):
        tangent = torch.func.jvp(
            lambda c, j=j: flatten_params(
                relu_neuron_rescaling("0", "2", torch.ones(7) + (c - 1) * torch.eye(7)[j])(params)
            )[0],
            (torch.tensor(1.0),),
            (torch.tensor(1.0),),
        )[1]
        assert abs(float(grad @ tangent)) <= 1e-13 * float(grad.norm() * tangent.norm())


def test_errors():
    model, params, _ = _net()
    with pytest.raises(ValueError, match="> 0"):
        relu_neuron_rescaling("0", "2", [1.0, -1.0])
    with pytest.raises(ValueError, match="> 0"):
        relu_neuron_rescaling("0", "2", [1.0, float("inf")])
    with pytest.raises(ValueError, match="1-D"):
        relu_neuron_rescaling("0", "2", [[1.0]])
    with pytest.raises(ValueError, match="1-D"):
        relu_neuron_rescaling("0", "2", [])
    with pytest.raises(ValueError, match="must agree"):
        relu_neuron_rescaling("0", "2", np.ones(3))(params)
    with pytest.raises(ValueError, match="needs params"):
        relu_neuron_rescaling("1", "2", np.ones(7))(params)


def test_rescaling_keeps_a_float32_models_dtype():
    # the scales are stored in float64; a float32 model must stay float32 (same arithmetic)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).float()
    params = {k: v.detach() for k, v in model.named_parameters()}
    moved = relu_neuron_rescaling("0", "2", [0.5, 1.0, 2.0, 4.0])(params)
    assert all(v.dtype == torch.float32 for v in moved.values())
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(0)).float()
    gap = (_forward(model)(moved, x) - _forward(model)(params, x)).abs().max()
    assert float(gap) <= 1e-5 * float(_forward(model)(params, x).abs().max())


def test_rescaling_of_conv_channels_matches_a_per_channel_computation():
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.ReLU(), torch.nn.Conv2d(3, 4, 2)).double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    scales = [0.25, 3.0, 1.5]
    moved = relu_neuron_rescaling("0", "2", scales, units_last=False)(params)
    for j, c in enumerate(scales):
        assert_close(moved["0.weight"][j], params["0.weight"][j] * c, rtol=1e-15, atol=0)
        assert_close(moved["0.bias"][j], params["0.bias"][j] * c, rtol=1e-15, atol=0)
        assert_close(moved["2.weight"][:, j], params["2.weight"][:, j] / c, rtol=1e-15, atol=0)
    x = torch.randn(5, 2, 7, 7, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert_close(_forward(model)(moved, x), _forward(model)(params, x), rtol=1e-12, atol=1e-12)

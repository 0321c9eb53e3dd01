"""Tests of lossgeom.symmetries.relu_neuron_rescaling (Chapter 4)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lossgeom.data import digits
from lossgeom.models import mlp, params_of
from lossgeom.symmetries import audit_symmetry, relu_neuron_rescaling

from conftest import assert_close


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
    from lossgeom.curvature import dense_gradient, flatten_params
    from lossgeom.models import loss_closure

    model, params, _ = _net()
    split = digits(50, 10, seed=0)
    loss_fn = loss_closure(model, split.x_train, split.y_train)
    grad = dense_gradient(loss_fn, params)
    for j in range(7):
        tangent = torch.func.jvp(
            lambda c: flatten_params(relu_neuron_rescaling("0", "2", torch.ones(7) + (c - 1) * torch.eye(7)[j])(params))[0],
            (torch.tensor(1.0),), (torch.tensor(1.0),))[1]
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

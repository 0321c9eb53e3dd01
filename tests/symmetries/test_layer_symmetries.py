"""Tests of symmetries.linear_layer_mixing and homogeneous_neuron_rescaling, and tasks.QuadraticMLP."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lossgeom import symmetries
from lossgeom.training import adam

from book_extra import from_book
from conftest import assert_close

tasks = from_book("lossgeom_book.tasks")


class Square(torch.nn.Module):
    def forward(self, z):
        return z * z


def bottleneck(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 2), torch.nn.Linear(2, 5), Square(), torch.nn.Linear(5, 3, bias=False)
    ).double()


def outputs(model, params, x):
    return torch.func.functional_call(model, params, (x,))


def test_linear_mixing_keeps_outputs_and_moves_weights():
    model, x = bottleneck(), torch.randn(10, 4, generator=torch.Generator().manual_seed(1))
    params = {k: v.detach() for k, v in model.named_parameters()}
    mix = symmetries.linear_layer_mixing("0", "1", torch.tensor([[1.0, 2.0], [0.5, 3.0]]))
    moved = mix(params)
    assert_close(outputs(model, moved, x), outputs(model, params, x), rtol=1e-12, atol=1e-12)
    assert_close(moved["0.bias"], torch.tensor([[1.0, 2.0], [0.5, 3.0]]) @ params["0.bias"], rtol=1e-15, atol=0)
    assert float((moved["1.weight"] - params["1.weight"]).abs().max()) > 0.1
    report = symmetries.audit_symmetry(lambda q, z: outputs(model, q, z), params, mix, x, tol=1e-10)
    assert report.is_symmetry and "condition number" in report.symmetry


def test_degree_two_rescaling_keeps_square_networks_and_degree_one_is_relu_rescaling():
    model, x = bottleneck(2), torch.randn(10, 4, generator=torch.Generator().manual_seed(3))
    params = {k: v.detach() for k, v in model.named_parameters()}
    scales = torch.tensor([0.5, 2.0, 1.5, 0.8, 3.0])
    square = symmetries.homogeneous_neuron_rescaling("1", "3", scales, degree=2)
    assert_close(outputs(model, square(params), x), outputs(model, params, x), rtol=1e-12, atol=1e-12)
    assert_close(square(params)["3.weight"], params["3.weight"] / scales**2, rtol=1e-15, atol=0)
    linear = symmetries.homogeneous_neuron_rescaling("1", "3", scales, degree=1)(params)
    relu = symmetries.relu_neuron_rescaling("1", "3", scales)(params)
    assert all(torch.equal(linear[k], relu[k]) for k in params)


def test_quadratic_mlp_equals_the_dense_one_hot_product():
    model = tasks.QuadraticMLP(7, 5, seed=4, init_scale=2.0)
    pairs = torch.tensor([[0, 6], [3, 3], [6, 1]])
    one_hot = torch.cat(
        [torch.nn.functional.one_hot(pairs[:, 0], 7), torch.nn.functional.one_hot(pairs[:, 1], 7)], dim=1
    ).double()
    dense = ((one_hot @ model.input.weight.T) ** 2) @ model.classifier.weight.T
    with torch.no_grad():
        assert_close(model(pairs), dense, rtol=1e-14, atol=1e-15)
    bound = 2.0 / np.sqrt(14)
    assert float(model.input.weight.detach().abs().max()) <= bound
    rescale = symmetries.homogeneous_neuron_rescaling(
        "input", tasks.CLASSIFIER.split(".")[0], torch.linspace(0.5, 2, 5), degree=2
    )
    params = {k: v.detach() for k, v in model.named_parameters()}
    with torch.no_grad():
        assert_close(torch.func.functional_call(model, rescale(params), (pairs,)), model(pairs), rtol=1e-12, atol=1e-12)


def test_generalisation_curve_records_both_accuracies_and_brackets_crossings():
    split = tasks.modular_arithmetic(7, "add", 0.6, seed=0)
    curve = tasks.generalisation_curve(tasks.QuadraticMLP(7, 16, seed=0), split, adam(0.05), 60, every=10)
    assert list(curve.checkpoints) == [0, 10, 20, 30, 40, 50, 60]
    assert curve.train_accuracy.shape == curve.test_accuracy.shape == (7,)
    reached = curve.steps_to_reach(curve.train_accuracy.max(), split="train")
    assert reached is not None and reached[1] - reached[0] in (0, 10)
    assert curve.steps_to_reach(1.5) is None


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="matrix must be invertible"):
        symmetries.linear_layer_mixing("0", "1", torch.tensor([[1.0, 2.0], [2.0, 4.0]]))
    with pytest.raises(ValueError, match="matrix must be square"):
        symmetries.linear_layer_mixing("0", "1", torch.ones(2, 3))
    params = {k: v.detach() for k, v in bottleneck().named_parameters()}
    with pytest.raises(ValueError, match="they must agree"):
        symmetries.linear_layer_mixing("0", "1", torch.eye(3))(params)
    with pytest.raises(ValueError, match="linear_layer_mixing needs params"):
        symmetries.linear_layer_mixing("7", "1", torch.eye(2))(params)
    with pytest.raises(ValueError, match="degree must be an int >= 1"):
        symmetries.homogeneous_neuron_rescaling("1", "3", torch.ones(5), degree=0)
    with pytest.raises(ValueError, match="scales must be finite and > 0"):
        symmetries.homogeneous_neuron_rescaling("1", "3", -torch.ones(5), degree=2)
    with pytest.raises(ValueError, match="split must be 'test' or 'train'"):
        tasks.GeneralisationCurve({}, np.array([0]), np.array([1.0]), np.array([1.0]), 0.0).steps_to_reach(0.5, "val")
    with pytest.raises(ValueError, match="x must hold token ids"):
        tasks.QuadraticMLP(5, 3)(torch.tensor([[0, 9]]))

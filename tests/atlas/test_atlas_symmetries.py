"""The transforms the atlas adds to lossgeom.symmetries: layer and normalisation rescalings, the reference class."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lossgeom.symmetries import (
    audit,
    compose,
    layer_rescaling,
    normalisation_rescaling,
    relu_neuron_rescaling,
    unit_permutation,
)
from lossgeom.symmetries.layers import reference_class, reference_class_shift
from lossgeom.symmetries.registry import classifier_layer, find_layer_rescalings, find_normalisation_rescalings

F64 = dict(dtype=torch.float64)


def conv_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 3, 3, **F64),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(12, 5, **F64),
        nn.LayerNorm(5, eps=1e-14, **F64),
        nn.ReLU(),
        nn.Linear(5, 4, **F64),
    )


def outputs(model, params, x):
    return torch.func.functional_call(model, params, (x,))


def test_layer_rescaling_is_the_per_neuron_rescaling_with_equal_scales():
    model = conv_net()
    params = dict(model.named_parameters())
    by_layer = layer_rescaling("0", "4", 3.0)(params)
    by_units = relu_neuron_rescaling("0", "4", [3.0] * 3, units_last=False)(params)
    for key in params:
        assert torch.allclose(by_layer[key], by_units[key], rtol=1e-15, atol=0)
    x = torch.randn(6, 1, 6, 6, **F64)
    assert torch.allclose(outputs(model, by_layer, x), outputs(model, params, x), rtol=1e-12, atol=1e-12)


def test_normalisation_rescaling_keeps_the_outputs_up_to_the_norms_eps():
    model = conv_net()
    params = dict(model.named_parameters())
    x = torch.randn(6, 1, 6, 6, **F64)
    moved = normalisation_rescaling("4", 5.0)(params)
    assert torch.equal(moved["4.weight"], 5.0 * params["4.weight"])
    assert torch.equal(moved["4.bias"], 5.0 * params["4.bias"])
    assert torch.allclose(outputs(model, moved, x), outputs(model, params, x), rtol=1e-11, atol=1e-11)
    model[5].eps = 1e-1  # a large eps breaks the scale invariance, and the audit sees it
    report = audit(model, None, x, symmetries=[normalisation_rescaling("4", 5.0)], require_symmetry=False)
    assert not report[0].is_symmetry


def test_reference_class_shift_zeroes_row_r_and_keeps_the_probabilities():
    model = conv_net()
    params = dict(model.named_parameters())
    moved = reference_class_shift("7.weight", 2, bias="7.bias")(params)
    assert torch.equal(moved["7.weight"], reference_class(params["7.weight"], 2))
    assert torch.equal(moved["7.weight"][2], torch.zeros(5, **F64)) and moved["7.bias"][2] == 0
    x = torch.randn(6, 1, 6, 6, **F64)
    p_before = torch.softmax(outputs(model, params, x), -1)
    assert torch.allclose(torch.softmax(outputs(model, moved, x), -1), p_before, rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="class index"):
        reference_class_shift("7.weight", 9)(params)
    with pytest.raises(TypeError, match="int class index"):
        reference_class_shift("7.weight", 1.0)


def test_compose_applies_in_order_and_refuses_mixed_invariants():
    model = conv_net()
    params = dict(model.named_parameters())
    first, second = unit_permutation("0", "4", [2, 0, 1], units_last=False), layer_rescaling("0", "4", 2.0)
    both = compose([first, second], "both")(params)
    by_hand = second(first(params))
    assert all(torch.equal(both[key], by_hand[key]) for key in params)
    with pytest.raises(ValueError, match="different invariants"):
        compose([first, reference_class_shift("7.weight", 0)])
    with pytest.raises(TypeError, match="non-empty sequence"):
        compose([])


def test_the_finders_read_the_graph_and_say_what_they_refuse():
    model = conv_net()
    found = find_layer_rescalings(model, 2.0)
    assert [s.name for s in found] == ["ReLU layer rescaling of 0 -> 4, c = 2"]
    assert any("LayerNorm" in reason for reason in found.skipped)
    norms = find_normalisation_rescalings(model, 2.0)
    assert [s.name for s in norms] == ["rescaling of layer 4 before LayerNorm 5 (eps 1e-14), c = 2"]
    batch = nn.Sequential(nn.Linear(3, 4, **F64), nn.BatchNorm1d(4, **F64), nn.ReLU(), nn.Linear(4, 2, **F64)).eval()
    refused = find_normalisation_rescalings(batch, 2.0)
    assert not refused.symmetries and "stored statistics" in refused.skipped[0]
    tanh = nn.Sequential(nn.Linear(3, 4, **F64), nn.Tanh(), nn.Linear(4, 2, **F64))
    assert "not positively homogeneous" in find_layer_rescalings(tanh, 2.0).skipped[0]
    assert classifier_layer(model) == ("7.weight", "7.bias")
    assert classifier_layer(nn.Sequential(nn.Linear(3, 2, bias=False), nn.LogSoftmax(-1))) == ("0.weight", None)
    assert classifier_layer(nn.Sequential(nn.Linear(3, 2), nn.Tanh())) is None
    with pytest.raises(ValueError, match="c must be > 0"):
        layer_rescaling("0", "4", -1.0)


def test_every_new_transform_is_a_symmetry_under_the_module_audit():
    model = conv_net()
    x = torch.randn(8, 1, 6, 6, **F64)
    chosen = [
        layer_rescaling("0", "4", 0.3),
        normalisation_rescaling("4", 7.0),
        reference_class_shift("7.weight", 1, bias="7.bias"),
    ]
    table = audit(model, None, x, symmetries=chosen)
    assert len(table) == len(chosen) == 3  # one report per transform: `all` below is not over an empty table
    assert [report.symmetry for report in table] == [symmetry.name for symmetry in chosen]
    for report in table:
        assert report.is_symmetry, report.symmetry
        assert report.relative_discrepancy <= report.relative_tolerance

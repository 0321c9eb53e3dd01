"""The functional form of a model: params_of, loss closures, accuracy, errors."""

import pytest
import torch
from small_models import mlp

from lossgeom.curvature import closure_gradient
from lossgeom.models import accuracy, loss_closure
from lossgeom.parameters import params_of


def test_params_of_copies_parameters_and_on_request_buffers_or_trainable_views():
    model = torch.nn.Sequential(
        torch.nn.Linear(2, 3, dtype=torch.float64), torch.nn.BatchNorm1d(3, dtype=torch.float64)
    ).eval()
    model[0].bias.requires_grad_(False)
    params = params_of(model)
    assert list(params) == ["0.weight", "0.bias", "1.weight", "1.bias"]
    params["0.weight"].add_(1.0)  # a copy: the model is untouched
    assert not torch.equal(params["0.weight"], model[0].weight)
    state = params_of(model, buffers=True)
    assert list(state) == [*params, "1.running_mean", "1.running_var", "1.num_batches_tracked"]
    trainable = params_of(model, trainable_only=True, copy=False)
    assert list(trainable) == ["0.weight", "1.weight", "1.bias"]
    assert trainable["0.weight"].data_ptr() == model[0].weight.data_ptr()  # a view of the model's storage
    assert not trainable["0.weight"].requires_grad
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        params_of({"w": torch.zeros(2)})


def test_loss_closure_matches_module_call_and_differentiates():
    model = mlp([4, 5, 3], activation="tanh", seed=0)
    x = torch.randn(7, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0])
    fn = loss_closure(model, torch.nn.CrossEntropyLoss(), (x, y))
    params = params_of(model)
    assert torch.allclose(fn(params), torch.nn.functional.cross_entropy(model(x), y), rtol=1e-14)
    grad = closure_gradient(fn, params)
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    ref = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert torch.allclose(grad, ref, rtol=1e-12, atol=1e-14)


def test_bad_inputs_are_named():
    model = mlp([2, 2])
    with pytest.raises(ValueError, match="same number of examples"):
        loss_closure(model, torch.nn.CrossEntropyLoss(), (torch.zeros(3, 2), torch.zeros(2, dtype=torch.long)))
    with pytest.raises(TypeError, match="loss must be a loss module, got the string 'cross_entropy'"):
        loss_closure(model, "cross_entropy", (torch.zeros(3, 2), torch.zeros(3, dtype=torch.long)))
    with pytest.raises(TypeError, match="data must be one"):
        loss_closure(model, torch.nn.CrossEntropyLoss(), torch.zeros(3, 2))
    bn = torch.nn.Sequential(torch.nn.Linear(2, 2, dtype=torch.float64), torch.nn.BatchNorm1d(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="batch norm in training mode"):
        loss_closure(bn, torch.nn.CrossEntropyLoss(), (torch.zeros(3, 2), torch.zeros(3, dtype=torch.long)))
    with pytest.raises(ValueError, match="x must contain only finite values"):
        loss_closure(
            model, torch.nn.CrossEntropyLoss(), (torch.full((3, 2), float("nan")), torch.zeros(3, dtype=torch.long))
        )


def test_accuracy_counts_argmax_hits_over_all_batches_at_the_given_point():
    model = torch.nn.Linear(2, 3, dtype=torch.float64)
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    point = {"weight": weight, "bias": torch.zeros(3, dtype=torch.float64)}
    y = torch.tensor([0, 1, 0, 2])  # predictions at the point: 0, 1, 0 or 1 (tie -> first), 2
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert accuracy(model, (x, y), params=point) == 1.0
    assert accuracy(model, [(x[:1], torch.tensor([2])), (x[1:], y[1:])], params=point) == 0.75
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the model is untouched
    with pytest.raises(ValueError, match="do not match predictions"):
        accuracy(model, (x, y[:, None]), params=point)
    with pytest.raises(TypeError, match="model must be"):
        accuracy(lambda v: v, (x, y))

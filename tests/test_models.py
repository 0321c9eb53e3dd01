"""Small models: seeded, float64, functional loss closures, errors."""

import pytest
import torch

from lossgeom.curvature import closure_gradient
from lossgeom.models import accuracy, loss_closure, mlp, params_of


def test_mlp_is_seeded_float64_and_leaves_global_rng_alone():
    state = torch.random.get_rng_state()
    a, b = mlp([4, 3, 2], seed=1), mlp([4, 3, 2], seed=1)
    assert torch.equal(torch.random.get_rng_state(), state)
    pa, pb = params_of(a), params_of(b)
    assert all(torch.equal(pa[k], pb[k]) and pa[k].dtype == torch.float64 for k in pa)
    assert not torch.equal(params_of(mlp([4, 3, 2], seed=2))["0.weight"], pa["0.weight"])
    assert torch.allclose(params_of(mlp([4, 3, 2], seed=1, init_scale=2.0))["0.weight"], 2 * pa["0.weight"])


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
    with pytest.raises(ValueError, match="sizes must list >= 2 positive ints"):
        mlp([4])
    with pytest.raises(ValueError, match="activation must be one of"):
        mlp([4, 2], activation="sigmoidish")
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

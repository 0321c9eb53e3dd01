"""The book's small models: the seeded MLP and the two-layer ReLU students."""

import pytest
import torch

from lossgeom.flatness.relu_quotient import two_layer_weights
from lossgeom.parameters import params_of
from lossgeom_book.models import as_params, mlp, regression_loss, relu_network, two_layer_relu


def test_mlp_is_seeded_float64_and_leaves_global_rng_alone():
    state = torch.random.get_rng_state()
    a, b = mlp([4, 3, 2], seed=1), mlp([4, 3, 2], seed=1)
    assert torch.equal(torch.random.get_rng_state(), state)
    pa, pb = params_of(a), params_of(b)
    assert all(torch.equal(pa[k], pb[k]) and pa[k].dtype == torch.float64 for k in pa)
    assert not torch.equal(params_of(mlp([4, 3, 2], seed=2))["0.weight"], pa["0.weight"])
    assert torch.allclose(params_of(mlp([4, 3, 2], seed=1, init_scale=2.0))["0.weight"], 2 * pa["0.weight"])


def test_two_layer_relu_its_weights_and_its_functional_forward_agree():
    net = two_layer_relu(3, 5, seed=2)
    a, W = two_layer_weights(net)
    x = torch.randn(7, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert torch.allclose(relu_network(a, W, x), net(x)[:, 0], rtol=1e-14, atol=1e-15)
    assert all(torch.equal(p, q) for p, q in zip(as_params(a, W).values(), params_of(net).values()))
    y = torch.linspace(-1.0, 1.0, 7, dtype=torch.float64)
    expected = 0.5 * ((net(x)[:, 0] - y) ** 2).mean()
    assert torch.allclose(regression_loss(a, W, x, y), expected, rtol=1e-14)
    wide = two_layer_relu(3, 5, k=2, seed=2)
    a2, W2 = two_layer_weights(wide)
    assert torch.allclose(relu_network(a2, W2, x), wide(x), rtol=1e-14, atol=1e-15)
    assert all(torch.equal(p, q) for p, q in zip(as_params(a2, W2).values(), params_of(wide).values()))


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="sizes must list >= 2 positive ints"):
        mlp([4])
    with pytest.raises(ValueError, match="activation must be one of"):
        mlp([4, 2], activation="sigmoidish")
    with pytest.raises(ValueError, match="init_scale must be > 0"):
        two_layer_relu(4, 10, init_scale=0.0)
    with pytest.raises(ValueError, match="a must have shape"):
        relu_network(torch.ones(3), torch.ones(4, 2), torch.ones(5, 2))
    with pytest.raises(ValueError, match=r"x must have shape \(n, 2\)"):
        relu_network(torch.ones(4), torch.ones(4, 2), torch.ones(5, 3))
    with pytest.raises(ValueError, match=r"y must have shape \(5,\)"):
        regression_loss(torch.ones(4), torch.ones(4, 2), torch.ones(5, 2), torch.ones(4))
    with pytest.raises(ValueError, match="as_params takes one network"):
        as_params(torch.ones(2, 4), torch.ones(2, 4, 2))

"""Tests of lossgeom_book.layer_symmetries: the batch-norm moves with the running statistics fixed or moved.

In eval mode the running statistics are buffers, so a symmetry of the loss as a function of
the parameters must leave them alone: :func:`ls.batchnorm_parameter_rescaling` does, the
library's :func:`lossgeom.symmetries.batchnorm_scale_invariance` moves them. Each test
recomputes the answer another way (the outputs, the eval-mode gradient, the Hessian).
"""

import pytest
import torch
from torch import nn

from lossgeom import curvature, symmetries
from lossgeom_book import architectures as arch
from lossgeom_book import data
from lossgeom_book import layer_symmetries as ls

CE = nn.CrossEntropyLoss()


@pytest.fixture(scope="module")
def digits():
    return data.digits(32, 16, seed=0)


@pytest.fixture(scope="module")
def resnet(digits):
    return arch.train_model(arch.DigitsResNet(2, seed=0), digits, steps=8, lr=0.03).model


def largest_output_change(model, probe, move):
    with torch.no_grad():
        before, after = model(probe), move.applied(model)(probe)
    return float((after - before).abs().max() / before.abs().max())


def test_the_parameters_only_bn_scale_keeps_the_function_and_the_statistics(digits, resnet):
    scales = torch.tensor([0.3, 4.0], dtype=torch.float64)
    move = ls.batchnorm_parameter_rescaling("block1.conv1", "block1.bn1", scales, eps=resnet.block1.bn1.eps)
    moved = move.applied(resnet)
    assert largest_output_change(resnet, digits.x_test, move) < 1e-12
    for key in ("running_mean", "running_var"):
        assert torch.equal(getattr(moved.block1.bn1, key), getattr(resnet.block1.bn1, key))
    assert torch.allclose(moved.block1.bn1.weight, resnet.block1.bn1.weight / scales)
    # negative control: the weight alone, statistics and affine left behind, changes the outputs
    alone = symmetries.Symmetry(
        "conv rows scaled alone",
        lambda s: {**s, "block1.conv1.weight": s["block1.conv1.weight"] * scales[:, None, None, None]},
    )
    assert largest_output_change(resnet, digits.x_test, alone) > 1e-3
    with pytest.raises(ValueError, match="positive"):
        ls.batchnorm_parameter_rescaling("conv", "bn", [1.0, -2.0], eps=1e-5)


def test_fixed_statistics_tangents_are_orthogonal_to_the_eval_gradient_and_moved_ones_are_not(digits, resnet):
    probe = (digits.x_train, digits.y_train)
    fixed = ls.resnet_scale_tangents(resnet, statistics="fixed")
    moved = ls.resnet_scale_tangents(resnet, statistics="moved")
    assert int(torch.linalg.matrix_rank(fixed)) == int(torch.linalg.matrix_rank(moved)) == 15 * resnet.width
    g = curvature.references.dense_gradient(resnet, CE, probe)
    cos = lambda T: (g @ T).abs() / (g.norm() * T.norm(dim=0))
    n_bn = 9 * resnet.width
    assert float(cos(fixed).max()) < 1e-10  # every column is a symmetry's tangent: <grad L, t> = 0
    assert float(cos(moved)[:n_bn].max()) > 1e-3  # W alone along its rows, statistics fixed: not one
    assert torch.equal(fixed[:, n_bn:], moved[:, n_bn:])  # the other moves act on parameters only
    # with the statistics fixed, the moved-statistics tangent W_j is not a Hessian null direction
    H = curvature.hessian_operator(resnet, CE, probe)
    largest = lambda T: float((H @ (T / T.norm(dim=0))).norm(dim=0).max())
    assert largest(moved[:, :n_bn]) > 3 * largest(fixed[:, :n_bn])  # 11x here
    with pytest.raises(ValueError, match="statistics"):
        ls.resnet_moves(resnet, lambda n: torch.ones(n, dtype=torch.float64), statistics="frozen")


def test_eval_mode_alignment_is_not_zero_where_train_mode_alignment_is(digits, resnet):
    probe = (digits.x_train, digits.y_train)
    train = ls.train_mode_alignment(resnet, probe, eps=1e-20)
    evaluated = ls.eval_mode_alignment(resnet, probe)
    assert set(train) == set(evaluated) and len(train) == 6
    assert max(abs(v) for v in train.values()) < 1e-10
    assert max(abs(v) for v in evaluated.values()) > 1e-3
    # recomputed by hand for one weight: the cosine of the eval-mode gradient with the weight
    params = dict(resnet.named_parameters())
    loss = CE(resnet.eval()(probe[0]), probe[1])
    (grad,) = torch.autograd.grad(loss, params["conv.weight"])
    w = params["conv.weight"].detach()
    assert evaluated["conv.weight"] == pytest.approx(float((grad * w).sum() / (grad.norm() * w.norm())), abs=1e-12)

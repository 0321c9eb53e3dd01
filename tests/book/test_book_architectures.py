"""Tests of lossgeom_book.architectures and lossgeom_book.layer_symmetries (Chapter 13)."""

import pytest
import torch

from lossgeom_book import architectures as arch
from lossgeom_book import data, tasks
from lossgeom_book import layer_symmetries as ls


@pytest.fixture(scope="module")
def digits():
    return data.digits(32, 16, seed=0)


@pytest.fixture(scope="module")
def resnet_fit(digits):
    return arch.train_model(arch.DigitsResNet(2, seed=0), digits, steps=8, lr=0.03)


@pytest.fixture(scope="module")
def encoder_fit():
    split = tasks.modular_arithmetic(5, "add", train_fraction=0.6, seed=0)
    return split, arch.train_model(
        arch.ModularEncoder(5, d_model=4, n_heads=2, d_ff=4), split, steps=30, lr=0.02, batch_size=8
    )


def test_shapes_and_dtype(digits):
    net = arch.DigitsResNet(2, seed=0).eval()
    assert net(digits.x_train[:5]).shape == (5, 10)
    enc = arch.ModularEncoder(7, d_model=4, n_heads=2, d_ff=4).eval()
    assert enc(torch.tensor([[1, 2], [3, 4]])).shape == (2, 7)
    assert all(p.dtype == torch.float64 for p in enc.parameters())


def test_seeded_construction_is_deterministic():
    a, b = arch.DigitsResNet(2, seed=3), arch.DigitsResNet(2, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_training_lowers_the_loss_and_is_deterministic(digits, resnet_fit):
    assert resnet_fit.losses[-1] < resnet_fit.losses[0]
    again = arch.train_model(arch.DigitsResNet(2, seed=0), digits, steps=8, lr=0.03)
    assert again.train_loss == resnet_fit.train_loss
    assert not resnet_fit.model.training


def test_minibatch_training_lowers_the_loss(encoder_fit):
    split, fit = encoder_fit
    assert fit.losses[-1] < fit.losses[0]
    assert fit.gap == pytest.approx(fit.test_loss - fit.train_loss)


def test_resnet_moves_preserve_outputs(digits, resnet_fit):
    for move in ls.resnet_symmetries(resnet_fit.model, seed=1).values():
        assert ls.output_gap(resnet_fit.model, ls.transformed(resnet_fit.model, move), digits.x_test) < 1e-11
    assert torch.linalg.matrix_rank(ls.resnet_scale_tangents(resnet_fit.model)) == 15 * 2


def test_attention_gauge_preserves_outputs_and_has_the_predicted_dimension(encoder_fit):
    split, fit = encoder_fit
    g = torch.Generator().manual_seed(0)
    A = [torch.eye(2) + 0.5 * torch.randn(2, 2, generator=g) for _ in range(2)]
    attn = "encoder.layers.0.self_attn"
    for move in (ls.attention_gauge(attn, 4, 2, A, A), ls.head_permutation(attn, 4, 2, [1, 0])):
        assert ls.output_gap(fit.model, ls.transformed(fit.model, move), split.x_test) < 1e-11
    assert torch.linalg.matrix_rank(ls.attention_gauge_tangents(fit.model, attn, 4, 2)) == 2 * (4 + 4)


def test_a_wrong_bn_scale_is_caught(digits, resnet_fit):
    wrong = lambda s: {**s, "conv.weight": 2 * s["conv.weight"]}  # statistics left behind
    assert ls.output_gap(resnet_fit.model, ls.transformed(resnet_fit.model, wrong), digits.x_test) > 1e-3


def test_family_study_returns_what_it_says(digits):
    settings = arch.family_settings(4, steps=5)
    measure = {"norm": lambda m, d: float(sum(p.detach().norm() for p in m.parameters()))}
    study = arch.family_study(digits, settings, measure, (digits.x_train, digits.y_train))
    assert study.gaps.shape == (4,) and study.before["norm"].shape == (4,)
    assert set(study.tau_before) == {"norm"} and -1 <= study.tau_after["norm"][0] <= 1
    assert study.output_gap < 1e-11
    assert len({(s["width"], s["lr"]) for s in arch.family_settings(16)}) > 3

"""Tests of lossgeom_book.architectures and lossgeom_book.layer_symmetries (Chapter 13)."""

import pytest
import torch

from lossgeom import symmetries
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


def worst_discrepancy(model, probe, moves):
    table = symmetries.audit(model, None, probe, symmetries=list(moves))
    assert all(r.is_symmetry for r in table)
    return max(r.relative_discrepancy for r in table)


def test_resnet_moves_preserve_outputs(digits, resnet_fit):
    moves = ls.resnet_symmetries(resnet_fit.model, seed=1).values()
    assert worst_discrepancy(resnet_fit.model, digits.x_test, moves) < 1e-11
    assert torch.linalg.matrix_rank(ls.resnet_scale_tangents(resnet_fit.model)) == 15 * 2


def test_the_residual_stream_rescaling_is_not_the_registrys_and_preserves_outputs(digits, resnet_fit):
    model = resnet_fit.model
    found = symmetries.find_symmetries(model, seed=0)
    assert not any(s.name.startswith("residual-stream") for s in found.symmetries)
    assert any("residual block's output units" in reason for reason in found.skipped)
    stream = ls.residual_stream_rescaling(
        ["block2.bn2", "block2.shortcut.1"], ["fc"], torch.tensor([0.5, 2.0, 3.0, 0.3])
    )
    assert worst_discrepancy(model, digits.x_test, [stream]) < 1e-11
    with pytest.raises(ValueError, match="positive"):
        ls.residual_stream_rescaling(["bn"], ["fc"], [1.0, -1.0])


def test_attention_gauge_preserves_outputs_and_has_the_predicted_dimension(encoder_fit):
    split, fit = encoder_fit
    g = torch.Generator().manual_seed(0)
    A = [torch.eye(2) + 0.5 * torch.randn(2, 2, generator=g) for _ in range(2)]
    attn = "encoder.layers.0.self_attn"
    gauge = [symmetries.attention_head_gauge(attn, i, 2, A[i], A[i]) for i in range(2)]
    moves = [symmetries.compose(gauge), symmetries.head_permutation(attn, [1, 0])]
    assert worst_discrepancy(fit.model, split.x_test, moves) < 1e-11
    rank = torch.linalg.matrix_rank(ls.attention_gauge_tangents(fit.model, attn, 2))
    assert rank == symmetries.attention_gauge_dimension(fit.model) == 2 * (4 + 4)


def test_a_wrong_bn_scale_is_caught(digits, resnet_fit):
    wrong = symmetries.Symmetry(
        "conv scaled, statistics left behind", lambda s: {**s, "conv.weight": 2 * s["conv.weight"]}
    )
    with pytest.raises(ValueError, match="is not a symmetry of DigitsResNet"):
        symmetries.audit(resnet_fit.model, None, digits.x_test, symmetries=[wrong])


def test_family_study_returns_what_it_says(digits):
    settings = arch.family_settings(4, steps=5)
    measure = {"norm": lambda m, d: float(sum(p.detach().norm() for p in m.parameters()))}
    study = arch.family_study(digits, settings, measure, (digits.x_train, digits.y_train))
    assert study.gaps.shape == (4,) and study.before["norm"].shape == (4,)
    assert set(study.tau_before) == {"norm"} and -1 <= study.tau_after["norm"][0] <= 1
    assert study.output_gap < 1e-11
    assert len({(s["width"], s["lr"]) for s in arch.family_settings(16)}) > 3

"""Contracts of the risk's set-up that a mutation sample of lossgeom.risk and lossgeom.batches showed untested.

References are independent of the library: torch's own loss module on the kept examples,
differentiated twice by ``torch.autograd.functional.hessian``, and the devices and messages
the documented contracts state.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import lossgeom.curvature as cv
from lossgeom.batches import DataSource, split_batch
from lossgeom.losses import term_counts
from lossgeom.risk import EmpiricalRisk, _agree, math_attention

from conftest import assert_close


class StrictCrossEntropy(nn.CrossEntropyLoss):
    """A cross-entropy that refuses to be called on a batch whose every target is ignored."""

    def forward(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not bool((y != self.ignore_index).any()):
            raise RuntimeError("called on a batch with no kept target")
        return super().forward(out, y)


def _dense_ce(model: nn.Module, x: torch.Tensor, y: torch.Tensor, reduction: str) -> torch.Tensor:
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def f(v: torch.Tensor) -> torch.Tensor:
        chunks, i = {}, 0
        for name, shape in zip(names, shapes, strict=True):
            k = shape.numel()
            chunks[name] = v[i : i + k].reshape(shape)
            i += k
        out = torch.func.functional_call(model, chunks, (x,))
        return nn.functional.cross_entropy(out, y, reduction=reduction)

    return torch.autograd.functional.hessian(f, flat)


def test_a_batch_whose_every_target_is_ignored_is_never_passed_to_the_mean_loss():
    reduction = "mean"  # under "sum" such a batch is a zero term, and the loss is called on it
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(7, 3, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (7,), generator=g)
    masked = torch.full((2,), -100)
    data = [(x[:4], y[:4]), (x[4:6], masked), (x[6:], y[6:])]
    got = cv.hessian_operator(model, StrictCrossEntropy(reduction=reduction), data).dense()
    kept = torch.cat([x[:4], x[6:]]), torch.cat([y[:4], y[6:]])
    assert_close(torch.as_tensor(got), _dense_ce(model, *kept, reduction), rtol=1e-10, atol=1e-12)


def test_a_one_term_batch_with_a_non_finite_loss_is_refused_at_set_up():
    torch.manual_seed(2)
    model = nn.Linear(2, 1).double()
    x = torch.ones(1, 2, dtype=torch.float64)
    y = torch.full((1, 1), 1e200, dtype=torch.float64)  # (out - 1e200)**2 overflows to inf
    assert not torch.isfinite(nn.MSELoss()(model(x), y))
    with pytest.raises(ValueError, match="the loss is non-finite"):
        EmpiricalRisk(model, nn.MSELoss(), (x, y))


def test_target_errors_name_the_batch_only_when_there_are_several():
    torch.manual_seed(3)
    model = nn.Linear(2, 3).double()
    x = torch.randn(4, 2, dtype=torch.float64)
    bad = torch.randn(4, 1, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"for MSELoss y must have the outputs' shape \(4, 3\)"):
        EmpiricalRisk(model, nn.MSELoss(), (x, bad))
    good = torch.randn(4, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"for MSELoss y of batch 1 must have the outputs' shape"):
        EmpiricalRisk(model, nn.MSELoss(), [(x, good), (x, bad)])


def test_every_tensor_of_a_batch_moves_to_the_given_device():
    x = torch.randn(3, 2, dtype=torch.float64)
    y = torch.tensor([0, 1, 0])
    meta = torch.device("meta")
    pair = split_batch((x, y), 0, meta)
    assert pair.args[0].device == meta and pair.y.device == meta
    keywords = split_batch(({"features": x, "scale": y.double()}, y), 0, meta)
    assert {k: v.device for k, v in keywords.kwargs.items()} == {"features": meta, "scale": meta}
    (held,) = list(DataSource([(x, y)], meta))
    assert held.args[0].device == meta and held.y.device == meta
    unmoved = split_batch((x, y), 0)
    assert unmoved.args[0] is x and unmoved.y is y


def test_soft_cross_entropy_targets_are_weighted_by_their_positions():
    g = torch.Generator().manual_seed(4)
    out = torch.randn(3, 4, 2, generator=g, dtype=torch.float64)
    probs = torch.softmax(torch.randn(3, 4, 2, generator=g, dtype=torch.float64), dim=1)
    assert term_counts(nn.CrossEntropyLoss(), out, probs).tolist() == [2.0, 2.0, 2.0]


def test_input_errors_of_a_single_batch_name_the_data():
    model = nn.Linear(2, 3).double()
    x = torch.tensor([[0.0, float("nan")]], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^data: x must contain only finite values"):
        EmpiricalRisk(model, nn.CrossEntropyLoss(), (x, torch.tensor([0])))


def test_agreement_off_the_cpu_is_to_a_thousand_rounding_units():
    a = torch.tensor([1.0, -2.0], dtype=torch.float64)
    assert _agree(a, a + 100 * torch.finfo(torch.float64).eps, exact=False)
    assert not _agree(a, a + 1e-6, exact=False)
    assert not _agree(a, a + 100 * torch.finfo(torch.float64).eps, exact=True)


def test_math_attention_switches_the_fused_fast_path_off_and_restores_it():
    before = torch.backends.mha.get_fastpath_enabled()
    with math_attention():
        assert torch.backends.mha.get_fastpath_enabled() is False
    assert torch.backends.mha.get_fastpath_enabled() == before

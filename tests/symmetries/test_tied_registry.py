"""Tied weights: one rule in every registry entry point (a tied layer is refused, with the reason)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lossgeom.symmetries import audit, find_symmetries
from lossgeom.symmetries.layers import layer_rescaling
from lossgeom.symmetries.registry import classifier_layer, find_layer_rescalings, find_normalisation_rescalings


class TiedLM(nn.Module):
    """A token model whose output projection is its embedding (registered first, so both names are plain)."""

    def __init__(self, vocabulary: int = 7, width: int = 4, hidden: int = 5, tied: bool = True) -> None:
        super().__init__()
        self.head = nn.Linear(width, vocabulary, bias=False)
        self.embed = nn.Embedding(vocabulary, width)
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)
        if tied:
            self.embed.weight = self.head.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.down(torch.relu(self.up(self.embed(tokens))))))


class TiedNorm(nn.Module):
    """A layer read by a LayerNorm whose weight is one tensor with a later layer's."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.free = nn.Linear(4, 4)
        self.norm2 = nn.LayerNorm(4)
        self.b = nn.Linear(4, 4)
        self.b.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.norm2(self.free(self.norm(self.a(x)))))


def _model(cls: type[nn.Module], **kwargs) -> nn.Module:
    torch.manual_seed(3)
    return cls(**kwargs).double().eval()


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}


def _unchanged(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict(keep_vars=True)
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def _output_gap(model: nn.Module, symmetry, probe: torch.Tensor) -> float:
    """The largest output change under ``symmetry``, relative to the output scale (dense float64 forward)."""
    params = {k: v.detach() for k, v in model.named_parameters()}
    with torch.no_grad():
        before = model(probe)
        after = torch.func.functional_call(model, symmetry(params), (probe,))
    return float((after - before).abs().max() / before.abs().max())


TOKENS = torch.arange(7).repeat(3)


def test_layer_rescaling_of_a_tied_weight_is_refused_with_the_reason():
    model = _model(TiedLM)
    state = _state(model)
    found = find_layer_rescalings(model, 2.0)
    names = [s.name for s in found]
    assert any("up -> down" in name for name in names)
    assert not any("-> head" in name for name in names)
    reasons = [r for r in found.skipped if "down -> head" in r]
    assert len(reasons) == 1 and "shared (tied)" in reasons[0] and "'head.weight'" in reasons[0]
    # every reported rescaling keeps the outputs; the refused one does not (25% and more)
    assert all(_output_gap(model, s, TOKENS) < 1e-13 for s in found)
    assert _output_gap(model, layer_rescaling("down", "head", 2.0), TOKENS) > 0.1
    _unchanged(model, state)


def test_the_untied_twin_reports_the_rescaling():
    found = find_layer_rescalings(_model(TiedLM, tied=False), 2.0)
    assert any("down -> head" in s.name for s in found)
    assert classifier_layer(_model(TiedLM, tied=False)) == ("head.weight", None)


def test_classifier_layer_refuses_a_tied_classifier():
    model = _model(TiedLM)
    state = _state(model)
    assert classifier_layer(model) is None
    _unchanged(model, state)


def test_find_symmetries_reports_only_output_preserving_transforms_on_tied_models():
    model = _model(TiedLM)
    state = _state(model)
    found = find_symmetries(model, loss=nn.CrossEntropyLoss(), seed=1)
    assert len(found) > 0
    assert all(_output_gap(model, s, TOKENS) < 1e-12 for s in found)
    assert any("head" in r and "shared (tied)" in r for r in found.skipped)
    table = audit(model, None, TOKENS, loss=nn.CrossEntropyLoss(), seed=1)
    assert all(report.is_symmetry for report in table)
    _unchanged(model, state)


def test_normalisation_rescaling_of_a_tied_weight_is_refused_with_the_reason():
    model = _model(TiedNorm)
    state = _state(model)
    found = find_normalisation_rescalings(model, 2.0)
    assert [s.name.split()[3] for s in found] == ["free"]
    reasons = [r for r in found.skipped if "'a'" in r]
    assert len(reasons) == 1 and "shared (tied)" in reasons[0]
    probe = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    # the reported one is exact up to the LayerNorm's eps; the tied one moves the later layer
    assert all(_output_gap(model, s, probe) < 1e-4 for s in found)
    moved = {k: v.detach() * (2.0 if k in ("a.weight", "a.bias") else 1.0) for k, v in model.named_parameters()}
    with torch.no_grad():
        gap = (torch.func.functional_call(model, moved, (probe,)) - model(probe)).abs().max()
    assert float(gap) > 0.1
    _unchanged(model, state)


@pytest.mark.parametrize("search", [find_layer_rescalings, find_normalisation_rescalings])
def test_every_registry_search_refuses_a_non_positive_factor(search):
    with pytest.raises(ValueError, match="c"):
        search(_model(TiedLM), 0.0)

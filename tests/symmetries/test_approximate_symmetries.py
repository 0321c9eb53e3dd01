"""Approximate symmetries (a rescaling before a LayerNorm, default eps) are measured and reported, not refused."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lossgeom.atlas import atlas
from lossgeom.symmetries import Symmetry, audit, audit_symmetry, compose, normalisation_rescaling, unit_permutation

F64 = dict(dtype=torch.float64)


def layer_norm_model(eps: float = 1e-5) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6, **F64), nn.LayerNorm(6, eps=eps, **F64), nn.ReLU(), nn.Linear(6, 3, **F64))


def test_the_rescaling_before_a_norm_is_marked_approximate_and_its_discrepancy_shrinks_with_eps():
    x = torch.randn(10, 4, **F64)
    discrepancies = []
    for eps in (1e-3, 1e-5, 1e-7):
        symmetry = normalisation_rescaling("0", 2.0)
        assert symmetry.approximate and "eps" in symmetry.approximate
        report = audit(layer_norm_model(eps), None, x, symmetries=[symmetry])  # default: refuses exact failures
        assert report[0].approximate == symmetry.approximate
        discrepancies.append(report[0].relative_discrepancy)
        assert "approximate symmetry" in str(report[0])
    # LN(c z) - LN(z) is first order in eps / var(z): each factor 100 in eps is about 100 in the discrepancy
    assert discrepancies[0] > 30 * discrepancies[1] > 900 * discrepancies[2] > 0
    assert 1e-7 < discrepancies[1] < 1e-3
    assert normalisation_rescaling("0", 1.0).approximate == ""  # c = 1 is the identity: exact


def test_an_exact_symmetry_that_fails_is_still_refused_and_a_composite_inherits_approximate():
    model = layer_norm_model()
    x = torch.randn(10, 4, **F64)
    wrong = Symmetry("doubling the output layer", lambda p: {**p, "3.weight": 2 * p["3.weight"]})
    with pytest.raises(ValueError, match="is not a symmetry"):
        audit(model, None, x, symmetries=[wrong])
    both = compose([unit_permutation("3", "3", torch.arange(3)), normalisation_rescaling("0", 3.0)], "both")
    assert both.approximate == normalisation_rescaling("0", 3.0).approximate
    assert compose([unit_permutation("3", "3", torch.arange(3))], "alone").approximate == ""


def test_the_atlas_runs_with_its_defaults_on_a_layer_norm_model_and_says_the_column_is_approximate():
    model = layer_norm_model()
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(20, 4, generator=gen, **F64), torch.randint(0, 3, (20,), generator=gen)
    table = atlas(model, nn.CrossEntropyLoss(), (x, y), probe=x[:10], measures=["lambda_max", "fisher_rao"])
    column = table.column("normalisation_rescaling")
    assert column.applies and column.receipt.approximate
    assert not column.receipt.is_symmetry  # eps 1e-5 moves the outputs beyond the 1e-10 tolerance
    assert "approximate: the normalisation's eps" in column.receipt_text()
    assert "Δ/scale < 1e-4" in column.receipt_text()
    # a measure at an approximately equivalent point is still recorded, with its factor
    assert table.cell("lambda_max", "normalisation_rescaling").factor is not None


def test_audit_symmetry_keeps_integer_probes_so_an_embedding_model_can_be_audited():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(7, 4, **F64), nn.Flatten(), nn.Linear(12, 3, **F64))
    tokens = torch.randint(0, 7, (5, 3))
    params = {k: v.detach() for k, v in model.named_parameters()}

    def forward(p, x):
        return torch.func.functional_call(model, p, (x,))

    identity = Symmetry("the identity", lambda p: {k: v.clone() for k, v in p.items()})
    report = audit_symmetry(forward, params, identity, tokens, tol=1e-12)
    assert report.is_symmetry and report.probe_size == 5
    with pytest.raises(TypeError, match="probe must hold real or integer inputs"):
        audit_symmetry(forward, params, identity, tokens > 3, tol=1e-12)

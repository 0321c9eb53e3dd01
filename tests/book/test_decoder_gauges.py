"""The decoder gauge directions and the sharpness studies of the chapter on decoder transformers.

Each gauge direction is checked against the audit (it keeps the outputs) and its tangent
against a derivative computed another way; the diagonal network's quotient metric against ASAM's;
the gauge sweep against the invariance it must show, with a negative control.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from lossgeom import flatness, symmetries
from lossgeom_book import architectures as arch
from lossgeom_book import decoder_gauges as gauges
from lossgeom_book import decoder_studies as studies
from lossgeom_book import decoders as dec
from lossgeom_book import tasks


@pytest.fixture(scope="module")
def folded() -> nn.Module:
    model = dec.LlamaStyleClassifier(11, 8, hidden=12, seed=0)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.RMSNorm):
                module.weight.uniform_(0.5, 1.5)
    return dec.fold_rms_gains(model)


def _probe() -> torch.Tensor:
    return torch.randint(0, 11, (5, 4), generator=torch.Generator().manual_seed(1))


def test_every_generator_is_a_symmetry(folded: nn.Module) -> None:
    families = gauges.gauge_generators(folded)
    moves = [f(0.3) for fams in families.values() for f in fams[:3]]
    table = symmetries.audit(folded, None, _probe(), symmetries=moves, rtol=1e-10)
    assert len(table) == 15 and all(r.is_symmetry for r in table)


def test_tangent_counts_and_ranks_equal_the_formulas(folded: nn.Module) -> None:
    tangents = gauges.gauge_tangents(folded)
    ranks = {k: int(torch.linalg.matrix_rank(T)) for k, T in tangents.items()}
    assert ranks == {
        "query/key gauge": 2 * 4,
        "value/output gauge": 2 * 16,
        "RMSNorm gain rescaling": 3 * 8,
        "SwiGLU rescaling": 12,
        "stream rotation": 28,
    }
    assert ranks == {k: v for k, v in symmetries.decoder_gauge_dimensions(folded).items() if k in ranks}


def test_swiglu_tangent_against_its_closed_form(folded: nn.Module) -> None:
    # d/dt of (up row i * e^t, down column i * e^-t): (+up row i, -down column i)
    (tangent,) = gauges.gauge_tangents(folded)["SwiGLU rescaling"][:, :1].T
    params = dict(folded.named_parameters())
    expected = {k: torch.zeros_like(p) for k, p in params.items()}
    expected["layers.0.mlp.up_proj.weight"][0] = params["layers.0.mlp.up_proj.weight"][0].detach()
    expected["layers.0.mlp.down_proj.weight"][:, 0] = -params["layers.0.mlp.down_proj.weight"][:, 0].detach()
    flat = torch.cat([v.reshape(-1) for v in expected.values()])
    assert torch.allclose(tangent, flat, atol=1e-8)


def test_stream_rotation_needs_folded_gains() -> None:
    model = dec.LlamaStyleClassifier(11, 8, hidden=12, seed=0)
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)
    rotation = gauges.gauge_generators(model)["stream rotation"][0](0.5)
    (report,) = symmetries.audit(model, None, _probe(), symmetries=[rotation], require_symmetry=False)
    assert not report.is_symmetry


def test_gauge_sweep_keeps_geodesic_and_moves_adaptive() -> None:
    split = tasks.modular_arithmetic(7, "add", train_fraction=0.8, seed=0)
    fit = arch.train_model(arch.ModularEncoder(7, d_model=8, n_heads=2, seed=0), split, steps=30, lr=0.01)
    ce, data = nn.CrossEntropyLoss(), (split.x_train, split.y_train)
    measures = {
        "geodesic": lambda m: flatness.geodesic_sharpness(m, ce, data, steps=2),
        "adaptive": lambda m: flatness.adaptive_sharpness(m, ce, data),
    }
    sweep = studies.gauge_sweep(fit.model, "encoder.layers.0.self_attn", 2, 4, (0.1, 10.0), measures, split.x_test)
    assert sweep.output_change < 1e-10
    assert np.abs(sweep.ratios["geodesic"] - 1).max() < 1e-8
    assert np.abs(sweep.ratios["adaptive"] - 1).max() > 0.05


def test_diagonal_quotient_metric_is_asam_at_eta_zero() -> None:
    split = studies.sparse_regression(10, 20, 15, 2, seed=0)
    fit = studies.train_diagonal(split, 0.3, 0.05, 200)
    mse, data = nn.MSELoss(), (split.x_train, split.y_train)
    first = flatness.geodesic_sharpness(fit.model, mse, data, metric="adaptive", order=1, steps=1, eta=0.0)
    assert abs(first - flatness.adaptive_sharpness(fit.model, mse, data, eta=0.0)) < 1e-12
    # invariant under (u, v) -> (c u, v / c) at eta = 0, at either order
    moved = studies.DiagonalNet(15, 1.0)
    c = torch.linspace(0.5, 2.0, 15, dtype=torch.float64)
    with torch.no_grad():
        moved.u.weight.copy_(fit.model.u.weight * c)
        moved.v.weight.copy_(fit.model.v.weight / c)
    a = flatness.geodesic_sharpness(fit.model, mse, data, eta=0.0, steps=3)
    assert abs(flatness.geodesic_sharpness(moved, mse, data, eta=0.0, steps=3) / a - 1) < 1e-8
    assert fit.train_loss < fit.test_loss


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="alpha"):
        studies.DiagonalNet(3, -1.0)
    with pytest.raises(ValueError, match="k"):
        studies.sparse_regression(5, 5, 4, 0)


def test_diagonal_training_stops_at_the_target_loss_above_rounding_level() -> None:
    split = studies.sparse_regression(10, 20, 15, 2, seed=0)
    free = studies.train_diagonal(split, 1.0, 0.05, 2000)
    stopped = studies.train_diagonal(split, 1.0, 0.05, 2000, target=1e-6)
    assert free.train_loss < 1e-12  # trained on to rounding level
    assert 1e-8 < stopped.train_loss <= 1e-6  # stopped at the first step at or below the target

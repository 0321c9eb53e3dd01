"""The atlas's decoder columns (RMSNorm gain, stream rotation, RoPE and GQA gauges, SwiGLU) and its geodesic row."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lossgeom.atlas import atlas
from lossgeom.atlas.measures import LAYER_MEASURES

pytest.importorskip("lossgeom_book")  # the book's decoder model: skipped without the book's extra
from lossgeom_book.decoders import LlamaStyleClassifier, fold_rms_gains  # noqa: E402

DECODER_COLUMNS = ["rmsnorm_gain", "stream_rotation", "rope_gauge", "gqa_gauge", "gqa_permutation", "swiglu_rescaling"]


def _data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 7, (12, 3), generator=generator), torch.randint(0, 7, (12,), generator=generator)


def _decoder(unit_gains: bool = True) -> nn.Module:
    model = LlamaStyleClassifier(7, d=8, heads=4, kv_heads=2, head_dim=2, hidden=6, seed=0)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.RMSNorm):
                module.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(1))
    return fold_rms_gains(model) if unit_gains else model


def test_decoder_columns_are_found_and_audited() -> None:
    model, (x, y) = _decoder(), _data()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    table = atlas(
        model,
        nn.CrossEntropyLoss(),
        (x, y),
        probe=x,
        measures=["sam", "fisher_rao", "geodesic"],
        transforms=DECODER_COLUMNS,
        seed=0,
    )
    assert all(c.applies and c.receipt.is_symmetry for c in table.columns)
    assert "commutant" in table.column("rope_gauge").symmetry.name
    assert {c.status for c in table.row("fisher_rao")} == {"invariant"}
    assert table.cell("sam", "gqa_permutation").status == "invariant"
    assert table.cell("sam", "gqa_gauge").status == "moves"
    assert {c.status for c in table.row("geodesic")} == {"not applicable"}
    assert "nn.MultiheadAttention" in table.base_reasons[2]
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_unfolded_gains_refuse_the_stream_rotation() -> None:
    model, (x, y) = _decoder(unit_gains=False), _data()
    table = atlas(
        model,
        nn.CrossEntropyLoss(),
        (x, y),
        probe=x,
        measures=["sam"],
        transforms=["stream_rotation", "rmsnorm_gain"],
        seed=0,
    )
    column = table.column("stream_rotation")
    assert not column.applies and "gains not folded" in column.reason
    assert table.column("rmsnorm_gain").applies


def test_folding_keeps_the_function() -> None:
    model, (x, _) = _decoder(unit_gains=False), _data()
    folded = fold_rms_gains(model)
    assert torch.allclose(folded(x), model(x), rtol=0, atol=1e-12)
    assert all(bool(torch.all(m.weight == 1)) for m in folded.modules() if isinstance(m, nn.RMSNorm))
    assert not all(bool(torch.all(m.weight == 1)) for m in model.modules() if isinstance(m, nn.RMSNorm))


def test_decoder_columns_absent_on_an_mlp() -> None:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(3, 4, dtype=torch.float64), nn.ReLU(), nn.Linear(4, 2, dtype=torch.float64))
    x, y = torch.randn(10, 3, dtype=torch.float64), torch.randint(0, 2, (10,))
    table = atlas(
        mlp,
        nn.CrossEntropyLoss(),
        (x, y),
        probe=x,
        measures=["sam"],
        transforms=["permutation", "swiglu_rescaling", "rope_gauge"],
        seed=0,
    )
    assert not table.column("swiglu_rescaling").applies and "SwiGLU" in table.column("swiglu_rescaling").reason
    assert not table.column("rope_gauge").applies


def test_geodesic_row_is_gauge_invariant_on_multihead_attention() -> None:
    torch.manual_seed(0)

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(5, 4, dtype=torch.float64)
            self.attn = nn.MultiheadAttention(4, 2, batch_first=True, dtype=torch.float64)
            self.head = nn.Linear(4, 5, dtype=torch.float64)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            h = self.embed(tokens.long())
            return self.head(self.attn(h, h, h, need_weights=False)[0].mean(1))

    x = torch.randint(0, 5, (12, 3), generator=torch.Generator().manual_seed(2))
    y = torch.randint(0, 5, (12,), generator=torch.Generator().manual_seed(3))
    table = atlas(
        Encoder().eval(),
        nn.CrossEntropyLoss(),
        (x, y),
        probe=x,
        measures=["asam", "geodesic"],
        transforms=["attention_gauge"],
        seed=0,
    )
    assert table.cell("geodesic", "attention_gauge").status == "invariant"
    assert table.cell("geodesic", "attention_gauge").change_text() == "< 1e-10"  # the row's own rounding floor
    assert table.cell("asam", "attention_gauge").status == "moves"


def test_geodesic_row_is_asked_for_by_name_only() -> None:
    from lossgeom.atlas.measures import MEASURES

    assert "geodesic" in LAYER_MEASURES and "geodesic" not in MEASURES
    with pytest.raises(ValueError, match="unknown measure"):
        atlas(_decoder(), nn.CrossEntropyLoss(), _data(), probe=_data()[0], measures=["geodesics"])


def test_rounding_floor_must_lie_below_the_tolerance() -> None:
    from lossgeom.atlas import Measure

    with pytest.raises(ValueError, match="rounding_floor must be >= 0 and below the tolerance"):
        Measure("m", "m", "m", "m", lambda point: 0.0, 1e-9, takes_point=True, rounding_floor=1e-9)
    with pytest.raises(ValueError, match="rounding_floor"):
        Measure("m", "m", "m", "m", lambda point: 0.0, 1e-9, takes_point=True, rounding_floor=-1.0)

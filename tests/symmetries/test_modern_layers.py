"""The registry on modern layers: batch norm (eval mode), residual blocks, layer norm and attention.

Every reported symmetry passes the module audit at 1e-10 relative in float64; the counts
are derived from the architecture; negative controls (the same transforms where they are
not exact) are refused; the caller's parameters and buffers stay bit-identical.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lossgeom.atlas import atlas
from lossgeom.parameters import params_of
from lossgeom.symmetries import (
    Symmetry,
    attention_gauge_dimension,
    attention_head_gauge,
    audit,
    batchnorm_scale_invariance,
    find_symmetries,
    layernorm_rescaling,
    relu_neuron_rescaling,
)
from lossgeom.symmetries.attention import conditioned_matrix

F64 = dict(dtype=torch.float64)
CE = nn.CrossEntropyLoss()


class BasicBlock(nn.Module):
    """torchvision-style: relu(bn2(conv2(relu(bn1(conv1 x)))) + shortcut(x))."""

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False, **F64)
        self.bn1 = nn.BatchNorm2d(cout, **F64)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False, **F64)
        self.bn2 = nn.BatchNorm2d(cout, **F64)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False, **F64), nn.BatchNorm2d(cout, **F64)
            )

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return torch.relu(out + shortcut)


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1, bias=False, **F64)
        self.bn = nn.BatchNorm2d(4, **F64)
        self.block1 = BasicBlock(4, 4)
        self.block2 = BasicBlock(4, 6, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(6, 3, **F64)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        x = self.block2(self.block1(x))
        return self.fc(torch.flatten(self.pool(x), 1))


def resnet() -> ResNet:
    torch.manual_seed(0)
    model = ResNet()
    with torch.no_grad():  # a few batches in train mode move the running statistics
        for _ in range(3):
            model(torch.randn(8, 1, 6, 6, **F64) * 2 + 0.5)
    return model.eval()


def images(n: int = 6) -> torch.Tensor:
    return torch.randn(n, 1, 6, 6, generator=torch.Generator().manual_seed(1), **F64)


def kinds(found) -> dict[str, int]:
    counts: dict[str, int] = {}
    for s in found:
        key = (
            "bn"
            if s.name.startswith("batch-norm scale invariance")
            else "affine"
            if "(batch-norm affine" in s.name
            else "perm"
            if s.name.startswith("permutation")
            else s.name.split(" ")[0]
        )
        counts[key] = counts.get(key, 0) + 1
    return counts


def frozen(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def bit_identical(model: nn.Module, state: dict[str, torch.Tensor]) -> bool:
    now = model.state_dict()
    return set(now) == set(state) and all(torch.equal(now[k], v) for k, v in state.items())


def test_resnet_counts_follow_from_the_architecture_and_every_symmetry_passes_the_audit():
    model = resnet()
    before = frozen(model)
    found = find_symmetries(model, loss=CE)
    # every conv feeds a batch norm: stem, 2 x (conv1, conv2), the downsampling 1x1 conv
    n_convs = 1 + 2 * 2 + 1
    # a batch norm's channels are read by one conv (through a ReLU) only between conv1 and conv2 of a block
    n_blocks = 2
    assert kinds(found) == {"bn": n_convs, "affine": n_blocks, "perm": n_blocks, "softmax": 1}
    names = [s.name for s in found]
    assert any(n.startswith("ReLU rescaling block2.bn1 -> block2.conv2 (batch-norm affine, 6 channels") for n in names)
    assert "permutation block1.conv1 -> block1.conv2 (through block1.bn1, 4 channels)" in names
    bn_kind = [s for s in found if s.name.startswith("batch-norm")]
    assert all(set(s.buffers) == {s.buffers[0], s.buffers[1]} and "running_var" in s.buffers[1] for s in bn_kind)
    # the block outputs (read by the skip path and the next block) are listed, with the reason
    residual = [r for r in found.skipped if "residual" in r]
    assert any(r.startswith("channels of 'bn'") and "feeds 2 operations" in r for r in residual)
    assert any(r.startswith("channels of 'block2.bn2'") and "residual sum" in r for r in residual)
    assert any(r.startswith("channels of 'block2.downsample.1'") and "residual sum" in r for r in residual)
    table = audit(model, None, images(), loss=CE, rtol=1e-10)
    assert len(table) == len(found) and all(r.is_symmetry for r in table)
    worst = max(r.relative_discrepancy for r in table)
    assert worst < 1e-10
    assert bit_identical(model, before)


def test_batchnorm_refusals_training_mode_no_running_stats_and_negative_variance():
    model = nn.Sequential(nn.Linear(3, 4, **F64), nn.BatchNorm1d(4, **F64), nn.ReLU(), nn.Linear(4, 2, **F64))
    assert any("training mode" in r for r in find_symmetries(model).skipped)
    no_stats = nn.Sequential(
        nn.Linear(3, 4, **F64), nn.BatchNorm1d(4, track_running_stats=False, **F64), nn.ReLU(), nn.Linear(4, 2, **F64)
    ).eval()
    assert any("track_running_stats=False" in r for r in find_symmetries(no_stats).skipped)
    tiny = model.eval()
    tiny[1].running_var.fill_(1e-9)  # var + eps ~ eps: a factor c < 1 makes c^2 (var + eps) - eps negative
    found = find_symmetries(tiny, rescale=4.0)
    assert not any(s.name.startswith("batch-norm") for s in found)
    assert any("refused conservatively" in r and "running variance negative" in r for r in found.skipped)
    with pytest.raises(ValueError, match="refused conservatively, a running variance would become negative"):
        scales = torch.full((4,), 0.5, **F64)
        batchnorm_scale_invariance("0", "1", scales, eps=tiny[1].eps)(params_of(tiny, buffers=True))


def test_a_negative_running_variance_keeps_the_eval_mode_function_so_the_refusal_is_conservative():
    # The reason the refusal gives: torch's eval-mode batch norm divides by sqrt(var' + eps) = c sqrt(var + eps),
    # which stays positive, so the moved model computes the same function with a negative running_var.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4, **F64), nn.BatchNorm1d(4, **F64), nn.ReLU(), nn.Linear(4, 2, **F64)).eval()
    with torch.no_grad():
        model[1].running_mean.copy_(torch.randn(4, **F64))
        model[1].running_var.copy_(torch.tensor([1e-9, 2e-6, 0.5, 3.0], **F64))
        model[1].weight.copy_(torch.randn(4, **F64))
        model[1].bias.copy_(torch.randn(4, **F64))
    c, eps = torch.tensor([0.25, 0.5, 0.5, 2.0], **F64), model[1].eps
    moved = params_of(model, buffers=True)
    moved["0.weight"], moved["0.bias"] = moved["0.weight"] * c[:, None], moved["0.bias"] * c
    moved["1.running_mean"] = moved["1.running_mean"] * c
    moved["1.running_var"] = c**2 * (moved["1.running_var"] + eps) - eps
    assert (moved["1.running_var"][:2] < 0).all()  # the state the library refuses
    x = torch.randn(64, 3, **F64)
    before, after = model(x), torch.func.functional_call(model, moved, (x,))
    assert torch.allclose(after, before, rtol=1e-12, atol=1e-12)
    stale = moved | {"1.running_mean": model[1].running_mean, "1.running_var": model[1].running_var}
    assert not torch.allclose(torch.func.functional_call(model, stale, (x,)), before, rtol=1e-3, atol=1e-3)
    with pytest.raises(ValueError, match="refused conservatively"):
        batchnorm_scale_invariance("0", "1", c, eps=eps)(params_of(model, buffers=True))


def test_negative_controls_are_refused_by_the_audit():
    model, x = resnet(), images()
    scales = torch.linspace(0.5, 2.0, 4, **F64)
    exact = batchnorm_scale_invariance("block1.conv1", "block1.bn1", scales, eps=model.block1.bn1.eps)
    assert audit(model, None, x, symmetries=[exact])[0].is_symmetry
    stale = Symmetry(
        "rescaling of block1.conv1 without the running statistics",
        lambda p: (
            exact.transform(p)
            | {
                "block1.bn1.running_mean": p["block1.bn1.running_mean"],
                "block1.bn1.running_var": p["block1.bn1.running_var"],
            }
        ),
    )
    with pytest.raises(ValueError, match="is not a symmetry"):
        audit(model, None, x, symmetries=[stale])
    # the block output is not a symmetry: rescale bn2's affine against the next block's conv1
    block_out = relu_neuron_rescaling("block1.bn2", "block2.conv1", scales, units_last=False)
    with pytest.raises(ValueError, match="is not a symmetry"):
        audit(model, None, x, symmetries=[block_out])
    # with the buffers missing the symmetry says how to call it
    with pytest.raises(ValueError, match="transforms the buffers"):
        exact(dict(model.named_parameters()))


class Tiny(nn.Module):
    """An embedding, a 2-layer transformer encoder (d_model 8, 2 heads, batch first), a Linear head."""

    def __init__(self, norm_first: bool, activation="relu"):
        super().__init__()
        self.embed = nn.Embedding(11, 8, **F64)
        layer = nn.TransformerEncoderLayer(
            8, 2, 12, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first, **F64
        )
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(8, 3, **F64)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)).mean(1))


def transformer(norm_first: bool, activation="relu") -> Tiny:
    torch.manual_seed(3)
    return Tiny(norm_first, activation).eval()


def tokens(n: int = 6) -> torch.Tensor:
    return torch.randint(0, 11, (n, 5), generator=torch.Generator().manual_seed(4))


@pytest.mark.parametrize("norm_first", [True, False])
def test_transformer_gauges_head_permutations_and_layer_norms_where_exact(norm_first):
    model = transformer(norm_first)
    before = frozen(model)
    found = find_symmetries(model, loss=CE)
    layers, heads = 2, 2
    counts = kinds(found)
    assert counts["attention"] == layers * heads and counts["head"] == layers
    assert counts.get("layer-norm", 0) == (2 * layers if norm_first else 0)
    assert counts["ReLU"] == layers and counts["perm"] == layers  # the feed-forward hidden units
    if not norm_first:
        assert sum("(post-LN)" in r for r in found.skipped) == 2 * layers
    d = 8 // heads
    assert attention_gauge_dimension(model) == layers * heads * (d**2 + d**2)
    assert attention_gauge_dimension(model.encoder.layers[0].self_attn) == heads * 2 * d**2
    table = audit(model, None, tokens(), loss=CE, rtol=1e-10)
    assert all(r.is_symmetry for r in table) and max(r.relative_discrepancy for r in table) < 1e-10
    assert bit_identical(model, before)


def test_gelu_feed_forward_is_only_permuted_and_attention_refusals():
    found = find_symmetries(transformer(True, activation="gelu"))
    assert kinds(found).get("ReLU", 0) == 0 and kinds(found)["perm"] == 2
    assert any("feed-forward activation (gelu) is not positively homogeneous" in r for r in found.skipped)

    class WithBiasKV(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(8, 2, add_bias_kv=True, batch_first=True, **F64)

        def forward(self, x):
            return self.attn(x, x, x)[0]

    assert any("bias_k" in r for r in find_symmetries(WithBiasKV()).skipped)


def test_attention_negative_controls():
    model = transformer(True)
    gen = torch.Generator().manual_seed(0)
    A, B = conditioned_matrix(4, 4.0, gen), conditioned_matrix(4, 4.0, gen)
    assert torch.linalg.cond(A) == pytest.approx(4.0, rel=1e-10)
    prefix = "encoder.layers.0.self_attn"
    exact = attention_head_gauge(prefix, 1, 2, A, B)
    assert audit(model, None, tokens(), symmetries=[exact])[0].is_symmetry

    def q_only(p):  # A^T on the queries without A^-1 on the keys
        w = p[f"{prefix}.in_proj_weight"].clone()
        w[4:8] = A.T @ w[4:8]
        return {**p, f"{prefix}.in_proj_weight": w}

    with pytest.raises(ValueError, match="is not a symmetry"):
        audit(model, None, tokens(), symmetries=[Symmetry("A on q alone", q_only)])
    # a layer-norm rescaling with a GELU between the norm and the linear map
    gelu = nn.Sequential(nn.Linear(4, 6, **F64), nn.LayerNorm(6, **F64), nn.GELU(), nn.Linear(6, 3, **F64))
    with torch.no_grad():
        gelu[1].weight.normal_()
    assert any("(GELU" in r and "not positively homogeneous" in r for r in find_symmetries(gelu).skipped)
    wrong = layernorm_rescaling("1", ["3.weight"], torch.linspace(0.5, 2.0, 6))
    with pytest.raises(ValueError, match="is not a symmetry"):
        audit(gelu, None, torch.randn(5, 4, **F64), symmetries=[wrong])


def test_the_atlas_runs_on_both_models_with_the_new_columns():
    model = resnet()
    x = images(8)
    y = torch.randint(0, 3, (8,), generator=torch.Generator().manual_seed(5))
    before = frozen(model)
    table = atlas(model, CE, (x, y), probe=x[:4], measures=["fisher_rao"], transforms=["bn_rescaling", "permutation"])
    assert table.column("bn_rescaling").applies and table.column("bn_rescaling").receipt.is_symmetry
    assert table.cell("fisher_rao", "bn_rescaling").status == "invariant"
    assert table.cell("fisher_rao", "permutation").status == "invariant"
    assert bit_identical(model, before)
    small = transformer(True)
    t = tokens(8)
    table = atlas(
        small,
        CE,
        (t, y),
        probe=t[:4],
        measures=["fisher_rao"],
        transforms=["attention_gauge", "head_permutation", "ln_rescaling"],
    )
    assert all(c.applies and c.receipt.is_symmetry for c in table.columns)
    assert table.cell("fisher_rao", "head_permutation").status == "invariant"
    assert table.cell("fisher_rao", "attention_gauge").status == "invariant"


def test_params_of_with_buffers_holds_parameters_and_buffers():
    model = resnet()
    state = params_of(model, buffers=True)
    assert "bn.running_var" in state and "conv.weight" in state
    moved = find_symmetries(model).symmetries[0].applied(model)
    assert not torch.equal(moved.bn.running_var, model.bn.running_var)

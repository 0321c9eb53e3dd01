"""The registry on decoder transformers recognised by structure: LLaMA-style (RMSNorm, RoPE, GQA, SwiGLU) and GPT-2.

Every kind the registry reports is audited exact (float64, ``rtol=1e-10``) on a hand-written
LLaMA-style model (torch's ``nn.RMSNorm``, no ``transformers`` needed), on HuggingFace
``LlamaForCausalLM`` (GQA) and on ``GPT2LMHeadModel`` built from small configs; each has a
negative control that changes the outputs; the gauge counts equal the derived formulas.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from lossgeom.parameters import params_of
from lossgeom.symmetries import Symmetry, audit, decoder_gauge_dimensions, find_symmetries
from lossgeom.symmetries.attention import conditioned_matrix
from lossgeom.symmetries.decoder import (
    AttentionLayout,
    grouped_head_permutation,
    haar_orthogonal,
    query_key_gauge,
    rotary_commutant,
    stream_rotation,
)

D, H, H_KV, D_K, HIDDEN, LAYERS, VOCAB = 16, 4, 2, 4, 24, 2, 11
EXACT = 1e-10


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


class Rotary(nn.Module):
    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))

    def forward(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = torch.arange(length, dtype=self.inv_freq.dtype)[:, None] * self.inv_freq[None]
        angles = torch.cat([freqs, freqs], dim=-1)  # the rotate_half layout: pairs (i, i + d/2)
        return angles.cos(), angles.sin()


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.num_heads, self.num_key_value_heads, self.head_dim = H, H_KV, D_K
        self.q_proj = nn.Linear(D, H * D_K, bias=False)
        self.k_proj = nn.Linear(D, H_KV * D_K, bias=False)
        self.v_proj = nn.Linear(D, H_KV * D_K, bias=False)
        self.o_proj = nn.Linear(H * D_K, D, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, H, D_K).transpose(1, 2)
        k = self.k_proj(x).view(b, t, H_KV, D_K).transpose(1, 2)
        v = self.v_proj(x).view(b, t, H_KV, D_K).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        k, v = k.repeat_interleave(H // H_KV, dim=1), v.repeat_interleave(H // H_KV, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(D_K)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        attention = scores.masked_fill(mask, float("-inf")).softmax(-1)
        return self.o_proj((attention @ v).transpose(1, 2).reshape(b, t, H * D_K))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(D, HIDDEN, bias=False), nn.Linear(D, HIDDEN, bias=False)
        self.down_proj, self.act_fn = nn.Linear(HIDDEN, D, bias=False), nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn, self.mlp = Attention(), MLP()
        self.input_layernorm, self.post_attention_layernorm = nn.RMSNorm(D, eps=1e-6), nn.RMSNorm(D, eps=1e-6)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class TinyLlama(nn.Module):
    """A LLaMA-style decoder written by hand: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU."""

    def __init__(self, tied: bool = False) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.norm, self.rotary_emb = nn.RMSNorm(D, eps=1e-6), Rotary(D_K)
        self.lm_head = nn.Linear(D, VOCAB, bias=False)
        if tied:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        cos, sin = self.rotary_emb(ids.shape[1])
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def _tiny(unit_gains: bool = True, tied: bool = False, seed: int = 0) -> TinyLlama:
    torch.manual_seed(seed)
    model = TinyLlama(tied).double().eval()
    if not unit_gains:
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, nn.RMSNorm):
                    module.weight.uniform_(0.5, 1.5)
    return model


def _probe(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (3, 7), generator=torch.Generator().manual_seed(seed))


def _layout(prefix: str = "layers.0.self_attn") -> AttentionLayout:
    return AttentionLayout(f"{prefix}.q_proj", f"{prefix}.k_proj", f"{prefix}.v_proj", f"{prefix}.o_proj", H, H_KV, D_K)


def _changes_outputs(model: nn.Module, symmetry: Symmetry) -> float:
    """The relative output change under ``symmetry`` (the audit's functional check, not required to pass)."""
    (report,) = audit(model, None, _probe(), symmetries=[symmetry], rtol=EXACT, require_symmetry=False)
    assert not report.is_symmetry
    return report.max_output_discrepancy / report.output_scale


LLAMA_KINDS = {
    "query/key gauge",
    "value/output gauge",
    "query head permutation",
    "key/value group permutation",
    "RMSNorm gain rescaling",
    "SwiGLU rescaling",
    "permutation",
    "stream rotation",
}


def test_hand_written_llama_every_kind_is_exact() -> None:
    model = _tiny()
    before = {k: v.clone() for k, v in params_of(model, buffers=True).items()}
    found = find_symmetries(model, seed=0)
    assert set(found.by_kind()) == LLAMA_KINDS
    table = audit(model, None, _probe(), rtol=EXACT)  # raises if any symmetry changes the outputs
    assert len(table) == len(found) and all(report.is_symmetry for report in table)
    for key, value in params_of(model, buffers=True).items():
        assert torch.equal(value, before[key]), key
    qk = found.by_kind()["query/key gauge"]
    assert len(qk) == LAYERS * H_KV and all("rotary commutant" in s.name for s in qk)
    assert sum("full GL(4) query/key gauge" in reason for reason in found.skipped) == LAYERS
    assert sum("gate rescaling" in reason and "not homogeneous" in reason for reason in found.skipped) == LAYERS


def test_gains_not_folded_refuse_the_stream_rotation() -> None:
    folded, unfolded = _tiny(), _tiny(unit_gains=False)
    found = find_symmetries(unfolded, seed=0)
    assert "stream rotation" not in found.by_kind()
    assert any(r.startswith("stream rotation: gains not folded") for r in found.skipped)
    audit(unfolded, None, _probe(), rtol=EXACT)  # the gain rescalings stay exact with any gains
    (rotation,) = find_symmetries(folded, seed=0).by_kind()["stream rotation"]
    assert _changes_outputs(unfolded, rotation) > 1e-3  # the refused rotation is not a symmetry there


def test_tied_embeddings_rotate_jointly() -> None:
    model = _tiny(tied=True)
    found = find_symmetries(model, seed=0)
    (rotation,) = found.by_kind()["stream rotation"]
    audit(model, None, _probe(), symmetries=[rotation], rtol=EXACT)
    assert any("norm" in r and "tied" in r for r in found.skipped)  # the final gain would move the embedding too
    assert decoder_gauge_dimensions(model)["RMSNorm gain rescaling"] == 2 * LAYERS * D


def test_full_query_key_gauge_breaks_a_rotary_head() -> None:
    model, generator = _tiny(), torch.Generator().manual_seed(3)
    A = conditioned_matrix(D_K, 4.0, generator)
    with pytest.raises(ValueError, match="commute with the rotary"):
        query_key_gauge(_layout(), 0, A, rotary=True)
    assert _changes_outputs(model, query_key_gauge(_layout(), 0, A, rotary=False)) > 1e-3
    commutant = rotary_commutant(torch.tensor([0.7, 1.8]), torch.tensor([0.4, -2.0]))
    audit(model, None, _probe(), symmetries=[query_key_gauge(_layout(), 1, commutant, rotary=True)], rtol=EXACT)
    # adjacent pairs (the interleaved layout) are not the commutant of this model's rotations
    adjacent = torch.tensor([[1.0, 0.5, 0, 0], [-0.5, 1.0, 0, 0], [0, 0, 1.0, 0], [0, 0, 0, 1.0]], dtype=torch.float64)
    assert _changes_outputs(model, query_key_gauge(_layout(), 0, adjacent, rotary=False)) > 1e-6


def test_gate_rescaling_breaks_swiglu() -> None:
    c = torch.linspace(0.5, 2.0, HIDDEN, dtype=torch.float64)
    gate, down = "layers.0.mlp.gate_proj.weight", "layers.0.mlp.down_proj.weight"

    def moved(params: dict) -> dict:
        return {**params, gate: params[gate] * c[:, None], down: params[down] / c}

    assert _changes_outputs(_tiny(), Symmetry("gate rescaling", moved)) > 1e-3


def test_group_permutations_keep_query_heads_with_their_key_value_head() -> None:
    with pytest.raises(ValueError, match="away from its key/value head"):
        grouped_head_permutation(_layout(), [2, 1, 0, 3], [0, 1])
    model = _tiny()
    symmetry = grouped_head_permutation(_layout(), [3, 2, 1, 0], [1, 0])
    assert symmetry.name.startswith("key/value group permutation")
    audit(model, None, _probe(), symmetries=[symmetry], rtol=EXACT)


def test_counts_equal_the_formulas() -> None:
    counts = decoder_gauge_dimensions(_tiny())
    assert counts == {
        "stream rotation": D * (D - 1) // 2,  # X7
        "query/key gauge": LAYERS * H_KV * D_K,  # X8/X9: the commutant, d_k per key/value head
        "value/output gauge": LAYERS * H_KV * D_K**2,  # X9: GL(d_v) per key/value head
        "RMSNorm gain rescaling": (2 * LAYERS + 1) * D,
        "SwiGLU rescaling": LAYERS * HIDDEN,  # X10
    }
    assert decoder_gauge_dimensions(_tiny(unit_gains=False))["stream rotation"] == 0
    with pytest.raises(ValueError, match="no LLaMA-style or GPT-2"):
        decoder_gauge_dimensions(nn.Sequential(nn.Linear(3, 3)))


def test_stream_rotation_refuses_a_matrix_that_is_not_orthogonal() -> None:
    with pytest.raises(ValueError, match="orthogonal"):
        stream_rotation(2 * torch.eye(3, dtype=torch.float64), ["w"])
    Q = haar_orthogonal(5, torch.Generator().manual_seed(0))
    assert torch.allclose(Q @ Q.T, torch.eye(5, dtype=torch.float64), atol=1e-14)


# HuggingFace models built from configs (no download)


def _hf_llama(tied: bool = False, float64_norms: bool = True) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=D,
        intermediate_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=H,
        num_key_value_heads=H_KV,
        max_position_embeddings=32,
        tie_word_embeddings=tied,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.LlamaForCausalLM(config).double().eval()
    if float64_norms:
        # LlamaRMSNorm normalises in float32 even in a float64 model (outputs agree only to ~1e-7
        # relative under an exact symmetry): the same map in float64, for the audit at 1e-10
        def forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
            return self.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)

        for module in model.modules():
            if type(module).__name__ == "LlamaRMSNorm":
                module.forward = forward.__get__(module)
    return model


def test_hf_llama_gqa_every_kind_is_exact() -> None:
    model = _hf_llama()
    found = find_symmetries(model, seed=0)
    assert set(found.by_kind()) == LLAMA_KINDS
    assert all("rotary commutant" in s.name for s in found.by_kind()["query/key gauge"])
    audit(model, None, _probe(), rtol=EXACT)
    assert decoder_gauge_dimensions(model) == decoder_gauge_dimensions(_tiny())


def test_hf_llama_float32_norms_exact_to_their_rounding() -> None:
    # as built, LlamaRMSNorm computes in float32: every symmetry holds to float32 rounding, not 1e-10
    table = audit(_hf_llama(float64_norms=False), None, _probe(), rtol=1e-6)
    assert all(report.is_symmetry for report in table)


def test_hf_llama_tied_embeddings() -> None:
    model = _hf_llama(tied=True)
    found = find_symmetries(model, seed=0)
    assert "stream rotation" in found.by_kind()
    assert any("model.norm" in r and "tied" in r for r in found.skipped)
    audit(model, None, _probe(), rtol=EXACT)


def _hf_gpt2() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=D, n_layer=LAYERS, n_head=H, n_positions=32, attn_implementation="eager"
    )
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.GPT2LMHeadModel(config).double().eval()


def test_gpt2_every_kind_is_exact() -> None:
    model = _hf_gpt2()
    before = {k: v.clone() for k, v in params_of(model, buffers=True).items()}
    found = find_symmetries(model, seed=0)
    kinds = {"query/key gauge", "value/output gauge", "head permutation", "layer-norm rescaling", "permutation"}
    assert set(found.by_kind()) == kinds | {"stream rotation"}
    assert all(f"GL({D_K})" in s.name for s in found.by_kind()["query/key gauge"])  # no rotary: the full gauge
    (rotation,) = found.by_kind()["stream rotation"]
    assert "fixing the ones direction" in rotation.name
    audit(model, None, _probe(), rtol=EXACT)
    for key, value in params_of(model, buffers=True).items():
        assert torch.equal(value, before[key]), key
    reasons = " | ".join(found.skipped)
    assert "GELU is not positively homogeneous" in reasons and "fixing the ones direction survive" in reasons
    assert "transformer.ln_f: the output head lm_head is tied" in reasons
    assert decoder_gauge_dimensions(model) == {
        "stream rotation": (D - 1) * (D - 2) // 2,
        "query/key gauge": LAYERS * H * D_K**2,
        "value/output gauge": LAYERS * H * D_K**2,
        "layer-norm rescaling": 2 * LAYERS * D,
    }


def test_gpt2_rotation_moving_the_ones_direction_changes_outputs() -> None:
    model = _hf_gpt2()
    (rotation,) = find_symmetries(model, seed=0).by_kind()["stream rotation"]
    Q = haar_orthogonal(D, torch.Generator().manual_seed(5))
    params = dict(model.named_parameters())
    # the same tensors as the registry's rotation, rotated by a Q that does not fix the ones direction
    moved_keys = [k for k in params if not torch.equal(rotation(params)[k], params[k])]
    last = [k for k in moved_keys if k.endswith("bias") or "wte" in k or "wpe" in k or ".c_proj." in k]
    first = [k for k in moved_keys if k not in last]
    assert _changes_outputs(model, stream_rotation(Q, last, first)) > 1e-3

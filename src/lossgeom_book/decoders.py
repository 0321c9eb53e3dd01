"""Small decoder transformers for the atlas and the audit pages: LLaMA-style and GPT-2.

- :class:`LlamaStyleClassifier`: a LLaMA-style decoder written with torch alone (``nn.RMSNorm``,
  rotary position embeddings in the ``rotate_half`` layout, grouped-query attention, a SwiGLU
  MLP), float64, reading a token sequence and returning the logits at its last position;
- :func:`hf_llama` and :func:`hf_gpt2`: HuggingFace ``LlamaForCausalLM`` and
  ``GPT2LMHeadModel`` built from small configs (random weights, no download, eager attention),
  float64 and in eval mode.

The layer and attribute names follow HuggingFace's LLaMA (``self_attn.q_proj``, ``mlp.gate_proj``,
``input_layernorm``, ...), which is how :func:`lossgeom.symmetries.find_symmetries` recognises
a decoder layer.
"""

from __future__ import annotations

import copy
import math
import warnings

import torch
from torch import nn

F64 = dict(dtype=torch.float64)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


class RotaryEmbedding(nn.Module):
    """Rotary position embeddings: position ``t`` rotates the pair ``(i, i + d/2)`` by ``t base^(-2i/d)``."""

    def __init__(self, head_dim: int, base: float = 10000.0) -> None:
        super().__init__()
        exponents = torch.arange(0, head_dim, 2, **F64) / head_dim
        self.register_buffer("inv_freq", 1.0 / base**exponents)

    def forward(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        angles = torch.arange(length, **F64)[:, None] * self.inv_freq[None]
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos(), angles.sin()


class GroupedQueryAttention(nn.Module):
    """Causal attention of ``heads`` query heads sharing ``kv_heads`` key/value heads, rotary on queries and keys."""

    def __init__(self, d: int, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        if heads % kv_heads:
            raise ValueError(f"heads must be a multiple of kv_heads, got {heads} and {kv_heads}")
        self.num_heads, self.num_key_value_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(d, heads * head_dim, bias=False, **F64)
        self.k_proj = nn.Linear(d, kv_heads * head_dim, bias=False, **F64)
        self.v_proj = nn.Linear(d, kv_heads * head_dim, bias=False, **F64)
        self.o_proj = nn.Linear(heads * head_dim, d, bias=False, **F64)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h, g, dk = self.num_heads, self.num_key_value_heads, self.head_dim
        q = self.q_proj(x).view(b, t, h, dk).transpose(1, 2)
        k = self.k_proj(x).view(b, t, g, dk).transpose(1, 2)
        v = self.v_proj(x).view(b, t, g, dk).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        k, v = k.repeat_interleave(h // g, dim=1), v.repeat_interleave(h // g, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(dk)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        weights = scores.masked_fill(causal, float("-inf")).softmax(-1)
        return self.o_proj((weights @ v).transpose(1, 2).reshape(b, t, h * dk))


class SwiGLU(nn.Module):
    """``down(silu(gate x) * up x)``."""

    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d, hidden, bias=False, **F64)
        self.up_proj = nn.Linear(d, hidden, bias=False, **F64)
        self.down_proj = nn.Linear(hidden, d, bias=False, **F64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaStyleLayer(nn.Module):
    """Pre-RMSNorm residual layer: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, d: int, heads: int, kv_heads: int, head_dim: int, hidden: int) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(d, eps=1e-6, **F64)
        self.self_attn = GroupedQueryAttention(d, heads, kv_heads, head_dim)
        self.post_attention_layernorm = nn.RMSNorm(d, eps=1e-6, **F64)
        self.mlp = SwiGLU(d, hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaStyleClassifier(nn.Module):
    """A LLaMA-style decoder (RMSNorm, RoPE, GQA, SwiGLU) whose output is the logits at the last position.

    Tokens ``(n, t)`` (integers, or floats holding integers) give logits ``(n, vocab)``:
    embedding, ``layers`` pre-RMSNorm layers, a final RMSNorm and a linear head with no
    bias, all in float64, drawn from ``torch.manual_seed(seed)``.
    """

    def __init__(
        self,
        vocab: int,
        d: int = 16,
        heads: int = 4,
        kv_heads: int = 2,
        head_dim: int = 4,
        hidden: int = 24,
        layers: int = 1,
        seed: int = 0,
    ) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.embed_tokens = nn.Embedding(vocab, d, **F64)
            self.layers = nn.ModuleList(LlamaStyleLayer(d, heads, kv_heads, head_dim, hidden) for _ in range(layers))
            self.norm = nn.RMSNorm(d, eps=1e-6, **F64)
            self.rotary_emb = RotaryEmbedding(head_dim)
            self.lm_head = nn.Linear(d, vocab, bias=False, **F64)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        tokens = tokens.long()
        x = self.embed_tokens(tokens)
        cos, sin = self.rotary_emb(tokens.shape[1])
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x[:, -1]))


def _float64_rms_norm(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return self.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)


def _transformers():  # noqa: ANN202
    """``transformers``, imported without tqdm's notebook warning (its text names a local path)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import transformers
    return transformers


def hf_llama(*, float64_norms: bool = True, seed: int = 0, **sizes: int) -> nn.Module:
    """A HuggingFace ``LlamaForCausalLM`` from ``LlamaConfig(**sizes)``: float64, eval mode, eager attention.

    ``LlamaRMSNorm`` normalises in float32 even in a float64 model; with ``float64_norms``
    each one's forward is replaced by the same map in float64 (its gain times ``x / rms(x)``).
    """
    transformers = _transformers()
    config = transformers.LlamaConfig(**sizes, attn_implementation="eager")
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(seed)
        model = transformers.LlamaForCausalLM(config).double().eval()
    if float64_norms:
        for module in model.modules():
            if type(module).__name__ == "LlamaRMSNorm":
                module.forward = _float64_rms_norm.__get__(module)
    return model


def hf_gpt2(*, seed: int = 0, **sizes: int) -> nn.Module:
    """A HuggingFace ``GPT2LMHeadModel`` from ``GPT2Config(**sizes)``: float64, eval mode, eager attention."""
    transformers = _transformers()
    sizes = {
        "bos_token_id": sizes.get("vocab_size", 50257) - 1,
        "eos_token_id": sizes.get("vocab_size", 50257) - 1,
        **sizes,
    }
    config = transformers.GPT2Config(**sizes, attn_implementation="eager")
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(seed)
        return transformers.GPT2LMHeadModel(config).double().eval()


def fold_rms_gains(model: LlamaStyleClassifier) -> LlamaStyleClassifier:
    """A copy of ``model`` with every RMSNorm gain folded into the linear maps that read it (gains set to 1).

    ``W (g * n(x)) = (W diag(g)) n(x)``: the same function, and the pre-RMSNorm residual
    stream then admits every orthogonal rotation (the computational invariance of
    SliceGPT). The caller's model is not changed.
    """
    folded = copy.deepcopy(model)
    readers = [
        (layer.input_layernorm, [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj])
        for layer in folded.layers
    ]
    readers += [(layer.post_attention_layernorm, [layer.mlp.gate_proj, layer.mlp.up_proj]) for layer in folded.layers]
    readers.append((folded.norm, [folded.lm_head]))
    with torch.no_grad():
        for norm, linears in readers:
            for linear in linears:
                linear.weight.mul_(norm.weight[None, :])
            norm.weight.fill_(1.0)
    return folded

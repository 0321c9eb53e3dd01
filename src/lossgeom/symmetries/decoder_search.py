"""The registry's search of decoder transformers, by module structure rather than by tracing.

HuggingFace decoders (and many hand-written ones) cannot be traced by ``torch.fx``, so their
layers are recognised by what they hold, without importing ``transformers``:

- a **LLaMA-style layer**: children ``self_attn`` (``q_proj``, ``k_proj``, ``v_proj``,
  ``o_proj`` Linear layers; head counts from ``num_heads`` / ``num_key_value_heads`` /
  ``head_dim`` or the module's ``config``), ``mlp`` (``gate_proj``, ``up_proj``,
  ``down_proj``) and the RMSNorms ``input_layernorm`` and ``post_attention_layernorm``
  (any module with a ``weight`` gain, no bias, computing ``g * x / rms(x)``: checked on a
  random input); rotary if the model holds a module with an ``inv_freq`` buffer or
  ``Rotary`` in its class name (the ``rotate_half`` layout is assumed);
- a **GPT-2 block**: ``ln_1``, ``attn`` (``c_attn`` fused queries, keys and values and
  ``c_proj``, transposed ``Conv1D`` weights ``[in, out]``), ``ln_2``, ``mlp`` (``c_fc``,
  ``c_proj``).

Every parameter outside the recognised layers must be an embedding, the final norm or the
output head, or the stream rotation is refused; the symmetries found are those of
:mod:`lossgeom.symmetries.decoder`, and :func:`decoder_gauge_dimensions` counts them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from lossgeom.formatting import fmt
from lossgeom.symmetries.attention import conditioned_matrix
from lossgeom.symmetries.core import Symmetry
from lossgeom.symmetries.decoder import (
    AttentionLayout,
    grouped_head_permutation,
    haar_orthogonal,
    hidden_unit_permutation,
    norm_gain_rescaling,
    orthogonal_fixing_ones,
    query_key_gauge,
    rotary_commutant,
    stream_rotation,
    swiglu_rescaling,
    value_output_gauge,
)
from lossgeom.symmetries.graph import _log_uniform

#: The kinds of symmetry the decoder search reports, as their names begin.
DECODER_KINDS = (
    "RMSNorm gain rescaling",
    "stream rotation",
    "query/key gauge",
    "value/output gauge",
    "query head permutation",
    "key/value group permutation",
    "SwiGLU rescaling",
)

_LLAMA_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
_SWIGLU = ("gate_proj", "up_proj", "down_proj")


def _config(module: nn.Module, *names: str) -> int | None:
    """The first integer attribute of ``module`` (or its ``config``) among ``names``."""
    for source in (module, getattr(module, "config", None)):
        for name in names:
            value = getattr(source, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def _is_rms_norm(module: nn.Module | None) -> bool:
    """``module`` computes ``g * x / sqrt(mean(x^2) + eps)`` with its 1-D ``weight`` ``g`` and no bias."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, nn.Parameter) or weight.ndim != 1 or getattr(module, "bias", None) is not None:
        return False
    if isinstance(module, (nn.LayerNorm, nn.GroupNorm)) or len(list(module.parameters())) != 1:
        return False
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, weight.numel(), generator=generator, dtype=torch.float64).to(weight)
    g = (torch.rand(weight.numel(), generator=generator, dtype=torch.float64) + 0.5).to(weight)
    try:
        with torch.no_grad():
            y = torch.func.functional_call(module, {"weight": g}, (x,))
    except Exception:  # a module that does not run on a plain tensor is not recognised
        return False
    expected = g * x / x.pow(2).mean(-1, keepdim=True).sqrt()
    return (
        isinstance(y, torch.Tensor) and y.shape == x.shape and bool(torch.allclose(y, expected, rtol=1e-4, atol=1e-5))
    )


def _is_conv1d(module: nn.Module | None) -> bool:
    """A transposed linear layer (GPT-2's ``Conv1D``): ``weight [in, out]``, ``bias [out]``, ``nf = out``."""
    weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
    return (
        not isinstance(module, nn.Linear)
        and isinstance(weight, nn.Parameter)
        and weight.ndim == 2
        and isinstance(bias, nn.Parameter)
        and bias.shape == (weight.shape[1],)
        and getattr(module, "nf", None) == weight.shape[1]
    )


def _children(module: nn.Module) -> dict[str, nn.Module]:
    return dict(module.named_children())


@dataclass
class _Layer:
    """A recognised decoder layer: its prefix, the attention layout and the names of its parts."""

    prefix: str
    kind: str  # "llama" or "gpt2"
    layout: AttentionLayout
    hidden: int
    width: int
    norms: tuple[str, str]
    partial_rotary: bool = False
    parameters: set[int] = field(default_factory=set)


def _llama_layer(prefix: str, layer: nn.Module) -> _Layer | None:
    parts = _children(layer)
    attention, mlp = parts.get("self_attn"), parts.get("mlp")
    norms = ("input_layernorm", "post_attention_layernorm")
    if attention is None or mlp is None or set(parts) - {"self_attn", "mlp", *norms}:
        return None
    projections, units = _children(attention), _children(mlp)
    if not all(isinstance(projections.get(n), nn.Linear) for n in _LLAMA_ATTENTION):
        return None
    if not all(isinstance(units.get(n), nn.Linear) for n in _SWIGLU) or not all(
        _is_rms_norm(parts.get(n)) for n in norms
    ):
        return None
    if any(list(m.parameters()) for n, m in {**projections, **units}.items() if n not in (*_LLAMA_ATTENTION, *_SWIGLU)):
        return None  # a part with parameters the registry does not know (a q/k norm, ...)
    q, k, o = projections["q_proj"], projections["k_proj"], projections["o_proj"]
    d = _config(attention, "head_dim")
    h = _config(attention, "num_heads", "num_attention_heads") or (q.out_features // d if d else None)
    groups = _config(attention, "num_key_value_groups")
    h_kv = _config(attention, "num_key_value_heads") or (h // groups if h and groups else None)
    if not (d and h and h_kv) or h % h_kv or q.out_features != h * d or k.out_features != h_kv * d:
        return None
    if projections["v_proj"].out_features != h_kv * d or o.in_features != h * d:
        return None
    width, hidden = q.in_features, units["up_proj"].out_features
    readers = [projections[n] for n in _LLAMA_ATTENTION[:3]] + [units["gate_proj"], units["up_proj"]]
    if (
        any(r.in_features != width for r in readers)
        or o.out_features != width
        or units["down_proj"].out_features != width
    ):
        return None
    if units["gate_proj"].out_features != hidden or units["down_proj"].in_features != hidden:
        return None
    if any(parts[n].weight.numel() != width for n in norms):
        return None
    a = f"{prefix}.self_attn"
    layout = AttentionLayout(f"{a}.q_proj", f"{a}.k_proj", f"{a}.v_proj", f"{a}.o_proj", h, h_kv, d)
    partial = getattr(getattr(attention, "config", None), "partial_rotary_factor", 1.0)
    norms = tuple(f"{prefix}.{n}" for n in norms)
    return _Layer(prefix, "llama", layout, hidden, width, norms, partial not in (None, 1, 1.0))


def _gpt2_layer(prefix: str, block: nn.Module) -> _Layer | None:
    parts = _children(block)
    attention, mlp = parts.get("attn"), parts.get("mlp")
    if attention is None or mlp is None or set(parts) != {"ln_1", "attn", "ln_2", "mlp"}:
        return None
    if not all(isinstance(parts[n], nn.LayerNorm) and parts[n].weight is not None for n in ("ln_1", "ln_2")):
        return None
    projections, units = _children(attention), _children(mlp)
    if not all(_is_conv1d(projections.get(n)) for n in ("c_attn", "c_proj")) or getattr(
        attention, "is_cross_attention", False
    ):
        return None
    if not all(_is_conv1d(units.get(n)) for n in ("c_fc", "c_proj")):
        return None
    known = {"c_attn", "c_proj", "c_fc"}
    if any(list(m.parameters()) for n, m in {**projections, **units}.items() if n not in known):
        return None
    E = projections["c_attn"].weight.shape[0]
    h, d = _config(attention, "num_heads"), _config(attention, "head_dim")
    if not (h and d) or h * d != E or projections["c_attn"].weight.shape[1] != 3 * E:
        return None
    a = f"{prefix}.attn"
    layout = AttentionLayout(f"{a}.c_attn", f"{a}.c_attn", f"{a}.c_attn", f"{a}.c_proj", h, h, d, True, (0, E, 2 * E))
    norms = (f"{prefix}.ln_1", f"{prefix}.ln_2")
    return _Layer(prefix, "gpt2", layout, units["c_fc"].weight.shape[1], E, norms)


@dataclass
class _Decoder:
    """The recognised structure of a decoder model."""

    layers: list[_Layer]
    width: int
    rotary: bool
    stream: dict[str, int]  # full parameter name -> stream axis (0 or -1), for the rotation
    refusal: str  # why the stream rotation is not exact ("" when it is)
    final_norm: str | None
    head: str | None  # the output head's prefix, if it reads the final norm alone


def _recognised_layers(model: nn.Module) -> list[_Layer]:
    """The LLaMA-style or GPT-2 layers of ``model`` (outermost first), each with the ids of its parameters."""
    layers: list[_Layer] = []
    for prefix, module in model.named_modules():
        if any(prefix.startswith(f"{done.prefix}.") for done in layers):
            continue
        layer = _llama_layer(prefix, module) or _gpt2_layer(prefix, module)
        if layer is not None:
            layer.parameters = {id(p) for p in module.parameters()}
            layers.append(layer)
    return layers


def _decoder(model: nn.Module) -> _Decoder | None:
    """The decoder structure of ``model``, or None when no layer is recognised."""
    names = {id(p): n for n, p in model.named_parameters()}
    layers = _recognised_layers(model)
    if not layers or len({layer.kind for layer in layers}) > 1:
        return None
    llama = layers[0].kind == "llama"
    width = layers[0].width
    owned = set().union(*(layer.parameters for layer in layers))
    rotary = llama and any(
        "Rotary" in type(m).__name__ or "inv_freq" in dict(m.named_buffers(recurse=False)) for m in model.modules()
    )
    stream: dict[str, int] = {}
    embeddings, norms, heads, others = [], [], [], []
    for prefix, module in model.named_modules():
        own = {n: p for n, p in module.named_parameters(recurse=False) if id(p) not in owned}
        if not own:
            continue
        if isinstance(module, nn.Embedding) and module.embedding_dim == width:
            embeddings.append(prefix)
            stream[names[id(module.weight)]] = -1
        elif (_is_rms_norm(module) if llama else isinstance(module, nn.LayerNorm)) and module.weight.numel() == width:
            norms.append(prefix)  # its gain is not rotated (it must be all ones); a LayerNorm's bias is
            if "bias" in own:
                stream[names[id(module.bias)]] = -1
        elif isinstance(module, nn.Linear) and module.in_features == width:
            heads.append(prefix)  # an output head reading the stream: its weight's columns rotate, not its bias
            stream[names[id(module.weight)]] = -1
        else:
            others.append(prefix)
    final_norm = norms[0] if len(norms) == 1 else None
    head = heads[0] if len(heads) == 1 and final_norm else None
    refusal = ""
    if others or len(norms) != 1 or len(heads) > 1 or not embeddings:
        refusal = (
            f"parameters outside the recognised layers ({', '.join(others + norms[1:] + heads[1:]) or 'none'}) "
            "or no single final norm and embedding"
        )
    for layer in layers:
        stream.update(_layer_stream(model, layer, llama))
    params = dict(model.named_parameters())
    gains = [f"{norm}.weight" for norm in (*(n for layer in layers for n in layer.norms), *norms)]
    unfolded = [n for n in gains if n in params and not bool(torch.all(params[n].detach() == 1))]
    if not refusal and unfolded:
        refusal = f"gains not folded ({', '.join(unfolded)} not all ones)"
    return _Decoder(layers, width, rotary, stream, refusal, final_norm, head)


def _layer_stream(model: nn.Module, layer: _Layer, llama: bool) -> dict[str, int]:
    """The stream axis of each parameter of ``layer`` that touches the residual stream."""
    params = dict(model.named_parameters())
    readers_writers: dict[str, int] = {}
    if llama:
        a, m = layer.layout.query.rsplit(".", 1)[0], f"{layer.prefix}.mlp"
        for reader in (*(f"{a}.{n}" for n in _LLAMA_ATTENTION[:3]), f"{m}.gate_proj", f"{m}.up_proj"):
            readers_writers[f"{reader}.weight"] = -1
        for writer in (f"{a}.o_proj", f"{m}.down_proj"):
            readers_writers[f"{writer}.weight"] = 0
            readers_writers[f"{writer}.bias"] = -1
    else:
        a, m = f"{layer.prefix}.attn", f"{layer.prefix}.mlp"
        readers_writers.update({f"{a}.c_attn.weight": 0, f"{m}.c_fc.weight": 0})
        readers_writers.update({f"{a}.c_proj.weight": -1, f"{a}.c_proj.bias": -1})
        readers_writers.update({f"{m}.c_proj.weight": -1, f"{m}.c_proj.bias": -1})
        readers_writers.update({f"{norm}.bias": -1 for norm in layer.norms})
    return {key: axis for key, axis in readers_writers.items() if key in params}


def _tied_names(model: nn.Module, prefix: str) -> list[str]:
    """The other names of ``prefix``'s weight, if it is shared with another module."""
    weight = getattr(model.get_submodule(prefix), "weight", None)
    names = [n for n, p in model.named_parameters(remove_duplicate=False) if p is weight]
    return [n for n in names if n != f"{prefix}.weight"]


def _decoder_search(
    model: nn.Module, rescale: float, condition: float, generator: torch.Generator, drawn: str
) -> tuple[tuple[Symmetry, ...], tuple[str, ...], str] | None:
    """The registry's symmetries of a decoder recognised by structure (None when none is recognised)."""
    decoder = _decoder(model)
    if decoder is None:
        return None
    found: list[Symmetry] = []
    skipped: list[str] = []
    llama = decoder.layers[0].kind == "llama"
    norm_kind = "RMSNorm gain" if llama else "layer-norm"
    for layer in decoder.layers:
        _attention_symmetries(layer, decoder.rotary, rescale, condition, generator, found, skipped)
        _mlp_symmetries(layer, rescale, generator, found, skipped)
    if decoder.final_norm is not None:
        where = f"{norm_kind} rescaling of {decoder.final_norm}"
        tied = _tied_names(model, decoder.head) if decoder.head else []
        if decoder.head is None:
            skipped.append(f"{where}: no single output head reads it (not audited)")
        elif tied:
            skipped.append(f"{where}: the output head {decoder.head} is tied to {', '.join(tied)} (not audited)")
        else:
            scales = _log_uniform(decoder.width, rescale, generator)
            found.append(norm_gain_rescaling(decoder.final_norm, [decoder.head], scales, kind=norm_kind))
    if decoder.head is not None:
        skipped.append(f"softmax row shift of {decoder.head}: the decoder search does not look for it (not audited)")
    if decoder.refusal:
        skipped.append(f"stream rotation: {decoder.refusal}; refused (not audited)")
    else:
        Q = haar_orthogonal(decoder.width, generator) if llama else orthogonal_fixing_ones(decoder.width, generator)
        first = [k for k, axis in decoder.stream.items() if axis == 0]
        found.append(stream_rotation(Q, [k for k, axis in decoder.stream.items() if axis != 0], first))
        if not llama:
            skipped.append(
                "stream rotations moving the all-ones direction: LayerNorm centres its input, so only the orthogonal "
                "maps fixing the ones direction survive (not a symmetry, not reported)"
            )
    sampling = (
        f"rescalings log-uniform in [1/{fmt(rescale)}, {fmt(rescale)}], gauges Q1 diag(s) Q2 of condition number "
        f"{fmt(condition)}"
        + (
            f" (rotary: scales log-uniform in [1/{fmt(rescale)}, {fmt(rescale)}], angles uniform)"
            if decoder.rotary
            else ""
        )
        + f", Haar stream rotations, drawn with {drawn}"
    )
    return tuple(found), tuple(skipped), sampling


def _attention_symmetries(
    layer: _Layer,
    rotary: bool,
    rescale: float,
    condition: float,
    generator: torch.Generator,
    found: list[Symmetry],
    skipped: list[str],
) -> None:
    """The query/key and value/output gauges and the head permutations of ``layer``'s attention."""
    layout, d, llama = layer.layout, layer.layout.head_dim, layer.kind == "llama"
    attention = layout.output.rsplit(".", 1)[0]
    for g in range(layout.n_kv_heads):
        if layer.partial_rotary:  # rotary on part of each head only: its gauge is refused below
            ...
        elif llama:  # the rotary commutant, also where no rotary module was found (a subgroup of GL(d_k))
            angles = 2 * math.pi * torch.rand(d // 2, generator=generator, dtype=torch.float64)
            A = rotary_commutant(_log_uniform(d // 2, rescale, generator), angles)
            found.append(query_key_gauge(layout, g, A, rotary=True))
        else:
            found.append(query_key_gauge(layout, g, conditioned_matrix(d, condition, generator), rotary=False))
        found.append(value_output_gauge(layout, g, conditioned_matrix(d, condition, generator)))
    if layer.partial_rotary:
        skipped.append(f"query/key gauges of {attention}: partial rotary embeddings (not audited)")
    elif llama:
        why = (
            "rotary embeddings rotate each frequency pair by position"
            if rotary
            else "no rotary embedding module was found, but the registry cannot tell that the attention applies none"
        )
        skipped.append(
            f"full GL({d}) query/key gauge of {attention}: {why}, so only the rotary commutant (one scaled 2x2 "
            "rotation per pair (i, i + d/2)) is reported"
        )
    identity = torch.arange(layout.n_kv_heads)
    if layout.group > 1:
        order = torch.cat([g * layout.group + torch.randperm(layout.group, generator=generator) for g in identity])
        found.append(grouped_head_permutation(layout, order, identity))
    if layout.n_kv_heads > 1:
        kv = torch.randperm(layout.n_kv_heads, generator=generator)
        if torch.equal(kv, identity):  # a group permutation that moves no group is a query head permutation
            kv = kv.roll(1)
        order = (kv[:, None] * layout.group + torch.arange(layout.group)).reshape(-1)
        found.append(grouped_head_permutation(layout, order, kv))


def _mlp_symmetries(
    layer: _Layer, rescale: float, generator: torch.Generator, found: list[Symmetry], skipped: list[str]
) -> None:
    """The gain rescalings of ``layer``'s two norms and its MLP's rescalings and permutations."""
    llama, m = layer.kind == "llama", f"{layer.prefix}.mlp"
    attention = layer.layout.output.rsplit(".", 1)[0]
    kind = "RMSNorm gain" if llama else "layer-norm"
    readers = (
        ([f"{attention}.{n}" for n in _LLAMA_ATTENTION[:3]], [f"{m}.gate_proj", f"{m}.up_proj"])
        if llama
        else ([f"{attention}.c_attn"], [f"{m}.c_fc"])
    )
    for norm, reads in zip(layer.norms, readers):
        scales = _log_uniform(layer.width, rescale, generator)
        found.append(norm_gain_rescaling(norm, reads, scales, transposed=not llama, kind=kind))
    if llama:
        found.append(swiglu_rescaling(m, _log_uniform(layer.hidden, rescale, generator)))
        skipped.append(
            f"gate rescaling of {m}.gate_proj: SiLU is not homogeneous (silu(c z) != c silu(z)), not a symmetry"
        )
        perm = torch.randperm(layer.hidden, generator=generator)
        found.append(hidden_unit_permutation([f"{m}.gate_proj", f"{m}.up_proj"], f"{m}.down_proj", perm))
    else:
        skipped.append(f"rescaling {m}.c_fc -> {m}.c_proj: GELU is not positively homogeneous (not a symmetry)")
        perm = torch.randperm(layer.hidden, generator=generator)
        found.append(hidden_unit_permutation([f"{m}.c_fc"], f"{m}.c_proj", perm, transposed=True))


def decoder_gauge_dimensions(model: nn.Module) -> dict[str, int]:
    r"""The dimension of each continuous gauge the registry reports on a decoder, summed over layers.

    Per attention layer with ``h`` query heads, ``h_kv`` key/value heads and head dimension
    ``d_k = d_v``: query/key ``h_kv d_k`` with rotary embeddings (the commutant) and
    ``h_kv d_k^2`` without; value/output ``h_kv d_v^2``. Per SwiGLU MLP its hidden width;
    per normalisation whose gain rescaling is reported, its width ``d``. The stream rotation:
    ``d (d - 1) / 2`` with RMSNorm, ``(d - 1)(d - 2) / 2`` with LayerNorm, 0 where refused.

    Args:
        model: a decoder the registry recognises (LLaMA-style or GPT-2).

    Returns:
        ``{kind: dimension}`` over the kinds of :data:`DECODER_KINDS` (and ``"layer-norm rescaling"``).

    Raises:
        TypeError: if ``model`` is not an ``nn.Module``.
        ValueError: if no decoder layer is recognised.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    decoder = _decoder(model)
    if decoder is None:
        raise ValueError(f"no LLaMA-style or GPT-2 decoder layer recognised in {type(model).__name__}")
    llama, d = decoder.layers[0].kind == "llama", decoder.width
    norm = "RMSNorm gain rescaling" if llama else "layer-norm rescaling"
    counts = {"stream rotation": 0, "query/key gauge": 0, "value/output gauge": 0, norm: 0}
    if llama:
        counts["SwiGLU rescaling"] = 0
    for layer in decoder.layers:
        h_kv, d_k = layer.layout.n_kv_heads, layer.layout.head_dim
        if not layer.partial_rotary:
            counts["query/key gauge"] += h_kv * (d_k if llama else d_k * d_k)
        counts["value/output gauge"] += h_kv * d_k * d_k
        counts[norm] += 2 * d
        # the permutations are discrete: no dimension
        if llama:
            counts["SwiGLU rescaling"] += layer.hidden
    if decoder.head is not None and not _tied_names(model, decoder.head):
        counts[norm] += d
    if not decoder.refusal:
        counts["stream rotation"] = d * (d - 1) // 2 if llama else (d - 1) * (d - 2) // 2
    return counts

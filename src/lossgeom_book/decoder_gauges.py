"""The continuous gauges of a LLaMA-style decoder, one Lie-algebra direction at a time, and their tangents.

Used by the chapter "Transformers as they are trained" (``chapters/ch14_decoder_transformers``)
on :class:`lossgeom_book.decoders.LlamaStyleClassifier`. :func:`gauge_generators` lists, by
kind, one-parameter families ``t -> Symmetry`` built from the library's transforms
(:mod:`lossgeom.symmetries.decoder`): the rotary commutant's log-scale and angle per frequency
pair (Su et al. 2021), ``exp(t E_ij)`` on each value/output gauge of grouped-query attention
(Ainslie et al. 2023), ``exp(t)`` on one RMSNorm channel or one SwiGLU unit (Shazeer 2020), and
``exp(t (E_ij - E_ji))`` on the residual stream (Ashkboos et al. 2024; exact only with the gains
folded). :func:`gauge_tangents` differentiates them at a point by central differences.
"""

from __future__ import annotations

import torch
from torch import nn

from lossgeom.symmetries.decoder import (
    AttentionLayout,
    norm_gain_rescaling,
    query_key_gauge,
    rotary_commutant,
    stream_rotation,
    swiglu_rescaling,
    value_output_gauge,
)

_KW = dict(dtype=torch.float64)
KINDS = ("query/key gauge", "value/output gauge", "RMSNorm gain rescaling", "SwiGLU rescaling", "stream rotation")


def sizes_of(model: nn.Module) -> dict[str, int]:
    """``d, heads, kv_heads, head_dim, hidden, layers`` read from a LLaMA-style model's modules."""
    attn, mlp = model.layers[0].self_attn, model.layers[0].mlp
    return dict(
        d=model.embed_tokens.embedding_dim,
        heads=attn.num_heads,
        kv_heads=attn.num_key_value_heads,
        head_dim=attn.head_dim,
        hidden=mlp.up_proj.out_features,
        layers=len(model.layers),
    )


def norm_readers(layers: int) -> dict[str, list[str]]:
    """Each RMSNorm of a ``layers``-layer LLaMA-style model and the Linear layers that read it."""
    readers = {}
    for i in range(layers):
        a, m = f"layers.{i}.self_attn", f"layers.{i}.mlp"
        readers[f"layers.{i}.input_layernorm"] = [f"{a}.q_proj", f"{a}.k_proj", f"{a}.v_proj"]
        readers[f"layers.{i}.post_attention_layernorm"] = [f"{m}.gate_proj", f"{m}.up_proj"]
    readers["norm"] = ["lm_head"]
    return readers


def stream_parameters(layers: int) -> tuple[list[str], list[str]]:
    """``(last_axis, first_axis)``: weights carrying the residual stream on their last axis, and on their first.

    The embedding and every map reading the stream carry it last; each layer's ``o_proj`` and
    ``down_proj``, which write to it, first.
    """
    last, first = ["embed_tokens.weight", "lm_head.weight"], []
    for i in range(layers):
        a, m = f"layers.{i}.self_attn", f"layers.{i}.mlp"
        last += [f"{a}.{n}.weight" for n in ("q_proj", "k_proj", "v_proj")]
        last += [f"{m}.gate_proj.weight", f"{m}.up_proj.weight"]
        first += [f"{a}.o_proj.weight", f"{m}.down_proj.weight"]
    return last, first


def _unit(n: int, i: int, t: float) -> torch.Tensor:
    return torch.exp(t * torch.eye(n, **_KW)[i])


def _attention(s: dict, layer: int) -> list:
    a, pairs, d_k = f"layers.{layer}.self_attn", s["head_dim"] // 2, s["head_dim"]
    lay = AttentionLayout(f"{a}.q_proj", f"{a}.k_proj", f"{a}.v_proj", f"{a}.o_proj", s["heads"], s["kv_heads"], d_k)
    qk, vo = [], []
    for g in range(s["kv_heads"]):
        for i in range(pairs):
            qk.append(
                lambda t, g=g, i=i: query_key_gauge(
                    lay, g, rotary_commutant(_unit(pairs, i, t), torch.zeros(pairs, **_KW)), rotary=True
                )
            )
            qk.append(
                lambda t, g=g, i=i: query_key_gauge(
                    lay, g, rotary_commutant(torch.ones(pairs, **_KW), t * torch.eye(pairs, **_KW)[i]), rotary=True
                )
            )
        for i in range(d_k * d_k):
            E = torch.zeros(d_k * d_k, **_KW)
            E[i] = 1.0
            vo.append(lambda t, g=g, E=E: value_output_gauge(lay, g, torch.linalg.matrix_exp(t * E.view(d_k, d_k))))
    return [qk, vo]


def gauge_generators(model: nn.Module) -> dict[str, list]:
    """Every continuous gauge direction of ``model``, by kind: families ``t -> Symmetry``, identity at 0."""
    s = sizes_of(model)
    out: dict[str, list] = {k: [] for k in KINDS}
    for layer in range(s["layers"]):
        qk, vo = _attention(s, layer)
        out["query/key gauge"] += qk
        out["value/output gauge"] += vo
        m = f"layers.{layer}.mlp"
        out["SwiGLU rescaling"] += [
            lambda t, i=i, m=m: swiglu_rescaling(m, _unit(s["hidden"], i, t)) for i in range(s["hidden"])
        ]
    for norm, readers in norm_readers(s["layers"]).items():
        out["RMSNorm gain rescaling"] += [
            lambda t, i=i, norm=norm, readers=readers: norm_gain_rescaling(norm, readers, _unit(s["d"], i, t))
            for i in range(s["d"])
        ]
    last, first = stream_parameters(s["layers"])
    for i in range(s["d"]):
        for j in range(i + 1, s["d"]):
            S = torch.zeros(s["d"], s["d"], **_KW)
            S[i, j], S[j, i] = 1.0, -1.0
            out["stream rotation"].append(lambda t, S=S: stream_rotation(torch.linalg.matrix_exp(t * S), last, first))
    return out


def gauge_tangents(model: nn.Module, step: float = 1e-5) -> dict[str, torch.Tensor]:
    """The tangent of every gauge direction at ``model``'s parameters: ``(n_params, k)`` per kind.

    Central differences ``(T(step) - T(-step)) / (2 step)`` of each family of
    :func:`gauge_generators` (error of order ``step^2``), flattened in ``named_parameters`` order.
    """
    params = {k: v.detach() for k, v in model.named_parameters()}

    def flat(p: dict) -> torch.Tensor:
        return torch.cat([p[k].reshape(-1) for k in params])

    return {
        kind: torch.stack([(flat(f(step)(params)) - flat(f(-step)(params))) / (2 * step) for f in families], dim=1)
        for kind, families in gauge_generators(model).items()
    }

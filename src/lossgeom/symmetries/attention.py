"""Symmetries of attention: the per-head gauge of ``nn.MultiheadAttention`` and head permutations.

With torch's row convention (``q = x W_q^T + b_q``; head ``h`` owns rows
``h d:(h+1) d`` of each of the query, key and value blocks of the packed
``in_proj_weight`` of shape ``(3E, E)``, ``d = E / n_heads``), for invertible ``d x d``
matrices ``A`` and ``B`` per head:

- ``W_q^h -> A^T W_q^h``, ``b_q^h -> A^T b_q^h``, ``W_k^h -> A^-1 W_k^h``,
  ``b_k^h -> A^-1 b_k^h`` give ``q' = q A`` and ``k' = k A^-T``, so every score
  ``q_h k_h^T`` is kept;
- ``W_v^h -> B^T W_v^h``, ``b_v^h -> B^T b_v^h`` and the head's columns of
  ``out_proj.weight`` ``W_o[:, h] -> W_o[:, h] B^-T`` give ``v' = v B`` and keep the
  output ``o_h W_o[:, h]^T``.

This is :func:`attention_head_gauge`, a ``GL(d) x GL(d)`` per head, whose dimension per
attention layer :func:`attention_gauge_dimension` counts (``h (d_k^2 + d_v^2)``).
:func:`head_permutation` relabels the heads. The registry's search
(``_attention_symmetries``) reads ``nn.MultiheadAttention``,
``nn.TransformerEncoderLayer`` and ``nn.TransformerEncoder`` modules (leaves of the
``torch.fx`` graph) from their known structure, with their layer norms and feed-forward
hidden units.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping

import torch
from numpy.typing import ArrayLike
from torch import nn

from lossgeom._validation import finite_tensor
from lossgeom.formatting import fmt
from lossgeom.symmetries.core import Symmetry
from lossgeom.symmetries.graph import _consumers, _describe, _log_uniform, _module, _tied
from lossgeom.symmetries.layers import relu_neuron_rescaling, unit_permutation
from lossgeom.symmetries.normalised import layernorm_rescaling
from lossgeom.types import Params

_ATTENTION_MODULES = (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerEncoder)


def _square_invertible(name: str, matrix: ArrayLike) -> torch.Tensor:
    M = finite_tensor(name, matrix).to(torch.float64)
    if M.ndim != 2 or M.shape[0] != M.shape[1]:
        raise ValueError(f"{name} must be a square (d x d) matrix, got shape {tuple(M.shape)}")
    singular = torch.linalg.svdvals(M)
    if float(singular[-1]) <= 1e-12 * float(singular[0]):
        raise ValueError(f"{name} must be invertible (its smallest singular value is ~0)")
    return M


def conditioned_matrix(size: int, condition: float, generator: torch.Generator) -> torch.Tensor:
    """A random ``size x size`` matrix ``Q1 diag(s) Q2`` of condition number ``condition`` (float64).

    ``Q1, Q2`` are the orthogonal factors of QR decompositions of Gaussian matrices and
    ``s = condition^(u - 1/2)`` with ``u`` uniform in ``[0, 1]``, its first two entries 0 and
    1: the singular values lie in ``[condition^-1/2, condition^1/2]`` and their ratio is
    exactly ``condition`` (for ``size >= 2``).

    Args:
        size: the side, an int >= 1.
        condition: the condition number, >= 1.
        generator: the generator every draw comes from.

    Returns:
        The matrix, float64.

    Raises:
        ValueError: if ``size < 1`` or ``condition < 1``.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be an int >= 1, got {size!r}")
    if not (isinstance(condition, (int, float)) and math.isfinite(condition) and condition >= 1):
        raise ValueError(f"condition must be a finite number >= 1, got {condition!r}")
    q1 = torch.linalg.qr(torch.randn(size, size, generator=generator, dtype=torch.float64)).Q
    q2 = torch.linalg.qr(torch.randn(size, size, generator=generator, dtype=torch.float64)).Q
    u = torch.rand(size, generator=generator, dtype=torch.float64)
    u[: min(size, 2)] = torch.tensor([0.0, 1.0], dtype=torch.float64)[: min(size, 2)]
    return q1 @ torch.diag(float(condition) ** (u - 0.5)) @ q2


def _condition_number(M: torch.Tensor) -> float:
    singular = torch.linalg.svdvals(M)
    return float(singular[0] / singular[-1])


def attention_head_gauge(attention: str, head: int, n_heads: int, qk: ArrayLike, vo: ArrayLike) -> Symmetry:
    """The gauge of one attention head: ``A`` between its queries and keys, ``B`` between its values and output.

    Acts on ``f"{attention}.in_proj_weight"``, ``f"{attention}.in_proj_bias"`` (if
    present) and ``f"{attention}.out_proj.weight"`` of an ``nn.MultiheadAttention`` with
    packed projections (see the module's docstring for the maps). Every attention score
    and every output is kept.

    Args:
        attention: name prefix of the ``nn.MultiheadAttention`` (``"layers.0.self_attn"``).
        head: the head's index, ``0 <= head < n_heads``.
        n_heads: the number of heads.
        qk: ``A``, an invertible ``d x d`` matrix (``d`` the head dimension).
        vo: ``B``, an invertible ``d x d`` matrix.

    Returns:
        A :class:`~lossgeom.symmetries.core.Symmetry` on the parameter dict.

    Raises:
        ValueError: on a head index out of range or a matrix that is not square and invertible.
    """
    A, B = _square_invertible("qk", qk), _square_invertible("vo", vo)
    if isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < n_heads:
        raise ValueError(f"head must be an int in [0, {n_heads}), got {head!r}")
    if A.shape != B.shape:
        raise ValueError(f"qk and vo must both be d x d, got {tuple(A.shape)} and {tuple(B.shape)}")
    d = A.shape[0]
    A_inv, B_inv_t = torch.linalg.inv(A), torch.linalg.inv(B).T
    w_in, b_in, w_out = f"{attention}.in_proj_weight", f"{attention}.in_proj_bias", f"{attention}.out_proj.weight"

    def transform(params: Params) -> dict[str, torch.Tensor]:
        if w_in not in params or w_out not in params:
            raise ValueError(f"attention_head_gauge needs {w_in!r} and {w_out!r}")
        E = params[w_out].shape[0]
        if params[w_in].shape != (3 * E, E) or E != n_heads * d:
            raise ValueError(f"{w_in} must be ({3 * n_heads * d}, {n_heads * d}) for {n_heads} heads of dimension {d}")
        like = params[w_in]
        maps = [m.to(dtype=like.dtype, device=like.device) for m in (A.T, A_inv, B.T)]
        rows = [slice(part * E + head * d, part * E + (head + 1) * d) for part in range(3)]
        out = dict(params)
        weight = params[w_in].clone()
        for block, matrix in zip(rows, maps):
            weight[block] = matrix @ params[w_in][block]
        out[w_in] = weight
        if b_in in params:
            bias = params[b_in].clone()
            for block, matrix in zip(rows, maps):
                bias[block] = matrix @ params[b_in][block]
            out[b_in] = bias
        columns = slice(head * d, (head + 1) * d)
        projection = params[w_out].clone()
        projection[:, columns] = params[w_out][:, columns] @ B_inv_t.to(dtype=like.dtype, device=like.device)
        out[w_out] = projection
        return out

    return Symmetry(
        f"attention gauge {attention} head {head} (A, B: {d} x {d}, condition numbers "
        f"{fmt(_condition_number(A), 3)}, {fmt(_condition_number(B), 3)})",
        transform,
    )


def head_permutation(attention: str, permutation: ArrayLike) -> Symmetry:
    """Relabel the heads of an ``nn.MultiheadAttention``: head ``permutation[j]`` becomes head ``j``.

    The blocks of rows of the queries, keys and values (and their biases) and the
    matching blocks of columns of ``out_proj.weight`` move together; the output is kept.

    Args:
        attention: name prefix of the ``nn.MultiheadAttention`` (packed projections).
        permutation: a permutation of ``0..n_heads-1``.

    Returns:
        A :class:`~lossgeom.symmetries.core.Symmetry` on the parameter dict.

    Raises:
        ValueError: if ``permutation`` is not a permutation of ``0..n-1``.
    """
    perm = torch.as_tensor(permutation)
    if perm.ndim != 1 or perm.numel() == 0 or perm.dtype.is_floating_point or perm.dtype == torch.bool:
        raise ValueError(f"permutation must be a non-empty 1-D sequence of integers, got {permutation!r}")
    perm = perm.to(torch.long)
    if not torch.equal(torch.sort(perm).values, torch.arange(perm.numel())):
        raise ValueError(f"permutation must hold each of 0..{perm.numel() - 1} exactly once")
    h = perm.numel()
    w_in, b_in, w_out = f"{attention}.in_proj_weight", f"{attention}.in_proj_bias", f"{attention}.out_proj.weight"

    def transform(params: Params) -> dict[str, torch.Tensor]:
        if w_in not in params or w_out not in params:
            raise ValueError(f"head_permutation needs {w_in!r} and {w_out!r}")
        E = params[w_out].shape[0]
        if E % h or params[w_in].shape != (3 * E, E):
            raise ValueError(f"{w_in} must be (3E, E) with E = {E} a multiple of {h} heads")
        d = E // h
        index = (perm[:, None] * d + torch.arange(d)).reshape(-1)
        rows = torch.cat([index + part * E for part in range(3)]).to(params[w_in].device)
        out = dict(params)
        out[w_in] = params[w_in][rows]
        if b_in in params:
            out[b_in] = params[b_in][rows]
        out[w_out] = params[w_out][:, index.to(params[w_out].device)]
        return out

    return Symmetry(f"head permutation {attention} ({h} heads)", transform)


def attention_gauge_dimension(module: nn.Module) -> int:
    """The dimension ``h (d_k^2 + d_v^2)`` of the attention gauges of ``module``, summed over its attention layers.

    Each ``nn.MultiheadAttention`` with ``h`` heads of dimension ``d_k = d_v = E / h``
    carries the group ``GL(d_k) x GL(d_v)`` per head (:func:`attention_head_gauge`).

    Args:
        module: an ``nn.MultiheadAttention``, or a module containing some (a transformer).

    Returns:
        The summed dimension (0 without attention layers).

    Raises:
        TypeError: if ``module`` is not an ``nn.Module``.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    total = 0
    for layer in module.modules():
        if isinstance(layer, nn.MultiheadAttention):
            h, d = layer.num_heads, layer.head_dim
            total += h * (d * d + d * d)
    return total


def _attention_refusal(model: nn.Module, prefix: str, mha: nn.MultiheadAttention, names: Params) -> str:
    if mha.bias_k is not None or mha.bias_v is not None:
        return "it has bias_k / bias_v (learned key and value rows), which the gauge does not transform"
    if mha.add_zero_attn:
        return "add_zero_attn is set"
    if not mha._qkv_same_embed_dim or mha.in_proj_weight is None:
        return "its query, key and value projections are separate weights (kdim or vdim != embed_dim)"
    if f"{prefix}.in_proj_weight" not in names or f"{prefix}.out_proj.weight" not in names:
        return "its projection weights are shared or parametrised"
    return _tied(model, prefix, f"{prefix}.out_proj") or ""


def _mha_symmetries(
    model: nn.Module,
    prefix: str,
    mha: nn.MultiheadAttention,
    names: Params,
    condition: float,
    generator: torch.Generator,
    found: list[Symmetry],
    skipped: list[str],
) -> None:
    refusal = _attention_refusal(model, prefix, mha, names)
    if refusal:
        skipped.append(f"attention gauges and head permutations of {prefix!r}: {refusal} (not audited)")
        return
    for head in range(mha.num_heads):
        A = conditioned_matrix(mha.head_dim, condition, generator)
        B = conditioned_matrix(mha.head_dim, condition, generator)
        found.append(attention_head_gauge(prefix, head, mha.num_heads, A, B))
    if mha.num_heads > 1:
        found.append(head_permutation(prefix, torch.randperm(mha.num_heads, generator=generator)))


def _random_dropout(layer: nn.TransformerEncoderLayer) -> bool:
    ps = [layer.dropout.p, layer.dropout1.p, layer.dropout2.p, layer.self_attn.dropout]
    return layer.training and any(p > 0 for p in ps)


def _activation_kind(activation: nn.Module | Callable[[torch.Tensor], torch.Tensor]) -> tuple[str, bool]:
    """``(name, positively homogeneous)`` of an encoder layer's feed-forward activation."""
    if activation is nn.functional.relu or isinstance(activation, nn.ReLU):
        return "ReLU", True
    if isinstance(activation, nn.LeakyReLU) or activation is nn.functional.leaky_relu:
        return "LeakyReLU", True
    return getattr(activation, "__name__", type(activation).__name__), False


def _encoder_layer_symmetries(
    model: nn.Module,
    prefix: str,
    layer: nn.TransformerEncoderLayer,
    names: Params,
    rescale: float,
    condition: float,
    generator: torch.Generator,
    found: list[Symmetry],
    skipped: list[str],
) -> None:
    if _random_dropout(layer):
        skipped.append(f"symmetries of encoder layer {prefix!r}: it is in training mode with dropout (random)")
        return
    attention = f"{prefix}.self_attn"
    _mha_symmetries(model, attention, layer.self_attn, names, condition, generator, found, skipped)
    packed = layer.self_attn._qkv_same_embed_dim and f"{attention}.in_proj_weight" in names
    reads = {"norm1": f"{attention}.in_proj_weight", "norm2": f"{prefix}.linear1.weight"}
    for norm, reader in reads.items():
        ln, where = getattr(layer, norm), f"layer-norm rescaling of {prefix}.{norm}"
        if not layer.norm_first:
            skipped.append(
                f"{where} (post-LN): its output is the residual stream as well as the input of the next "
                "sublayer, so rescaling its weight and bias changes the function (not a symmetry, not reported)"
            )
        elif not ln.elementwise_affine or ln.weight is None or (norm == "norm1" and not packed):
            skipped.append(f"{where}: no affine weight, or separate q/k/v projections (not audited)")
        else:
            scales = _log_uniform(ln.normalized_shape[0], rescale, generator)
            found.append(layernorm_rescaling(f"{prefix}.{norm}", [reader], scales))
    kind, homogeneous = _activation_kind(layer.activation)
    pair, width = f"{prefix}.linear1 -> {prefix}.linear2", layer.linear1.out_features
    if homogeneous:
        scales = _log_uniform(width, rescale, generator)
        moved = relu_neuron_rescaling(f"{prefix}.linear1", f"{prefix}.linear2", scales, activation=kind)
        found.append(
            Symmetry(
                f"{kind} rescaling {pair} (feed-forward, {width} units, c in [1/{fmt(rescale)}, {fmt(rescale)}])",
                moved.transform,
            )
        )
    else:
        skipped.append(f"rescaling {pair}: the feed-forward activation ({kind}) is not positively homogeneous")
    perm = torch.randperm(width, generator=generator)
    found.append(
        Symmetry(
            f"permutation {pair} (feed-forward, {width} units)",
            unit_permutation(f"{prefix}.linear1", f"{prefix}.linear2", perm).transform,
        )
    )
    skipped.append(
        f"the residual stream of encoder layer {prefix!r} ({layer.linear2.out_features} features): read by the "
        "skip connections and the next layer, its rescaling and permutation are not audited"
    )


def _attention_symmetries(
    model: nn.Module,
    node: torch.fx.Node,
    names: Params,
    counts: Mapping[str, int],
    rescale: float,
    condition: float,
    generator: torch.Generator,
    found: list[Symmetry],
    skipped: list[str],
) -> None:
    """The symmetries inside the attention module or transformer layer(s) at ``node``.

    They keep the module's own function, so they hold however often the module is called.
    """
    module, name = _module(model, node), node.target
    if isinstance(module, nn.MultiheadAttention):
        reads = [user for user in _consumers(node)]
        if any(not (u.op == "call_function" and u.target is operator.getitem and u.args[1] == 0) for u in reads):
            skipped.append(
                f"symmetries of {_describe(node, module)}: its attention weights (or the whole tuple) are read, "
                "which a head permutation changes (not audited)"
            )
            return
        _mha_symmetries(model, name, module, names, condition, generator, found, skipped)
        return
    if isinstance(module, nn.TransformerEncoderLayer):
        layers = [(name, module)]
    else:
        layers = [(f"{name}.layers.{i}", layer) for i, layer in enumerate(module.layers)]
        if module.norm is not None:
            skipped.append(f"the final norm {name}.norm of {_describe(node, module)}: its symmetries are not audited")
    for prefix, layer in layers:
        _encoder_layer_symmetries(model, prefix, layer, names, rescale, condition, generator, found, skipped)

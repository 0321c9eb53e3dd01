r"""Symmetries of decoder transformers as they are trained: RMSNorm, rotary, grouped-query and SwiGLU blocks.

Each symmetry here moves blocks of coordinates of named weights by a matrix: the
coordinates of an axis at given positions go ``v -> M v``. For a ``Linear`` weight
``[out, in]`` the output axis is 0; a transposed ``Conv1D`` weight (GPT-2's, ``[in, out]``)
has it last. With one row vector ``q`` per head and position:

- **query/key gauge** of a key/value head (:func:`query_key_gauge`): ``q -> q A`` on every
  query head of its group and ``k -> k A^-T``, so every score ``q k^T`` is kept. With rotary
  position embeddings (Su et al. 2021) the score is ``q R_m R_n^T k^T``, kept only when ``A``
  commutes with every rotation ``R_m``: for distinct frequencies, one scaled ``2 x 2``
  rotation per frequency pair (:func:`rotary_commutant`, real dimension ``d_k`` instead of
  ``d_k^2``). The pairs are those of the ``rotate_half`` layout, ``(i, i + d_k / 2)``;
- **value/output gauge** (:func:`value_output_gauge`): ``v -> v B`` on a key/value head and
  the output projection's columns of every query head reading it times ``B^-T``;
  grouped-query attention (Ainslie et al. 2023) shares both gauges within a group;
- **head permutations** (:func:`grouped_head_permutation`): query heads within a group, or
  whole groups (their query heads with their key/value head);
- **SwiGLU** ``W_down (silu(W_gate x) * (W_up x))`` (Shazeer 2020): a hidden unit's up row
  times ``c`` and down column over ``c`` for any ``c != 0`` (:func:`swiglu_rescaling`);
  never the gate's, as SiLU is not homogeneous; and unit permutations
  (:func:`hidden_unit_permutation`);
- **gain rescaling** of an RMSNorm ``g * x / rms(x)`` (or a LayerNorm's weight and bias)
  against the maps that read it (:func:`norm_gain_rescaling`);
- **residual-stream rotation** ``x -> x Q`` (:func:`stream_rotation`, Ashkboos et al. 2024):
  with unit gains ``rms(x Q) = rms(x)``, so the embeddings, every map writing to the stream
  and every map reading it move together; for LayerNorm ``Q`` must fix the all-ones direction
  (:func:`orthogonal_fixing_ones`).

The registry's search by structure is :mod:`lossgeom.symmetries.decoder_search`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from numpy.typing import ArrayLike

from lossgeom._validation import finite_tensor
from lossgeom.formatting import fmt
from lossgeom.symmetries.attention import _condition_number, _square_invertible
from lossgeom.symmetries.core import Symmetry
from lossgeom.types import Params

#: One move: the coordinates at ``index`` of ``key``'s axis ``axis`` go ``v -> matrix v``
#: (``optional``: a bias that may be absent).
_Move = tuple[str, int, torch.Tensor, torch.Tensor, bool]


def _moved(kind: str, params: Params, moves: Sequence[_Move]) -> dict[str, torch.Tensor]:
    out = dict(params)
    for key, axis, index, matrix, optional in moves:
        if key not in out:
            if optional:
                continue
            raise ValueError(f"{kind} needs the parameter {key!r}")
        tensor = out[key]
        if axis >= tensor.ndim or int(index.max()) >= tensor.shape[axis]:
            raise ValueError(f"{key} has shape {tuple(tensor.shape)}: no coordinate {int(index.max())} on axis {axis}")
        front = tensor.movedim(axis, 0).clone()
        where = index.to(tensor.device)
        block = front[where]
        front[where] = torch.tensordot(matrix.to(dtype=tensor.dtype, device=tensor.device), block, dims=([1], [0]))
        out[key] = front.movedim(0, axis).contiguous()
    return out


def _linear(prefix: str, transposed: bool) -> tuple[str, str, int, int]:
    """``(weight, bias, output axis, input axis)`` of a Linear (``[out, in]``) or transposed Conv1D layer."""
    return f"{prefix}.weight", f"{prefix}.bias", int(transposed), 1 - int(transposed)


def _block(start: int, size: int) -> torch.Tensor:
    return torch.arange(start, start + size)


@dataclass(frozen=True)
class AttentionLayout:
    """Where the heads of an attention layer live in its parameters.

    Attributes:
        query: name prefix of the query projection (``"layers.0.self_attn.q_proj"``).
        key: of the key projection (the same fused layer as ``query`` for GPT-2's ``c_attn``).
        value: of the value projection.
        output: of the output projection.
        n_heads: the number of query heads ``h``.
        n_kv_heads: the number of key/value heads ``h_kv`` (divides ``h``; query head ``j``
            reads key/value head ``j // (h / h_kv)``).
        head_dim: ``d_k = d_v``.
        transposed: the weights are stored ``[in, out]`` (GPT-2's ``Conv1D``).
        offsets: where the queries, keys and values start in their projection's outputs
            (``(0, E, 2 E)`` in a fused projection).
    """

    query: str
    key: str
    value: str
    output: str
    n_heads: int
    n_kv_heads: int
    head_dim: int
    transposed: bool = False
    offsets: tuple[int, int, int] = (0, 0, 0)

    def __post_init__(self) -> None:
        for field in ("n_heads", "n_kv_heads", "head_dim"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field} must be an int >= 1, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads})")

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.n_heads // self.n_kv_heads

    def queries_of(self, kv_head: int) -> range:
        """The query heads that read key/value head ``kv_head``.

        Args:
            kv_head: the index of a key/value head, in ``[0, n_kv_heads)``.

        Returns:
            The range of the indices of its query heads.

        Raises:
            ValueError: if ``kv_head`` is not such an index.
        """
        if isinstance(kv_head, bool) or not isinstance(kv_head, int) or not 0 <= kv_head < self.n_kv_heads:
            raise ValueError(f"kv_head must be an int in [0, {self.n_kv_heads}), got {kv_head!r}")
        return range(kv_head * self.group, (kv_head + 1) * self.group)


def _heads(layout: AttentionLayout, kv_head: int) -> str:
    if layout.group == 1:
        return f"head {kv_head}"
    queries = layout.queries_of(kv_head)
    return f"kv head {kv_head} of query heads {queries.start}-{queries.stop - 1}"


def rotary_commutant(scales: ArrayLike, angles: ArrayLike) -> torch.Tensor:
    """The ``d_k x d_k`` matrix acting on pair ``(i, i + d_k/2)`` as ``s_i`` times a rotation by ``theta_i``.

    On each frequency pair of the ``rotate_half`` layout the block is
    ``s [[cos t, sin t], [-sin t, cos t]]``: it commutes with every rotary rotation, and these
    matrices are all that do when the frequencies are distinct.

    Args:
        scales: ``d_k / 2`` non-zero scales.
        angles: ``d_k / 2`` angles (radians).

    Returns:
        The matrix, float64.

    Raises:
        ValueError: if the two do not match, or a scale is zero or not finite.
    """
    s, t = finite_tensor("scales", scales).double(), finite_tensor("angles", angles).double()
    if s.ndim != 1 or s.shape != t.shape or s.numel() == 0:
        raise ValueError(
            f"scales and angles must be 1-D of one length (d_k / 2), got {tuple(s.shape)}, {tuple(t.shape)}"
        )
    if (s == 0).any():
        raise ValueError("scales must be non-zero")
    half = s.numel()
    A = torch.zeros(2 * half, 2 * half, dtype=torch.float64)
    i = torch.arange(half)
    A[i, i] = A[i + half, i + half] = s * torch.cos(t)
    A[i, i + half] = s * torch.sin(t)
    A[i + half, i] = -s * torch.sin(t)
    return A


def _in_commutant(A: torch.Tensor) -> bool:
    half = A.shape[0] // 2
    if A.shape[0] % 2:
        return False
    i = torch.arange(half)
    scales = torch.sqrt(A[i, i] ** 2 + A[i, i + half] ** 2)
    return bool(torch.allclose(rotary_commutant(scales, torch.atan2(A[i, i + half], A[i, i])), A, rtol=0, atol=1e-12))


def query_key_gauge(layout: AttentionLayout, kv_head: int, qk: ArrayLike, *, rotary: bool) -> Symmetry:
    """``q -> q A`` on every query head of key/value head ``kv_head``'s group, ``k -> k A^-T`` on its keys.

    Rows of the query and key projections (columns of a ``Conv1D``) and their biases move;
    every score is kept. With ``rotary`` set, ``A`` must commute with the rotary rotations
    (:func:`rotary_commutant`): a general ``A`` changes a rotary model's scores.

    Args:
        layout: the attention layer (:class:`AttentionLayout`).
        kv_head: the key/value head, ``0 <= kv_head < n_kv_heads``.
        qk: ``A``, an invertible ``d_k x d_k`` matrix.
        rotary: whether the queries and keys are rotated by position (rotary embeddings).

    Returns:
        A :class:`~lossgeom.symmetries.core.Symmetry` on the parameter dict.

    Raises:
        ValueError: on a bad head, a matrix that is not ``d_k x d_k`` and invertible, or (with
            ``rotary``) one outside the commutant of the rotations.
    """
    A, d = _square_invertible("qk", qk), layout.head_dim
    queries = layout.queries_of(kv_head)
    if A.shape[0] != d:
        raise ValueError(f"qk must be {d} x {d} (the head dimension), got {tuple(A.shape)}")
    if rotary and not _in_commutant(A):
        raise ValueError("qk must commute with the rotary rotations (one scaled 2x2 rotation per pair (i, i + d/2))")
    q_w, q_b, q_out, _ = _linear(layout.query, layout.transposed)
    k_w, k_b, k_out, _ = _linear(layout.key, layout.transposed)
    q0, k0, _ = layout.offsets
    moves: list[_Move] = []
    for h in queries:
        rows = _block(q0 + h * d, d)
        moves += [(q_w, q_out, rows, A.T, False), (q_b, 0, rows, A.T, True)]
    rows, inverse = _block(k0 + kv_head * d, d), torch.linalg.inv(A)
    moves += [(k_w, k_out, rows, inverse, False), (k_b, 0, rows, inverse, True)]
    group = layout.query.rsplit(".", 1)[0]
    where = "rotary commutant" if rotary else f"GL({d})"
    return Symmetry(
        f"query/key gauge {group} {_heads(layout, kv_head)} ({where}, condition number {fmt(_condition_number(A), 3)})",
        lambda params: _moved("query_key_gauge", params, moves),
    )


def value_output_gauge(layout: AttentionLayout, kv_head: int, vo: ArrayLike) -> Symmetry:
    """``v -> v B`` on key/value head ``kv_head``, and ``B^-T`` on the output columns of each query head reading it.

    Args:
        layout: the attention layer (:class:`AttentionLayout`).
        kv_head: the key/value head, ``0 <= kv_head < n_kv_heads``.
        vo: ``B``, an invertible ``d_v x d_v`` matrix.

    Returns:
        A :class:`~lossgeom.symmetries.core.Symmetry` on the parameter dict.

    Raises:
        ValueError: on a bad head or a matrix that is not ``d_v x d_v`` and invertible.
    """
    B, d = _square_invertible("vo", vo), layout.head_dim
    queries = layout.queries_of(kv_head)
    if B.shape[0] != d:
        raise ValueError(f"vo must be {d} x {d} (the head dimension), got {tuple(B.shape)}")
    v_w, v_b, v_out, _ = _linear(layout.value, layout.transposed)
    o_w, _, _, o_in = _linear(layout.output, layout.transposed)
    rows = _block(layout.offsets[2] + kv_head * d, d)
    moves: list[_Move] = [(v_w, v_out, rows, B.T, False), (v_b, 0, rows, B.T, True)]
    inverse = torch.linalg.inv(B)
    moves += [(o_w, o_in, _block(h * d, d), inverse, False) for h in queries]
    group = layout.output.rsplit(".", 1)[0]
    return Symmetry(
        f"value/output gauge {group} {_heads(layout, kv_head)} ("
        f"GL({d}), condition number {fmt(_condition_number(B), 3)})",
        lambda params: _moved("value_output_gauge", params, moves),
    )


def _permutation(name: str, order: ArrayLike) -> torch.Tensor:
    perm = torch.as_tensor(order)
    if perm.ndim != 1 or perm.numel() == 0 or perm.dtype.is_floating_point or perm.dtype == torch.bool:
        raise ValueError(f"{name} must be a non-empty 1-D sequence of integers, got {order!r}")
    perm = perm.to(torch.long)
    if not torch.equal(torch.sort(perm).values, torch.arange(perm.numel())):
        raise ValueError(f"{name} must hold each of 0..{perm.numel() - 1} exactly once")
    return perm


def _permutation_matrix(perm: torch.Tensor, block: int = 1) -> torch.Tensor:
    """``P`` with ``(P v)[j] = v[perm[j]]``, each entry of ``perm`` a block of ``block`` coordinates."""
    index = (perm[:, None] * block + torch.arange(block)).reshape(-1)
    return torch.eye(index.numel(), dtype=torch.float64)[index]


def grouped_head_permutation(layout: AttentionLayout, query_order: ArrayLike, kv_order: ArrayLike) -> Symmetry:
    """Relabel heads: query head ``query_order[j]`` becomes ``j``, key/value head ``kv_order[g]`` becomes ``g``.

    A query head must stay with its key/value head: ``query_order[j]`` belongs to the group
    of ``kv_order[j // group]``. Query, key and value rows (and biases) and the output
    projection's columns move together.

    Args:
        layout: the attention layer (:class:`AttentionLayout`).
        query_order: a permutation of the ``h`` query heads.
        kv_order: a permutation of the ``h_kv`` key/value heads.

    Returns:
        A :class:`~lossgeom.symmetries.core.Symmetry` on the parameter dict.

    Raises:
        ValueError: on sequences that are not permutations, or a query head moved to another group.
    """
    q, kv = _permutation("query_order", query_order), _permutation("kv_order", kv_order)
    if q.numel() != layout.n_heads or kv.numel() != layout.n_kv_heads:
        raise ValueError(
            f"need {layout.n_heads} query and {layout.n_kv_heads} key/value heads, got {q.numel()}, {kv.numel()}"
        )
    if not torch.equal(q // layout.group, kv.repeat_interleave(layout.group)):
        raise ValueError("query_order moves a query head away from its key/value head (see kv_order)")
    d, (q0, k0, v0) = layout.head_dim, layout.offsets
    P_q, P_kv = _permutation_matrix(q, d), _permutation_matrix(kv, d)
    moves: list[_Move] = []
    for prefix, start, P in ((layout.query, q0, P_q), (layout.key, k0, P_kv), (layout.value, v0, P_kv)):
        weight, bias, out_axis, _ = _linear(prefix, layout.transposed)
        rows = _block(start, P.shape[0])
        moves += [(weight, out_axis, rows, P, False), (bias, 0, rows, P, True)]
    o_w, _, _, o_in = _linear(layout.output, layout.transposed)
    moves.append((o_w, o_in, _block(0, P_q.shape[0]), P_q, False))
    group = layout.output.rsplit(".", 1)[0]
    kind = (
        "head permutation"
        if layout.group == 1
        else ("query head permutation" if torch.equal(kv, torch.arange(kv.numel())) else "key/value group permutation")
    )
    return Symmetry(
        f"{kind} {group} ({layout.n_heads} query heads, {layout.n_kv_heads} key/value heads)",
        lambda params: _moved("grouped_head_permutation", params, moves),
    )


def _scales(scales: ArrayLike, positive: bool) -> torch.Tensor:
    c = finite_tensor("scales", scales).double()
    if c.ndim != 1 or c.numel() == 0:
        raise ValueError(f"scales must be a non-empty 1-D sequence, got shape {tuple(c.shape)}")
    if (c <= 0).any() if positive else (c == 0).any():
        raise ValueError("scales must be > 0" if positive else "scales must be non-zero")
    return c


def swiglu_rescaling(mlp: str, scales: ArrayLike) -> Symmetry:
    """Row ``j`` of ``up_proj`` (and its bias) times ``c_j``, column ``j`` of ``down_proj`` over ``c_j``.

    ``W_down (silu(g) * (c u)) / c`` is the same output for any ``c != 0``; the gate is left
    alone (``silu(c z) != c silu(z)``).

    Args:
        mlp: name prefix of the MLP (with ``gate_proj``, ``up_proj``, ``down_proj``).
        scales: one non-zero factor per hidden unit.

    Returns:
        A :class:`~lossgeom.symmetries.core.Symmetry` on the parameter dict.

    Raises:
        ValueError: if a scale is zero or not finite.
    """
    c = _scales(scales, positive=False)
    units = torch.arange(c.numel())
    moves: list[_Move] = [
        (f"{mlp}.up_proj.weight", 0, units, torch.diag(c), False),
        (f"{mlp}.up_proj.bias", 0, units, torch.diag(c), True),
        (f"{mlp}.down_proj.weight", 1, units, torch.diag(1 / c), False),
    ]
    return Symmetry(
        f"SwiGLU rescaling {mlp}.up_proj -> {mlp}.down_proj ({c.numel()} units, c in "
        f"[{fmt(float(c.min()), 4)}, {fmt(float(c.max()), 4)}])",
        lambda params: _moved("swiglu_rescaling", params, moves),
    )


def hidden_unit_permutation(
    layers_in: Sequence[str], layer_out: str, permutation: ArrayLike, *, transposed: bool = False
) -> Symmetry:
    """Permute hidden units: outputs (and biases) of every layer in ``layers_in``, inputs of ``layer_out``.

    A SwiGLU MLP's gate and up projections move together; GPT-2's ``c_fc -> c_proj``
    (``transposed``) is one layer in. Unit ``permutation[j]`` becomes unit ``j``.

    Args:
        layers_in: name prefixes of the layers whose output units are permuted.
        layer_out: name prefix of the layer reading them.
        permutation: a permutation of ``0..width-1``.
        transposed: the weights are stored ``[in, out]`` (``Conv1D``).

    Returns:
        A :class:`~lossgeom.symmetries.core.Symmetry` on the parameter dict.

    Raises:
        ValueError: if ``permutation`` is not a permutation or ``layers_in`` is empty.
    """
    perm, layers_in = (
        _permutation("permutation", permutation),
        [layers_in] if isinstance(layers_in, str) else list(layers_in),
    )
    if not layers_in:
        raise ValueError("layers_in must name at least one layer")
    P, units = _permutation_matrix(perm), torch.arange(perm.numel())
    moves: list[_Move] = []
    for prefix in layers_in:
        weight, bias, out_axis, _ = _linear(prefix, transposed)
        moves += [(weight, out_axis, units, P, False), (bias, 0, units, P, True)]
    weight, _, _, in_axis = _linear(layer_out, transposed)
    moves.append((weight, in_axis, units, P, False))
    return Symmetry(
        f"permutation {', '.join(layers_in)} -> {layer_out} ({perm.numel()} units)",
        lambda params: _moved("hidden_unit_permutation", params, moves),
    )


def norm_gain_rescaling(
    norm: str, readers: Sequence[str], scales: ArrayLike, *, transposed: bool = False, kind: str = "RMSNorm gain"
) -> Symmetry:
    """A normalisation's gain (and bias, if any) times ``c`` per channel, the input columns of its readers over ``c``.

    ``W (c * (g * n + b)) / c = W (g * n + b)``: exact for any ``eps`` (the normalisation is
    untouched), an RMSNorm's ``g * x / rms(x)`` and a LayerNorm alike.

    Args:
        norm: name prefix of the normalisation module (its ``weight``, optional ``bias``).
        readers: name prefixes of the layers reading its output.
        scales: one positive factor per channel.
        transposed: the readers' weights are stored ``[in, out]`` (``Conv1D``).
        kind: the symmetry's name starts with ``f"{kind} rescaling"``.

    Returns:
        A :class:`~lossgeom.symmetries.core.Symmetry` on the parameter dict.

    Raises:
        ValueError: if ``readers`` is empty or a scale is not positive and finite.
    """
    c, readers = _scales(scales, positive=True), [readers] if isinstance(readers, str) else list(readers)
    if not readers:
        raise ValueError("readers must name at least one layer that reads the normalisation")
    channels = torch.arange(c.numel())
    moves: list[_Move] = [
        (f"{norm}.weight", 0, channels, torch.diag(c), False),
        (f"{norm}.bias", 0, channels, torch.diag(c), True),
    ]
    moves += [(f"{r}.weight", int(not transposed), channels, torch.diag(1 / c), False) for r in readers]
    return Symmetry(
        f"{kind} rescaling {norm} -> {', '.join(readers)} ({c.numel()} channels, c in "
        f"[{fmt(float(c.min()), 4)}, {fmt(float(c.max()), 4)}])",
        lambda params: _moved("norm_gain_rescaling", params, moves),
    )


def haar_orthogonal(size: int, generator: torch.Generator) -> torch.Tensor:
    """A Haar-distributed ``size x size`` orthogonal matrix (QR of a Gaussian matrix, signs fixed), float64.

    Args:
        size: the side, an int >= 1.
        generator: the generator the draw comes from.

    Returns:
        The matrix.

    Raises:
        ValueError: if ``size < 1``.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be an int >= 1, got {size!r}")
    q, r = torch.linalg.qr(torch.randn(size, size, generator=generator, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


def orthogonal_fixing_ones(size: int, generator: torch.Generator) -> torch.Tensor:
    """A random orthogonal ``Q`` with ``Q 1 = 1`` (Haar on the complement of the all-ones direction), float64.

    These are the rotations a LayerNorm commutes with: centring subtracts the component along
    ``1``, which ``Q`` keeps. Their dimension is ``(d - 1)(d - 2) / 2``.

    Args:
        size: the side ``d``, an int >= 2.
        generator: the generator the draw comes from.

    Returns:
        The matrix.

    Raises:
        ValueError: if ``size < 2``.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 2:
        raise ValueError(f"size must be an int >= 2, got {size!r}")
    ones = torch.full((size, 1), 1 / math.sqrt(size), dtype=torch.float64)
    basis = torch.linalg.qr(torch.cat([ones, torch.eye(size, dtype=torch.float64)[:, : size - 1]], dim=1)).Q
    U = basis[:, 1:]  # orthonormal complement of the ones direction
    return ones @ ones.T + U @ haar_orthogonal(size - 1, generator) @ U.T


def stream_rotation(Q: ArrayLike, last_axis: Sequence[str], first_axis: Sequence[str] = ()) -> Symmetry:
    """The residual-stream rotation ``x -> x Q``: ``M -> M Q`` for ``last_axis``, ``M -> Q^T M`` for ``first_axis``.

    ``last_axis`` holds the tensors whose last axis is the stream (embeddings, biases written
    to it, a LayerNorm's bias, readers' ``Linear`` weights ``[out, d]``, writers' ``Conv1D``
    weights ``[in, d]``); ``first_axis`` those whose first axis is (writers' ``Linear`` weights
    ``[d, in]``, readers' ``Conv1D`` weights ``[d, out]``). A tied embedding is one tensor,
    rotated once.

    Args:
        Q: an orthogonal ``d x d`` matrix.
        last_axis: full parameter names, stream on the last axis.
        first_axis: full parameter names, stream on the first axis.

    Returns:
        A :class:`~lossgeom.symmetries.core.Symmetry` on the parameter dict.

    Raises:
        ValueError: if ``Q`` is not orthogonal, or no tensor is named.
    """
    Q = _square_invertible("Q", Q)
    if not torch.allclose(Q @ Q.T, torch.eye(Q.shape[0], dtype=torch.float64), rtol=0, atol=1e-12):
        raise ValueError("Q must be orthogonal (Q Q^T = I)")
    if not list(last_axis) + list(first_axis):
        raise ValueError("name at least one tensor to rotate")
    stream = torch.arange(Q.shape[0])
    moves: list[_Move] = [(key, -1, stream, Q.T, False) for key in last_axis]
    moves += [(key, 0, stream, Q.T, False) for key in first_axis]

    def transform(params: Params) -> dict[str, torch.Tensor]:
        fixed = [
            (key, params[key].ndim - 1 if axis < 0 else axis, *rest) for key, axis, *rest in moves if key in params
        ]
        if len(fixed) != len(moves):
            raise ValueError(f"stream_rotation needs {sorted({m[0] for m in moves} - set(params))}")
        return _moved("stream_rotation", params, fixed)

    ones = torch.ones(Q.shape[0], dtype=torch.float64)
    fixing = " fixing the ones direction" if torch.allclose(Q @ ones, ones, rtol=0, atol=1e-12) else ""
    return Symmetry(
        f"stream rotation ({Q.shape[0]} x {Q.shape[0]} orthogonal{fixing}, {len(moves)} tensors)", transform
    )

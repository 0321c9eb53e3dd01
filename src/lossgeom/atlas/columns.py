"""The columns and cells of the symmetry audit atlas.

A column is one function-preserving transformation (:data:`TRANSFORMS`), built from the
model's own graph by :mod:`lossgeom.symmetries` at a stated size, with its audit receipt
(:class:`Column`); a cell is one measure under one column, "invariant", "moves" (by a
factor) or "not applicable" with the reason (:class:`Cell`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from lossgeom import symmetries
from lossgeom.atlas.measures import Measure
from lossgeom.atlas.records import ROUNDING_FLOOR, _below_decade
from lossgeom.formatting import fmt
from lossgeom.symmetries.core import AuditReport, Symmetry
from lossgeom.symmetries.registry import FoundSymmetries

#: Short column titles of the transformation kinds (for tables).
SHORT_TITLES: dict[str, str] = {
    "relu_rescaling": "ReLU rescaling",
    "layer_rescaling": "layer rescaling",
    "permutation": "permutation",
    "softmax_shift": "softmax shift",
    "reference_class": "reference class",
    "normalisation_rescaling": "norm. rescaling",
    "bn_rescaling": "BN scale inv.",
    "ln_rescaling": "LN rescaling",
    "attention_gauge": "attention gauge",
    "head_permutation": "head permutation",
    "rmsnorm_gain": "RMSNorm gain",
    "stream_rotation": "stream rotation",
    "rope_gauge": "RoPE gauge",
    "gqa_gauge": "GQA gauge",
    "gqa_permutation": "GQA permutation",
    "swiglu_rescaling": "SwiGLU rescaling",
}

#: The transformation kinds, in the atlas's column order, with their titles.
TRANSFORMS: dict[str, str] = {
    "relu_rescaling": "per-neuron ReLU rescaling",
    "layer_rescaling": "layer rescaling",
    "permutation": "neuron permutation",
    "softmax_shift": "softmax common-row shift",
    "reference_class": "reference class",
    "normalisation_rescaling": "normalisation-preceding rescaling",
}

#: The transformation kinds of modern layers, asked for by name (``transforms=["bn_rescaling"]``); the
#: default columns stay :data:`TRANSFORMS`. Each composes every instance the registry finds.
LAYER_TRANSFORMS: dict[str, str] = {
    "bn_rescaling": "batch-norm scale invariance (running statistics moved along)",
    "ln_rescaling": "layer-norm rescaling against the linear maps reading it",
    "attention_gauge": "attention head gauge (A on queries and keys, B on values and output)",
    "head_permutation": "attention head permutation",
    "rmsnorm_gain": "RMSNorm gain rescaling against the linear maps reading it",
    "stream_rotation": "residual-stream rotation (embedding, every writer and every reader)",
    "rope_gauge": "rotary query/key gauge (the commutant of the rotations, per key/value head)",
    "gqa_gauge": "grouped-query value/output gauge (one GL(d_v) per key/value head, shared by its query heads)",
    "gqa_permutation": "grouped-query head permutations (query heads within a group, key/value groups)",
    "swiglu_rescaling": "SwiGLU up/down rescaling",
}

#: The name prefix of each kind's symmetries in :func:`~lossgeom.symmetries.find_symmetries`.
_LAYER_PREFIXES = {
    "bn_rescaling": "batch-norm scale invariance",
    "ln_rescaling": "layer-norm rescaling",
    "attention_gauge": "attention gauge",
    "head_permutation": "head permutation",
    "rmsnorm_gain": "RMSNorm gain rescaling",
    "stream_rotation": "stream rotation",
    "rope_gauge": "query/key gauge",
    "gqa_gauge": "value/output gauge",
    "gqa_permutation": ("query head permutation", "key/value group permutation"),
    "swiglu_rescaling": "SwiGLU rescaling",
}

#: The size of each decoder column's draw, as :func:`~lossgeom.symmetries.find_symmetries` draws it.
_DECODER_SIZES = {
    "rmsnorm_gain": "c_j log-uniform in [1/{size}, {size}]",
    "stream_rotation": "Haar orthogonal Q",
    "rope_gauge": "rotary commutant, scales log-uniform in [1/{size}, {size}], angles uniform",
    "gqa_gauge": "B = Q1 diag(s) Q2 per key/value head, condition number {condition}",
    "gqa_permutation": "uniform random",
    "swiglu_rescaling": "c_j log-uniform in [1/{size}, {size}]",
}


@dataclass(frozen=True)
class Column:
    """One transformation of the atlas: what it is, its size, and its audit receipt (or why it is absent)."""

    key: str
    title: str
    size: str
    symmetry: Symmetry | None = None
    receipt: AuditReport | None = None
    reason: str = ""

    @property
    def applies(self) -> bool:
        """Whether the transformation exists for the model (it has a symmetry to audit)."""
        return self.symmetry is not None

    @property
    def short(self) -> str:
        """The column's title in a table header."""
        return SHORT_TITLES.get(self.key, self.title)

    def receipt_text(self) -> str:
        """``"Δ/scale < 1e-13, tol 1e-10"``, or the reason the column is absent.

        The audit's largest output discrepancy over the output scale, by its order at
        rounding level.

        Returns:
            ``"Δ/scale < {floor}, tol {tolerance}"`` (the discrepancy shown by its decade when it
            is at or above the audit's rounding floor), followed by ``"; approximate: {why}"``
            for an approximate symmetry, or ``"n/a: {reason}"`` without a receipt.
        """
        if self.receipt is None:
            return f"n/a: {self.reason}"
        change, floor = self.receipt.relative_discrepancy, self.receipt.rounding_floor
        shown = f"< {fmt(floor)}" if change < floor else _below_decade(change)
        text = f"Δ/scale {shown}, tol {fmt(self.receipt.relative_tolerance, 2)}"
        return text + (f"; approximate: {self.receipt.approximate}" if self.receipt.approximate else "")


@dataclass(frozen=True)
class Cell:
    """One (measure, transformation) cell: the verdict and the numbers behind it.

    ``status`` is ``"invariant"`` (relative change at most ``tolerance``), ``"moves"``
    (by ``factor = after / before``) or ``"not applicable"`` (``reason`` says why).
    """

    measure: str
    transform: str
    status: str
    before: float | None = None
    after: float | None = None
    tolerance: float | None = None
    reason: str = ""
    floor: float = ROUNDING_FLOOR

    @property
    def relative_change(self) -> float | None:
        """``|after - before| / |before|`` (``/ 1`` when ``before == 0``); None without both values."""
        if self.before is None or self.after is None:
            return None
        return abs(self.after - self.before) / (abs(self.before) if self.before != 0 else 1.0)

    @property
    def factor(self) -> float | None:
        """``after / before``; None without both values or when ``before == 0``."""
        if self.before is None or self.after is None or self.before == 0:
            return None
        return self.after / self.before

    def change_text(self) -> str:
        """The relative change ``|after - before| / |before|`` (``/ 1`` when ``before == 0``) in words.

        Returns:
            ``"< {floor}"`` below the rounding floor, the change's decade otherwise, or ``"-"``
            when ``before`` or ``after`` is missing.
        """
        change = self.relative_change
        if change is None:
            return "-"
        return f"< {fmt(self.floor)}" if change < self.floor else _below_decade(change)

    def text(self, sig: int = 3) -> str:
        """The verdict in a few words: ``invariant (Δ < 1e-13)``, ``×0.25`` or ``n/a``.

        Args:
            sig: significant digits of the factor (raised, up to 12, until it does not read ``×1``).

        Returns:
            ``"n/a"``, ``"invariant (Δ ...)"``, ``"×{factor}"`` (with ``" (sign change)"`` for a
            negative factor) or ``"from 0 to {after}"`` when ``before`` is 0.
        """
        if self.status == "not applicable":
            return "n/a"
        if self.status == "invariant":
            return f"invariant (Δ {self.change_text()})"
        factor = self.factor
        if factor is None:
            return f"from 0 to {fmt(self.after, sig)}"
        shown = fmt(factor, sig)
        while shown == "1" and sig < 12:  # a move must not read as "×1"
            sig += 1
            shown = fmt(factor, sig)
        return f"×{shown}" + (" (sign change)" if factor < 0 else "")


def _log_factor(cell: Cell) -> float:
    if cell.status == "invariant":
        return 0.0
    factor = cell.factor
    if cell.status != "moves" or factor is None or factor == 0:
        return math.nan
    return math.log10(abs(factor))


def _wanted(transforms: str | Symmetry | Sequence[str | Symmetry] | None) -> list[str | Symmetry]:
    """The requested columns, names of :data:`TRANSFORMS` or symmetries, checked."""
    wanted = (
        list(TRANSFORMS)
        if transforms is None
        else ([transforms] if isinstance(transforms, (str, Symmetry)) else list(transforms))
    )
    if not wanted:
        raise ValueError("transforms must name at least one transformation")
    for item in wanted:
        if isinstance(item, str) and item not in TRANSFORMS and item not in LAYER_TRANSFORMS:
            raise ValueError(
                f"unknown transformation {item!r}; the atlas knows {list(TRANSFORMS) + list(LAYER_TRANSFORMS)} "
                "(or pass a lossgeom Symmetry)"
            )
        if not isinstance(item, (str, Symmetry)):
            raise TypeError(f"transforms must hold names or lossgeom Symmetry objects, got {type(item).__name__}")
    keys = [item if isinstance(item, str) else item.name for item in wanted]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise ValueError(
            f"transforms name {repeated[0]!r} more than once: each column is keyed by its name, so give "
            "every Symmetry a distinct name (or compose them into one)"
        )
    return wanted


def _columns(
    model: nn.Module,
    loss: nn.Module,
    transforms: str | Symmetry | Sequence[str | Symmetry] | None,
    size: float,
    seed: int,
    reference: int,
) -> list[Column]:
    wanted = _wanted(transforms)
    found = None
    if any(isinstance(item, str) for item in wanted):
        found = symmetries.find_symmetries(model, loss=loss, rescale=size, shift=size, seed=seed)
    cross_entropy = isinstance(loss, nn.CrossEntropyLoss) and type(loss).forward is nn.CrossEntropyLoss.forward
    return [
        Column(item.name, item.name, "as named", item)
        if isinstance(item, Symmetry)
        else _named_column(item, model, found, size, reference, cross_entropy)
        for item in wanted
    ]


def _named_column(
    item: str, model: nn.Module, found: FoundSymmetries | None, size: float, reference: int, cross_entropy: bool
) -> Column:
    """The column of the transformation kind ``item`` (a key of :data:`TRANSFORMS`) for ``model``."""
    title, chosen, reason = {**TRANSFORMS, **LAYER_TRANSFORMS}[item], [], ""
    if item in _LAYER_PREFIXES:
        prefixes = _LAYER_PREFIXES[item]
        prefixes = (prefixes,) if isinstance(prefixes, str) else prefixes
        chosen = [s for s in found if s.name.startswith(prefixes)]
        size_text = (
            _DECODER_SIZES[item].format(size=fmt(size), condition=fmt(4.0))
            if item in _DECODER_SIZES
            else f"A, B = Q1 diag(s) Q2 per head, condition number {fmt(4.0)}"
            if item == "attention_gauge"
            else "uniform random"
            if item == "head_permutation"
            else f"c_j log-uniform in [1/{fmt(size)}, {fmt(size)}]"
        )
        reason = "; ".join(r for r in found.skipped if any(p.split()[0] in r for p in prefixes)) or (
            f"no place for a {' or '.join(prefixes)} in this model"
        )
    elif item == "relu_rescaling":
        chosen = [
            s
            for s in found
            if " rescaling " in s.name and not s.name.startswith(("softmax", "layer-norm", "RMSNorm", "SwiGLU"))
        ]
        size_text = f"c_j log-uniform in [1/{fmt(size)}, {fmt(size)}]"
        reason = "no two layers joined by a positively homogeneous activation"
    elif item == "permutation":
        chosen = [s for s in found if s.name.startswith("permutation")]
        size_text = "uniform random"
        reason = "no two layers whose units can be relabelled"
    elif item == "softmax_shift":
        chosen = [s for s in found if s.name.startswith("softmax row shift")]
        size_text = f"shift norm {fmt(size)} x RMS row"
        reason = "no softmax classifier (a final Linear layer under nn.CrossEntropyLoss)"
    elif item == "layer_rescaling":
        chosen = list(symmetries.registry.find_layer_rescalings(model, size))
        size_text = f"c = {fmt(size)}"
        reason = "no two layers joined by a positively homogeneous activation"
    elif item == "normalisation_rescaling":
        search = symmetries.registry.find_normalisation_rescalings(model, size)
        chosen = list(search)
        size_text = f"c = {fmt(size)}"
        reason = "; ".join(search.skipped) or "no normalisation layer reads a Linear or Conv layer"
    else:  # reference_class
        size_text = f"r = {reference}"
        layer = symmetries.registry.classifier_layer(model) if cross_entropy else None
        if layer is not None:
            chosen = [symmetries.layers.reference_class_shift(layer[0], reference, bias=layer[1])]
        reason = "no softmax classifier (a final Linear layer under nn.CrossEntropyLoss)"
    if chosen:
        parts = f" ({len(chosen)} layer pairs)" if len(chosen) > 1 else ""
        return Column(item, title, size_text, symmetries.compose(chosen, title + parts))
    return Column(item, title, size_text, None, reason=reason)


def _cell(
    measure: Measure, column: Column, before: float | None, after: float | None, reason: str, dtype: torch.dtype
) -> Cell:
    if not column.applies:
        return Cell(measure.key, column.key, "not applicable", reason=column.reason)
    if before is None:
        return Cell(measure.key, column.key, "not applicable", reason=reason)
    tolerance = measure.tolerance_for(dtype)
    change = abs(after - before) / (abs(before) if before != 0 else 1.0)
    status = "invariant" if change <= tolerance else "moves"
    floor = max(symmetries.core.rounding_floor(dtype), measure.rounding_floor)
    return Cell(measure.key, column.key, status, before, after, tolerance, floor=floor)

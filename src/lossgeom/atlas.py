"""The symmetry audit atlas: which flatness measures survive which function-preserving transformations.

One call, :func:`atlas`, answers the book's question for a researcher's own model: given a
``torch.nn.Module``, a loss module, data and a probe set, it

1. builds one function-preserving transformation per column (per-neuron ReLU rescaling,
   layer-wise rescaling, neuron permutation, the softmax common-row shift, the
   reference-class representative, the rescaling of a layer that feeds a normalisation),
   each from the model's own graph (:mod:`lossgeom.symmetries`), at a stated size;
2. audits every transformation on the probe (:func:`lossgeom.symmetries.audit`): the
   outputs before and after must agree to a relative tolerance, or the call stops, since
   a change in geometry across a transformation that changed the function means nothing;
3. recomputes every measure (:mod:`lossgeom.flatness`, module-first) at the transformed
   parameters and compares it with its value at the model's own parameters.

Each cell of the resulting :class:`Atlas` is "invariant" (the relative change and the
measure's numerical tolerance), the factor by which the measure moved, or "not
applicable" with the reason (Flat^Q on a network that is not two-layer, the softmax
proxies under a square loss, a normalisation rescaling in a model without
normalisation). Every cell of a column shares that column's audit receipt. The atlas
also records the point itself (:class:`PointRecord`): the loss and gradient norm at the
model's parameters and at each transformed point, and, where the Fisher-Riemannian row
is measured, the Fisher's rank at the cut that row uses (:data:`FISHER_RANK_THRESHOLD`),
the eigenvalues on either side of the cut, the Hessian's part on the Fisher's kernel and
the row's value at other cuts (:data:`FISHER_CUTS`). The appendix ``appendices/atlas``
tabulates it for the book's models.
"""
from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from lossgeom import flatness, symmetries
from lossgeom._validation import positive
from lossgeom.contract import MeasurementContract
from lossgeom.formatting import fmt
from lossgeom.symmetries import AuditReport, Symmetry

#: Relative changes below this are reported by their order only (float64 rounding level;
#: :func:`lossgeom.symmetries.rounding_floor` gives the floor of another dtype).
ROUNDING_FLOOR = 1e-13

#: The rank cut of the Fisher-Riemannian row. A Fisher eigenvalue at most this times the
#: largest counts as zero. It is the default ``rel_threshold`` of
#: :func:`lossgeom.flatness.fisher_riemannian_sharpness`, which
#: :func:`lossgeom.flatness.riemannian_sharpness` (the row's measure) uses; it is read from
#: that signature, so the row and :class:`FisherRecord` cannot disagree.
FISHER_RANK_THRESHOLD: float = float(
    inspect.signature(flatness.fisher_riemannian_sharpness).parameters["rel_threshold"].default)

#: The cuts at which :class:`FisherRecord` also evaluates the Fisher-Riemannian sharpness
#: (largest first; the row's own cut is among them), to show how far the row depends on it.
#: The smallest stays two decades above the float64 rounding of a Fisher eigendecomposition
#: (about 1e-13 of the largest eigenvalue), so the values there keep their digits.
FISHER_CUTS: tuple[float, ...] = tuple(sorted({1e-6, FISHER_RANK_THRESHOLD, 1e-11}, reverse=True))


@dataclass(frozen=True)
class Measure:
    """A flatness or sharpness measure as a row of the atlas.

    Attributes:
        key: short name used to select it (``"lambda_max"``) and in labels.
        title: the row's title in plain text (it is also a link text and an axis label).
        definition: the definition in one line.
        citation: the ``references.bib`` key(s) of its source, comma separated.
        function: ``function(point, **options)`` with ``point`` a
            :class:`lossgeom.flatness.LossPoint` (``takes_point=True``), or
            ``function(model, loss, data, **options)`` for a measure of your own.
        tolerance: the relative change (float64) below which the measure is called
            invariant: its numerical accuracy, not a claim about the model.
        options: keyword arguments passed to ``function``.
        takes_point: how ``function`` is called (see ``function``).
    """

    key: str
    title: str
    definition: str
    citation: str
    function: Callable[..., float]
    tolerance: float = 1e-9
    options: Mapping[str, Any] = field(default_factory=dict)
    takes_point: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key.strip():
            raise ValueError("a measure needs a non-empty key")
        if not callable(self.function):
            raise TypeError(f"measure {self.key!r}: function must be callable")
        positive("tolerance", self.tolerance)

    def tolerance_for(self, dtype: torch.dtype) -> float:
        """The invariance tolerance in ``dtype``: ``tolerance`` in float64, at least 1e-3 in float32."""
        return self.tolerance if dtype == torch.float64 else max(self.tolerance, 1e-3)

    def __call__(self, point: flatness.LossPoint) -> float:
        if self.takes_point:
            value = self.function(point, **self.options)
        else:
            value = self.function(point.model_at_point(), point.loss, point.data, **self.options)
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"measure {self.key!r} returned {value}; it must be finite")
        return value


def _riemannian(point, **options):
    return flatness.riemannian_sharpness(point, fisher="true", **options)


def _diagonal(point, **options):
    return flatness.riemannian_sharpness(point, fisher="diagonal", **options)


#: The book's measures, in the atlas's row order.
MEASURES: dict[str, Measure] = {m.key: m for m in [
    Measure("lambda_max", "λ_max(H)", "largest eigenvalue of the loss Hessian H (Lanczos)",
            "cohen2021gradient", flatness.lambda_max, 1e-6, {"tol": 1e-9}),
    Measure("trace", "tr H", "trace of the loss Hessian", "yao2020pyhessian",
            flatness.hessian_trace),
    Measure("keskar", "Keskar ε-sharpness",
            "100 (max over |z_i| <= eps (|theta_i| + 1) of L(theta + z) - L) / (1 + L), by L-BFGS-B",
            "keskar2017large", flatness.keskar_sharpness, 1e-6, {"epsilon": 1e-3, "max_iter": 20}),
    Measure("sam", "SAM sharpness", "L(theta + rho g / |g|) - L(theta), g the gradient",
            "foret2021sharpness", flatness.sam_sharpness, 1e-9, {"rho": 0.05}),
    Measure("asam", "ASAM adaptive sharpness",
            "L(theta + rho T^2 g / |T g|) - L(theta), T = |w| + eta on weights, 1 on biases",
            "kwon2021asam", flatness.adaptive_sharpness, 1e-9, {"rho": 0.5, "eta": 0.01}),
    Measure("fisher_rao", "Fisher-Rao norm", "sqrt(<theta, I theta>), I the empirical Fisher",
            "liang2019fisher", flatness.fisher_rao_norm),
    Measure("relative_flatness", "relative flatness (first layer)",
            "sum over rows s, s' of <w_s, w_s'> tr H_{s,s'} for the first weight layer",
            "petzka2021relative", flatness.relative_flatness),
    Measure("kappa_exact", "κ_exact", "mean |h|^2 tr(W^T P(p) W) of the last layer",
            "petzka2021relative, opazo2026flatness", flatness.classifier_kappa_exact),
    Measure("b_raw", "B_raw", "|W|_F^2 mean |h|^2 (1 - |p|^2) of the last layer",
            "opazo2026flatness", flatness.classifier_b_raw),
    Measure("b_quot", "B_quot", "B_raw at the centred classifier W - 1 wbar^T",
            "opazo2026flatness", flatness.classifier_b_quot),
    Measure("flat_q", "Flat^Q", "trace of the Riemannian Hessian on the ReLU rescaling quotient",
            "miyagawa2026symmetry", flatness.model_quotient_flatness),
    Measure("fisher_riemannian", "Fisher-Riemannian sharpness",
            "largest eigenvalue of H in the metric of the true Fisher F (on its range)",
            "ahmed2026fisher", _riemannian, 1e-6),
    Measure("diagonal_fisher", "diagonal-Fisher sharpness",
            "largest eigenvalue of D^-1/2 H D^-1/2, D the diagonal of the true Fisher",
            "ahmed2026fisher", _diagonal, 1e-6),
    Measure("wolkowicz_styan", "Wolkowicz-Styan bound", "m + s sqrt(n - 1) >= lambda_max(H), from tr H and tr H^2",
            "wolkowicz1980bounds", flatness.wolkowicz_styan),
]}

#: Short column titles of the transformation kinds (for tables).
SHORT_TITLES: dict[str, str] = {
    "relu_rescaling": "ReLU rescaling",
    "layer_rescaling": "layer rescaling",
    "permutation": "permutation",
    "softmax_shift": "softmax shift",
    "reference_class": "reference class",
    "normalisation_rescaling": "norm. rescaling",
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
        return self.symmetry is not None

    @property
    def short(self) -> str:
        """The column's title in a table header."""
        return SHORT_TITLES.get(self.key, self.title)

    def receipt_text(self) -> str:
        """``"Δ/scale < 1e-13, tol 1e-10"`` (the audit's largest output discrepancy over the
        output scale, by its order at rounding level), or the reason the column is absent."""
        if self.receipt is None:
            return f"n/a: {self.reason}"
        change, floor = self.receipt.relative_discrepancy, self.receipt.rounding_floor
        shown = f"< {fmt(floor)}" if change < floor else _below_decade(change)
        return f"Δ/scale {shown}, tol {fmt(self.receipt.relative_tolerance, 2)}"


def _below_decade(change: float) -> str:
    """``"< 1e-12"`` for 6.8e-13: a change within tolerance is reported by its order.

    Its leading digits belong to the machine's rounding (another CPU changes them), so
    only the decade above it is shown.
    """
    if change == 0:
        return "0"
    return f"< 1e{math.floor(math.log10(change)) + 1}"


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
        if self.before is None or self.after is None:
            return None
        return abs(self.after - self.before) / (abs(self.before) if self.before != 0 else 1.0)

    @property
    def factor(self) -> float | None:
        if self.before is None or self.after is None or self.before == 0:
            return None
        return self.after / self.before

    def change_text(self) -> str:
        change = self.relative_change
        if change is None:
            return "-"
        return f"< {fmt(self.floor)}" if change < self.floor else _below_decade(change)

    def text(self, sig: int = 3) -> str:
        """The verdict in a few words: ``invariant (Δ < 1e-13)``, ``×0.25`` or ``n/a``."""
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


@dataclass(frozen=True)
class FisherRecord:
    """The Fisher at a point, as the Fisher-Riemannian row sees it.

    Attributes:
        threshold: the row's rank cut (:data:`FISHER_RANK_THRESHOLD`), relative to the
            Fisher's largest eigenvalue.
        rank: the number of Fisher eigenvalues above ``threshold`` times the largest (the
            dimension of the range the row maximises over).
        n_parameters: the number of parameters (the Fisher's size).
        kept: the smallest kept eigenvalue over the largest.
        dropped: the largest dropped eigenvalue over the largest (0 if none is dropped).
            Where ``kept / dropped`` is many decades, any cut between gives the same rank;
            where it is near 1 the spectrum runs through the cut, and the rank is the cut's.
        kernel_leakage: ``|H N|_2 / |H|_2`` for an orthonormal basis ``N`` of the dropped
            eigenvectors: the Hessian's part on the Fisher's kernel. Where it is zero the row
            is invariant under every invertible linear symmetry; where it is not, only under
            those whose Jacobian is orthogonal (permutations, translations).
        cuts: ``(cut, rank, value)`` of the Fisher-Riemannian sharpness at each cut of
            :data:`FISHER_CUTS`.
    """

    threshold: float
    rank: int
    n_parameters: int
    kept: float
    dropped: float
    kernel_leakage: float
    cuts: tuple[tuple[float, int, float], ...]

    @property
    def gap(self) -> float:
        """``kept / dropped``: how many-fold the spectrum drops across the cut (inf if nothing is dropped)."""
        return self.kept / self.dropped if self.dropped > 0 else math.inf

    def dropped_text(self) -> str:
        """``dropped`` with 2 digits, or ``"< 1e-13"`` at float64 rounding level (its digits are the CPU's)."""
        return f"< {fmt(ROUNDING_FLOOR)}" if self.dropped < ROUNDING_FLOOR else fmt(self.dropped, 2)

    def gap_text(self) -> str:
        """``gap`` with 2 digits, or ``"more than 2.2e+06"`` (``kept`` over the rounding floor) when
        the largest dropped eigenvalue is rounding."""
        if self.dropped < ROUNDING_FLOOR:
            return f"more than {fmt(self.kept / ROUNDING_FLOOR, 2)}"
        return fmt(self.gap, 2)

    def value(self, cut: float | None = None) -> float:
        """The Fisher-Riemannian sharpness at ``cut`` (one of :data:`FISHER_CUTS`; default the row's)."""
        cut = self.threshold if cut is None else cut
        for at, _, value in self.cuts:
            if at == cut:
                return value
        raise ValueError(f"cut must be one of {[c for c, _, _ in self.cuts]}, got {cut}")

    def rank_at(self, cut: float) -> int:
        """The Fisher's rank at ``cut`` (one of :data:`FISHER_CUTS`)."""
        for at, rank, _ in self.cuts:
            if at == cut:
                return rank
        raise ValueError(f"cut must be one of {[c for c, _, _ in self.cuts]}, got {cut}")


def fisher_record(hessian: np.ndarray, fisher: np.ndarray) -> FisherRecord:
    """The :class:`FisherRecord` of a dense Hessian and Fisher (one eigendecomposition of the Fisher).

    The value at each cut is ``lambda_max(R^T H R)`` with ``R = U_+ diag(phi_+)^(-1/2)`` over
    the Fisher eigenvalues ``phi`` above the cut, as in
    :func:`lossgeom.flatness.fisher_riemannian_sharpness` (the unit tests check that they agree).

    Raises:
        ValueError: if the matrices are not square of one size, or the Fisher has no
            positive eigenvalue.
    """
    H, F = np.asarray(hessian, dtype=np.float64), np.asarray(fisher, dtype=np.float64)
    if H.ndim != 2 or H.shape[0] != H.shape[1] or H.shape != F.shape:
        raise ValueError(f"hessian and fisher must be square matrices of one size, got {H.shape} and {F.shape}")
    phi, U = np.linalg.eigh(F)
    top = phi[-1]
    if not top > 0:
        raise ValueError("fisher must have a positive eigenvalue")
    cuts = []
    for cut in FISHER_CUTS:
        keep = phi > cut * top
        R = U[:, keep] / np.sqrt(phi[keep])
        cuts.append((cut, int(keep.sum()), float(np.linalg.eigvalsh(R.T @ H @ R)[-1])))
    keep = phi > FISHER_RANK_THRESHOLD * top
    kernel = U[:, ~keep]
    h_norm = float(np.abs(np.linalg.eigvalsh(H)).max())
    leakage = float(np.linalg.norm(H @ kernel, 2) / h_norm) if kernel.size and h_norm > 0 else 0.0
    dropped = float(phi[~keep].max() / top) if (~keep).any() else 0.0
    return FisherRecord(FISHER_RANK_THRESHOLD, int(keep.sum()), H.shape[0], float(phi[keep].min() / top),
                        max(dropped, 0.0), leakage, tuple(cuts))


@dataclass(frozen=True)
class PointRecord:
    """Where a measurement was taken: the loss, the gradient norm, and the Fisher as the row sees it.

    The Fisher-Riemannian verdicts depend on stationarity (at a critical point whose
    Fisher kernel is made of symmetry directions the Hessian vanishes on that kernel), so
    the atlas records how far from one each point is.

    Attributes:
        loss: the mean loss on the data.
        gradient_norm: the Euclidean norm of its gradient (in the point's own coordinates,
            so a rescaling changes it while keeping the loss).
        fisher: the :class:`FisherRecord`, where the Fisher-Riemannian row is measured.
    """

    loss: float
    gradient_norm: float
    fisher: FisherRecord | None = None

    def text(self) -> str:
        """``"loss 0.0181, gradient norm 0.0529"`` (3 significant digits)."""
        return f"loss {fmt(self.loss, 3)}, gradient norm {fmt(self.gradient_norm, 3)}"


def _point_record(point: flatness.LossPoint, with_fisher: bool) -> PointRecord:
    value, gradient = point.value_and_gradient(point.flat())
    fisher = None
    if with_fisher:
        try:
            fisher = fisher_record(point.hessian(), point.fisher())
        except flatness.NotApplicable:
            fisher = None
    return PointRecord(float(value), float(gradient.norm()), fisher)


def feature_norm_change(model: nn.Module, loss: nn.Module, data, symmetry: Symmetry) -> float:
    """The largest relative change of an example's classifier-feature norm ``|[h_i; 1]|`` under ``symmetry``.

    The last-layer proxies (kappa_exact, B_raw, B_quot) read the classifier ``[W b]`` and
    its features ``[h; 1]`` (:meth:`lossgeom.flatness.LossPoint.classifier`); a
    transformation that leaves every ``|[h_i; 1]|`` unchanged (a permutation of the
    classifier's inputs, a rescaling of units the classifier does not read) changes them
    only through ``W``. Returns ``max_i | |h'_i| - |h_i| | / |h_i|``.

    Raises:
        NotApplicable: if the model has no softmax classifier under ``loss``.
    """
    if not isinstance(symmetry, Symmetry):
        raise TypeError(f"symmetry must be a lossgeom Symmetry, got {type(symmetry).__name__}")
    base = flatness.LossPoint(model, loss, data)
    moved = flatness.LossPoint(model, loss, data, params=symmetry(base.params))
    before, after = base.classifier()[1].norm(dim=1), moved.classifier()[1].norm(dim=1)
    return float(((after - before).abs() / before).max())


def hessian_block_trace(point: flatness.LossPoint, names) -> float:
    """``sum_i H_ii`` over the coordinates of the parameters ``names`` (one HVP per coordinate).

    Under a rescaling ``theta -> D theta`` that multiplies these parameters by ``c`` and
    keeps the loss, ``H -> D^-1 H D^-1``: the trace moves by exactly
    ``(1/c^2 - 1) * hessian_block_trace(point, names)``.
    """
    from lossgeom.curvature import hessian_operator

    names = [names] if isinstance(names, str) else list(names)
    if not names:
        raise ValueError("names must list at least one parameter of the model")
    index = np.concatenate([point.block_indices(name) for name in names])
    operator = hessian_operator(point.loss_fn, point.params, method="reverse-over-reverse")
    columns = torch.eye(operator.shape[0], dtype=operator.dtype, device=operator.device)[:, torch.as_tensor(index)]
    block = operator.matmat(columns).detach().cpu().numpy()
    return float(block[index, np.arange(len(index))].sum())


def _log_factor(cell: Cell) -> float:
    if cell.status == "invariant":
        return 0.0
    factor = cell.factor
    if cell.status != "moves" or factor is None or factor == 0:
        return math.nan
    return math.log10(abs(factor))


@dataclass(frozen=True)
class Atlas:
    """The result of :func:`atlas`: measures (rows) by transformations (columns), with receipts.

    ``cells[i][j]`` is the :class:`Cell` of ``measures[i]`` under ``columns[j]``; each
    column carries its audit receipt. ``base[i]`` is measure ``i`` at the model's own
    parameters (None where it does not apply, with the reason in ``base_reasons[i]``).
    ``point`` records the model's own parameters (loss, gradient norm, the Fisher as the
    Fisher-Riemannian row sees it) and ``column_points[j]`` the image under ``columns[j]``
    (None where the column does not apply).
    """

    model: str
    dtype: str
    n_parameters: int
    n_examples: int
    loss: str
    probe_size: int
    size: float
    seed: int
    measures: tuple[Measure, ...]
    columns: tuple[Column, ...]
    cells: tuple[tuple[Cell, ...], ...]
    base: tuple[float | None, ...]
    base_reasons: tuple[str, ...]
    data: str = ""
    model_mode: str = "eval"
    point: PointRecord | None = None
    column_points: tuple[PointRecord | None, ...] = ()

    def _row_index(self, measure: str) -> int:
        keys = [m.key for m in self.measures]
        if measure not in keys:
            raise KeyError(f"no measure {measure!r} in this atlas; rows are {keys}")
        return keys.index(measure)

    def _column_index(self, transform: str) -> int:
        keys = [c.key for c in self.columns]
        if transform not in keys:
            raise KeyError(f"no transformation {transform!r} in this atlas; columns are {keys}")
        return keys.index(transform)

    def measure(self, key: str) -> Measure:
        """The :class:`Measure` of the row ``key`` (``"lambda_max"``)."""
        return self.measures[self._row_index(key)]

    def value(self, measure: str) -> float | None:
        """``measure`` at the model's own parameters (None where it does not apply to the model)."""
        return self.base[self._row_index(measure)]

    def cell(self, measure: str, transform: str) -> Cell:
        """The cell of ``measure`` (a key such as ``"lambda_max"``) under ``transform`` (``"permutation"``)."""
        return self.cells[self._row_index(measure)][self._column_index(transform)]

    def row(self, measure: str) -> tuple[Cell, ...]:
        return self.cells[self._row_index(measure)]

    def column(self, transform: str) -> Column:
        """The :class:`Column` ``transform`` (``"permutation"``): its symmetry, size and receipt."""
        return self.columns[self._column_index(transform)]

    def column_cells(self, transform: str, applicable: bool = True) -> tuple[Cell, ...]:
        """The cells of every measure under ``transform`` (only the applicable ones by default)."""
        j = self._column_index(transform)
        return tuple(row[j] for row in self.cells if not applicable or row[j].status != "not applicable")

    def column_point(self, transform: str) -> PointRecord | None:
        """The :class:`PointRecord` of the image under ``transform`` (None where it does not apply)."""
        return self.column_points[self._column_index(transform)] if self.column_points else None

    def point_text(self) -> str:
        """Where the table was measured, in a sentence or two (loss, gradient norm, the Fisher's cut)."""
        if self.point is None:
            return ""
        moved = [(c, r) for c, r in zip(self.columns, self.column_points) if r is not None]
        text = f"Point measured (the model's parameters, mean over the {self.n_examples} examples): {self.point.text()}"
        if moved:
            norms = [r.gradient_norm for _, r in moved]
            losses = max(abs(r.loss - self.point.loss) for _, r in moved) / abs(self.point.loss)
            shown = f"< {fmt(ROUNDING_FLOOR)}" if losses < ROUNDING_FLOOR else _below_decade(losses)
            text += (f"; at the transformed points the loss changes by {shown} of itself and the gradient norm "
                     f"lies in [{fmt(min(norms), 3)}, {fmt(max(norms), 3)}]")
        fisher = self.point.fisher
        if fisher is not None:
            text += (f". Fisher-Riemannian row: the Fisher has rank {fisher.rank} of {fisher.n_parameters} at the "
                     f"cut {fmt(fisher.threshold)} x its largest eigenvalue (smallest kept {fmt(fisher.kept, 2)}, "
                     f"largest dropped {fisher.dropped_text()}: a drop by a factor of {fisher.gap_text()} across "
                     f"the cut); the Hessian's part on its kernel is {fmt(fisher.kernel_leakage, 2)} of its norm")
        return text + "."

    def fisher_cuts_markdown(self, sig: int = 4) -> str:
        """The Fisher-Riemannian row at each cut of :data:`FISHER_CUTS`, as a MyST table.

        One row per cut: the Fisher's rank and the value at the model's parameters, then the
        factor ``after / before`` under each applicable column with the rank there.
        """
        if self.point is None or self.point.fisher is None:
            raise ValueError("this atlas has no Fisher record: the Fisher-Riemannian row was not measured")
        moved = [(c, r) for c, r in zip(self.columns, self.column_points) if r is not None and r.fisher is not None]
        header = ["cut", "rank", "value"] + [c.short for c, _ in moved]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for cut, rank, value in self.point.fisher.cuts:
            mark = " (the row's)" if cut == self.point.fisher.threshold else ""
            factors = [f"×{fmt(r.fisher.value(cut) / value, sig)} (rank {r.fisher.rank_at(cut)})" for _, r in moved]
            lines.append("| " + " | ".join([fmt(cut) + mark, str(rank), fmt(value, sig)] + factors) + " |")
        return "\n".join(lines)

    def log_factors(self) -> np.ndarray:
        """``log10 |after / before|`` per cell (0 where invariant, NaN where not applicable)."""
        return np.array([[_log_factor(cell) for cell in row] for row in self.cells])

    def summary(self, measure: str, sig: int = 3) -> str:
        """One sentence: under which columns ``measure`` is invariant and by what factors it moves."""
        i = self._row_index(measure)
        if self.base[i] is None:
            return f"does not apply to this model: {self.base_reasons[i]}"
        titles = {c.key: c.title for c in self.columns}
        kept = [titles[c.transform] for c in self.cells[i] if c.status == "invariant"]
        moved = [f"{titles[c.transform]} ({c.text(sig)})" for c in self.cells[i] if c.status == "moves"]
        parts = []
        if kept:
            parts.append("invariant under " + ", ".join(kept))
        if moved:
            parts.append("moves under " + ", ".join(moved))
        return "; ".join(parts) if parts else "no transformation of this model applies"

    def to_markdown(self, link_prefix: str | None = None, sig: int = 3) -> str:
        """The table as MyST markdown: one row per measure, one column per transformation, receipts last.

        With ``link_prefix="atlas"`` each measure's title links to the label
        ``(atlas-<key>)=`` (underscores become hyphens), where the book defines it.
        """
        header = ["measure (tolerance)"] + [c.short for c in self.columns]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for measure, row in zip(self.measures, self.cells):
            title = measure.title
            if link_prefix:
                title = f"{{ref}}`{title} <{link_prefix}-{measure.key.replace('_', '-')}>`"
            tol = fmt(measure.tolerance_for(getattr(torch, self.dtype)), 1)
            lines.append("| " + " | ".join([f"{title} ({tol})"] + [cell.text(sig) for cell in row]) + " |")
        lines.append("| " + " | ".join(["audit receipt (outputs on the probe)"]
                                      + [c.receipt_text() if c.applies else "n/a" for c in self.columns]) + " |")
        sizes = "; ".join(f"{c.short}: {c.size}" for c in self.columns if c.applies)
        lines += ["", f"Transformation sizes (seed {self.seed}): {sizes}."]
        absent: dict[str, list[str]] = {}
        for c in self.columns:
            if not c.applies:
                absent.setdefault(c.reason, []).append(c.short)
        for measure, base, reason in zip(self.measures, self.base, self.base_reasons):
            if base is None:
                absent.setdefault(reason, []).append(measure.title)
        if absent:
            lines += ["", "Not applicable here: " + "; ".join(f"{', '.join(names)} ({reason})"
                                                            for reason, names in absent.items()) + "."]
        if self.point is not None:
            lines += ["", self.point_text()]
        return "\n".join(lines)

    def __str__(self) -> str:
        header = ["measure"] + [c.key for c in self.columns]
        body = [[m.key] + [cell.text() for cell in row] for m, row in zip(self.measures, self.cells)]
        body.append(["audit"] + [c.receipt_text() if c.applies else "n/a" for c in self.columns])
        widths = [max(len(line[i]) for line in [header] + body) for i in range(len(header))]
        lines = [f"symmetry audit atlas of {self.model} ({self.dtype}, {self.n_parameters} parameters, "
                 f"{self.n_examples} examples, {self.loss}); audit on {self.probe_size} probe inputs"]
        lines += ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in [header] + body]
        lines += [f"{c.key}: {c.reason}" for c in self.columns if not c.applies]
        if self.point is not None:
            lines.append(self.point_text())
        return "\n".join(lines)

    def contract(self) -> MeasurementContract:
        """The measurement contract of the table and its heat map (for a figure caption)."""
        options = {m.key: dict(m.options) for m in self.measures}
        radii = []
        if "sam" in options:
            radii.append(f"SAM rho = {fmt(options['sam'].get('rho', 0.05))}")
        if "asam" in options:
            radii.append(f"ASAM rho = {fmt(options['asam'].get('rho', 0.5))}, "
                         f"eta = {fmt(options['asam'].get('eta', 0.01))}")
        if "keskar" in options:
            radii.append(f"Keskar eps = {fmt(options['keskar'].get('epsilon', 1e-3))} "
                         f"({options['keskar'].get('max_iter', 20)} L-BFGS-B iterations)")
        sizes = "; ".join(f"{c.title}: {c.size}" for c in self.columns if c.applies)
        at = f", {self.point.text()}" if self.point is not None else ""
        return MeasurementContract(
            centre=f"the trained {self.model} ({self.n_parameters} parameters{at}) and its image under each "
                   "column's transformation",
            directions="none chosen: every measure is recomputed at the transformed parameters (SAM and ASAM "
                       "use their first-order ascent direction, Keskar's box is searched by L-BFGS-B, the "
                       "curvature measures use the dense Hessian or Lanczos)",
            normalisation="each measure's own (ASAM: |w| + eta on weights; Keskar: eps (|theta_i| + 1); relative "
                          "flatness: the rows of the first layer; Fisher-Riemannian: the Fisher metric on its range, "
                          f"eigenvalues above {fmt(FISHER_RANK_THRESHOLD)} x the largest)",
            radius="; ".join(radii) if radii else "n/a (no perturbation-based measure in the table)",
            loss=self.loss,
            reduction=f"mean over the {self.n_examples} examples",
            data=self.data or f"{self.n_examples} examples",
            model_mode=self.model_mode,
            resolution=f"one draw per transformation (seed {self.seed}); {sizes}; colour log10 |after / before|, "
                       "0 where the change is within the row's tolerance; outputs audited on "
                       f"{self.probe_size} probe inputs",
            precision=self.dtype,
        )

    def heatmap(self, ax=None, title: str | None = None):
        """A heat map of ``log10 |after / before|`` per cell, annotated; grey where not applicable.

        Returns the matplotlib figure (caption it with :meth:`contract`, e.g. through
        :func:`lossgeom_book.display.glue_figure`).
        """
        from matplotlib import pyplot as plt

        values = self.log_factors()
        if ax is None:
            fig, ax = plt.subplots(figsize=(1.25 * len(self.columns) + 3.2, 0.36 * len(self.measures) + 1.6))
        else:
            fig = ax.figure
        finite = np.abs(values[np.isfinite(values)])
        limit = max(0.5, float(finite.max()) if finite.size else 0.5)
        masked = np.ma.masked_invalid(values)
        colours = plt.get_cmap("RdBu_r").with_extremes(bad="0.85")
        image = ax.imshow(masked, cmap=colours, vmin=-limit, vmax=limit, aspect="auto")
        for i, row in enumerate(self.cells):
            for j, cell in enumerate(row):
                text = {"invariant": "inv.", "not applicable": "n/a"}.get(cell.status)
                if text is None:
                    text = cell.text(3).split(" ")[0] if cell.factor is not None else "from 0"
                dark = np.isfinite(values[i, j]) and abs(values[i, j]) > 0.6 * limit
                ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
        ax.set_xticks(range(len(self.columns)), [c.title.replace(" ", "\n", 1) for c in self.columns], fontsize=7)
        ax.set_yticks(range(len(self.measures)), [m.key for m in self.measures], fontsize=7)
        ax.grid(False)
        ax.set_title(title or f"{self.model}: log10 |change factor|", fontsize=9)
        fig.colorbar(image, ax=ax, label="log10 |after / before|", shrink=0.8)
        fig.tight_layout()
        return fig


def _measures(measures) -> list[Measure]:
    if measures is None:
        return list(MEASURES.values())
    if isinstance(measures, (str, Measure)):
        measures = [measures]
    chosen = []
    for item in measures:
        if isinstance(item, Measure):
            chosen.append(item)
        elif isinstance(item, str):
            if item not in MEASURES:
                raise ValueError(f"unknown measure {item!r}; the atlas knows {list(MEASURES)} (or pass a Measure)")
            chosen.append(MEASURES[item])
        else:
            raise TypeError(f"measures must hold measure names or Measure objects, got {type(item).__name__}")
    keys = [m.key for m in chosen]
    if not chosen or len(set(keys)) != len(keys):
        raise ValueError(f"measures must be a non-empty list without repeats, got {keys}")
    return chosen


def _columns(model: nn.Module, loss, transforms, size: float, seed: int, reference: int) -> list[Column]:
    wanted = list(TRANSFORMS) if transforms is None else (
        [transforms] if isinstance(transforms, (str, Symmetry)) else list(transforms))
    if not wanted:
        raise ValueError("transforms must name at least one transformation")
    for item in wanted:
        if isinstance(item, str) and item not in TRANSFORMS:
            raise ValueError(f"unknown transformation {item!r}; the atlas knows {list(TRANSFORMS)} "
                             "(or pass a lossgeom Symmetry)")
        if not isinstance(item, (str, Symmetry)):
            raise TypeError(f"transforms must hold names or lossgeom Symmetry objects, got {type(item).__name__}")
    found = None
    if any(isinstance(item, str) for item in wanted):
        found = symmetries.find_symmetries(model, loss=loss, rescale=size, shift=size, seed=seed)
    cross_entropy = isinstance(loss, nn.CrossEntropyLoss)
    columns = []
    for item in wanted:
        if isinstance(item, Symmetry):
            columns.append(Column(item.name, item.name, "as named", item))
            continue
        title, chosen, reason = TRANSFORMS[item], [], ""
        if item == "relu_rescaling":
            chosen = [s for s in found if " rescaling " in s.name and not s.name.startswith("softmax")]
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
            chosen = list(symmetries.find_layer_rescalings(model, size))
            size_text = f"c = {fmt(size)}"
            reason = "no two layers joined by a positively homogeneous activation"
        elif item == "normalisation_rescaling":
            search = symmetries.find_normalisation_rescalings(model, size)
            chosen = list(search)
            size_text = f"c = {fmt(size)}"
            reason = "; ".join(search.skipped) or "no normalisation layer reads a Linear or Conv layer"
        else:  # reference_class
            size_text = f"r = {reference}"
            layer = symmetries.classifier_layer(model) if cross_entropy else None
            if layer is not None:
                chosen = [symmetries.reference_class_shift(layer[0], reference, bias=layer[1])]
            reason = "no softmax classifier (a final Linear layer under nn.CrossEntropyLoss)"
        if chosen:
            parts = f" ({len(chosen)} layer pairs)" if len(chosen) > 1 else ""
            columns.append(Column(item, title, size_text, symmetries.compose(chosen, title + parts)))
        else:
            columns.append(Column(item, title, size_text, None, reason=reason))
    return columns


def _cell(measure: Measure, column: Column, before: float | None, after: float | None, reason: str,
          dtype: torch.dtype) -> Cell:
    if not column.applies:
        return Cell(measure.key, column.key, "not applicable", reason=column.reason)
    if before is None:
        return Cell(measure.key, column.key, "not applicable", reason=reason)
    tolerance = measure.tolerance_for(dtype)
    change = abs(after - before) / (abs(before) if before != 0 else 1.0)
    status = "invariant" if change <= tolerance else "moves"
    return Cell(measure.key, column.key, status, before, after, tolerance, floor=symmetries.rounding_floor(dtype))


def atlas(model: nn.Module, loss: nn.Module, data, probe: torch.Tensor, *, measures=None, transforms=None,
          size: float = 2.0, seed: int = 0, reference: int = 0, rtol: float | None = None,
          description: str = "") -> Atlas:
    """The symmetry audit atlas of ``model``: every measure under every function-preserving transformation.

    For each transformation (column) the outputs on ``probe`` are audited first
    (:func:`lossgeom.symmetries.audit`, relative tolerance ``rtol``); then every measure
    (row) is recomputed at the transformed parameters and compared with its value at the
    model's own parameters. A measure is called invariant when its relative change is
    within its numerical tolerance (:attr:`Measure.tolerance`); otherwise the cell
    records the factor ``after / before`` at the stated transformation size. Cells whose
    measure or transformation does not apply to the model say so.

    Example (a small classifier, three measures)::

        >>> import torch
        >>> from torch import nn
        >>> from lossgeom.atlas import atlas
        >>> _ = torch.manual_seed(0)
        >>> model = nn.Sequential(nn.Linear(4, 6, dtype=torch.float64), nn.ReLU(),
        ...                       nn.Linear(6, 3, dtype=torch.float64))
        >>> x, y = torch.randn(40, 4, dtype=torch.float64), torch.randint(0, 3, (40,))
        >>> table = atlas(model, nn.CrossEntropyLoss(), (x, y), x[:10],
        ...               measures=["sam", "fisher_rao", "b_raw", "b_quot"])
        >>> for key in ("sam", "fisher_rao", "b_raw", "b_quot"):
        ...     print(key, [table.cell(key, t).status for t in ("layer_rescaling", "softmax_shift")])
        sam ['moves', 'invariant']
        fisher_rao ['invariant', 'invariant']
        b_raw ['moves', 'moves']
        b_quot ['moves', 'invariant']
        >>> table.cell("b_raw", "normalisation_rescaling").reason
        'no normalisation layer reads a Linear or Conv layer'
        >>> print(table.columns[1].receipt_text())
        Δ/scale < 1e-13, tol 1e-10

    Args:
        model: the model (``model(x)`` returns one tensor: logits for a classifier); its
            parameters are copied, never changed.
        loss: ``nn.CrossEntropyLoss()`` or ``nn.MSELoss()`` (mean reduction).
        data: ``(x, y)`` or an iterable of ``(x, y)`` batches: where the measures are taken.
        probe: inputs on which every transformation's outputs are audited (first
            dimension indexes examples; each input of the shape ``model`` takes).
        measures: names from :data:`MEASURES` or :class:`Measure` objects (default: all).
        transforms: names from :data:`TRANSFORMS` or :class:`~lossgeom.symmetries.Symmetry`
            objects acting on the dict of ``model.named_parameters()`` (default: all kinds;
            several instances of a kind, one per layer pair, are applied together).
        size: the transformation size ``r > 1``: per-neuron rescalings log-uniform in
            ``[1/r, r]``, layer and normalisation rescalings by ``c = r``, the common-row shift
            of norm ``r`` times the classifier's root-mean-square row norm.
        seed: seed of the draws (rescaling factors, permutations, shift direction).
        reference: the class ``r`` whose row the reference-class representative zeroes.
        rtol: the audit's relative output tolerance (default 1e-10 in float64, 1e-4 in float32).
        description: what ``data`` is, for the contract.

    Returns:
        An :class:`Atlas`, with a :class:`PointRecord` of the model's parameters
        (``point``) and of each transformed point (``column_points``): the loss and the
        gradient norm there and, where the Fisher-Riemannian row is measured, the Fisher's
        rank at :data:`FISHER_RANK_THRESHOLD` and the row's value at each of :data:`FISHER_CUTS`.

    Raises:
        ValueError: on an unknown measure or transformation name, a probe the model cannot
            take, a transformation that fails the audit (naming it and the discrepancy),
            or bad data or loss; TypeError on inputs of the wrong kind.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    size = positive("size", size)
    if size <= 1:
        raise ValueError(f"size must be > 1 (rescalings lie in [1/size, size]), got {size}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    chosen = _measures(measures)
    if not isinstance(probe, torch.Tensor):
        raise TypeError(f"probe must be a torch.Tensor of inputs, got {type(probe).__name__}")
    if probe.ndim == 0 or probe.shape[0] == 0:
        raise ValueError(f"probe must hold at least one input along its first dimension, got shape "
                         f"{tuple(probe.shape)}")
    base_point = flatness.LossPoint(model, loss, data)
    dtype = base_point.dtype
    if isinstance(reference, bool) or not isinstance(reference, int):
        raise TypeError(f"reference must be an int class index, got {type(reference).__name__}")
    if base_point.kind == "cross_entropy":
        n_classes = base_point.outputs(base_point.params).shape[-1]
        if not 0 <= reference < n_classes:
            raise ValueError(f"reference must be a class index in 0..{n_classes - 1}, got {reference}")
    work = copy.deepcopy(model)
    columns = _columns(work, loss, transforms, size, seed, reference)
    active = [c for c in columns if c.applies]
    if not active:
        raise ValueError("no transformation of the atlas applies to this model: "
                         + "; ".join(f"{c.title}: {c.reason}" for c in columns))
    table = symmetries.audit(work, None, probe, loss=loss, symmetries=[c.symmetry for c in active], rtol=rtol)
    receipts = {c.key: report for c, report in zip(active, table.reports)}
    columns = [Column(c.key, c.title, c.size, c.symmetry, receipts.get(c.key), c.reason) for c in columns]
    base, reasons = [], []
    for measure in chosen:
        try:
            base.append(measure(base_point))
            reasons.append("")
        except flatness.NotApplicable as err:
            base.append(None)
            reasons.append(str(err))
    riemannian = any(m.key == "fisher_riemannian" and value is not None for m, value in zip(chosen, base))
    record = _point_record(base_point, riemannian)
    after: dict[str, list[float | None]] = {}
    records: list[PointRecord | None] = []
    for column in columns:
        if not column.applies:
            records.append(None)
            continue
        point = flatness.LossPoint(model, loss, (base_point.x, base_point.y), params=column.symmetry(base_point.params))
        after[column.key] = [measure(point) if value is not None else None for measure, value in zip(chosen, base)]
        records.append(_point_record(point, riemannian))
    cells = tuple(tuple(_cell(measure, column, base[i], after[column.key][i] if column.applies else None,
                              reasons[i], dtype) for column in columns) for i, measure in enumerate(chosen))
    return Atlas(type(model).__name__, str(dtype).removeprefix("torch."), base_point.n_parameters,
                 int(base_point.x.shape[0]), type(loss).__name__ + "()", int(probe.shape[0]), size, seed,
                 tuple(chosen), tuple(columns), cells, tuple(base), tuple(reasons), description,
                 "train" if model.training else "eval", record, tuple(records))

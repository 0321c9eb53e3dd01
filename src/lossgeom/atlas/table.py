"""The symmetry audit atlas: which flatness measures survive which function-preserving transformations.

One call, :func:`atlas` ``(model, loss, data, *, probe, ...)``, asks of a model which of its
flatness measures are functions of the predictor and which depend on the coordinates: given
a ``torch.nn.Module``, a loss module, data and a probe set, it

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
also records the point itself (:class:`~lossgeom.atlas.records.PointRecord`): the loss and gradient norm at the
model's parameters and at each transformed point, and, where the Fisher-Riemannian row
is measured, the Fisher's rank at the cut that row uses (:data:`~lossgeom.atlas.measures.FISHER_RANK_THRESHOLD`),
the eigenvalues on either side of the cut, the Hessian's part on the Fisher's kernel and
the row's value at other cuts (:data:`~lossgeom.atlas.measures.FISHER_CUTS`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from lossgeom import flatness, symmetries
from lossgeom._validation import positive
from lossgeom.atlas.columns import Cell, Column, _cell, _columns, _log_factor
from lossgeom.atlas.measures import FISHER_RANK_THRESHOLD, LAYER_MEASURES, MEASURES, Measure
from lossgeom.atlas.records import ROUNDING_FLOOR, PointRecord, _below_decade, _point_record
from lossgeom.contract import MeasurementContract
from lossgeom.formatting import fmt
from lossgeom.progress import progress_bar, show_progress
from lossgeom.symmetries.core import Symmetry
from lossgeom.types import Data, Group, Params


@dataclass(frozen=True)
class Atlas:
    """The result of :func:`atlas`: measures (rows) by transformations (columns), with receipts.

    ``cells[i][j]`` is the :class:`~lossgeom.atlas.columns.Cell` of ``measures[i]`` under ``columns[j]``; each
    column carries its audit receipt. ``base[i]`` is measure ``i`` at the model's own
    parameters (None where it does not apply, with the reason in ``base_reasons[i]``).
    ``point`` records the model's own parameters (loss, gradient norm, the Fisher as the
    Fisher-Riemannian row sees it) and ``column_points[j]`` the image under ``columns[j]``
    (None where the column does not apply). ``n_examples`` counts the examples that carry a
    term of the loss (those whose every target is the loss's ``ignore_index`` are not
    measured; see :class:`~lossgeom.flatness.LossPoint`).
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
        """The :class:`~lossgeom.atlas.measures.Measure` of the row ``key`` (``"lambda_max"``).

        Args:
            key: the row's measure key.

        Returns:
            The row's :class:`~lossgeom.atlas.measures.Measure`.

        Raises:
            KeyError: if the atlas has no row ``key``.
        """
        return self.measures[self._row_index(key)]

    def value(self, measure: str) -> float | None:
        """``measure`` at the model's own parameters (None where it does not apply to the model).

        Args:
            measure: the row's measure key (``"lambda_max"``).

        Returns:
            ``base`` of the row: the measure's value, or None where it does not apply.

        Raises:
            KeyError: if the atlas has no row ``measure``.
        """
        return self.base[self._row_index(measure)]

    def cell(self, measure: str, transform: str) -> Cell:
        """The cell of ``measure`` (a key such as ``"lambda_max"``) under ``transform`` (``"permutation"``).

        Args:
            measure: the row's measure key.
            transform: the column's transformation key.

        Returns:
            The :class:`~lossgeom.atlas.columns.Cell` at that row and column.

        Raises:
            KeyError: if the atlas has no such row or column.
        """
        return self.cells[self._row_index(measure)][self._column_index(transform)]

    def row(self, measure: str) -> tuple[Cell, ...]:
        """The cells of ``measure`` under every column, in column order.

        Args:
            measure: the row's measure key (``"lambda_max"``).

        Returns:
            The row's :class:`~lossgeom.atlas.columns.Cell` objects, one per column.

        Raises:
            KeyError: if the atlas has no row ``measure``.
        """
        return self.cells[self._row_index(measure)]

    def column(self, transform: str) -> Column:
        """The :class:`~lossgeom.atlas.columns.Column` ``transform`` (``"permutation"``).

        It holds the column's symmetry, size and receipt.

        Args:
            transform: the column's transformation key.

        Returns:
            The :class:`~lossgeom.atlas.columns.Column` ``transform``.

        Raises:
            KeyError: if the atlas has no column ``transform``.
        """
        return self.columns[self._column_index(transform)]

    def column_cells(self, transform: str, applicable: bool = True) -> tuple[Cell, ...]:
        """The cells of every measure under ``transform`` (only the applicable ones by default).

        Args:
            transform: the column's transformation key.
            applicable: whether to leave out the cells whose status is ``"not applicable"``.

        Returns:
            The column's :class:`~lossgeom.atlas.columns.Cell` objects, in row order.

        Raises:
            KeyError: if the atlas has no column ``transform``.
        """
        j = self._column_index(transform)
        return tuple(row[j] for row in self.cells if not applicable or row[j].status != "not applicable")

    def column_point(self, transform: str) -> PointRecord | None:
        """The :class:`~lossgeom.atlas.records.PointRecord` of the image under ``transform``.

        None where the transformation does not apply.

        Args:
            transform: the column's transformation key.

        Returns:
            ``column_points`` of the column, or None (also when no column points were recorded).

        Raises:
            KeyError: if the atlas has no column ``transform`` (and column points were recorded).
        """
        return self.column_points[self._column_index(transform)] if self.column_points else None

    def point_text(self) -> str:
        """Where the table was measured, in a sentence or two (loss, gradient norm, the Fisher's cut).

        Returns:
            The sentences, with the loss change and gradient norms at the transformed points and
            the Fisher-Riemannian row's Fisher record where recorded; ``""`` when ``point`` is None.
        """
        if self.point is None:
            return ""
        moved = [(c, r) for c, r in zip(self.columns, self.column_points) if r is not None]
        text = f"Point measured (the model's parameters, mean over the {self.n_examples} examples): {self.point.text()}"
        if moved:
            norms = [r.gradient_norm for _, r in moved]
            losses = max(abs(r.loss - self.point.loss) for _, r in moved) / abs(self.point.loss)
            shown = f"< {fmt(ROUNDING_FLOOR)}" if losses < ROUNDING_FLOOR else _below_decade(losses)
            text += (
                f"; at the transformed points the loss changes by {shown} of itself and the gradient norm "
                f"lies in [{fmt(min(norms), 3)}, {fmt(max(norms), 3)}]"
            )
        fisher = self.point.fisher
        if fisher is not None:
            text += (
                f". Fisher-Riemannian row: the Fisher has rank {fisher.rank} of {fisher.n_parameters} at the "
                f"cut {fmt(fisher.threshold)} x its largest eigenvalue (smallest kept {fmt(fisher.kept, 2)}, "
                f"largest dropped {fisher.dropped_text()}: a drop by a factor of {fisher.gap_text()} across "
                f"the cut); the Hessian's part on its kernel is {fmt(fisher.kernel_leakage, 2)} of its norm"
            )
        return text + "."

    def log_factors(self) -> np.ndarray:
        """``log10 |after / before|`` per cell (0 where invariant, NaN where not applicable).

        Returns:
            An array of shape ``(len(measures), len(columns))``.
        """
        return np.array([[_log_factor(cell) for cell in row] for row in self.cells])

    def summary(self, measure: str, sig: int = 3) -> str:
        """One sentence: under which columns ``measure`` is invariant and by what factors it moves.

        Args:
            measure: the row's measure key (``"lambda_max"``).
            sig: significant digits of the factors.

        Returns:
            ``"invariant under ...; moves under ... (×factor)"``, or why the measure does not apply.

        Raises:
            KeyError: if the atlas has no row ``measure``.
        """
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

    def __str__(self) -> str:
        header = ["measure"] + [c.key for c in self.columns]
        body = [[m.key] + [cell.text() for cell in row] for m, row in zip(self.measures, self.cells)]
        body.append(["audit"] + [c.receipt_text() if c.applies else "n/a" for c in self.columns])
        widths = [max(len(line[i]) for line in [header] + body) for i in range(len(header))]
        lines = [
            f"symmetry audit atlas of {self.model} ({self.dtype}, {self.n_parameters} parameters, "
            f"{self.n_examples} examples, {self.loss}); audit on {self.probe_size} probe inputs"
        ]
        lines += ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in [header] + body]
        lines += [f"{c.key}: {c.reason}" for c in self.columns if not c.applies]
        if self.point is not None:
            lines.append(self.point_text())
        return "\n".join(lines)

    def contract(self) -> MeasurementContract:
        """The measurement contract of the table and its heat map (for a figure caption).

        Returns:
            A :class:`~lossgeom.contract.MeasurementContract` stating the centre, the measures' radii
            and normalisations, the loss, data, model mode, resolution and precision.
        """
        options = {m.key: dict(m.options) for m in self.measures}
        radii = []
        if "sam" in options:
            radii.append(f"SAM rho = {fmt(options['sam'].get('rho', 0.05))}")
        if "asam" in options:
            radii.append(
                f"ASAM rho = {fmt(options['asam'].get('rho', 0.5))}, eta = {fmt(options['asam'].get('eta', 0.01))}"
            )
        if "keskar" in options:
            radii.append(
                f"Keskar eps = {fmt(options['keskar'].get('epsilon', 1e-3))} "
                f"({options['keskar'].get('max_iter', 20)} L-BFGS-B iterations)"
            )
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


def _measures(measures: str | Measure | Sequence[str | Measure] | None) -> list[Measure]:
    if measures is None:
        return list(MEASURES.values())
    if isinstance(measures, (str, Measure)):
        measures = [measures]
    chosen = []
    for item in measures:
        if isinstance(item, Measure):
            chosen.append(item)
        elif isinstance(item, str):
            known = {**MEASURES, **LAYER_MEASURES}
            if item not in known:
                raise ValueError(f"unknown measure {item!r}; the atlas knows {list(known)} (or pass a Measure)")
            chosen.append(known[item])
        else:
            raise TypeError(f"measures must hold measure names or Measure objects, got {type(item).__name__}")
    keys = [m.key for m in chosen]
    if not chosen or len(set(keys)) != len(keys):
        raise ValueError(f"measures must be a non-empty list without repeats, got {keys}")
    return chosen


def atlas(
    model: nn.Module,
    loss: nn.Module,
    data: Data,
    *,
    params: Params | None = None,
    group: Group = None,
    probe: torch.Tensor,
    measures: Sequence[str | Measure] | None = None,
    transforms: Sequence[str | Symmetry] | None = None,
    size: float = 2.0,
    seed: int = 0,
    reference: int = 0,
    rtol: float | None = None,
    description: str = "",
    output: Callable[[object], torch.Tensor] | None = None,
    progress: bool | None = None,
) -> Atlas:
    """The symmetry audit atlas of ``model``: every measure under every function-preserving transformation.

    For each transformation (column) the outputs on ``probe`` are audited first
    (:func:`lossgeom.symmetries.audit`, relative tolerance ``rtol``); then every measure
    (row) is recomputed at the transformed parameters and compared with its value at the
    model's own parameters. A measure is called invariant when its relative change is
    within its numerical tolerance (:attr:`~lossgeom.atlas.measures.Measure.tolerance`); otherwise the cell
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
        >>> table = atlas(model, nn.CrossEntropyLoss(), (x, y), probe=x[:10],
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
        model: the model (``model(x)`` returns the outputs, logits for a classifier, or a
            tuple, dict or ``ModelOutput`` holding them: see ``output``); its parameters
            are copied, never changed.
        loss: the loss module, mean reduction (as :class:`~lossgeom.flatness.LossPoint`: called
            for every value and derivative; a measure that needs a likelihood it does not
            have, e.g. under class weights, is "not applicable" with the reason).
        data: ``(x, y)`` or an iterable of ``(x, y)`` batches: where the measures are taken
            (examples with no term of the loss, every target ``ignore_index``, are dropped).
        params: the point (``None``: the model's own trainable parameters); the model is
            copied with them, never changed.
        group: must be ``None``: the atlas forms dense curvature from every example on one
            process.
        probe: inputs on which every transformation's outputs are audited (first
            dimension indexes examples; each input of the shape ``model`` takes).
        measures: names from :data:`~lossgeom.atlas.measures.MEASURES` or
            :data:`~lossgeom.atlas.measures.LAYER_MEASURES`, or
            :class:`~lossgeom.atlas.measures.Measure` objects (default: all of ``MEASURES``).
        transforms: names from :data:`~lossgeom.atlas.columns.TRANSFORMS` or
            :class:`~lossgeom.symmetries.Symmetry`
            objects acting on the dict of ``model.named_parameters()`` (default: all kinds;
            several instances of a kind, one per layer pair, are applied together).
        size: the transformation size ``r > 1``: per-neuron rescalings log-uniform in
            ``[1/r, r]``, layer and normalisation rescalings by ``c = r``, the common-row shift
            of norm ``r`` times the classifier's root-mean-square row norm.
        seed: seed of the draws (rescaling factors, permutations, shift direction).
        reference: the class ``r`` whose row the reference-class representative zeroes.
        rtol: the audit's relative output tolerance (default 1e-10 in float64, 1e-4 in float32).
        description: what ``data`` is, for the contract.
        output: a callable selecting the tensor of outputs from what ``model`` returns
            (``None``: the output itself, or its tensor ``logits``), as in
            :class:`~lossgeom.flatness.LossPoint`; the outputs audited and measured.
        progress: a bar of the cells (measure evaluations, the model's own parameters'
            included) on stderr: ``None`` in interactive use only, ``True`` always,
            ``False`` never (see ``lossgeom.progress``).

    Returns:
        An :class:`Atlas`, with a :class:`~lossgeom.atlas.records.PointRecord` of the model's
        parameters (``point``) and of each transformed point (``column_points``): the loss
        and the gradient norm there and, where the Fisher-Riemannian row is measured, the
        Fisher's rank at :data:`~lossgeom.atlas.measures.FISHER_RANK_THRESHOLD` and the row's
        value at each of :data:`~lossgeom.atlas.measures.FISHER_CUTS`.

    Raises:
        ValueError: on an unknown measure or transformation name, a probe the model cannot
            take, a transformation that fails the audit (naming it and the discrepancy),
            or bad data or loss; TypeError on inputs of the wrong kind (``progress`` not a
            bool or None included).
    """
    size = _checked_size(model, size, seed)
    show_progress(progress)  # refuses a bad value before any work
    if group is not None:
        raise ValueError(
            "group: the atlas forms dense curvature from every example on one process and takes no "
            "process group; gather the data on one rank and pass group=None"
        )
    chosen = _measures(measures)
    _check_probe(probe)
    base_point = flatness.LossPoint(model, loss, data, params=params, output=output)
    # the model at the point, returning the selected outputs (a view of the caller's if params is None)
    model = base_point.model_at_point() if params is not None else base_point.model
    if params is not None:
        base_point = flatness.LossPoint(model, loss, data)
    dtype = base_point.dtype
    _check_reference(reference, base_point)
    work = copy.deepcopy(model)
    columns = _columns(work, loss, transforms, size, seed, reference)
    active = [c for c in columns if c.applies]
    if not active:
        raise ValueError(
            "no transformation of the atlas applies to this model: "
            + "; ".join(f"{c.title}: {c.reason}" for c in columns)
        )
    table = symmetries.audit(
        work, None, probe, loss=loss, symmetries=[c.symmetry for c in active], rtol=rtol, progress=False
    )
    receipts = {c.key: report for c, report in zip(active, table.reports)}
    columns = [Column(c.key, c.title, c.size, c.symmetry, receipts.get(c.key), c.reason) for c in columns]
    with progress_bar(progress, total=len(chosen) * (1 + len(active)), desc="atlas", unit="cell") as bar:
        base, reasons = _base_values(chosen, base_point, bar.update)
        riemannian = any(m.key == "fisher_riemannian" and value is not None for m, value in zip(chosen, base))
        record = _point_record(base_point, riemannian)
        after: dict[str, list[float | None]] = {}
        records: list[PointRecord | None] = []
        for column in columns:
            if not column.applies:
                records.append(None)
                continue
            point = _column_point(column.symmetry, model, loss, base_point)
            after[column.key] = []
            for measure, value in zip(chosen, base):
                after[column.key].append(measure(point) if value is not None else None)
                bar.update(1)
            records.append(_point_record(point, riemannian))
    cells = tuple(
        tuple(
            _cell(measure, column, base[i], after[column.key][i] if column.applies else None, reasons[i], dtype)
            for column in columns
        )
        for i, measure in enumerate(chosen)
    )
    return Atlas(
        type(model).__name__,
        str(dtype).removeprefix("torch."),
        base_point.n_parameters,
        base_point.n_examples,
        type(loss).__name__ + "()",
        int(probe.shape[0]),
        size,
        seed,
        tuple(chosen),
        tuple(columns),
        cells,
        tuple(base),
        tuple(reasons),
        description,
        "train" if model.training else "eval",
        record,
        tuple(records),
    )


def _checked_size(model: nn.Module, size: float, seed: int) -> float:
    """The transformation size (> 1), after checking the model and the seed."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    size = positive("size", size)
    if size <= 1:
        raise ValueError(f"size must be > 1 (rescalings lie in [1/size, size]), got {size}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    return size


def _check_probe(probe: torch.Tensor) -> None:
    if not isinstance(probe, torch.Tensor):
        raise TypeError(f"probe must be a torch.Tensor of inputs, got {type(probe).__name__}")
    if probe.ndim == 0 or probe.shape[0] == 0:
        raise ValueError(
            f"probe must hold at least one input along its first dimension, got shape {tuple(probe.shape)}"
        )


def _column_point(
    symmetry: Symmetry, model: nn.Module, loss: nn.Module, base_point: flatness.LossPoint
) -> flatness.LossPoint:
    """The loss point at the image of the model under ``symmetry``.

    At the transformed parameters, or on the transformed copy of the model when the
    symmetry moves buffers too (a batch norm's running statistics).
    """
    data = (base_point.x, base_point.y)
    if symmetry.buffers:
        return flatness.LossPoint(symmetry.applied(model), loss, data)
    return flatness.LossPoint(model, loss, data, params=symmetry(base_point.params))


def _check_reference(reference: int, base_point: flatness.LossPoint) -> None:
    if isinstance(reference, bool) or not isinstance(reference, int):
        raise TypeError(f"reference must be an int class index, got {type(reference).__name__}")
    if isinstance(base_point.loss, nn.CrossEntropyLoss):
        with torch.no_grad():
            n_classes = base_point.outputs(base_point.params).shape[-1]
        if not 0 <= reference < n_classes:
            raise ValueError(f"reference must be a class index in 0..{n_classes - 1}, got {reference}")


def _base_values(
    chosen: list[Measure], base_point: flatness.LossPoint, done: Callable[[int], object]
) -> tuple[list[float | None], list[str]]:
    """Each measure at the model's own parameters (None where it does not apply) and why not; ``done(1)`` after each."""
    base, reasons = [], []
    for measure in chosen:
        try:
            base.append(measure(base_point))
            reasons.append("")
        except flatness.loss_point.NotApplicable as err:
            base.append(None)
            reasons.append(str(err))
        done(1)
    return base, reasons

"""The book's atlas pages (``appendices/atlas*``): an atlas as MyST tables, heat maps and size sweeps.

:func:`atlas_table_markdown` renders a :class:`lossgeom.atlas.Atlas` as a narrow MyST table
(short measure titles that link to the book's definitions, short cells, the rows and columns
that do not apply left out and listed under it); :func:`atlas_markdown` is the full-width
table with every row and column. :func:`fisher_cuts_markdown` gives the Fisher-Riemannian
row at each cut, and :func:`atlas_heatmap` draws the table as a heat map of
``log10 |after / before|``. :func:`diagonal_fisher_rounding` says when the diagonal-Fisher
row reads rounding (its metric divides by a Fisher-diagonal entry at rounding level); the
renderings then mark that row's cells ``rounding`` instead of a verdict.
:func:`size_sweep_markdown` and :func:`size_sweep_figure` show how the factors of a few
measures grow with the transformation size ``r`` (one atlas per size), and
:func:`size_sweep_interactive` draws the same sweep as a plotly figure for the static HTML.
:func:`verdicts` and :func:`listed` read tables for the pages' prose, and
:func:`layernorm_mlp` and :func:`train_full_batch` build the network two pages train.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import plotly.graph_objects as go
import torch
from matplotlib import pyplot as plt
from plotly.subplots import make_subplots
from torch import nn

from lossgeom import training
from lossgeom.atlas import Atlas, Column, Measure
from lossgeom.atlas.columns import Cell
from lossgeom.contract import MeasurementContract
from lossgeom.formatting import fmt
from lossgeom.symmetries.core import ROUNDING_FLOOR
from lossgeom_book.interactive import rounded

#: What a cell of a row that reads rounding shows, in the table and in the heat map.
ROUNDING_TEXT = "rounding"

#: Short row titles of the narrow tables; each links to the measure's definition, which gives the full title.
SHORT_MEASURE_TITLES: dict[str, str] = {
    "lambda_max": "λ_max(H)",
    "trace": "tr H",
    "keskar": "Keskar",
    "sam": "SAM",
    "asam": "ASAM",
    "fisher_rao": "Fisher-Rao",
    "relative_flatness": "rel. flatness",
    "kappa_exact": "κ_exact",
    "b_raw": "B_raw",
    "b_quot": "B_quot",
    "flat_q": "Flat^Q",
    "fisher_riemannian": "Fisher-Riem.",
    "diagonal_fisher": "diag. Fisher",
    "wolkowicz_styan": "Wolk.-Styan",
    "diagonal_fisher_cut": "diag. Fisher (cut)",
}

#: The legend of a narrow table's cells (:func:`atlas_table_markdown`).
CELL_LEGEND = (
    "Cells: inv. <1e-k, invariant (relative change below 1e-k); ×f, moved by the factor f = after / before; "
    "tol, the row's tolerance on the relative change; audit Δ/scale, the largest change of the outputs on "
    "the probe over their scale, against the audit's tolerance."
)


def diagonal_fisher_rounding(fisher_diagonal, floor: float = ROUNDING_FLOOR) -> dict[str, str]:
    """``{"diagonal_fisher": why}`` when the diagonal-Fisher row reads rounding, else ``{}``.

    The row (``flatness.riemannian_sharpness(..., fisher="diagonal")``) keeps every
    parameter whose Fisher diagonal ``D_i`` is positive and divides its Hessian by
    ``sqrt(D_i D_j)``. ``D_i`` is the mean squared per-example gradient of parameter ``i``;
    where its root, relative to the largest, ``sqrt(D_i / max D)``, is below ``floor``
    (float64 rounding of a gradient), the entry is rounding, and so is the row's value.

    Args:
        fisher_diagonal: the Fisher's diagonal, ``(n,)``, nonnegative, not all zero.
        floor: the rounding floor on the gradient scale, in ``(0, 1)``.

    Returns:
        ``{"diagonal_fisher": reason}``, the reason naming how many entries are rounding, or
        ``{}`` when none is.

    Raises:
        ValueError: if the diagonal has a negative or non-finite entry, is all zero, or
            ``floor`` is not in ``(0, 1)``.
    """
    diagonal = np.asarray(fisher_diagonal, dtype=np.float64).ravel()
    if not 0 < floor < 1:
        raise ValueError(f"floor must lie in (0, 1), got {floor}")
    if not np.isfinite(diagonal).all() or (diagonal < 0).any() or not (diagonal > 0).any():
        raise ValueError("fisher_diagonal must be finite and nonnegative with a positive entry")
    relative = diagonal / diagonal.max()
    rounding = int(((relative > 0) & (np.sqrt(relative) < floor)).sum())
    if not rounding:
        return {}
    entries = "entry" if rounding == 1 else "entries"
    return {
        "diagonal_fisher": f"its metric divides by {rounding} Fisher-diagonal {entries} at rounding level, "
        f"the root of each below {fmt(floor)} of the largest's"
    }


def _checked_rounding(table: Atlas, rounding: Mapping[str, str] | None) -> dict[str, str]:
    rounding = dict(rounding or {})
    for key in rounding:
        table.row(key)  # a KeyError names an unknown measure
    return rounding


def _cell_text(cell: Cell, rounding: Mapping[str, str], sig: int) -> str:
    if cell.measure in rounding and cell.status != "not applicable":
        return ROUNDING_TEXT
    return cell.text(sig)


def short_title(measure: Measure) -> str:
    """The measure's row title in a narrow table (:data:`SHORT_MEASURE_TITLES`, else its title)."""
    return SHORT_MEASURE_TITLES.get(measure.key, measure.title)


def compact_cell_text(cell: Cell, sig: int = 3) -> str:
    """A cell in a few characters: ``inv. <1e-13``, ``×0.917`` or ``n/a`` (see :meth:`Cell.text`)."""
    if cell.status == "invariant":
        return "inv. " + cell.change_text().replace(" ", "")
    return cell.text(sig)


def _linked(title: str, key: str, link_prefix: str | None) -> str:
    return f"{{ref}}`{title} <{link_prefix}-{key.replace('_', '-')}>`" if link_prefix else title


def _absent(table: Atlas) -> dict[str, list[str]]:
    """The columns and measures that do not apply, grouped by the reason."""
    absent: dict[str, list[str]] = {}
    for c in table.columns:
        if not c.applies:
            absent.setdefault(c.reason, []).append(c.short)
    for measure, base, reason in zip(table.measures, table.base, table.base_reasons):
        if base is None:
            absent.setdefault(reason, []).append(measure.title)
    return absent


def _footer(table: Atlas, rounding: Mapping[str, str]) -> list[str]:
    """The lines under a table: what does not apply, the rows that read rounding, the point measured."""
    groups = {
        "Not applicable here": [f"{', '.join(names)} ({reason})" for reason, names in _absent(table).items()],
        "Read as rounding here": [f"{table.measure(key).title} ({reason})" for key, reason in rounding.items()],
    }
    lines = []
    for label, items in groups.items():
        if items:
            lines += ["", f"{label}: " + "; ".join(items) + "."]
    if table.point is not None:
        lines += ["", table.point_text()]
    return lines


def _discrepancy(column: Column) -> str:
    """The audit's discrepancy of ``column``, compact: ``<1e-13`` (below the floor) or its decade."""
    change, floor = column.receipt.relative_discrepancy, column.receipt.rounding_floor
    if change < floor:
        return f"<{fmt(floor)}"
    return "0" if change == 0 else f"<1e{math.floor(math.log10(change)) + 1}"


def atlas_table_markdown(
    table: Atlas, link_prefix: str | None = None, sig: int = 3, rounding: Mapping[str, str] | None = None
) -> str:
    """An :class:`~lossgeom.atlas.Atlas` as a narrow MyST table: a row per measure, a column per transformation.

    Narrower than :func:`atlas_markdown`: the measure's short title (:data:`SHORT_MEASURE_TITLES`)
    and its tolerance in a column of its own, cells as :func:`compact_cell_text`, and the
    rows and columns that do not apply to the model left out (the lines under the table
    list them with the reason). The last row is the audit's discrepancy per column. Under
    the table: each column's full title and size, the legend of the cells
    (:data:`CELL_LEGEND`), what does not apply, the rows that read rounding and the point
    measured.

    With ``link_prefix="atlas"`` each measure's title links to the label
    ``(atlas-<key>)=`` (underscores become hyphens), where the book defines it.
    ``rounding`` maps a measure key to why that row reads rounding at this model (e.g. from
    :func:`diagonal_fisher_rounding`): its cells read ``rounding`` instead of a verdict.
    """
    rounding = _checked_rounding(table, rounding)
    kept = [j for j, column in enumerate(table.columns) if column.applies]
    columns = [table.columns[j] for j in kept]
    header = ["measure", "tol"] + [c.short for c in columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for measure, row, base in zip(table.measures, table.cells, table.base):
        if base is None:
            continue
        tol = fmt(measure.tolerance_for(getattr(torch, table.dtype)), 1)
        cells = [ROUNDING_TEXT if measure.key in rounding else compact_cell_text(row[j], sig) for j in kept]
        lines.append("| " + " | ".join([_linked(short_title(measure), measure.key, link_prefix), tol] + cells) + " |")
    tolerances = {fmt(c.receipt.relative_tolerance, 2) for c in columns}
    shared = len(tolerances) == 1
    receipts = [
        _discrepancy(c)
        + ("" if shared else f", tol {fmt(c.receipt.relative_tolerance, 2)}")
        + (" (approx.)" if c.receipt.approximate else "")
        for c in columns
    ]
    lines.append("| " + " | ".join(["audit Δ/scale", tolerances.pop() if shared else "-"] + receipts) + " |")
    described = [f"{c.short} ({c.title}): {c.size}" if c.short != c.title else f"{c.short}: {c.size}" for c in columns]
    lines += ["", f"Columns (seed {table.seed}): {'; '.join(described)}. {CELL_LEGEND}"]
    approximate = [f"{c.short}: {c.receipt.approximate}" for c in columns if c.receipt.approximate]
    if approximate:
        lines += ["", "Approximate symmetries: " + "; ".join(approximate) + "."]
    return "\n".join(lines + _footer(table, rounding))


def atlas_markdown(
    table: Atlas, link_prefix: str | None = None, sig: int = 3, rounding: Mapping[str, str] | None = None
) -> str:
    """An :class:`~lossgeom.atlas.Atlas` as MyST markdown: a row per measure, a column per transformation.

    The audit receipts come last.

    With ``link_prefix="atlas"`` each measure's title links to the label
    ``(atlas-<key>)=`` (underscores become hyphens), where the book defines it.
    ``rounding`` maps a measure key to why that row reads rounding at this model (e.g. from
    :func:`diagonal_fisher_rounding`): its applicable cells read ``rounding`` instead of a
    verdict, and a line under the table gives the reason.
    """
    rounding = _checked_rounding(table, rounding)
    header = ["measure (tolerance)"] + [c.short for c in table.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for measure, row in zip(table.measures, table.cells):
        title = measure.title
        if link_prefix:
            title = f"{{ref}}`{title} <{link_prefix}-{measure.key.replace('_', '-')}>`"
        tol = fmt(measure.tolerance_for(getattr(torch, table.dtype)), 1)
        cells = [_cell_text(cell, rounding, sig) for cell in row]
        lines.append("| " + " | ".join([f"{title} ({tol})"] + cells) + " |")
    lines.append(
        "| "
        + " | ".join(
            ["audit receipt (outputs on the probe)"] + [c.receipt_text() if c.applies else "n/a" for c in table.columns]
        )
        + " |"
    )
    sizes = "; ".join(f"{c.short}: {c.size}" for c in table.columns if c.applies)
    lines += ["", f"Transformation sizes (seed {table.seed}): {sizes}."]
    return "\n".join(lines + _footer(table, rounding))


def fisher_cuts_markdown(table: Atlas, sig: int = 4, by_column: bool = False) -> str:
    """The Fisher-Riemannian row at each cut of :data:`~lossgeom.atlas.measures.FISHER_CUTS`, as a MyST table.

    One row per cut: the Fisher's rank and the value at the model's parameters, then the
    factor ``after / before`` under each applicable column with the rank there. With
    ``by_column=True`` the table is transposed, and narrow: one column per cut, a first row
    with the value and rank at the model, then one row per applicable column.
    """
    if table.point is None or table.point.fisher is None:
        raise ValueError("this atlas has no Fisher record: the Fisher-Riemannian row was not measured")
    moved = [(c, r) for c, r in zip(table.columns, table.column_points) if r is not None and r.fisher is not None]
    if by_column:
        cuts = table.point.fisher.cuts
        marks = [fmt(cut) + (" (the row's)" if cut == table.point.fisher.threshold else "") for cut, _, _ in cuts]
        lines = ["| cut | " + " | ".join(marks) + " |", "|" + "---|" * (len(cuts) + 1)]
        model = [f"{fmt(value, sig)} (rank {rank})" for _, rank, value in cuts]
        lines.append("| at the model | " + " | ".join(model) + " |")
        for c, r in moved:
            factors = [
                f"×{fmt(r.fisher.value(cut) / value, sig)} (rank {r.fisher.rank_at(cut)})" for cut, _, value in cuts
            ]
            lines.append(f"| {c.short} | " + " | ".join(factors) + " |")
        return "\n".join(lines)
    header = ["cut", "rank", "value"] + [c.short for c, _ in moved]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for cut, rank, value in table.point.fisher.cuts:
        mark = " (the row's)" if cut == table.point.fisher.threshold else ""
        factors = [f"×{fmt(r.fisher.value(cut) / value, sig)} (rank {r.fisher.rank_at(cut)})" for _, r in moved]
        lines.append("| " + " | ".join([fmt(cut) + mark, str(rank), fmt(value, sig)] + factors) + " |")
    return "\n".join(lines)


def atlas_heatmap(table: Atlas, ax=None, title: str | None = None, rounding: Mapping[str, str] | None = None):
    """A heat map of ``log10 |after / before|`` per cell, annotated; grey where not applicable.

    The applicable cells of a row in ``rounding`` (as for :func:`atlas_markdown`) are grey
    too, annotated ``rounding``. Returns the matplotlib figure (caption it with
    :meth:`lossgeom.atlas.Atlas.contract`, e.g. through :func:`lossgeom_book.display.glue_figure`).
    """
    rounding = _checked_rounding(table, rounding)
    values = table.log_factors()
    for i, measure in enumerate(table.measures):
        if measure.key in rounding:
            values[i] = np.nan
    if ax is None:
        fig, ax = plt.subplots(figsize=(1.25 * len(table.columns) + 3.2, 0.36 * len(table.measures) + 1.6))
    else:
        fig = ax.figure
    finite = np.abs(values[np.isfinite(values)])
    limit = max(0.5, float(finite.max()) if finite.size else 0.5)
    masked = np.ma.masked_invalid(values)
    colours = plt.get_cmap("RdBu_r").with_extremes(bad="0.85")
    image = ax.imshow(masked, cmap=colours, vmin=-limit, vmax=limit, aspect="auto")
    for i, row in enumerate(table.cells):
        for j, cell in enumerate(row):
            text = {"invariant": "inv.", "not applicable": "n/a"}.get(cell.status)
            if cell.measure in rounding and cell.status != "not applicable":
                text = ROUNDING_TEXT
            elif text is None:
                text = cell.text(3).split(" ")[0] if cell.factor is not None else "from 0"
            dark = np.isfinite(values[i, j]) and abs(values[i, j]) > 0.6 * limit
            ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
    ax.set_xticks(range(len(table.columns)), [c.title.replace(" ", "\n", 1) for c in table.columns], fontsize=7)
    ax.set_yticks(range(len(table.measures)), [m.key for m in table.measures], fontsize=7)
    ax.grid(False)
    ax.set_title(title or f"{table.model}: log10 |change factor|", fontsize=9)
    fig.colorbar(image, ax=ax, label="log10 |after / before|", shrink=0.8)
    fig.tight_layout()
    return fig


def verdicts(table: Atlas, measures: Sequence[str], column: str) -> set[str]:
    """The set of verdicts (``"invariant"``, ``"moves"``, ``"not applicable"``) of ``measures`` under ``column``."""
    return {table.cell(key, column).status for key in measures}


def listed(items: Sequence[str]) -> str:
    """``"a, b and c"``: the items in running text."""
    items = list(items)
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def layernorm_mlp(eps: float = 1e-14, seed: int = 0) -> nn.Sequential:
    """The atlas's digits MLP: ``Linear(64, 10) - ReLU - Linear(10, 8) - LayerNorm(8, eps) - ReLU - Linear(8, 10)``.

    float64, PyTorch's default initialisation drawn after ``torch.manual_seed(seed)`` (the
    global random state is restored afterwards). With ``eps`` far below the squared scale of
    the LayerNorm's inputs the normalisation undoes a rescaling of the layer in front of it.
    """
    f64 = dict(dtype=torch.float64)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(
            nn.Linear(64, 10, **f64),
            nn.ReLU(),
            nn.Linear(10, 8, **f64),
            nn.LayerNorm(8, eps=eps, **f64),
            nn.ReLU(),
            nn.Linear(8, 10, **f64),
        )


def train_full_batch(model: nn.Module, loss: nn.Module, data, steps: int, learning_rate: float) -> nn.Module:
    """``model`` after ``steps`` full-batch Adam updates on the mean ``loss`` over ``data``, in eval mode.

    The model is trained in place (``lossgeom.training.train`` with ``training.adam``) and returned.
    """
    loss_fn = training.indexed_loss(model, loss, data)
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    run = training.train(loss_fn, params, training.adam(learning_rate), steps)
    model.load_state_dict(run.params)
    return model.eval()


def _sweep_sizes(tables: Mapping[float, Atlas]) -> list[float]:
    """The sizes of a sweep, ascending, after checking that the tables are one model's at one seed."""
    if not tables:
        raise ValueError("a size sweep needs at least one atlas")
    for size, table in tables.items():
        if table.size != size:
            raise ValueError(f"the atlas under size {size} was computed at size {table.size}")
    if len({(t.model, t.n_parameters, t.n_examples, t.seed) for t in tables.values()}) > 1:
        raise ValueError("a size sweep compares one model on one data set at one seed: the atlases differ")
    return sorted(tables)


def _sweep_columns(tables: Mapping[float, Atlas], columns: Sequence[str]) -> list[str]:
    """The columns among ``columns`` that apply at every size (those that apply at none are left out)."""
    applying = []
    for key in columns:
        applies = {table.column(key).applies for table in tables.values()}
        if applies == {True}:
            applying.append(key)
        elif applies != {False}:
            raise ValueError(f"column {key!r} applies at some sizes and not at others")
    return applying


def size_sweep_markdown(
    tables: Mapping[float, Atlas], measures: Sequence[str], columns: Sequence[str], sig: int = 3
) -> str:
    """The factors of ``measures`` under ``columns`` against the transformation size ``r``, as a MyST table.

    ``tables`` maps each size ``r`` to the atlas of one model at that size (same seed); a
    row per (measure, column) that applies, a column per size, cells as
    :func:`compact_cell_text`.
    """
    sizes = _sweep_sizes(tables)
    header = ["measure", "column"] + [f"r = {fmt(size)}" for size in sizes]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    first = tables[sizes[0]]
    for key in measures:
        for column in _sweep_columns(tables, columns):
            cells = [compact_cell_text(tables[size].cell(key, column), sig) for size in sizes]
            lines.append(
                "| " + " | ".join([short_title(first.measure(key)), first.column(column).short] + cells) + " |"
            )
    return "\n".join(lines)


def size_sweep_figure(tables: Mapping[float, Atlas], measures: Sequence[str], columns: Sequence[str], title=None):
    """One panel per measure: the factor ``after / before`` against the size ``r``, a line per column.

    Both axes are logarithmic and shared; a dotted line marks a factor of 1 (no change).
    Returns the matplotlib figure (caption it with :func:`size_sweep_contract`).
    """
    sizes = _sweep_sizes(tables)
    keys = _sweep_columns(tables, columns)
    first = tables[sizes[0]]
    fig, axes = plt.subplots(1, len(measures), figsize=(1.9 * len(measures) + 0.8, 2.9), sharey=True, squeeze=False)
    for ax, key in zip(axes[0], measures):
        ax.axhline(1.0, color="0.5", linewidth=0.8, linestyle=":")
        for n, column in enumerate(keys):
            factors = [tables[size].cell(key, column).factor for size in sizes]
            values = [abs(f) if f is not None else np.nan for f in factors]
            ax.plot(sizes, values, marker="os^vD"[n % 5], markersize=4, label=first.column(column).short)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(sizes, [fmt(size) for size in sizes], fontsize=7)
        ax.minorticks_off()
        ax.set_title(short_title(first.measure(key)), fontsize=9)
        ax.set_xlabel("size r", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
    values = np.array([abs(line.get_ydata()) for ax in axes[0] for line in ax.get_lines()[1:]], dtype=float)
    values = values[np.isfinite(values) & (values > 0)]
    low, high = (values.min(), values.max()) if values.size else (1.0, 1.0)
    ticks = [2.0**k for k in range(math.floor(math.log2(min(low, 1.0))), math.ceil(math.log2(max(high, 1.0))) + 1)]
    axes[0][0].set_yticks(ticks, [fmt(t) for t in ticks])
    axes[0][0].set_ylabel("after / before", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(keys), fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


#: The static sweep's markers and matplotlib's first colours, so both figures draw a column alike.
_SWEEP_MARKERS = ("circle", "square", "triangle-up", "triangle-down", "diamond")
_SWEEP_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd")


def size_sweep_interactive(
    tables: Mapping[float, Atlas], measures: Sequence[str], columns: Sequence[str], title: str | None = None
) -> go.Figure:
    """:func:`size_sweep_figure` as a plotly figure: a panel per measure, a line per column, two panels a row.

    Hovering a point shows the cell as the tables print it (:func:`compact_cell_text`); a
    column's legend entry shows or hides its line in every panel. The factors are rounded
    to 4 significant digits (``lossgeom_book.interactive.rounded``); a cell without a
    factor leaves a gap. Glue it with ``lossgeom_book.interactive.glue_interactive``.
    """
    sizes = _sweep_sizes(tables)
    keys = _sweep_columns(tables, columns)
    first = tables[sizes[0]]
    n_cols = min(2, len(measures))
    n_rows = math.ceil(len(measures) / n_cols)
    fig = make_subplots(
        rows=n_rows,
        cols=n_cols,
        shared_xaxes="all",
        shared_yaxes="all",
        vertical_spacing=0.12,
        subplot_titles=[short_title(first.measure(key)) for key in measures],
    )
    values = []
    for n, key in enumerate(measures):
        row, col = n // n_cols + 1, n % n_cols + 1
        fig.add_hline(y=1.0, line=dict(color="grey", width=1, dash="dot"), row=row, col=col)
        hover = f"{short_title(first.measure(key))}, %{{fullData.name}}, r = %{{x}}: %{{text}}<extra></extra>"
        for m, column in enumerate(keys):
            cells = [tables[size].cell(key, column) for size in sizes]
            factors = [abs(c.factor) if c.factor is not None and c.factor != 0 else None for c in cells]
            values += [f for f in factors if f is not None]
            fig.add_trace(
                go.Scatter(
                    x=rounded(sizes),
                    y=[None if f is None else rounded(f) for f in factors],
                    mode="lines+markers",
                    name=first.column(column).short,
                    legendgroup=column,
                    showlegend=n == 0,
                    marker=dict(symbol=_SWEEP_MARKERS[m % 5]),
                    line=dict(color=_SWEEP_COLOURS[m % 5]),
                    text=[compact_cell_text(c) for c in cells],
                    hovertemplate=hover,
                ),
                row=row,
                col=col,
            )
    low, high = (min(values + [1.0]), max(values + [1.0]))
    ticks = [2.0**k for k in range(math.floor(math.log2(low)), math.ceil(math.log2(high)) + 1)]
    fig.update_xaxes(type="log", tickvals=rounded(sizes), ticktext=[fmt(size) for size in sizes])
    fig.update_xaxes(title_text="size r", row=n_rows)
    fig.update_yaxes(type="log", tickvals=rounded(ticks), ticktext=[fmt(t) for t in ticks])
    fig.update_yaxes(title_text="after / before", col=1)
    fig.update_layout(
        legend=dict(orientation="h", x=0, y=-0.12, yanchor="top", title_text="column: "),
        margin=dict(l=60, r=20, t=70 if title else 40, b=60),
        title=dict(text=title, font=dict(size=13)) if title else None,
    )
    return fig


def size_sweep_contract(tables: Mapping[float, Atlas]) -> MeasurementContract:
    """The measurement contract of :func:`size_sweep_figure`: the atlases' own, with the sizes as resolution."""
    sizes = _sweep_sizes(tables)
    first = tables[sizes[0]]
    return replace(
        first.contract(),
        resolution=f"{len(sizes)} sizes r = {listed([fmt(size) for size in sizes])}, one atlas at each "
        f"(seed {first.seed}); y: after / before on a log axis (an invariant cell lies within its row's "
        f"tolerance of 1); outputs audited on {first.probe_size} probe inputs at every size",
    )

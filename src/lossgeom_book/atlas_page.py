"""The book's atlas page (``appendices/atlas``): an atlas as MyST tables and heat maps.

:func:`atlas_markdown` renders a :class:`lossgeom.atlas.Atlas` as a MyST table whose
measure titles link to the book's definitions, :func:`fisher_cuts_markdown` the
Fisher-Riemannian row at each cut, and :func:`atlas_heatmap` draws the table as a heat map
of ``log10 |after / before|``. :func:`diagonal_fisher_rounding` says when the
diagonal-Fisher row reads rounding (its metric divides by a Fisher-diagonal entry at
rounding level); both renderings then mark that row's cells ``rounding`` instead of a
verdict.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from matplotlib import pyplot as plt

from lossgeom.atlas import ROUNDING_FLOOR, Atlas, Cell
from lossgeom.formatting import fmt

#: What a cell of a row that reads rounding shows, in the table and in the heat map.
ROUNDING_TEXT = "rounding"


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
    absent: dict[str, list[str]] = {}
    for c in table.columns:
        if not c.applies:
            absent.setdefault(c.reason, []).append(c.short)
    for measure, base, reason in zip(table.measures, table.base, table.base_reasons):
        if base is None:
            absent.setdefault(reason, []).append(measure.title)
    if absent:
        lines += [
            "",
            "Not applicable here: "
            + "; ".join(f"{', '.join(names)} ({reason})" for reason, names in absent.items())
            + ".",
        ]
    if rounding:
        lines += [
            "",
            "Read as rounding here: "
            + "; ".join(f"{table.measure(key).title} ({reason})" for key, reason in rounding.items())
            + ".",
        ]
    if table.point is not None:
        lines += ["", table.point_text()]
    return "\n".join(lines)


def fisher_cuts_markdown(table: Atlas, sig: int = 4) -> str:
    """The Fisher-Riemannian row at each cut of :data:`~lossgeom.atlas.measures.FISHER_CUTS`, as a MyST table.

    One row per cut: the Fisher's rank and the value at the model's parameters, then the
    factor ``after / before`` under each applicable column with the rank there.
    """
    if table.point is None or table.point.fisher is None:
        raise ValueError("this atlas has no Fisher record: the Fisher-Riemannian row was not measured")
    moved = [(c, r) for c, r in zip(table.columns, table.column_points) if r is not None and r.fisher is not None]
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

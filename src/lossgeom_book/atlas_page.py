"""The book's atlas page (``appendices/atlas``): an atlas as MyST tables and heat maps.

:func:`atlas_markdown` renders a :class:`lossgeom.atlas.Atlas` as a MyST table whose
measure titles link to the book's definitions, :func:`fisher_cuts_markdown` the
Fisher-Riemannian row at each cut, and :func:`atlas_heatmap` draws the table as a heat map
of ``log10 |after / before|``.
"""

from __future__ import annotations

import numpy as np
import torch
from matplotlib import pyplot as plt

from lossgeom.atlas import Atlas
from lossgeom.formatting import fmt


def atlas_markdown(table: Atlas, link_prefix: str | None = None, sig: int = 3) -> str:
    """An :class:`~lossgeom.atlas.Atlas` as MyST markdown: a row per measure, a column per transformation.

    The audit receipts come last.

    With ``link_prefix="atlas"`` each measure's title links to the label
    ``(atlas-<key>)=`` (underscores become hyphens), where the book defines it.
    """
    header = ["measure (tolerance)"] + [c.short for c in table.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for measure, row in zip(table.measures, table.cells):
        title = measure.title
        if link_prefix:
            title = f"{{ref}}`{title} <{link_prefix}-{measure.key.replace('_', '-')}>`"
        tol = fmt(measure.tolerance_for(getattr(torch, table.dtype)), 1)
        lines.append("| " + " | ".join([f"{title} ({tol})"] + [cell.text(sig) for cell in row]) + " |")
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


def atlas_heatmap(table: Atlas, ax=None, title: str | None = None):
    """A heat map of ``log10 |after / before|`` per cell, annotated; grey where not applicable.

    Returns the matplotlib figure (caption it with :meth:`lossgeom.atlas.Atlas.contract`, e.g. through
    :func:`lossgeom_book.display.glue_figure`).
    """
    values = table.log_factors()
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
            if text is None:
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

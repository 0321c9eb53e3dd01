#!/usr/bin/env python3
"""Re-sync and re-execute chapters, writing their reference outputs deterministically.

Usage (from the repository root, inside .venv; `make outputs` does this):

    python tools/execute_chapters.py                  # every chapters/*.md
    python tools/execute_chapters.py chapters/ch02_family_of_minima.md

The MyST .md file is the source of truth. For each chapter this script puts the hidden
Colab install cell first (``lossgeom_book.toc.colab_cell``, from ``_config.yml``'s repository
setting), writes the py:percent twin, executes the notebook top to bottom in a fresh kernel with nbclient
(``record_timing=False``, so no timestamps), and writes the .ipynb with its outputs.
With PYTHONHASHSEED=0 (set by the Makefile) running it twice changes no byte.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

from lossgeom_book.toc import COLAB_MARKER, colab_cell

ROOT = Path(__file__).resolve().parent.parent
FORMATS = "ipynb,md:myst,py:percent"


def merge_streams(nb) -> None:
    """Join consecutive stream outputs of one name: how the kernel chunks prints varies."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        merged = []
        for out in cell.outputs:
            if (
                merged
                and out.output_type == "stream"
                and merged[-1].output_type == "stream"
                and merged[-1].name == out.name
            ):
                merged[-1].text += out.text
            else:
                merged.append(out)
        cell.outputs = merged


def ensure_colab_cell(nb) -> None:
    """Make the first code cell the Colab install cell (tagged remove-cell: hidden in the book)."""
    source = colab_cell(ROOT / "_config.yml")
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    if code and nb.cells[code[0]].source.startswith(COLAB_MARKER):
        nb.cells[code[0]].source = source
        nb.cells[code[0]].metadata["tags"] = ["remove-cell"]
        return
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["remove-cell"]})
    nb.cells.insert(code[0] if code else len(nb.cells), cell)


def execute(md: Path) -> float:
    nb = jupytext.read(md)
    ensure_colab_cell(nb)
    nb.metadata["jupytext"] = {**nb.metadata.get("jupytext", {}), "formats": FORMATS}
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    for index, cell in enumerate(nb.cells):
        cell.id = f"cell-{index}"  # jupytext draws random ids; fixed ids keep the .ipynb byte-stable
    jupytext.write(nb, md.with_suffix(".py"), fmt="py:percent")
    start = time.perf_counter()
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", record_timing=False, resources={"metadata": {"path": str(md.parent)}}
    )
    client.execute()
    elapsed = time.perf_counter() - start
    nb.metadata.pop("widgets", None)
    merge_streams(nb)
    nbformat.write(nb, md.with_suffix(".ipynb"))
    # rewrite the .md through jupytext too, so its header matches the pairing exactly
    jupytext.write(nb, md, fmt="md:myst")
    return elapsed


def main(argv: list[str]) -> int:
    if os.environ.get("PYTHONHASHSEED") != "0":
        print("PYTHONHASHSEED must be 0 for deterministic outputs (run through `make outputs`)", file=sys.stderr)
        return 2
    paths = [Path(a) for a in argv] or sorted((ROOT / "chapters").glob("*.md"))
    for md in paths:
        if md.suffix != ".md" or not md.exists():
            print(f"not a chapter .md file: {md}", file=sys.stderr)
            return 2
        seconds = execute(md.resolve())
        print(f"{md.name}: executed in {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

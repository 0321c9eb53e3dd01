#!/usr/bin/env python3
"""Time the execution of every chapter (a benchmark, not a test): `make bench`.

Executes each chapters/*.md and each executable appendix (or the pages named) in a fresh
kernel, as the book build does, and writes wall times to
benchmarks/results/chapter_times.json. The budget is 60 s
per chapter on 2 cores and 4 minutes for the whole book; the script reports both.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import jupytext
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
BUDGET_CHAPTER, BUDGET_BOOK = 60.0, 240.0


def main(argv: list[str]) -> int:
    appendices = [p for p in sorted((ROOT / "appendices").glob("*.md")) if "kernelspec:" in p.read_text()]
    paths = [Path(a) for a in argv] or sorted((ROOT / "chapters").glob("*.md")) + appendices
    times = {}
    for md in paths:
        nb = jupytext.read(md)
        start = time.perf_counter()
        NotebookClient(
            nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(md.parent)}}
        ).execute()
        times[md.stem] = round(time.perf_counter() - start, 1)
        flag = "" if times[md.stem] <= BUDGET_CHAPTER else "  OVER BUDGET"
        print(f"{md.stem}: {times[md.stem]:.1f} s{flag}")
    total = round(sum(times.values()), 1)
    print(f"total: {total:.1f} s (budget {BUDGET_BOOK:.0f} s)")
    out = {"cores": os.cpu_count(), "python": platform.python_version(), "seconds": times, "total": total}
    if not argv:
        (ROOT / "benchmarks" / "results" / "chapter_times.json").write_text(json.dumps(out, indent=2) + "\n")
    return 0 if all(t <= BUDGET_CHAPTER for t in times.values()) and total <= BUDGET_BOOK else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""Time the book's execution (a benchmark, not a test): `make bench`.

Two passes over every executable page of ``_toc.yml`` (each chapters/*.md and each
appendix with a kernelspec; the script fails if one is missing from the table of contents):

1. **each page on its own**, one at a time in a fresh kernel with the environment's
   ``OMP_NUM_THREADS`` (the Makefile's 2): the budget of 60 s per page;
2. **the whole book as `make book` executes it** (``tools/execute_book.py``): ``--jobs``
   pages at once (2), longest first by the times of pass 1, ``cores // jobs`` threads per
   kernel, the claims appendix after every other page: the budget of 4 minutes of wall time.

Each page is read and executed as myst-nb does in the book build. Writes
benchmarks/results/chapter_times.json (cores, Python, load average, per-page seconds of
both passes, their sums, the parallel wall time and the budget checks) when every page
was run; ``--quick`` runs three short pages and only prints (or writes ``--output``).
Exits 1 when a budget is missed or a page fails.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import execute_book  # noqa: E402 - tools/ is not a package

RESULTS = ROOT / "benchmarks" / "results" / "chapter_times.json"
BUDGET_PAGE, BUDGET_BOOK = 60.0, 240.0
QUICK = ("ch01_object_and_metric", "ch02_family_of_minima", "ch03_perturbation_sets")


def book_pages() -> list[execute_book.Page]:
    """Every page `make book` executes; raises if a chapter or executable appendix is not among them."""
    pages = execute_book.executable_pages(ROOT)
    names = {p.docname for p in pages}
    appendices = [p for p in sorted((ROOT / "appendices").glob("*.md")) if "kernelspec:" in p.read_text()]
    expected = sorted((ROOT / "chapters").glob("*.md")) + appendices
    missing = [str(p.relative_to(ROOT)) for p in expected if str(p.relative_to(ROOT).with_suffix("")) not in names]
    if missing:
        raise SystemExit(f"pages the book does not execute (not in _toc.yml): {missing}")
    return pages


def select(pages: list[execute_book.Page], names: list[str]) -> list[execute_book.Page]:
    """The pages named by stem, docname or path."""
    by_name = {}
    for page in pages:
        by_name.update({page.stem: page, page.docname: page, str(page.path.relative_to(ROOT)): page})
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise SystemExit(f"unknown pages {unknown}; the book executes {[p.stem for p in pages]}")
    return list(dict.fromkeys(by_name[n] for n in names))


def timed_pass(pages, *, jobs: int, threads: int | None, expected: dict[str, float]) -> dict:
    """Execute ``pages`` ``jobs`` at a time; per-page seconds (by stem), their sum and the wall time."""
    stems = {p.docname: p.stem for p in pages}
    label = "each page alone" if jobs == 1 else f"{jobs} pages at once, longest first"
    print(f"{label} (OMP_NUM_THREADS={threads or os.environ.get('OMP_NUM_THREADS', 'unset')}):", flush=True)

    def report(result: execute_book.Result) -> None:
        flag = "  FAILED" if result.error else ("  OVER BUDGET" if result.seconds > BUDGET_PAGE else "")
        print(f"  {stems[result.docname]}: {result.seconds:.1f} s{flag}", flush=True)

    results, wall = execute_book.execute_pages(
        pages, jobs=jobs, root=ROOT, expected=expected, threads=threads, on_result=report
    )
    for result in results.values():
        if result.error:
            print(f"\n{result.docname} failed:\n{result.error}", file=sys.stderr)
    seconds = {stems[p.docname]: round(results[p.docname].seconds, 1) for p in pages}
    summed = round(sum(seconds.values()), 1)
    print(f"  sum {summed:.1f} s, wall {wall:.1f} s", flush=True)
    return {
        "jobs": jobs,
        "omp_num_threads": threads or os.environ.get("OMP_NUM_THREADS"),
        "seconds": seconds,
        "sum": summed,
        "wall": round(wall, 1),
        "failed": sorted(stems[d] for d, r in results.items() if r.error),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="*", help="pages to time (stem, docname or path); default: every page")
    parser.add_argument("--quick", action="store_true", help=f"time three short pages only: {', '.join(QUICK)}")
    parser.add_argument("--jobs", type=int, default=2, help="pages at once in the book pass, as `make book` (2)")
    parser.add_argument("--book-only", action="store_true", help="skip the pass of each page alone")
    parser.add_argument("--output", type=Path, help=f"write the JSON here (default {RESULTS.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be a positive integer, got {args.jobs}")
    every = book_pages()
    chosen = args.pages or (list(QUICK) if args.quick else [])
    pages = select(every, chosen) if chosen else every
    complete = len(pages) == len(every)

    load = os.getloadavg()
    print(f"{len(pages)} pages, {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    expected = execute_book.expected_seconds()
    alone = None
    if not args.book_only:
        alone = timed_pass(pages, jobs=1, threads=None, expected=expected)
        expected = {**expected, **alone["seconds"]}
    if alone is not None and args.jobs == 1:
        book = alone  # one page at a time is the book pass too
    else:
        threads = execute_book.threads_per_kernel(args.jobs)
        book = timed_pass(pages, jobs=args.jobs, threads=threads, expected=expected)

    per_page = (alone or book)["seconds"]
    over = sorted(stem for stem, s in per_page.items() if s > BUDGET_PAGE)
    budget = {
        "page_seconds": BUDGET_PAGE,
        "book_wall_seconds": BUDGET_BOOK,
        "pages_over": over,
        "pages_within": not over,
        "book_within": book["wall"] <= BUDGET_BOOK,
    }
    failed = sorted(set(book["failed"]) | set((alone or {}).get("failed", [])))
    print(
        f"book: {book['wall']:.1f} s of wall time with {args.jobs} at once (budget {BUDGET_BOOK:.0f} s); "
        f"pages over {BUDGET_PAGE:.0f} s: {', '.join(over) or 'none'}"
    )
    out = {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_at_start": [round(x, 2) for x in load],
        "seconds": per_page,
        "sequential_total": (alone or {}).get("sum"),
        "omp_num_threads_alone": (alone or {}).get("omp_num_threads"),
        "book": {k: book[k] for k in ("jobs", "omp_num_threads", "wall", "sum", "seconds")},
        "budget": budget,
        "failed": failed,
    }
    target = args.output or (RESULTS if complete and not args.book_only else None)
    if target is not None:
        target.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {target}")
    return 0 if budget["pages_within"] and budget["book_within"] and not failed else 1


if __name__ == "__main__":
    sys.exit(main())

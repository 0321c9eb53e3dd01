#!/usr/bin/env python3
"""Execute the book's pages in parallel, then let `jupyter-book build` render them: `make book`.

Jupyter Book 1.x executes each notebook while Sphinx reads it, one page after another,
and its Sphinx stack cannot read in parallel (``-j``: sphinx-multitoc-numbering and
sphinx-jupyterbook-latex do not declare themselves parallel-safe, so Sphinx warns, which
``-W`` turns into an error, and reads serially anyway). So `make book` runs three steps:

1. ``python tools/execute_book.py fill --jobs 2`` empties the build's jupyter-cache and
   executes every executable page of ``_toc.yml`` fresh, ``--jobs`` pages at a time,
   longest first (by the per-page times in benchmarks/results/chapter_times.json), each
   kernel limited to ``cores // jobs`` threads (``OMP_NUM_THREADS``). Each page is read
   exactly as myst-nb reads it and executed by the call myst-nb makes
   (``jupyter_cache.executors.utils.single_nb_execution``, in the page's folder, with the
   ``execute:`` timeout of ``_config.yml``), then stored in the jupyter-cache that myst-nb
   reads (``_build/.jupyter_cache``) with its own execution time, and written to
   ``_build/jupyter_execute`` as myst-nb writes it. The pages that summarise the others
   (``READ_LAST`` of ``_ext/read_order.py``: the claims appendix reads the chapters executed
   in this build from ``_build/jupyter_execute``) run after all the others.
2. ``jupyter-book build . -W -n --keep-going`` with ``execute_notebooks: cache`` in
   ``_config.yml``: every page is a cache hit, and Sphinx only renders.
3. ``python tools/execute_book.py check`` fails if myst-nb executed any page itself (a
   cache miss would run a page twice, and serially) or did not read a page that was filled,
   then puts the outputs back into ``_build/jupyter_execute/*.ipynb`` (myst-nb 1.4 writes a
   cache hit's notebook there without its outputs), and removes the cache, so that a later
   `jupyter-book build` never renders outputs older than the library.

The benchmark ``benchmarks/chapter_times.py`` schedules pages with :func:`execute_pages`
too, so that it times the book the way `make book` executes it. Nothing here writes into
chapters/ or appendices/ (``tools/execute_chapters.py`` writes the reference outputs).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from functools import lru_cache
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMES = ROOT / "benchmarks" / "results" / "chapter_times.json"
BUILD = "_build"


@dataclass(frozen=True)
class Page:
    """An executable page of the book: its Sphinx docname and its source file."""

    docname: str
    path: Path

    @property
    def stem(self) -> str:
        return Path(self.docname).name


@dataclass
class Result:
    """One page's execution: the executed notebook (nbformat JSON) or the error, and its seconds."""

    docname: str
    seconds: float
    notebook: str | None = None
    error: str | None = None


@lru_cache(maxsize=4)
def book_config(root: Path) -> dict:
    """The Sphinx configuration jupyter-book derives from ``root/_config.yml``."""
    from jupyter_book.config import get_final_config

    config, _ = get_final_config(
        user_yaml=root / "_config.yml",
        cli_config={"latex_individualpages": False},
        sourcedir=root,
        validate=False,
    )
    return config


def parser_configs(root: Path):
    """myst-parser's and myst-nb's configurations, built from the book's as Sphinx builds them."""
    from myst_nb.core.config import NbParserConfig
    from myst_parser.config.main import MdParserConfig

    config = book_config(root)
    md = {name: config[f"myst_{name}"] for name, _, _ in MdParserConfig().as_triple() if f"myst_{name}" in config}
    nb = {name: config[f"nb_{name}"] for name, _, _ in NbParserConfig().as_triple() if f"nb_{name}" in config}
    return MdParserConfig(**md), NbParserConfig(**nb)


def cache_path(root: Path) -> Path:
    """The jupyter-cache myst-nb uses: ``execute: cache:`` of _config.yml, else ``_build/.jupyter_cache``."""
    configured = book_config(root).get("nb_execution_cache_path") or ""
    return (root / configured).resolve() if configured else (root / BUILD / ".jupyter_cache").resolve()


def output_folder(root: Path) -> Path:
    """Where myst-nb writes each page's executed notebook and its glue data."""
    return root / BUILD / "jupyter_execute"


def read_last(root: Path) -> tuple[str, ...]:
    """The docnames Sphinx reads after every other page (``READ_LAST`` of ``_ext/read_order.py``)."""
    path = root / "_ext" / "read_order.py"
    if not path.is_file():
        return ()
    spec = importlib.util.spec_from_file_location("read_order", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return tuple(getattr(module, "READ_LAST", ()))


def executable_pages(root: Path = ROOT) -> list[Page]:
    """Every page of ``_toc.yml`` that myst-nb executes: the MyST Markdown notebooks and .ipynb files."""
    from myst_nb.core.read import is_myst_markdown_notebook
    from sphinx_external_toc.parsing import parse_toc_yaml

    _, nb_config = parser_configs(root)
    excluded = nb_config.execution_excludepatterns
    pages = []
    for docname in parse_toc_yaml(root / "_toc.yml"):
        candidates = [root / f"{docname}{suffix}" for suffix in (".md", ".ipynb", *nb_config.custom_formats)]
        path = next((p for p in candidates if p.is_file()), None)
        if path is None or any(path.relative_to(root).match(pattern) for pattern in excluded):
            continue
        if path.suffix != ".md" or is_myst_markdown_notebook(path.read_text("utf8")):
            pages.append(Page(docname, path))
    return pages


def read_page(path: Path, root: Path):
    """The notebook of ``path`` exactly as myst-nb's parser builds it, and the execution settings.

    Returns:
        ``(notebook, nb_config)``, the configuration updated by the notebook's own ``mystnb``
        metadata as myst-nb does.
    """
    import re

    from myst_nb.core.read import create_nb_reader

    md_config, nb_config = parser_configs(root)
    text = path.read_text("utf8")
    reader = create_nb_reader(str(path), md_config, nb_config, text)
    if reader is None:
        raise ValueError(f"{path} is not a notebook myst-nb executes")
    notebook = reader.read(text)
    kernel = notebook.metadata.get("kernelspec", {}).get("name")
    for pattern, alias in (nb_config.kernel_rgx_aliases or {}).items():
        if kernel is not None and re.fullmatch(pattern, kernel):
            notebook.metadata["kernelspec"]["name"] = alias
            break
    overrides = dict(notebook.metadata.get(nb_config.metadata_key, {}))
    overrides.pop("output_folder", None)
    return notebook, nb_config.copy(**overrides) if overrides else nb_config


def _limit_threads(threads: int | None) -> None:
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)


def execute_page(docname: str, path: str, root: str) -> Result:
    """Execute one page in a fresh kernel, as myst-nb's cache client does on a miss."""
    import tempfile
    from contextlib import nullcontext

    import nbformat
    from jupyter_cache.executors.utils import single_nb_execution

    start = time.perf_counter()
    try:
        notebook, config = read_page(Path(path), Path(root))
        cwd = tempfile.TemporaryDirectory() if config.execution_in_temp else nullcontext(str(Path(path).parent))
        with cwd as folder:
            result = single_nb_execution(
                notebook,
                cwd=os.path.abspath(folder),
                allow_errors=config.execution_allow_errors,
                timeout=config.execution_timeout,
                meta_override=True,
            )
    except Exception:  # a dead kernel or an unreadable page: report it with the page's name
        return Result(docname, time.perf_counter() - start, error=traceback.format_exc())
    if result.err is not None:
        return Result(docname, result.time, error=result.exc_string)
    return Result(docname, result.time, notebook=nbformat.writes(notebook))


def expected_seconds(path: Path = TIMES) -> dict[str, float]:
    """Each page's last measured execution time (by file stem), for longest-first scheduling."""
    try:
        seconds = json.loads(path.read_text()).get("seconds", {})
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in seconds.items() if isinstance(v, int | float)}


def schedule(pages: Iterable[Page], expected: dict[str, float]) -> list[Page]:
    """Longest first; a page with no measured time goes first (it may be the longest)."""
    return sorted(pages, key=lambda p: -expected.get(p.stem, float("inf")))


def threads_per_kernel(jobs: int) -> int | None:
    """``cores // jobs`` threads per kernel when pages run side by side; None keeps the environment's."""
    return max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else None


def execute_pages(
    pages: list[Page],
    *,
    jobs: int,
    root: Path = ROOT,
    expected: dict[str, float] | None = None,
    threads: int | None = None,
    on_result: Callable[[Result], None] | None = None,
) -> tuple[dict[str, Result], float]:
    """Execute ``pages`` in ``jobs`` worker processes, longest first; READ_LAST pages after the rest.

    Args:
        pages: the pages to execute.
        jobs: how many pages execute at once.
        root: the book's folder.
        expected: seconds per page stem for the order (default: the last benchmark's).
        threads: ``OMP_NUM_THREADS`` of every kernel (None: the environment's).
        on_result: called in this process with each result as it arrives (before any
            READ_LAST page starts).

    Returns:
        The results by docname, and the wall time in seconds from the first page's start.
    """
    if jobs < 1:
        raise ValueError(f"jobs must be a positive integer, got {jobs}")
    last = read_last(root)
    order = schedule(pages, expected_seconds() if expected is None else expected)
    first, then = [p for p in order if p.docname not in last], [p for p in order if p.docname in last]
    results: dict[str, Result] = {}

    def record(result: Result) -> None:
        results[result.docname] = result
        if on_result is not None:
            on_result(result)

    start = time.perf_counter()
    context = get_context("spawn")  # workers start clean: no copy of this process's state
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=_limit_threads, initargs=(threads,)) as pool:
        for phase in (first, then):
            failed = sorted(d for d, r in results.items() if r.error)
            if failed:  # the READ_LAST pages summarise the others
                for page in phase:
                    record(Result(page.docname, 0.0, error=f"not run: it runs after the others, and {failed} failed"))
                continue
            pending = {pool.submit(execute_page, p.docname, str(p.path), str(root)) for p in phase}
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    record(future.result())
    return results, time.perf_counter() - start


def _print_result(result: Result) -> None:
    status = "FAILED" if result.error else "ok"
    print(f"  {result.docname}: {result.seconds:.1f} s {status}", flush=True)


def fill(root: Path, jobs: int) -> int:
    """Execute every page in parallel into an emptied jupyter-cache (step 1 of `make book`)."""
    import nbformat
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    pages = executable_pages(root)
    cache_dir, out_dir = cache_path(root), output_folder(root)
    shutil.rmtree(cache_dir, ignore_errors=True)
    shutil.rmtree(out_dir, ignore_errors=True)
    cache = get_cache(str(cache_dir))
    threads = threads_per_kernel(jobs)
    paths = {p.docname: p.path for p in pages}
    load = os.getloadavg()
    print(
        f"execute_book: {len(pages)} pages, {jobs} at a time, longest first, "
        f"OMP_NUM_THREADS={threads or os.environ.get('OMP_NUM_THREADS', 'unset')} per kernel "
        f"({os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})",
        flush=True,
    )

    def store(result: Result) -> None:
        _print_result(result)
        if result.error:
            return
        notebook = nbformat.reads(result.notebook, as_version=4)
        bundle = CacheBundleIn(notebook, str(paths[result.docname]), data={"execution_seconds": result.seconds})
        cache.cache_notebook_bundle(bundle, check_validity=False, overwrite=True)
        target = out_dir.joinpath(*f"{result.docname}.ipynb".split("/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(result.notebook, encoding="utf8")

    results, wall = execute_pages(pages, jobs=jobs, root=root, threads=threads, on_result=store)
    failed = [r for r in results.values() if r.error]
    total = sum(r.seconds for r in results.values())
    print(f"execute_book: {len(results)} pages in {wall:.1f} s of wall time ({total:.1f} s summed over pages)")
    for result in failed:
        print(f"\n{result.docname} failed:\n{result.error}", file=sys.stderr)
    return 1 if failed else 0


def check(root: Path) -> int:
    """Verify the build used the cache for every page and executed none; restore the outputs (step 3)."""
    import nbformat
    from jupyter_cache import get_cache

    cache_dir, out_dir = cache_path(root), output_folder(root)
    if not cache_dir.is_dir():
        print(f"execute_book check: no jupyter-cache at {cache_dir}; run `execute_book.py fill` first", file=sys.stderr)
        return 1
    cache = get_cache(str(cache_dir))
    problems = []
    executed = cache.list_project_records()
    if executed:
        uris = ", ".join(record.uri for record in executed)
        problems.append(f"myst-nb executed pages itself (not found in the cache, so run twice): {uris}")
    pages = executable_pages(root)
    filled = {record.uri for record in cache.list_cache_records()}
    html = root / BUILD / "html"
    for page in pages:
        target = out_dir.joinpath(*f"{page.docname}.ipynb".split("/"))
        if str(page.path) not in filled:
            problems.append(f"{page.docname}: not in the cache (was `fill` run on this tree?)")
        elif not (html / f"{page.docname}.html").is_file() or not target.is_file():
            problems.append(f"{page.docname}: filled but not built (no {page.docname}.html)")
        else:
            try:
                _, merged = cache.merge_match_into_notebook(nbformat.reads(target.read_text("utf8"), as_version=4))
            except KeyError:
                problems.append(f"{page.docname}: the notebook myst-nb read does not match its cache record")
                continue
            target.write_text(nbformat.writes(merged), encoding="utf8")
    for problem in problems:
        print(f"execute_book check: {problem}", file=sys.stderr)
    if problems:
        return 1
    shutil.rmtree(cache_dir)
    print(f"execute_book check: the build rendered all {len(pages)} pages from this run's execution, executing none")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fill_parser = sub.add_parser("fill", help="execute every page in parallel into the build's jupyter-cache")
    fill_parser.add_argument("--jobs", type=int, default=2, help="pages executed at once (default 2)")
    sub.add_parser("check", help="after the build: no page executed twice; restore _build/jupyter_execute outputs")
    for command in (fill_parser, sub.choices["check"]):
        command.add_argument("--root", type=Path, default=ROOT, help="the book's folder (default: this repository)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if args.command == "fill":
        if args.jobs < 1:
            parser.error(f"--jobs must be a positive integer, got {args.jobs}")
        return fill(root, args.jobs)
    return check(root)


if __name__ == "__main__":
    sys.exit(main())

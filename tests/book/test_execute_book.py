"""Tests of tools/execute_book.py: which pages `make book` executes in parallel, and in what order."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location("execute_book", ROOT / "tools" / "execute_book.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("execute_book", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _toc_files() -> list[str]:
    def walk(entries):
        for entry in entries:
            if "file" in entry:
                yield entry["file"]
            yield from walk(entry.get("sections", []) + entry.get("chapters", []))

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [toc["root"], *walk(toc.get("parts", []))]


def test_every_executable_page_of_the_toc_is_filled_and_no_other():
    tool = _tool()
    pages = {page.docname for page in tool.executable_pages(ROOT)}
    notebooks = {
        name
        for name in _toc_files()
        if (ROOT / f"{name}.md").is_file() and "kernelspec:" in (ROOT / f"{name}.md").read_text()
    }
    assert pages == notebooks and "appendices/claims" in pages and "chapters/ch14_decoder_transformers" in pages


def test_longest_first_unknown_first_and_the_summaries_last():
    tool = _tool()
    pages = [tool.Page(name, ROOT / f"{name}.md") for name in ("chapters/a", "chapters/b", "chapters/c")]
    order = tool.schedule(pages, {"a": 5.0, "b": 40.0})
    assert [p.docname for p in order] == ["chapters/c", "chapters/b", "chapters/a"]  # c unmeasured, then 40, 5
    assert tool.read_last(ROOT)[0] == "appendices/claims"  # it reads the chapters executed before it
    assert tool.threads_per_kernel(1) is None and tool.threads_per_kernel(2) >= 1

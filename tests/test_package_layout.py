"""The layout promises of the two packages, checked on their source (issue 18).

``lossgeom`` is the library: no import cycle among its modules, no import inside a
function (a hidden cycle), never an import of ``lossgeom_book`` or of the book's
dependencies, shared types defined once, and no module of either package over 600 lines.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
LIBRARY = SRC / "lossgeom"
BOOK = SRC / "lossgeom_book"
MAX_LINES = 600
SHARED_TYPES = ("Params", "LossFn", "Forward", "Batch", "Data")


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(root: Path) -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(root.rglob("*.py"))}


LIBRARY_MODULES = _modules(LIBRARY)
ALL_MODULES = {**LIBRARY_MODULES, **_modules(BOOK)}


def _imported(tree: ast.Module, module: str, known: dict[str, Path], top_level_only: bool) -> set[str]:
    """The modules of ``known`` that ``module``'s imports name (``from a.b import c`` may name ``a.b.c``)."""
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in found if name in known and name != module}


def _graph() -> dict[str, set[str]]:
    graph = {}
    for name, path in LIBRARY_MODULES.items():
        tree = ast.parse(path.read_text())
        graph[name] = _imported(tree, name, LIBRARY_MODULES, top_level_only=False)
    return graph


def test_the_library_has_modules_to_check():
    assert len(LIBRARY_MODULES) >= 20 and "lossgeom.curvature.hessian" in LIBRARY_MODULES
    assert len(_modules(BOOK)) >= 10


def test_no_import_cycle_among_library_modules():
    """Depth-first search over the import graph; a package imports its own submodules,
    so an edge to a package counts as an edge to its ``__init__``, which is what Python runs."""
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt.startswith(node + "."):
                continue  # a package importing its own submodule is how packages are built
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(nxt) :] + [nxt]))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_a_cycle_is_detected_when_there_is_one(monkeypatch):
    fake = {"lossgeom.a": {"lossgeom.b"}, "lossgeom.b": {"lossgeom.a"}}
    monkeypatch.setattr(sys.modules[__name__], "_graph", lambda: fake)
    with pytest.raises(AssertionError, match="import cycle"):
        test_no_import_cycle_among_library_modules()


@pytest.mark.parametrize("name", sorted(LIBRARY_MODULES))
def test_library_module_imports_only_at_top_and_never_the_book(name):
    tree = ast.parse(LIBRARY_MODULES[name].read_text())
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            targets = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            assert not any(t.split(".")[0] == "lossgeom_book" for t in targets), f"{name} imports {targets}"
            assert not any(t.split(".")[0] in ("matplotlib", "myst_nb", "sklearn", "yaml") for t in targets), (
                f"{name} imports a book dependency {targets}"
            )
            assert id(node) in top, f"{name} imports {targets} inside a function or block (line {node.lineno})"


@pytest.mark.parametrize("name", sorted(ALL_MODULES))
def test_no_module_over_600_lines(name):
    lines = len(ALL_MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines"


def test_shared_types_are_defined_once():
    definitions = {t: [] for t in SHARED_TYPES}
    for name, path in ALL_MODULES.items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(target, ast.Name) and target.id in definitions:
                        definitions[target.id].append(name)
    assert definitions == {t: ["lossgeom.types"] for t in SHARED_TYPES}


def test_importing_the_library_loads_no_book_dependency():
    code = (
        "import sys, lossgeom.curvature, lossgeom.symmetries, lossgeom.flatness, lossgeom.atlas, lossgeom.landscape;"
        "print(sorted(m for m in ('matplotlib', 'myst_nb', 'sklearn', 'yaml', 'lossgeom_book') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(SRC), "PATH": ""},
    )
    assert out.stdout.strip() == "[]"

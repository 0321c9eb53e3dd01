"""The library on its own: one version, the typing marker, and a book package that refuses clearly.

``pip install .`` gives ``lossgeom`` (torch, numpy, scipy, tqdm) and ships ``lossgeom_book``,
which needs the ``book`` extra: without it, importing it raises ``ModuleNotFoundError``
naming what is missing and the extra. The myst-nb renderer of the ledger's JSON lives
outside ``lossgeom_book`` so that myst-nb loads it in any environment. These tests run in
the library's lane (``pip install .[test]``) and in the book's environment alike.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import json
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

import lossgeom
from lossgeom_book_mystnb import LedgerJsonRenderer

from book_extra import from_book

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
EXTRAS = PYPROJECT["project"]["optional-dependencies"]


def _names(requirements: list[str]) -> set[str]:
    """The distribution names of requirement strings such as ``"torch>=2.4"``."""
    return {requirement.split(">")[0].split("=")[0].strip() for requirement in requirements}


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_the_version_has_one_source_and_the_installed_metadata_agrees():
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "lossgeom.__version__"}
    assert importlib.metadata.version("lossgeom") == lossgeom.__version__


def test_the_library_ships_its_typing_marker():
    assert importlib.resources.files("lossgeom").joinpath("py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["lossgeom"]


def test_the_library_depends_on_torch_numpy_scipy_and_tqdm_only():
    # tqdm draws the progress bars of long computations (lossgeom.progress)
    assert _names(PYPROJECT["project"]["dependencies"]) == {"torch", "numpy", "scipy", "tqdm"}


def test_the_test_extra_holds_none_of_the_books_dependencies():
    assert _names(EXTRAS["test"]) == {"pytest", "hypothesis"}
    assert not _names(EXTRAS["test"]) & _names(EXTRAS["book"])


def test_the_book_package_without_a_dependency_names_it_and_the_extra():
    result = _python("import sys; sys.modules['matplotlib'] = None; import lossgeom_book")
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: lossgeom_book serves the book"), last
    assert "matplotlib" in last and 'pip install "lossgeom[book]"' in last


def test_the_book_package_without_a_dependency_loads_none_of_its_modules():
    code = (
        "import sys; sys.modules['sklearn'] = None\n"
        "try:\n    import lossgeom_book.data\n"
        "except ModuleNotFoundError as error:\n    print('lossgeom[book]' in str(error))\n"
        "print(sorted(m for m in sys.modules if m.startswith('lossgeom_book')))"
    )
    assert _python(code).stdout.split() == ["True", "[]"]


def test_the_book_package_lists_the_book_extra():
    book = pytest.importorskip("lossgeom_book")
    assert set(book.BOOK_DEPENDENCIES.values()) == _names(EXTRAS["book"])


def test_the_installed_entry_point_is_the_one_pyproject_declares():
    (entry,) = importlib.metadata.entry_points(group="myst_nb.mime_renderers", name="lossgeom_ledger")
    declared = PYPROJECT["project"]["entry-points"]["myst_nb.mime_renderers"]["lossgeom_ledger"]
    assert entry.value == declared, f"installed metadata names {entry.value!r}: reinstall (pip install -e .)"


def test_the_ledger_renderer_loads_through_its_entry_point_with_the_standard_library_alone():
    code = (
        "import importlib.metadata, json, sys\n"
        "before = set(sys.modules)\n"
        "(entry,) = importlib.metadata.entry_points(group='myst_nb.mime_renderers', name='lossgeom_ledger')\n"
        "entry.load()\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(json.dumps(sorted(new - set(sys.stdlib_module_names))))"
    )
    result = _python(code)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == ["lossgeom_book_mystnb"]


def test_the_ledger_renderer_renders_ledger_json_as_nothing_and_leaves_other_output_alone():
    def output(mime_type, content):
        return SimpleNamespace(mime_type=mime_type, content=content)

    assert LedgerJsonRenderer.handle_mime(None, output("application/json", {"ledger": []}), False) == []
    assert LedgerJsonRenderer.handle_mime(None, output("application/json", {"rows": []}), False) is None
    assert LedgerJsonRenderer.handle_mime(None, output("text/markdown", {"ledger": []}), False) is None


def test_a_book_name_imports_on_first_use_and_is_not_probed_at_collection():
    noise = from_book("lossgeom_book.noise")
    with pytest.raises(AttributeError, match="__wrapped__"):
        noise.__wrapped__  # doctest's and pytest's probes never import the book  # noqa: B018
    with pytest.raises(AttributeError, match="pytest_mock_example"):
        noise.pytest_mock_example_attribute_that_shouldnt_exist  # noqa: B018
    missing = from_book("lossgeom_book.no_such_module", "anything")
    with pytest.raises(pytest.skip.Exception, match="no_such_module"):
        missing()
    with pytest.raises(ValueError, match="module must be lossgeom_book"):
        from_book("numpy")

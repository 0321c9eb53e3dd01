"""Names from the book's package in the library's tests, imported by the first test that uses them.

A few tests of the library take a model, data or a reference computation from
``lossgeom_book``, which needs the book's extra dependencies (``pip install ".[book]"``).
Such a file imports the name through :func:`from_book` instead of an ``import`` line:
the module is imported when a test first uses the name, and where the book's
dependencies are missing that test is skipped with the reason ``lossgeom_book`` gives
(the packages it lacks and the extra to install), while every other test of the file
runs. The library's lane (``make test-lib``; its command is in ``tests/library.ini``)
needs only ``pip install ".[test]"``.
"""

from __future__ import annotations

from typing import Any

import pytest


class _BookName:
    """``module`` or ``module.attribute`` of ``lossgeom_book``, imported on first use (else the test skips)."""

    def __init__(self, module: str, attribute: str | None) -> None:
        self._module = module
        self._attribute = attribute

    def _resolve(self) -> Any:
        module = pytest.importorskip(self._module)
        return module if self._attribute is None else getattr(module, self._attribute)

    def __getattr__(self, name: str) -> Any:
        # pytest and doctest probe every module-level object at collection (``__test__``,
        # ``__wrapped__``, ``pytest_mock_example_attribute_that_shouldnt_exist``): no import
        # then, and no skip outside a test. The tests use only the book modules' public names.
        if name.startswith(("_", "pytest_")):
            raise AttributeError(name)
        return getattr(self._resolve(), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        name = self._module if self._attribute is None else f"{self._module}.{self._attribute}"
        return f"<{name}, imported on first use>"


def from_book(module: str, attribute: str | None = None) -> Any:
    """``module`` of ``lossgeom_book`` (or its ``attribute``), imported by the first test that uses it.

    ``from_book("lossgeom_book.noise")`` stands for ``import lossgeom_book.noise``, and
    ``from_book("lossgeom_book.data", "digits")`` for ``from lossgeom_book.data import digits``
    where ``digits`` is called. Without the book's dependencies the test that uses it skips.
    """
    if module != "lossgeom_book" and not module.startswith("lossgeom_book."):
        raise ValueError(f"module must be lossgeom_book or one of its modules, not {module!r}")
    return _BookName(module, attribute)

"""lossgeom_book: what serves only the book *Same Function, Different Geometry*.

The results ledger, glue and plot style, the table-of-contents reader, the chapters'
data loading, and the toy models and experiments of the source documents, one module per
experiment. It builds on ``lossgeom``; ``lossgeom`` never imports it.

It needs the book's dependencies beyond the library's, the ``book`` extra
(``pip install "lossgeom[book]"``); without them importing it raises
:class:`ModuleNotFoundError` naming what is missing, before any of its modules half-loads.
"""

from importlib.util import find_spec as _find_spec

#: The ``book`` extra of ``pyproject.toml``: the module each distribution provides, and its name on the index.
BOOK_DEPENDENCIES = {
    "matplotlib": "matplotlib",
    "sklearn": "scikit-learn",
    "myst_nb": "myst-nb",
    "yaml": "PyYAML",
    "sympy": "sympy",
    "curvlinops": "curvlinops-for-pytorch",
    "plotly": "plotly",
}

_missing = [module for module in BOOK_DEPENDENCIES if _find_spec(module) is None]
if _missing:
    raise ModuleNotFoundError(
        "lossgeom_book serves the book and needs its extra dependencies, missing here: "
        + ", ".join(BOOK_DEPENDENCIES[module] for module in _missing)
        + '; pip install "lossgeom[book]" adds them (".[book]" from a checkout). '
        "The library, lossgeom, needs only torch, numpy, scipy and tqdm.",
        name=_missing[0],
    )
del _missing

"""Every library name the book's prose cites exists: ``lossgeom.x.y`` in backticks resolves.

Prose names functions (``lossgeom_book.softmax_head.reference_ratio``) so that a reader can call
them; when the library moves a name, the sentence must move with it.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([*ROOT.glob("chapters/*.md"), *ROOT.glob("appendices/*.md"), ROOT / "intro.md", ROOT / "README.md"])
CITED = re.compile(r"`(lossgeom(?:_book)?(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?:\(\))?`")


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a module or an attribute reachable from one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_resolves_tells_a_real_name_from_a_stale_one():
    assert resolves("lossgeom.curvature")
    assert resolves("lossgeom.contract.MeasurementContract")
    assert not resolves("lossgeom.softmax_no_such_module.ratio")
    assert not resolves("lossgeom.contract.NoSuchName")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_library_name_exists(page):
    stale = sorted({name for name in CITED.findall(page.read_text()) if not resolves(name)})
    assert stale == []

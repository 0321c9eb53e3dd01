"""One spelling per concept in every public signature of ``lossgeom``.

The glossary (appendices/package.md, "Argument names"): tolerance ``tol``, product budget
``n_probes``, step size ``lr``, optimiser ``optimiser`` (British in our names), seed ``seed``.
The test walks every public module of ``lossgeom`` (its ``__all__``, else the names it
defines without a leading underscore), every public function and class there, and every
class's ``__init__`` (a dataclass's fields), public methods and properties' setters, and
refuses the other spellings.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import types

import pytest

import lossgeom

#: banned parameter name -> the glossary's name
BANNED = {
    "rtol": "tol",
    "relative_tolerance": "tol",
    "tolerance": "tol",
    "gtol": "tol",
    "n_hvp": "n_probes",  # a budget; a result dataclass reports the products it spent as n_hvp
    "learning_rate": "lr",
    "learning_rates": "lr",
    "optimizer": "optimiser",
    "random_state": "seed",
    "rng_seed": "seed",
}
#: banned inside any parameter name (and, for "optimizer", inside any callable's own name)
BANNED_PARTS = {"optimizer": "optimiser", "learning_rate": "lr"}
#: fields a result dataclass may carry under a name that is banned as an input
RESULT_FIELDS = {"n_hvp"}

#: (qualified callable, parameter) pairs still spelled otherwise, each with its owner; remove an
#: entry when its module moves to the glossary's name (the test fails on a stale entry)
ALLOWED = {
    # owner Q (atlas): tolerances of a cell/measure and of the atlas
    ("lossgeom.atlas.columns.Cell", "tolerance"),
    ("lossgeom.atlas.measures.Measure", "tolerance"),
    ("lossgeom.atlas.table.atlas", "rtol"),
    # owner Q (symmetries.module_audit): the audit's tolerance and its table's record of it
    ("lossgeom.symmetries.module_audit.audit", "rtol"),
    ("lossgeom.symmetries.module_audit.AuditTable", "relative_tolerance"),
    # owner S (symmetries.core): the audit report's absolute and relative tolerances
    ("lossgeom.symmetries.core.AuditReport", "tolerance"),
    ("lossgeom.symmetries.core.AuditReport", "relative_tolerance"),
    # owner Q (flatness.stability): the step sizes of the SGD stability analysis
    ("lossgeom.flatness.stability.stability_operator", "learning_rate"),
    ("lossgeom.flatness.stability.stability_lambda_max", "learning_rate"),
    ("lossgeom.flatness.stability.stable_pairs", "learning_rates"),
    ("lossgeom.flatness.stability.stable_pair_grid", "learning_rates"),
}


def public_modules(package: types.ModuleType = lossgeom) -> list[types.ModuleType]:
    """Every module of ``package`` with no private part in its dotted name."""
    found = [package]
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        found.append(importlib.import_module(info.name))
    return found


def _public_names(module: types.ModuleType) -> list[str]:
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [
        name
        for name, obj in vars(module).items()
        if not name.startswith("_") and getattr(obj, "__module__", None) == module.__name__
    ]


def _signatures(obj: object, qualname: str) -> list[tuple[str, inspect.Signature]]:
    """``(qualified name, signature)`` of a function, or of a class's constructor and public methods."""
    out = []
    if inspect.isclass(obj):
        try:
            out.append((qualname, inspect.signature(obj)))
        except (TypeError, ValueError):
            pass
        for name, member in vars(obj).items():
            if name.startswith("_"):
                continue
            func = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
            if isinstance(member, property):
                func = member.fset
            if inspect.isfunction(func):
                out.append((f"{qualname}.{name}", inspect.signature(func)))
    elif callable(obj):
        try:
            out.append((qualname, inspect.signature(obj)))
        except (TypeError, ValueError):
            pass
    return out


def violations(module: types.ModuleType) -> list[tuple[str, str, str]]:
    """``(qualified callable, offending name, glossary name)`` for every banned spelling in ``module``."""
    found = []
    for name in _public_names(module):
        obj = getattr(module, name)
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        home = getattr(obj, "__module__", "") or ""
        if not home.startswith(module.__name__.split(".")[0]):
            continue  # torch's, numpy's or typing's own names
        qualname = f"{home}.{obj.__qualname__}"
        is_result = dataclasses.is_dataclass(obj)
        for where, signature in _signatures(obj, qualname):
            own = where.rsplit(".", 1)[-1]
            if "optimizer" in own.lower():
                found.append((where, own, BANNED_PARTS["optimizer"]))
            for parameter in signature.parameters:
                if is_result and where == qualname and parameter in RESULT_FIELDS:
                    continue
                good = BANNED.get(parameter) or next(
                    (g for part, g in BANNED_PARTS.items() if part in parameter.lower()), None
                )
                if good is not None:
                    found.append((where, parameter, good))
    return found


def all_violations() -> set[tuple[str, str, str]]:
    """The banned spellings across every public module of ``lossgeom``."""
    return {v for module in public_modules() for v in violations(module)}


def test_public_signatures_use_the_glossary_names():
    found = all_violations()
    unexpected = sorted(v for v in found if v[:2] not in ALLOWED)
    assert not unexpected, "spell these as the glossary does (appendices/package.md):\n" + "\n".join(
        f"  {where}: {bad} -> {good}" for where, bad, good in unexpected
    )


def test_allow_list_has_no_stale_entries():
    found = {v[:2] for v in all_violations()}
    stale = sorted(ALLOWED - found)
    assert not stale, f"these allow-list entries no longer occur; remove them from ALLOWED: {stale}"


def _planted_module() -> types.ModuleType:
    module = types.ModuleType("lossgeom.planted")

    def hutchpp_like(operator, n_hvp: int = 99, rtol: float = 1e-8, seed: int = 0) -> None:
        """A planted function with two banned spellings."""

    def make_optimizer(params, learning_rate: float = 0.1) -> None:
        """A planted function whose name and step size are spelled otherwise."""

    @dataclasses.dataclass(frozen=True)
    class PlantedResult:
        """A result dataclass: ``n_hvp`` reports products spent and is allowed; ``tolerance`` is not."""

        estimate: float
        n_hvp: int
        tolerance: float

    class PlantedSolver:
        """A class whose method takes a banned spelling."""

        def __init__(self, tol: float = 1e-8) -> None:
            self.tol = tol

        def solve(self, relative_tolerance: float) -> None:
            """Solve to a relative tolerance."""

    for obj in (hutchpp_like, make_optimizer, PlantedResult, PlantedSolver):
        obj.__module__ = module.__name__
        setattr(module, obj.__name__, obj)
    module.__all__ = ["hutchpp_like", "make_optimizer", "PlantedResult", "PlantedSolver"]
    return module


def test_the_check_fails_on_planted_banned_spellings():
    found = {(where.rsplit(".", 1)[-1], bad) for where, bad, _ in violations(_planted_module())}
    assert found == {
        ("hutchpp_like", "n_hvp"),
        ("hutchpp_like", "rtol"),
        ("make_optimizer", "make_optimizer"),
        ("make_optimizer", "learning_rate"),
        ("PlantedResult", "tolerance"),
        ("solve", "relative_tolerance"),
    }


@pytest.mark.parametrize("good", sorted(set(BANNED.values())))
def test_the_glossary_table_names_every_spelling(good):
    from pathlib import Path

    table = (Path(__file__).resolve().parents[1] / "appendices" / "package.md").read_text()
    section = table.split("## Argument names", 1)[1].split("\n## ", 1)[0]
    assert f"`{good}`" in section
    for bad, target in BANNED.items():
        if target == good and bad not in ("learning_rates", "random_state", "rng_seed"):
            assert f"`{bad}`" in section, f"the glossary should list `{bad}` under `{good}`"

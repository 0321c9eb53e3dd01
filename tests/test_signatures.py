"""One calling convention for the public callables of lossgeom.

Every public callable (a name in a subpackage's ``__all__``, or a public name defined in a
public module) whose first parameter is a model and that reads a loss or data has exactly
``(model, loss, data, *, params=None, group=None, ...)``: the three positional arguments, then
keyword-only extras beginning with the point and the process group. A callable that takes
neither a loss nor data reads the module alone (its structure or its parameters) and is
outside the convention. A public callable whose first parameter is a loss closure
``loss_fn(params)`` is named ``closure_*``. Exceptions are listed below, one line of reason
each; the lists must stay short and current (an entry that no longer breaks the rule is
an error).
"""

from __future__ import annotations

import fnmatch
import importlib
import inspect
import pkgutil
import types
from collections.abc import Callable, Iterator

import pytest
from torch import nn

import lossgeom

#: Model-first callables outside the convention, and why.
ALLOWED = {
    "lossgeom.symmetries.registry.find_symmetries": "reads only the model's graph; loss= only declares a softmax head",
    "lossgeom.symmetries.module_audit.audit": "checks outputs on a probe, then calls the caller's measure",
    "lossgeom.flatness.loss_point.LossPoint": "one stored point on one process; the model-first measures take group=",
    "lossgeom.curvature.references.dense_*": "dense autograd references for tests on one process: no group",
    "lossgeom.models.accuracy": "counts correct predictions: no loss",
    "lossgeom.models.loss_closure": "builds the closure loss_fn(params) of one batch, the input of the closure forms",
    "lossgeom.training.loop.indexed_loss": "builds the indexed closure loss_fn(params, indices) that train takes",
}

#: Closure-first callables not (yet) named ``closure_*``, and why.
CLOSURE_ALLOWED = {
    "lossgeom.training.loop.train": "the one training loop steps a closure loss_fn(params, indices); "
    "its model form (the user's loss module over real batches) is the next issue's",
}

MODEL_NAMES = ("model", "module")
MODEL_ANNOTATIONS = (nn.Module, "nn.Module", "torch.nn.Module")


def _public_modules() -> list[types.ModuleType]:
    found = [lossgeom]
    for info in pkgutil.walk_packages(lossgeom.__path__, "lossgeom."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            found.append(importlib.import_module(info.name))
    return found


def _public_names(module: types.ModuleType) -> list[str]:
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__
    ]


def public_callables(modules=None) -> Iterator[tuple[str, Callable]]:
    """``(qualified name, callable)`` for every public function and class, each once."""
    seen = set()
    for module in _public_modules() if modules is None else modules:
        for name in _public_names(module):
            value = getattr(module, name)
            if not (inspect.isfunction(value) or inspect.isclass(value)) or id(value) in seen:
                continue
            seen.add(id(value))
            yield f"{value.__module__}.{value.__qualname__}", value


def _parameters(value: Callable) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(value).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature
        return []


def takes_a_model(value: Callable) -> bool:
    """Whether the first parameter is a model: annotated ``nn.Module``, or named ``model`` and unannotated."""
    parameters = _parameters(value)
    if not parameters or parameters[0].name == "loss":
        return False
    first = parameters[0]
    if first.annotation in MODEL_ANNOTATIONS:
        return True
    return first.name in MODEL_NAMES and first.annotation is inspect.Parameter.empty


def reads_loss_or_data(value: Callable) -> bool:
    return any(p.name in ("loss", "data") for p in _parameters(value))


def convention_problem(value: Callable) -> str | None:
    """What breaks ``(model, loss, data, *, params=None, group=None, ...)``, or None."""
    parameters = _parameters(value)
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keyword = [p for p in parameters if p.kind is p.KEYWORD_ONLY]
    if [p.name for p in positional] != ["model", "loss", "data"]:
        return f"positional arguments {[p.name for p in positional]}, not ['model', 'loss', 'data']"
    if any(p.default is not p.empty for p in positional):
        return "model, loss and data must be required"
    if [p.name for p in keyword[:2]] != ["params", "group"] or any(p.default is not None for p in keyword[:2]):
        return f"keyword-only arguments begin {[p.name for p in keyword[:2]]}, not params=None, group=None"
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return "takes *args"
    return None


def closure_problem(name: str, value: Callable) -> str | None:
    parameters = _parameters(value)
    if parameters and parameters[0].name == "loss_fn" and not value.__name__.startswith("closure_"):
        return f"first parameter loss_fn but not named closure_* ({value.__name__})"
    return None


def _allowed(name: str, table) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in table)


def convention_violations(callables) -> dict[str, str]:
    found = {}
    for name, value in callables:
        if takes_a_model(value) and reads_loss_or_data(value):
            problem = convention_problem(value)
            if problem is not None:
                found[name] = problem
    return found


def closure_violations(callables) -> dict[str, str]:
    return {name: problem for name, value in callables if (problem := closure_problem(name, value))}


@pytest.fixture(scope="module")
def callables() -> list[tuple[str, Callable]]:
    return list(public_callables())


def test_model_first_callables_follow_the_convention(callables):
    broken = {k: v for k, v in convention_violations(callables).items() if not _allowed(k, ALLOWED)}
    assert not broken, "\n".join(f"{k}: {v}" for k, v in sorted(broken.items()))


def test_closure_forms_are_named_as_such(callables):
    broken = closure_violations(callables)
    unexplained = {k: v for k, v in broken.items() if not _allowed(k, CLOSURE_ALLOWED)}
    assert not unexplained, "\n".join(f"{k}: {v}" for k, v in sorted(unexplained.items()))


def test_the_allow_lists_are_short_and_current(callables):
    names = dict(callables)
    violations = {**convention_violations(callables), **closure_violations(callables)}
    assert len(ALLOWED) + len(CLOSURE_ALLOWED) <= 12
    for table in (ALLOWED, CLOSURE_ALLOWED):
        for pattern, reason in table.items():
            assert reason and "\n" not in reason, pattern
            matched = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
            assert matched, f"allow-list entry {pattern} names no public callable: remove it"
            assert any(n in violations for n in matched), f"{pattern} now follows the rule: remove it from the list"


# the test of the tests: planted functions that break each rule are found


def _planted_module() -> types.ModuleType:
    module = types.ModuleType("lossgeom.planted")

    def positional_extra(model: nn.Module, loss, data, probe, *, params=None, group=None) -> float:
        return 0.0

    def no_group(model, loss, data, *, params=None) -> float:
        return 0.0

    def optional_data(model, loss=None, data=None, *, params=None, group=None) -> float:
        return 0.0

    def follows(model: nn.Module, loss, data, *, params=None, group=None, tol: float = 1e-8) -> float:
        return 0.0

    def structural(model: nn.Module) -> int:
        return 0

    def lanczos(loss_fn, params) -> float:
        return 0.0

    def closure_lanczos(loss_fn, params) -> float:
        return 0.0

    for function in (positional_extra, no_group, optional_data, follows, structural, lanczos, closure_lanczos):
        function.__module__ = module.__name__
        function.__qualname__ = function.__name__
        setattr(module, function.__name__, function)
    module.__all__ = [f.__name__ for f in (positional_extra, no_group, optional_data, follows, structural)] + [
        "lanczos",
        "closure_lanczos",
    ]
    return module


def test_the_checks_find_planted_functions_that_break_the_convention():
    planted = list(public_callables([_planted_module()]))
    assert sorted(convention_violations(planted)) == [
        "lossgeom.planted.no_group",
        "lossgeom.planted.optional_data",
        "lossgeom.planted.positional_extra",
    ]
    assert convention_violations(planted)["lossgeom.planted.positional_extra"].startswith("positional arguments")
    assert list(closure_violations(planted)) == ["lossgeom.planted.lanczos"]


def test_a_function_planted_in_a_subpackage_fails_the_convention_test(monkeypatch, callables):
    def sharpness(model, loss, data, rho: float = 0.05) -> float:
        return 0.0

    from lossgeom import flatness

    sharpness.__module__, sharpness.__qualname__ = "lossgeom.flatness", "sharpness"
    monkeypatch.setattr(flatness, "sharpness", sharpness, raising=False)
    monkeypatch.setattr(flatness, "__all__", [*flatness.__all__, "sharpness"])
    with pytest.raises(
        AssertionError, match=r"lossgeom\.flatness\.sharpness: positional arguments \['model', 'loss', 'data', 'rho'\]"
    ):
        test_model_first_callables_follow_the_convention(list(public_callables()))

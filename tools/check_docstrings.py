"""Check the docstrings of lossgeom's public API (run by `make lint`).

Every public function, class and method that lossgeom's packages export (their
``__all__``, or public module-level names defined in a public module) must have a
docstring; a function or method with parameters other than ``self``/``cls`` must have an
``Args:`` section naming each of them; one that returns a value (an annotation other
than ``None``) a ``Returns:`` section. Google style, as sphinx.ext.napoleon renders it.
Exits 1 and lists every problem when there is one.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import lossgeom  # noqa: E402


def public_modules():
    """Every module of lossgeom whose dotted path has no part starting with an underscore."""
    yield lossgeom
    for info in pkgutil.walk_packages(lossgeom.__path__, "lossgeom."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            yield importlib.import_module(info.name)


def defined_here(module):
    """The public functions and classes defined in ``module`` itself (not re-exported)."""
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj) or inspect.isclass(obj):
            yield name, obj


def _parameters(func) -> list[str]:
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return []
    return [
        p.name
        for p in signature.parameters.values()
        if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


def _returns_value(func) -> bool:
    annotation = inspect.signature(func).return_annotation
    return annotation not in (inspect.Signature.empty, None, "None")


def problems_of(qualname: str, func, doc: str | None) -> list[str]:
    """What the docstring of ``func`` (shown as ``qualname``) lacks."""
    if not doc or not doc.strip():
        return [f"{qualname}: no docstring"]
    found = []
    params = _parameters(func)
    if params:
        if "Args:" not in doc:
            found.append(f"{qualname}: no Args: section (parameters {', '.join(params)})")
        else:
            args = doc.split("Args:", 1)[1]
            missing = [p for p in params if f"{p}:" not in args and f"{p} (" not in args]
            if missing:
                found.append(f"{qualname}: Args: does not name {', '.join(missing)}")
    if _returns_value(func) and "Returns:" not in doc and "Yields:" not in doc:
        found.append(f"{qualname}: no Returns: section")
    return found


def check() -> list[str]:
    """Every problem in the public API, one line each."""
    found = []
    for module in public_modules():
        for name, obj in defined_here(module):
            qualname = f"{module.__name__}.{name}"
            if inspect.isfunction(obj):
                found += problems_of(qualname, obj, obj.__doc__)
                continue
            doc = (obj.__doc__ or "").strip()
            if not doc or doc.startswith(f"{name}("):  # a dataclass's generated signature is not a docstring
                found.append(f"{qualname}: no docstring")
            for attr, member in vars(obj).items():
                if attr.startswith("_") or not inspect.isfunction(member):
                    continue
                found += problems_of(f"{qualname}.{attr}", member, member.__doc__)
    return found


def main() -> int:
    """Print the problems; 0 when there are none."""
    found = check()
    for line in found:
        print(line)
    print(f"{len(found)} docstring problem(s) in lossgeom's public API")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())

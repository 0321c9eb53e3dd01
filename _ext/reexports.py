"""Resolve references to names that a package re-exports (issue 18's layout).

The package appendix documents every object once, in the module that defines it
(``lossgeom.curvature.hessian.HessianOperator``), while docstrings and readers use the
public path (``lossgeom.curvature.HessianOperator``) or, inside a module, the bare name.
On a missing Python reference this finds the one documented object it names: a dotted
target is imported and replaced by its defining module and qualified name; a bare one
(or ``Class.method``) is matched against the documented objects' names, and resolves only
when exactly one matches, so an ambiguous reference still fails the nitpicky build.
"""

from __future__ import annotations

import importlib


def _defining_path(target: str) -> str | None:
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        module = getattr(obj, "__module__", None)
        qualname = getattr(obj, "__qualname__", None)
        if module and qualname and module.startswith("lossgeom"):
            return f"{module}.{qualname}"
        return None
    return None


def _resolve(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    if not target.startswith("lossgeom") and "lossgeom" not in (node.get("py:module") or ""):
        return None
    domain = env.get_domain("py")
    candidates = []
    if target.startswith("lossgeom"):
        path = _defining_path(target)
        if path and path != target and path in domain.objects:
            candidates = [path]
    else:
        suffix = "." + target
        candidates = [name for name in domain.objects if name.endswith(suffix) and name.startswith("lossgeom")]
    if len(candidates) != 1:
        return None
    node["reftarget"] = candidates[0]
    return domain.resolve_xref(env, node.get("refdoc"), app.builder, node.get("reftype"), candidates[0], node, contnode)


def setup(app):
    app.connect("missing-reference", _resolve)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

"""The peer libraries of the benchmark scripts that are not in the environment: imported, or installed.

PyHessian (``pyhessian==0.1``) and hessian-eigenthings (``hessian-eigenthings==1.0.0a5``)
are not dependencies of the book. If one cannot be imported, :func:`import_peer` uses the
directory named by an environment variable (PYHESSIAN_TARGET, then PEERS_TARGET, for
PyHessian; PEERS_TARGET for hessian-eigenthings), installing the package there with
``pip install --no-deps --target`` if it is not there yet, or else installs it into a
throwaway temporary directory (one per process, shared by the peers), and adds that
directory to ``sys.path``; if that fails too, it returns None and says why.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PYHESSIAN = "pyhessian==0.1"
HESSIAN_EIGENTHINGS = "hessian-eigenthings==1.0.0a5"
_THROWAWAY: list[str] = []  # the temporary directory of this process, once made


def _throwaway_dir() -> str:
    if not _THROWAWAY:
        _THROWAWAY.append(tempfile.mkdtemp(prefix="benchmark-peers-"))
    return _THROWAWAY[0]


def import_peer(module: str, requirement: str, env_vars: tuple[str, ...]):
    """``(module or None, how it was obtained)`` for ``module`` of the pip package ``requirement``.

    ``module`` is a dotted name whose first part is the package's directory (``pyhessian.hessian``);
    the first of ``env_vars`` that is set names the directory to import from or install into.
    """
    try:
        found = importlib.import_module(module)
        return found, f"already importable (from {Path(found.__file__).parents[module.count('.') + 1]})"
    except ImportError:
        pass
    package = module.split(".")[0]
    var = next((v for v in env_vars if os.environ.get(v)), None)
    target = os.environ[var] if var else _throwaway_dir()
    where = f"the directory in {var}" if var else "a throwaway directory"
    if (Path(target) / package).is_dir():
        how = f"imported from {where} ({target})"
    else:
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps"]
        result = subprocess.run([*cmd, "--target", target, requirement], capture_output=True, text=True)
        if result.returncode != 0:
            print(f"{requirement} skipped: could not install it ({result.stderr.strip()[-200:]})")
            return None, "not installed"
        how = f"installed with --no-deps into {where}"
    if target not in sys.path:
        sys.path.insert(0, target)
    try:
        return importlib.import_module(module), how
    except ImportError as err:
        print(f"{requirement} skipped: {err}")
        return None, "import failed"


def import_pyhessian():
    """``(pyhessian.hessian module or None, how it was obtained)``."""
    return import_peer("pyhessian.hessian", PYHESSIAN, ("PYHESSIAN_TARGET", "PEERS_TARGET"))


def import_hessian_eigenthings():
    """``(hessian_eigenthings module or None, how it was obtained)``."""
    return import_peer("hessian_eigenthings", HESSIAN_EIGENTHINGS, ("PEERS_TARGET",))

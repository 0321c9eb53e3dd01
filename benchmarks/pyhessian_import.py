"""PyHessian for the benchmark scripts: imported, or installed into a throwaway directory.

PyHessian (``pyhessian==0.1``) is not a dependency of the book. If it cannot be imported,
:func:`import_pyhessian` installs it with ``pip install --no-deps --target <temporary dir>``
(or uses the directory named by the environment variable PYHESSIAN_TARGET) and adds that
directory to ``sys.path``; if that fails too, it returns None and says why.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def import_pyhessian():
    """``(pyhessian.hessian module or None, how it was obtained)``."""
    try:
        return importlib.import_module("pyhessian.hessian"), "already importable"
    except ImportError:
        pass
    target = os.environ.get("PYHESSIAN_TARGET") or tempfile.mkdtemp(prefix="pyhessian-")
    if not (Path(target) / "pyhessian").is_dir():
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--target",
            target,
            "pyhessian==0.1",
        ]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            print(f"PyHessian skipped: could not install pyhessian==0.1 ({result.stderr.strip()[-200:]})")
            return None, "not installed"
    sys.path.insert(0, target)
    try:
        return importlib.import_module("pyhessian.hessian"), "installed with --no-deps into a throwaway directory"
    except ImportError as err:
        print(f"PyHessian skipped: {err}")
        return None, "import failed"

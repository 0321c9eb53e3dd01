"""A random sample of single-token mutants of ``src/lossgeom``, run against ``tests/`` alone.

Each mutant changes one token of one module: a comparison or arithmetic operator flipped
(``<`` to ``<=``, ``+`` to ``-``, ...), a number changed (``0`` to ``1``, ``n`` to ``n + 1``,
``1e-10`` to ``1e-9``), ``and``/``or`` swapped, ``True``/``False`` swapped, or ``is`` /
``is not`` / ``in`` / ``not in`` negated. Sites are every such token outside strings and
comments; the sample is uniform over sites, seeded. A mutant is *killed* when the tests of
its package (``tests/<package>/``, the architecture property tests and the risk and model
tests) fail, or failing that, when the whole of ``tests/`` fails; otherwise it *survives*,
and the survivors are listed for a person to judge which are equivalent (no input can tell
them from the original).

Usage: ``python benchmarks/mutation_sample.py [--n 30] [--seed 0] [--only FILE:LINE:COL ...]``;
writes ``benchmarks/results/mutation_sample.json``. Each mutant runs in a copy of ``src``
and ``tests`` under a temporary directory, so the working tree is never edited.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SWAPS = {
    "<": "<=",
    "<=": "<",
    ">": ">=",
    ">=": ">",
    "==": "!=",
    "!=": "==",
    "+": "-",
    "-": "+",
    "*": "/",
    "/": "*",
    "//": "/",
    "**": "*",
    "and": "or",
    "or": "and",
    "True": "False",
    "False": "True",
    "is": "is not",
    "in": "not in",
}


def _number(text: str) -> str | None:
    """A changed number: ints ``n -> n + 1`` (``0 -> 1``), floats with an exponent one decade up, others x 2."""
    try:
        value = int(text, 0)
        return str(value + 1)
    except ValueError:
        pass
    if "e" in text.lower():
        mantissa, exponent = text.lower().split("e")
        return f"{mantissa}e{int(exponent) + 1}"
    try:
        return repr(float(text) * 2) if float(text) != 0 else "1.0"
    except ValueError:
        return None


def _loop_in(tokens, i: int) -> bool:
    """Whether the ``in`` at ``tokens[i]`` belongs to a ``for`` (loop or comprehension)."""
    for tok in reversed(tokens[:i]):
        if tok.type in (tokenize.NEWLINE, tokenize.NL) or tok.string in ("in", "if", "=", ":"):
            return False
        if tok.string == "for":
            return True
    return False


def sites(path: Path) -> list[tuple[int, int, str, str]]:
    """Every mutable token of ``path``: ``(line, column, original, replacement)``."""
    found = []
    tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.NUMBER:
            new = _number(tok.string)
        elif tok.type in (tokenize.OP, tokenize.NAME) and tok.string in SWAPS:
            new = SWAPS[tok.string]
            following = tokens[i + 1].string if i + 1 < len(tokens) else ""
            previous = tokens[i - 1].string if i else ""
            if tok.string == "is" and following == "not":
                new = "is"  # 'is not' -> 'is' (drop the 'not' below)
            if tok.string == "in" and (previous == "not" or _loop_in(tokens, i)):
                continue  # 'not in' is mutated at 'not'; 'for x in' is not an operator
            if tok.string in ("*", "**") and previous in ("(", ",", "{", "[", ""):
                continue  # star-args and unpacking, not arithmetic
        elif tok.type == tokenize.NAME and tok.string == "not" and i + 1 < len(tokens) and tokens[i + 1].string == "in":
            new = ""  # 'not in' -> 'in'
        else:
            continue
        if new is None or new == tok.string:
            continue
        found.append((tok.start[0], tok.start[1], tok.string, new))
    return found


def mutate(text: str, line: int, column: int, original: str, replacement: str) -> str:
    lines = text.splitlines(keepends=True)
    row = lines[line - 1]
    assert row[column : column + len(original)] == original, (line, column, original)
    if original == "is" and replacement == "is":
        tail = row[column + 2 :]
        assert tail.lstrip().startswith("not")
        lines[line - 1] = row[:column] + "is" + tail.lstrip()[3:]
    elif original == "not" and replacement == "":
        lines[line - 1] = row[:column] + row[column + 4 :]
    else:
        lines[line - 1] = row[:column] + replacement + row[column + len(original) :]
    return "".join(lines)


def _targeted(module: Path, work: Path) -> list[str]:
    package = module.relative_to(work / "src" / "lossgeom").parts
    tests = ["tests/test_architectures.py", "tests/test_architectures_measures.py", "tests/test_risk.py"]
    tests.append("tests/test_models.py")
    if len(package) > 1 and (work / "tests" / package[0]).is_dir():
        tests.insert(0, f"tests/{package[0]}")
    return tests


def _run(work: Path, tests: list[str], timeout: float) -> str:
    env = dict(os.environ, PYTHONPATH=str(work / "src"), PYTHONHASHSEED="0", OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile"]
    try:
        result = subprocess.run(command + tests, cwd=work, env=env, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "killed (timeout)"
    return "survived" if result.returncode == 0 else "killed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="*", help="FILE:LINE:COL sites to rerun instead of a sample")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "mutation_sample.json"))
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in ("src", "tests", "pyproject.toml", "README.md"):
            source = ROOT / name
            (shutil.copytree if source.is_dir() else shutil.copy)(source, work / name)
        # sites and texts are read from the copy, so edits to the working tree meanwhile do not matter
        modules = sorted((work / "src" / "lossgeom").rglob("*.py"))
        every = [(m, *site) for m in modules for site in sites(m)]
        if args.only:
            wanted = {tuple(item.rsplit(":", 2)) for item in args.only}
            chosen = [s for s in every if (str(s[0].relative_to(work)), str(s[1]), str(s[2])) in wanted]
        else:
            chosen = random.Random(args.seed).sample(every, args.n)
        for module, line, column, original, replacement in chosen:
            relative = module.relative_to(work)
            text = module.read_text()
            (work / relative).write_text(mutate(text, line, column, original, replacement))
            status = _run(work, _targeted(module, work), 900)
            stage = "package tests"
            if status == "survived":
                status, stage = _run(work, ["tests"], 1800), "tests/"
            (work / relative).write_text(text)
            row = dict(
                site=f"{relative}:{line}:{column}",
                code=text.splitlines()[line - 1].strip(),
                original=original,
                replacement=replacement or "(removed)",
                status=status,
                decided_by=stage,
            )
            results.append(row)
            print(json.dumps(row), flush=True)
    killed = sum(r["status"].startswith("killed") for r in results)
    summary = dict(sites=len(every), sampled=len(results), seed=args.seed, killed=killed, mutants=results)
    Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    print(f"{killed} of {len(results)} mutants killed by tests/ ({len(every)} sites)")


if __name__ == "__main__":
    main()

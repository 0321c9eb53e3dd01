"""Set-up plus one product of the GGN and the two Fisher operators: wall time and peak memory.

A tanh MLP on 10 classes, batch 256, float64, one thread; each operator runs in a fresh
process so that its peak resident memory (``ru_maxrss``) is its own. Writes
``benchmarks/results/fisher_matrix_free.json``. Usage:
``python benchmarks/fisher_matrix_free.py [--hidden 300 200] [--inputs 100]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _one(kind: str, inputs: int, hidden: list[int]) -> dict:
    import torch
    from torch import nn

    from lossgeom import curvature

    torch.set_num_threads(1)
    torch.manual_seed(0)
    widths = [inputs, *hidden, 10]
    layers = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(a, b, dtype=torch.float64), nn.Tanh()]
    model = nn.Sequential(*layers[:-1])
    x, y = torch.randn(256, inputs, dtype=torch.float64), torch.randint(0, 10, (256,))
    loss = nn.CrossEntropyLoss()
    start = time.perf_counter()
    if kind == "ggn":
        operator = curvature.ggn_operator(model, loss, (x, y))
    else:
        operator = curvature.fisher_operator(model, loss, (x, y), kind=kind)
    operator @ torch.randn(operator.shape[0], dtype=torch.float64)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB (Linux reports KiB)
    return dict(operator=kind, parameters=operator.shape[0], seconds=round(seconds, 2), peak_rss_mib=round(peak))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=100)
    parser.add_argument("--hidden", type=int, nargs="+", default=[300, 200])
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_one(args.one, args.inputs, args.hidden)))
        return
    rows = []
    for kind in ("ggn", "empirical", "true"):
        command = [sys.executable, __file__, "--one", kind, "--inputs", str(args.inputs), "--hidden"]
        out = subprocess.run(command + [str(h) for h in args.hidden], capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout))
        print(rows[-1], flush=True)
    result = dict(batch=256, classes=10, dtype="float64", threads=1, rows=rows)
    (ROOT / "benchmarks" / "results" / "fisher_matrix_free.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

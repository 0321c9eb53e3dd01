#!/usr/bin/env python3
"""Curvature at scale: Hessian-vector products on one and two gloo ranks of this machine.

Usage, from the repository root:

    .venv/bin/python benchmarks/distributed_scaling.py            # the full run (about 2 minutes)
    .venv/bin/python benchmarks/distributed_scaling.py --quick    # a smoke test

It writes ``benchmarks/results/distributed_scaling.json``, which the appendix page
``appendices/scaling.md`` renders (the page never runs this script).

Setting: tanh MLPs ``64 -> w -> w -> 10`` (about 1e4 and 1e5 parameters), float64, the mean
cross-entropy on 4096 seeded random examples in all, one torch thread per rank, ranks
spawned with ``torch.multiprocessing`` on loopback (gloo, as ``torchrun`` would). Two runs
per size: *strong* scaling (the 4096 examples split over the ranks) and *weak* scaling (4096
examples per rank). Per rank, in batches of 512 examples, are measured:

- seconds per Hessian-vector product with ``group=`` (what a user gets), median of 5
  blocks of 4 products after one untimed block;
- seconds per product of the same rank's local operator (``group=None`` on its shard):
  the computation alone;
- seconds per ``all_reduce`` of one ``n``-vector (the communication a product adds),
  median of 20.

The communication share is the all-reduce time over the product time. Each rank must
equal the one-process result on the concatenated data (checked to 1e-10 on the first
product).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402

from lossgeom.curvature import hessian_operator  # noqa: E402

RESULT = Path(__file__).resolve().parent / "results" / "distributed_scaling.json"
BATCH = 512


def mlp(width: int) -> nn.Module:
    torch.manual_seed(0)
    f64 = torch.float64
    return nn.Sequential(
        nn.Linear(64, width, dtype=f64),
        nn.Tanh(),
        nn.Linear(width, width, dtype=f64),
        nn.Tanh(),
        nn.Linear(width, 10, dtype=f64),
    ).eval()


def examples(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 64, dtype=torch.float64, generator=g), torch.randint(0, 10, (n,), generator=g)


def batches(x, y):
    return [(x[i : i + BATCH], y[i : i + BATCH]) for i in range(0, len(x), BATCH)]


def seconds_per_product(operator, v: torch.Tensor, blocks: int) -> float:
    operator.matmat(v)  # untimed: warm-up
    times = []
    for _ in range(blocks):
        start = time.perf_counter()
        operator.matmat(v)
        times.append((time.perf_counter() - start) / v.shape[1])
    return statistics.median(times)


def rank_run(rank: int, world: int, init: str, out: str, width: int, total: int, weak: bool, blocks: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    group = dist.group.WORLD
    model = mlp(width)
    per_rank = total if weak else total // world
    x, y = examples(per_rank * world, seed=1)
    shard = batches(x[rank * per_rank : (rank + 1) * per_rank], y[rank * per_rank : (rank + 1) * per_rank])
    shared = hessian_operator(model, nn.CrossEntropyLoss(), shard, group=group)
    n = shared.shape[0]
    v = torch.randn(n, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    first = shared.matmat(v[:, :1])
    local = hessian_operator(model, nn.CrossEntropyLoss(), shard)
    with_group = seconds_per_product(shared, v, blocks)
    computation = seconds_per_product(local, v, blocks)
    reduce_times = []
    buffer = torch.randn(n, dtype=torch.float64)
    for _ in range(20):
        dist.barrier(group)
        start = time.perf_counter()
        dist.all_reduce(buffer, group=group)
        reduce_times.append(time.perf_counter() - start)
    torch.save(
        {
            "rank": rank,
            "examples": per_rank,
            "n": n,
            "seconds_per_product": with_group,
            "computation_seconds_per_product": computation,
            "all_reduce_seconds": statistics.median(reduce_times),
            "first_product": first,
        },
        Path(out) / f"rank{rank}.pt",
    )
    dist.destroy_process_group()


def one_setting(world: int, width: int, total: int, weak: bool, blocks: int) -> dict:
    with tempfile.TemporaryDirectory() as where:
        mp.spawn(rank_run, args=(world, f"{where}/init", where, width, total, weak, blocks), nprocs=world)
        ranks = [torch.load(Path(where) / f"rank{r}.pt", weights_only=False) for r in range(world)]
    per_rank = ranks[0]["examples"]
    x, y = examples(per_rank * world, seed=1)
    one = hessian_operator(mlp(width), nn.CrossEntropyLoss(), batches(x, y))
    v = torch.randn(one.shape[0], 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    reference = one.matmat(v[:, :1])
    error = max(float((r["first_product"] - reference).abs().max()) for r in ranks) / float(reference.abs().max())
    if error > 1e-10:
        raise AssertionError(f"rank products differ from one process by {error:.2e} (relative)")
    product = max(r["seconds_per_product"] for r in ranks)
    reduce = max(r["all_reduce_seconds"] for r in ranks) if world > 1 else 0.0
    return {
        "ranks": world,
        "scaling": "weak" if weak else "strong",
        "parameters": ranks[0]["n"],
        "examples_per_rank": per_rank,
        "examples_in_all": per_rank * world,
        "seconds_per_product": product,
        "computation_seconds_per_product": max(r["computation_seconds_per_product"] for r in ranks),
        "all_reduce_seconds": reduce,
        "communication_share": reduce / product,
        "products_per_second_per_rank": 1.0 / product,
        "examples_per_second": per_rank * world / product,
        "bytes_per_product_per_rank": ranks[0]["n"] * 8,
        "max_rel_error_vs_one_process": error,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one small size, two blocks")
    args = parser.parse_args()
    widths = [64] if args.quick else [80, 300]
    blocks = 2 if args.quick else 5
    total = 1024 if args.quick else 4096
    start = time.perf_counter()
    load_at_start = os.getloadavg()[0]
    runs = []
    for width in widths:
        for weak in (False, True):
            for world in (1, 2):
                if weak and world == 1:
                    continue  # the one-rank run is the same for both
                runs.append(one_setting(world, width, total, weak, blocks))
                print(json.dumps(runs[-1]), flush=True)
    result = {
        "what": "Hessian-vector products with group= on 1 and 2 gloo ranks (loopback), tanh MLPs, float64",
        "setting": {"batch": BATCH, "examples": total, "widths": widths, "threads_per_rank": 1, "quick": args.quick},
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpu_count": os.cpu_count(),
            "machine": platform.machine(),
            "load_average_1min_at_start": load_at_start,
            "load_average_1min_at_end": os.getloadavg()[0],
        },
        "runs": runs,
        "total_seconds": time.perf_counter() - start,
    }
    if not args.quick:
        RESULT.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1)[:2000], file=sys.stderr)


if __name__ == "__main__":
    main()

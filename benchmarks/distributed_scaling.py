#!/usr/bin/env python3
"""Curvature at scale: Hessian-vector products on one and two gloo ranks of this machine.

Usage, from the repository root:

    .venv/bin/python benchmarks/distributed_scaling.py                    # both cases, the full run
    .venv/bin/python benchmarks/distributed_scaling.py --case mlp         # the MLPs (about 2 minutes)
    .venv/bin/python benchmarks/distributed_scaling.py --case resnet18    # the ResNet-18 (about 3 minutes)
    .venv/bin/python benchmarks/distributed_scaling.py --quick            # a smoke test of both

It writes ``benchmarks/results/distributed_scaling.json``, which the appendix page
``appendices/scaling.md`` renders (the page never runs this script). A case's entry is
replaced by each run of that case, except that a ``--quick`` run never replaces a full one
(it writes its entry, marked ``"quick": true``, only where there is none or a quick one).

Ranks are spawned with ``torch.multiprocessing`` on loopback (gloo, as ``torchrun`` would).

**mlp** (the top-level keys of the JSON): tanh MLPs ``64 -> w -> w -> 10`` (about 1e4 and
1e5 parameters), float64, the mean cross-entropy on 4096 seeded random examples in all, one
torch thread per rank. Two runs per size: *strong* scaling (the 4096 examples split over
the ranks) and *weak* scaling (4096 examples per rank). Per rank, in batches of 512
examples, are measured:

- seconds per Hessian-vector product with ``group=`` (what a user gets), median of 5
  blocks of 4 products after one untimed block;
- seconds per product of the same rank's local operator (``group=None`` on its shard):
  the computation alone;
- seconds per ``all_reduce`` of one ``n``-vector (the communication a product adds),
  median of 20.

The communication share is the all-reduce time over the product time. Each rank must
equal the one-process result on the concatenated data (checked to 1e-10 on the first
product).

**resnet18** (the key ``"resnet18"``): the ResNet-18 of ``benchmarks/scale_models.py``
(11,173,962 parameters, float32, batch norm in eval mode), the mean cross-entropy on one
global batch of seeded random 32x32 images (``--batch``, 32 by default), split evenly over
2 ranks of one thread each, against the same batch on 1 rank of one thread and on 1 rank
of two threads (each rank's shard is one batch, so its gradient's graph is kept between
products). Per rank:

- seconds per product ``H.matvec(v)`` with ``group=`` (a float32 vector of ``n``
  entries), each product timed alone after a barrier, one untimed product first; the
  setting's time is, per product, the slowest rank's, and its median over ``--products``;
- seconds of the rank's own gradient step on its shard (``loss(model(x), y).backward()``,
  no all-reduce), median of ``--gradients`` after one untimed;
- the all-reduce, two ways: one ``all_reduce`` of a float32 ``n``-vector timed on its own
  after a barrier (median of 10: the communication a product adds; its share of the
  product is the *communication share*), and the ``all_reduce`` inside each product,
  instrumented (it also holds the wait for the slower rank);
- the peak resident memory of the rank process (``ru_maxrss``), after the gradient steps
  and at the end.

The first product (untimed) of every setting is compared with the 1-rank, 1-thread one:
the relative difference ``||a - b|| / ||b||`` is reported, and must be below 1e-4 (float32
rounding of sums over the batch taken in another order); the ranks of a setting must agree
bit for bit.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from scale_models import n_params, resnet18, resnet_batch  # noqa: E402
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


def mlp_case(quick: bool) -> dict:
    """The MLP runs: strong and weak scaling at two sizes (one at ``quick``)."""
    widths = [64] if quick else [80, 300]
    blocks = 2 if quick else 5
    total = 1024 if quick else 4096
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
    return {
        "what": "Hessian-vector products with group= on 1 and 2 gloo ranks (loopback), tanh MLPs, float64",
        "setting": {"batch": BATCH, "examples": total, "widths": widths, "threads_per_rank": 1, "quick": quick},
        "environment": environment(load_at_start),
        "runs": runs,
        "total_seconds": time.perf_counter() - start,
    }


def environment(load_at_start: float) -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "load_average_1min_at_start": load_at_start,
        "load_average_1min_at_end": os.getloadavg()[0],
    }


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes


def resnet_rank_run(
    rank: int, world: int, threads: int, init: str, out: str, batch: int, products: int, gradients: int
) -> None:
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    group = dist.group.WORLD
    model, loss = resnet18(), nn.CrossEntropyLoss()
    x, y = resnet_batch(batch, seed=1)
    per_rank = batch // world
    shard = (x[rank * per_rank : (rank + 1) * per_rank], y[rank * per_rank : (rank + 1) * per_rank])
    gradient_times = []
    for _ in range(gradients + 1):  # the first untimed
        model.zero_grad(set_to_none=True)
        dist.barrier(group)
        start = time.perf_counter()
        loss(model(shard[0]), shard[1]).backward()
        gradient_times.append(time.perf_counter() - start)
    model.zero_grad(set_to_none=True)
    rss_after_gradients = peak_rss_mb()
    dist.barrier(group)
    start = time.perf_counter()
    H = hessian_operator(model, loss, shard, group=group)
    setup = time.perf_counter() - start
    v = torch.randn(H.shape[0], dtype=torch.float32, generator=torch.Generator().manual_seed(2))
    first = H.matvec(v)  # untimed: the product compared across settings
    original, inside = dist.all_reduce, []

    def timed_all_reduce(tensor, *args, **kwargs):  # the product's own all-reduce, instrumented
        begin = time.perf_counter()
        result = original(tensor, *args, **kwargs)
        inside[-1] += time.perf_counter() - begin
        return result

    product_times = []
    dist.all_reduce = timed_all_reduce
    try:
        for _ in range(products):
            dist.barrier(group)
            inside.append(0.0)
            start = time.perf_counter()
            H.matvec(v)
            product_times.append(time.perf_counter() - start)
    finally:
        dist.all_reduce = original
    reduce_times, buffer = [], torch.randn(H.shape[0], dtype=torch.float32)
    for _ in range(10):
        dist.barrier(group)
        start = time.perf_counter()
        dist.all_reduce(buffer, group=group)
        reduce_times.append(time.perf_counter() - start)
    torch.save(
        {
            "n": H.shape[0],
            "product_seconds": product_times,
            "all_reduce_in_product_seconds": inside,
            "gradient_seconds": gradient_times[1:],
            "setup_seconds": setup,
            "all_reduce_seconds": statistics.median(reduce_times),
            "peak_rss_mb_after_gradients": rss_after_gradients,
            "peak_rss_mb": peak_rss_mb(),
            "first_product": first,
        },
        Path(out) / f"rank{rank}.pt",
    )
    dist.destroy_process_group()


def resnet_setting(world: int, threads: int, batch: int, products: int, gradients: int) -> tuple[dict, torch.Tensor]:
    """One setting of the ResNet-18: its row, and its first product."""
    with tempfile.TemporaryDirectory() as where:
        mp.spawn(
            resnet_rank_run,
            args=(world, threads, f"{where}/init", where, batch, products, gradients),
            nprocs=world,
        )
        ranks = [torch.load(Path(where) / f"rank{r}.pt", weights_only=False) for r in range(world)]
    first = ranks[0]["first_product"]
    if any(not torch.equal(r["first_product"], first) for r in ranks[1:]):
        raise AssertionError("the ranks' products differ (every rank should receive the same all-reduced vector)")
    per_product = [max(times) for times in zip(*(r["product_seconds"] for r in ranks))]
    per_gradient = [max(times) for times in zip(*(r["gradient_seconds"] for r in ranks))]
    product = statistics.median(per_product)
    gradient = statistics.median(per_gradient)
    reduce = max(r["all_reduce_seconds"] for r in ranks) if world > 1 else 0.0
    inside = [max(times) for times in zip(*(r["all_reduce_in_product_seconds"] for r in ranks))]
    row = {
        "ranks": world,
        "threads_per_rank": threads,
        "cores_used": world * threads,
        "parameters": ranks[0]["n"],
        "images_per_rank": batch // world,
        "images_in_all": batch,
        "seconds_per_product": product,
        "product_seconds_all": per_product,
        "gradient_seconds_per_rank": gradient,
        "product_over_gradient": product / gradient,
        "setup_seconds": max(r["setup_seconds"] for r in ranks),
        "all_reduce_seconds": reduce,
        "communication_share": reduce / product,
        "all_reduce_in_product_seconds": statistics.median(inside) if world > 1 else 0.0,
        "bytes_per_product_per_rank": ranks[0]["n"] * first.element_size(),
        "peak_rss_mb_per_rank_after_gradients": max(r["peak_rss_mb_after_gradients"] for r in ranks),
        "peak_rss_mb_per_rank": max(r["peak_rss_mb"] for r in ranks),
    }
    return row, first


def resnet_case(batch: int, products: int, gradients: int, quick: bool) -> dict:
    """The ResNet-18 runs: 1 rank of 1 and of 2 threads, 2 ranks of 1 thread, on one global batch."""
    if batch < 2 or batch % 2:
        raise ValueError(f"--batch must be an even number of images of at least 2, got {batch}")
    start = time.perf_counter()
    load_at_start = os.getloadavg()[0]
    runs, reference = [], None
    for world, threads in ((1, 1), (1, 2), (2, 1)):
        row, first = resnet_setting(world, threads, batch, products, gradients)
        if reference is None:
            reference = first
        row["rel_diff_vs_one_rank"] = float((first - reference).norm() / reference.norm())
        row["max_abs_diff_over_max_abs_vs_one_rank"] = float((first - reference).abs().max() / reference.abs().max())
        if row["rel_diff_vs_one_rank"] > 1e-4:
            raise AssertionError(f"{world} rank(s) of {threads} thread(s) differ from 1 rank by {row}")
        runs.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "product_seconds_all"}), flush=True)
    one, two_threads, two_ranks = (r["seconds_per_product"] for r in runs)
    return {
        "what": "ResNet-18 Hessian-vector products with group= on 1 and 2 gloo ranks (loopback), float32, "
        "batch norm in eval mode",
        "setting": {
            "model": "ResNet-18 of benchmarks/scale_models.py (CIFAR stem, 32x32 inputs, 10 classes)",
            "parameters": n_params(resnet18()),
            "global_batch": batch,
            "products_timed": products,
            "gradients_timed": gradients,
            "all_reduce_timing": "one all_reduce of a float32 n-vector timed alone after a barrier (median of "
            "10); also the product's own all_reduce instrumented (it includes the wait for the slower rank)",
            "quick": quick,
        },
        "environment": environment(load_at_start),
        "runs": runs,
        "speedup_two_ranks_over_one_rank_one_thread": one / two_ranks,
        "speedup_two_ranks_over_one_rank_two_threads": two_threads / two_ranks,
        "total_seconds": time.perf_counter() - start,
    }


def write(result: dict, case: str, entry: dict) -> None:
    """Put a case's entry into the JSON (the MLP's at the top level), unless a quick one would replace a full one."""
    old = result.get("resnet18") if case == "resnet18" else (result if "runs" in result else None)
    if entry["setting"]["quick"] and old is not None and not old["setting"]["quick"]:
        print(f"{case}: a quick run does not replace the full results; not written", file=sys.stderr)
        return
    if case == "resnet18":
        result["resnet18"] = entry
    else:
        kept = {"resnet18": result["resnet18"]} if "resnet18" in result else {}
        result.clear()
        result.update(entry | kept)
    RESULT.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{case}: written to {RESULT}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats (a smoke test)")
    parser.add_argument("--case", choices=("mlp", "resnet18", "all"), default="all")
    parser.add_argument("--batch", type=int, default=None, help="ResNet-18 global batch (32; quick: 2)")
    parser.add_argument("--products", type=int, default=None, help="ResNet-18 products timed (5; quick: 2)")
    parser.add_argument("--gradients", type=int, default=None, help="ResNet-18 gradients timed (5; quick: 2)")
    args = parser.parse_args()
    result = json.loads(RESULT.read_text()) if RESULT.exists() else {}
    if args.case in ("mlp", "all"):
        write(result, "mlp", mlp_case(args.quick))
    if args.case in ("resnet18", "all"):
        few = 2 if args.quick else 5
        entry = resnet_case(
            args.batch or (2 if args.quick else 32), args.products or few, args.gradients or few, args.quick
        )
        write(result, "resnet18", entry)
        print(json.dumps({k: v for k, v in entry.items() if k != "runs"}, indent=1), file=sys.stderr)


if __name__ == "__main__":
    main()

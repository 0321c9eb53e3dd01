"""One rank of the data-parallel tests (``tests/curvature/test_data_parallel.py``), run under gloo.

Every rank builds the same model and the same 23 examples, keeps only its own shard (shards
of unequal sizes, cut into batches of at most 5, so batches differ in size too), measures
with ``group=`` and saves what it measured; the test compares every rank's numbers with each
other (bit for bit) and with one process on the concatenated data.
"""

from __future__ import annotations

import copy
import pathlib

import torch
import torch.distributed as dist
from torch import nn

from lossgeom import curvature

#: examples per rank, by world size (23 in all: unequal on purpose)
SHARDS = {2: (9, 14), 3: (4, 11, 8)}
BATCH = 5
N_EXAMPLES = 23


def problem() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The model (tanh MLP 5 -> 6 -> 3, float64) and all the data, identical on every rank."""
    torch.manual_seed(0)
    f64 = torch.float64
    model = nn.Sequential(nn.Linear(5, 6, dtype=f64), nn.Tanh(), nn.Linear(6, 3, dtype=f64)).eval()
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(N_EXAMPLES, 5, dtype=torch.float64, generator=generator)
    y = torch.randint(0, 3, (N_EXAMPLES,), generator=generator)
    return model, x, y


def shard(world: int, rank: int, x: torch.Tensor, y: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rank ``rank``'s examples, cut into batches of at most :data:`BATCH`."""
    sizes = SHARDS[world]
    start = sum(sizes[:rank])
    xs, ys = x[start : start + sizes[rank]], y[start : start + sizes[rank]]
    return [(xs[i : i + BATCH], ys[i : i + BATCH]) for i in range(0, len(xs), BATCH)]


def probes(n: int) -> torch.Tensor:
    """Three seeded directions (the same on every rank)."""
    return torch.randn(n, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))


def measure(model, loss, data, group) -> dict:
    """Every quantity the test compares, for one model, loss and data (local or whole)."""
    hessian = curvature.hessian_operator(model, loss, data, group=group)
    ggn = curvature.ggn_operator(model, loss, data, group=group)
    m = probes(hessian.shape[0])
    out = {
        "hvp": hessian.matvec(m[:, 0]),
        "hessian_block": hessian.matmat(m),
        "gradient": torch.from_numpy(hessian.gradient()),
        "ggn_block": ggn.matmat(m),
        "top_values": torch.from_numpy(curvature.top_eigenpairs(hessian, k=2, tol=1e-12, seed=0).values),
        "hutchinson": curvature.hutchinson_trace(ggn, n_probes=20, seed=3).estimate,
        "hutchpp": curvature.hutchpp_trace(hessian, n_probes=30, seed=4).estimate,
        "lambda_max": curvature.lambda_max(model, loss, data, group=group, tol=1e-12),
    }
    if isinstance(loss, nn.CrossEntropyLoss):
        for kind in ("empirical", "true"):
            out[f"fisher_{kind}_block"] = curvature.fisher_operator(model, loss, data, group=group, kind=kind).matmat(m)
    return out


def _error(call) -> str:
    try:
        call()
    except (TypeError, ValueError) as err:
        return f"{type(err).__name__}: {err}"
    return "no error"


def run(rank: int, world: int, init_file: str, out_dir: str) -> None:
    """The body of one rank (the target of ``torch.multiprocessing.spawn``)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    group = dist.group.WORLD
    try:
        model, x, y = problem()
        data = shard(world, rank, x, y)
        results = {
            "cross_entropy": measure(model, nn.CrossEntropyLoss(), data, group),
            "mse_sum": measure(
                model,
                nn.MSELoss(reduction="sum"),
                [(bx, nn.functional.one_hot(by, 3).double()) for bx, by in data],
                group,
            ),
        }
        ddp = nn.parallel.DistributedDataParallel(copy.deepcopy(model)).eval()
        results["ddp_hvp"] = curvature.hessian_operator(ddp, nn.CrossEntropyLoss(), data, group=group).matvec(
            probes(sum(p.numel() for p in model.parameters()))[:, 0]
        )
        differing = copy.deepcopy(model)
        if rank == world - 1:
            with torch.no_grad():
                differing[2].bias[1] += 1e-12
        results["differing_params"] = _error(
            lambda: curvature.hessian_operator(differing, nn.CrossEntropyLoss(), data, group=group)
        )
        bad = [(bx, by.clone()) for bx, by in data]
        if rank == 0:
            bad[0][1][0] = 7  # a class index out of range on one rank only
        results["one_rank_fails"] = _error(
            lambda: curvature.ggn_operator(model, nn.CrossEntropyLoss(), bad, group=group)
        )
        dataset = torch.utils.data.TensorDataset(x, y)
        padded = torch.utils.data.DataLoader(
            dataset, batch_size=BATCH, sampler=torch.utils.data.DistributedSampler(dataset, world, rank, shuffle=False)
        )
        results["padded_sampler"] = _error(
            lambda: curvature.hessian_operator(model, nn.CrossEntropyLoss(), padded, group=group)
        )
        torch.save(results, pathlib.Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()

"""Data-parallel curvature on ``torch.distributed``: what a process group changes, and its checks.

Every operator of :mod:`lossgeom.curvature` (and what is built on them: spectra, traces,
densities, :func:`lossgeom.curvature.lambda_max`) takes ``group=``, a ``torch.distributed``
process group (``None``, the default: one process). With a group, each rank passes only its
own shard of the data; the risk is

``L(theta) = sum_r sum_{b in shard r} w_b loss(f(x_b; theta), y_b)``

with the weights ``w_b`` of the *concatenated* data (under mean reduction ``1 / T``, ``T`` the
all-reduced number of loss terms), so shards and batches of any size weight every example as
one process would. A product ``A v`` is each rank's local sum over its batches followed by
one ``all_reduce`` (sum) of the ``n``-vector; nothing else is communicated per product. Start
vectors and random probes are drawn from the seed on every rank alike (never all-reduced), and
every rank receives the same reduced vector, so every rank computes the same numbers.

Checked once, when the risk is built (collectively, so that an error on one rank raises on
every rank instead of leaving the others waiting in a collective): each rank's own data and
model (the checks of :class:`lossgeom.risk.EmpiricalRisk`); that every rank holds the same
parameter vector, bit for bit; and that a ``DistributedSampler`` does not pad its shards with
duplicated examples. A ``DistributedDataParallel`` model is measured through its ``.module``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from lossgeom.types import Data, Group


def check_group(group: Group) -> Group:
    """``group`` if it is a usable process group, ``None`` for one process; a clear error otherwise.

    Args:
        group: ``None`` (one process) or a ``torch.distributed`` process group, e.g.
            ``torch.distributed.group.WORLD`` or one from ``torch.distributed.new_group``.

    Returns:
        ``group``.

    Raises:
        ValueError: if a group is given but ``torch.distributed`` is not initialised
            (call ``torch.distributed.init_process_group`` first, e.g. under ``torchrun``).
        TypeError: if ``group`` is not a process group.
    """
    if group is None:
        return None
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            "group: torch.distributed is not initialised; call torch.distributed.init_process_group(...) "
            "first (e.g. under torchrun), or pass group=None for one process"
        )
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(
            f"group must be a torch.distributed process group (e.g. torch.distributed.group.WORLD), "
            f"got {type(group).__name__}"
        )
    return group


def world_size(group: Group) -> int:
    """The number of ranks of ``group`` (1 for ``None``).

    Args:
        group: a process group or ``None``.

    Returns:
        The number of ranks.
    """
    return 1 if group is None else dist.get_world_size(group)


def rank(group: Group) -> int:
    """This process's rank in ``group`` (0 for ``None``).

    Args:
        group: a process group or ``None``.

    Returns:
        The rank.
    """
    return 0 if group is None else dist.get_rank(group)


def all_reduce_sum(tensor: torch.Tensor, group: Group) -> torch.Tensor:
    """The sum of ``tensor`` over the ranks of ``group`` (``tensor`` itself for ``None``).

    One ``torch.distributed.all_reduce`` of a contiguous copy; the input is not modified.

    Args:
        tensor: this rank's tensor.
        group: a process group or ``None``.

    Returns:
        The sum over ranks (the same on every rank; a detached copy), or ``tensor`` itself for ``None``.
    """
    if group is None:
        return tensor
    out = tensor.detach().contiguous().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out


def _all_reduce(values: list[float], op: str, group: Group) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=group)
    return t.tolist()


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module a ``DistributedDataParallel`` (or ``DataParallel``) wrapper holds; ``model`` otherwise.

    The wrapper's forward synchronises buffers with the other ranks, a collective call that
    ranks with different numbers of batches would not match; the curvature needs only the
    module itself.

    Args:
        model: a module, wrapped or not.

    Returns:
        The module itself.
    """
    if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        return model.module
    return model


def check_sampler(data: Data) -> None:
    """Refuse a ``DataLoader`` whose ``DistributedSampler`` pads its shards with repeated examples.

    ``DistributedSampler(drop_last=False)`` repeats examples so that every rank gets the same
    number; the repeats would be counted twice in the curvature.

    Args:
        data: what the caller passed as data (a ``DataLoader`` is inspected; anything else passes).

    Raises:
        ValueError: naming how many examples the padding repeats and how to avoid it.
    """
    sampler = getattr(data, "sampler", None)
    if isinstance(sampler, torch.utils.data.DistributedSampler):
        n_data = len(sampler.dataset)
        if sampler.total_size > n_data:
            raise ValueError(
                f"data: its DistributedSampler pads the {n_data} examples to {sampler.total_size} by repeating "
                f"{sampler.total_size - n_data} of them, which the curvature would count twice; shard without "
                "padding (e.g. torch.utils.data.Subset(dataset, range(rank, len(dataset), world_size)); shards "
                "may differ in size) or use DistributedSampler(..., drop_last=True), which drops the remainder"
            )


def agree_on_errors(error: Exception | None, group: Group) -> None:
    """Raise on every rank if any rank of ``group`` failed its local checks (a collective call).

    Args:
        error: this rank's error, or ``None``.
        group: the process group.

    Raises:
        ValueError: on the ranks that passed, naming the ranks that failed; a rank that
            failed raises its own error (``TypeError`` or ``ValueError``).
    """
    failed = torch.zeros(world_size(group), dtype=torch.float64)
    failed[rank(group)] = 0.0 if error is None else 1.0
    failed = all_reduce_sum(failed, group)
    if error is not None:
        raise error
    if failed.any():
        ranks = [int(r) for r in torch.nonzero(failed).reshape(-1)]
        raise ValueError(f"rank(s) {ranks} of the group failed their checks of the model, loss or data (see there)")


def check_same_point(point: torch.Tensor, names: list[str], sizes: list[int], group: Group) -> None:
    """Refuse ranks whose parameter vectors differ (shapes first, then values bit for bit).

    Args:
        point: this rank's flat parameter vector.
        names: the parameters' names, in the order of ``point``.
        sizes: their numbers of entries.
        group: the process group.

    Raises:
        ValueError: on every rank, naming the first parameter that differs.
    """
    n = float(point.numel())
    hi, neg_lo = _all_reduce([n, -n], "MAX", group)
    if hi != -neg_lo:
        raise ValueError(
            f"params: the ranks hold different numbers of parameters ({int(-neg_lo)} to {int(hi)}); "
            "every rank must measure the same model"
        )
    values = point.detach().to(torch.float64)
    high = values.clone()
    low = values.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=group)
    differs = torch.nonzero(high != low).reshape(-1)
    if differs.numel():
        ends = torch.tensor(sizes).cumsum(0)
        name = names[int((ends <= int(differs[0])).sum())]
        raise ValueError(
            f"params: the ranks' parameters differ ({differs.numel()} entries, first in {name!r}, by up to "
            f"{float((high - low).abs().max()):.3g}); broadcast them from one rank (DistributedDataParallel "
            "does at construction) before measuring"
        )


__all__ = [
    "agree_on_errors",
    "all_reduce_sum",
    "check_group",
    "check_same_point",
    "check_sampler",
    "rank",
    "unwrap_model",
    "world_size",
]

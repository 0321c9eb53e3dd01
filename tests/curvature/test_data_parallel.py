"""Data-parallel curvature under torch.distributed: 2 and 3 gloo processes on loopback.

Each rank holds an unequal shard of 23 examples cut into batches of unequal sizes
(``tests/gloo_worker.py``); every rank's products, gradient, top eigenvalues, seeded Hutchinson
and Hutch++ traces and ``lambda_max`` must equal those of one process on the concatenated data
(float64, 1e-10) and be bit-identical across ranks; a DDP-wrapped model measures as its module;
parameters that differ between ranks, an error on one rank, and a padding DistributedSampler
are refused on every rank with a clear error instead of a hang.
"""

from __future__ import annotations

import gloo_worker
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built in")

TOL = 1e-10


@pytest.fixture(scope="module", params=[2, 3], ids=["2-ranks", "3-ranks"])
def ranks(request, tmp_path_factory):
    """Spawn ``world`` gloo processes once per world size; return (world, each rank's results)."""
    world = request.param
    where = tmp_path_factory.mktemp(f"gloo{world}")
    mp.spawn(gloo_worker.run, args=(world, str(where / "init"), str(where)), nprocs=world, join=True)
    return world, [torch.load(where / f"rank{r}.pt", weights_only=False) for r in range(world)]


@pytest.fixture(scope="module")
def reference():
    """One process, all 23 examples in one batch."""
    model, x, y = gloo_worker.problem()
    return {
        "cross_entropy": gloo_worker.measure(model, nn.CrossEntropyLoss(), (x, y), None),
        "mse_sum": gloo_worker.measure(
            model, nn.MSELoss(reduction="sum"), (x, nn.functional.one_hot(y, 3).double()), None
        ),
    }


def _close(actual, expected):
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    scale = max(1.0, float(expected.abs().max()))
    assert float((actual - expected).abs().max()) <= TOL * scale


@pytest.mark.parametrize("loss", ["cross_entropy", "mse_sum"])
def test_every_quantity_matches_one_process_on_the_concatenated_data(ranks, reference, loss):
    world, results = ranks
    expected = reference[loss]
    assert set(results[0][loss]) == set(expected)
    for r in range(world):
        for key, value in expected.items():
            _close(results[r][loss][key], value)


@pytest.mark.parametrize("loss", ["cross_entropy", "mse_sum"])
def test_every_rank_returns_the_same_numbers_bit_for_bit(ranks, loss):
    world, results = ranks
    for r in range(1, world):
        for key, value in results[0][loss].items():
            assert torch.equal(torch.as_tensor(results[r][loss][key]), torch.as_tensor(value)), key


def test_the_shards_are_unequal_and_cover_the_data(ranks):
    world, _ = ranks
    sizes = gloo_worker.SHARDS[world]
    assert sum(sizes) == gloo_worker.N_EXAMPLES and len(set(sizes)) == world


def test_a_ddp_model_measures_as_its_module(ranks, reference):
    world, results = ranks
    for r in range(world):
        _close(results[r]["ddp_hvp"], reference["cross_entropy"]["hvp"])


def test_ranks_with_different_parameters_are_refused_on_every_rank(ranks):
    world, results = ranks
    for r in range(world):
        message = results[r]["differing_params"]
        assert message.startswith("ValueError: params: the ranks' parameters differ (1 entries, first in '2.bias'")


def test_an_error_on_one_rank_is_raised_on_every_rank(ranks):
    world, results = ranks
    assert "class indices in [0, 3)" in results[0]["one_rank_fails"]
    for r in range(1, world):
        assert results[r]["one_rank_fails"].startswith("ValueError: rank(s) [0] of the group failed")


def test_a_padding_distributed_sampler_is_refused(ranks):
    world, results = ranks
    for r in range(world):
        assert "DistributedSampler pads the 23 examples to 24 by repeating 1" in results[r]["padded_sampler"]


def test_a_group_without_an_initialised_process_group_is_refused():
    model, x, y = gloo_worker.problem()
    with pytest.raises(ValueError, match="group: torch.distributed is not initialised"):
        gloo_worker.curvature.hessian_operator(model, nn.CrossEntropyLoss(), (x, y), group=object())

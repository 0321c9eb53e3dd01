"""The atlas on loss modules with options: masked targets measured on the kept examples, likelihoods refused by name."""

from __future__ import annotations

import torch
from torch import nn

from lossgeom.atlas import atlas

F64 = dict(dtype=torch.float64)
KEYS = ["trace", "sam", "fisher_rao", "kappa_exact", "b_quot", "fisher_riemannian"]


def softplus_classifier() -> nn.Sequential:
    torch.manual_seed(31)
    return nn.Sequential(nn.Linear(3, 6, **F64), nn.Softplus(), nn.Linear(6, 4, **F64))


def masked(n: int = 30):
    gen = torch.Generator().manual_seed(32)
    x, y = torch.randn(n, 3, generator=gen, **F64), torch.randint(0, 4, (n,), generator=gen)
    y = torch.where(torch.rand(n, generator=gen) < 0.3, torch.full_like(y, -100), y)
    return x, y, y != -100


def test_every_cell_with_ignored_targets_is_that_of_the_kept_examples():
    model = softplus_classifier()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y, kept = masked()
    got = atlas(model, nn.CrossEntropyLoss(), (x, y), probe=x[:8], measures=KEYS, transforms=["softmax_shift"])
    want = atlas(
        model, nn.CrossEntropyLoss(), (x[kept], y[kept]), probe=x[:8], measures=KEYS, transforms=["softmax_shift"]
    )
    assert got.n_examples == int(kept.sum()) < x.shape[0]
    for key in KEYS:
        a, b = got.cell(key, "softmax_shift"), want.cell(key, "softmax_shift")
        assert a.status == b.status
        for u, v in ((a.before, b.before), (a.after, b.after)):
            assert abs(u - v) <= 1e-10 * abs(v), (key, u, v)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_class_weights_make_the_likelihood_rows_not_applicable_naming_the_option():
    model = softplus_classifier()
    x, y, kept = masked()
    loss = nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 0.5, 1.0], **F64))
    table = atlas(model, loss, (x[kept], y[kept]), probe=x[:8], measures=KEYS, transforms=["softmax_shift"])
    for key in ("fisher_rao", "kappa_exact", "b_quot", "fisher_riemannian"):
        cell = table.cell(key, "softmax_shift")
        assert cell.status == "not applicable" and "weight=..." in cell.reason, (key, cell)
    assert table.cell("trace", "softmax_shift").status == "invariant"
    assert table.point.fisher is None


def test_the_fisher_rao_cell_differs_from_the_measure_over_every_row():
    """The defect the masked test guards against: counting the ignored rows changes the number."""
    model = softplus_classifier()
    x, y, kept = masked()
    got = atlas(
        model,
        nn.CrossEntropyLoss(ignore_index=-100),
        (x, y),
        probe=x[:8],
        measures=["fisher_rao"],
        transforms=["softmax_shift"],
    )
    every = atlas(
        model,
        nn.CrossEntropyLoss(),
        (x, torch.where(kept, y, 0)),
        probe=x[:8],
        measures=["fisher_rao"],
        transforms=["softmax_shift"],
    )
    assert abs(got.base[0] - every.base[0]) > 1e-3 * every.base[0]

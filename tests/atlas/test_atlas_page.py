"""The atlas page's renderings: rows that read rounding, and the rule that finds them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from lossgeom import flatness
from lossgeom.atlas import ROUNDING_FLOOR, atlas
from lossgeom.risk import math_attention
from lossgeom_book import tasks
from lossgeom_book.architectures import ModularEncoder
from lossgeom_book.atlas_page import ROUNDING_TEXT, atlas_heatmap, atlas_markdown, diagonal_fisher_rounding

F64 = dict(dtype=torch.float64)
MEASURES = ["trace", "sam", "fisher_rao", "b_raw"]


@pytest.fixture(scope="module")
def table():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5, **F64), nn.ReLU(), nn.Linear(5, 4, **F64))
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(24, 3, generator=gen, **F64), torch.randint(0, 4, (24,), generator=gen)
    return atlas(model, nn.CrossEntropyLoss(), (x, y), x[:12], measures=MEASURES, size=2.0, seed=0)


def test_a_row_marked_rounding_reads_rounding_in_every_applicable_cell_and_says_why(table):
    plain = atlas_markdown(table).splitlines()
    marked = atlas_markdown(table, rounding={"trace": "a reason"}).splitlines()
    row = 2 + MEASURES.index("trace")
    cells = [cell.strip() for cell in marked[row].split("|")[2:-1]]
    statuses = [cell.status for cell in table.row("trace")]
    assert statuses.count("not applicable") == 1  # the normalisation rescaling: no normalisation layer
    assert cells == [ROUNDING_TEXT if s != "not applicable" else "n/a" for s in statuses]
    assert ROUNDING_TEXT not in plain[row] and any(c.strip().startswith("×") for c in plain[row].split("|"))
    reason = ["", "Read as rounding here: tr H (a reason)."]
    assert marked == plain[:row] + [marked[row]] + plain[row + 1 : -2] + reason + plain[-2:]  # before the point
    assert atlas_markdown(table, rounding={}) == "\n".join(plain)


def test_the_heat_map_greys_a_rounding_row_and_annotates_it(table):
    fig = atlas_heatmap(table, rounding={"sam": "why"})
    ax = fig.axes[0]
    row = MEASURES.index("sam")
    image = ax.get_images()[0].get_array()
    assert image.mask[row].all() and not image.mask[MEASURES.index("b_raw")].all()
    texts = [t.get_text() for t in ax.texts]
    n_columns = len(table.columns)
    assert texts[row * n_columns : (row + 1) * n_columns].count(ROUNDING_TEXT) == n_columns - 1
    assert ROUNDING_TEXT not in texts[: row * n_columns]


def test_an_unknown_measure_is_refused(table):
    with pytest.raises(KeyError, match="lambda_max"):
        atlas_markdown(table, rounding={"lambda_max": "not measured here"})
    with pytest.raises(KeyError, match="nonsense"):
        atlas_heatmap(table, rounding={"nonsense": "why"})


@pytest.mark.parametrize(
    ("diagonal", "expected"),
    [
        ([1.0, 0.5, 1e-20, 0.0], None),  # root 1e-10 of the largest: small, but not rounding; zeros are not kept
        ([1.0, 3e-27, 0.2], 1),  # root 5.5e-14 < 1e-13
        ([4.0, 1e-40, 1e-33, 0.0], 2),
    ],
)
def test_the_rule_counts_entries_whose_root_is_below_the_floor(diagonal, expected):
    found = diagonal_fisher_rounding(np.array(diagonal))
    if expected is None:
        assert found == {}
    else:
        entries = "entry" if expected == 1 else "entries"
        assert found == {
            "diagonal_fisher": f"its metric divides by {expected} Fisher-diagonal {entries} at rounding level, "
            "the root of each below 1e-13 of the largest's"
        }


def test_the_rule_finds_exactly_the_key_bias_of_attention():
    """Adding a vector to every key adds one constant to each query's scores, which the softmax removes."""
    split = tasks.modular_arithmetic(p=5, train_fraction=0.6, seed=0)
    model = ModularEncoder(p=5, d_model=4, n_heads=2, d_ff=4, seed=0).eval()
    with math_attention():
        point = flatness.LossPoint(model, nn.CrossEntropyLoss(), (split.x_train, split.y_train))
        diagonal = np.diag(point.fisher())
    in_proj_bias = point.block_indices("encoder.layers.0.self_attn.in_proj_bias")
    keys = in_proj_bias[4:8]
    relative = np.sqrt(diagonal / diagonal.max())
    assert (relative[keys] < ROUNDING_FLOOR).all()
    assert np.delete(relative, keys)[np.delete(diagonal, keys) > 0].min() > 1e3 * ROUNDING_FLOOR
    assert diagonal_fisher_rounding(diagonal) == {
        "diagonal_fisher": "its metric divides by 4 Fisher-diagonal entries at rounding level, "
        "the root of each below 1e-13 of the largest's"
    }


def test_bad_diagonals_and_floors_are_refused():
    with pytest.raises(ValueError, match="nonnegative"):
        diagonal_fisher_rounding(np.array([1.0, -1e-3]))
    with pytest.raises(ValueError, match="positive entry"):
        diagonal_fisher_rounding(np.zeros(3))
    with pytest.raises(ValueError, match="finite"):
        diagonal_fisher_rounding(np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="floor"):
        diagonal_fisher_rounding(np.ones(2), floor=0.0)

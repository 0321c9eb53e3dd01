"""The atlas pages' renderings (wide and narrow tables, heat maps, size sweeps), the rule that finds rows
reading rounding, and the helpers the pages share."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from lossgeom import flatness
from lossgeom.atlas import atlas
from lossgeom.atlas.measures import FISHER_CUTS
from lossgeom.atlas.records import hessian_block_trace
from lossgeom.risk import math_attention
from lossgeom.symmetries.core import ROUNDING_FLOOR

# the atlas pages' renderings are the book's: without its packages (pip install ".[book]") the file skips
pytest.importorskip("lossgeom_book")

from lossgeom_book import tasks
from lossgeom_book.architectures import ModularEncoder
from lossgeom_book.atlas_page import (
    ROUNDING_TEXT,
    atlas_heatmap,
    atlas_markdown,
    atlas_table_markdown,
    compact_cell_text,
    diagonal_fisher_rounding,
    fisher_cuts_markdown,
    layernorm_mlp,
    listed,
    size_sweep_contract,
    size_sweep_figure,
    size_sweep_markdown,
    train_full_batch,
    verdicts,
)

F64 = dict(dtype=torch.float64)
MEASURES = ["trace", "sam", "fisher_rao", "b_raw"]


def small_problem():
    """A 3-5-4 ReLU classifier (float64) and 24 seeded examples."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5, **F64), nn.ReLU(), nn.Linear(5, 4, **F64))
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(24, 3, generator=gen, **F64), torch.randint(0, 4, (24,), generator=gen)
    return model, (x, y)


@pytest.fixture(scope="module")
def table():
    model, (x, y) = small_problem()
    return atlas(model, nn.CrossEntropyLoss(), (x, y), probe=x[:12], measures=MEASURES, size=2.0, seed=0)


@pytest.fixture(scope="module")
def fisher_table():
    model, (x, y) = small_problem()
    return atlas(model, nn.CrossEntropyLoss(), (x, y), probe=x[:12], measures=["fisher_riemannian"], size=2.0, seed=0)


SWEPT = ["trace", "sam", "fisher_rao"]
RESCALINGS = ["relu_rescaling", "layer_rescaling", "normalisation_rescaling"]
SIZES = (1.5, 2.0, 3.0)


@pytest.fixture(scope="module")
def sweep():
    model, (x, y) = small_problem()
    return {
        r: atlas(
            model, nn.CrossEntropyLoss(), (x, y), probe=x[:12], measures=SWEPT, transforms=RESCALINGS, size=r, seed=0
        )
        for r in SIZES
    }


def cells_of(line: str) -> list[str]:
    return [cell.strip() for cell in line.split("|")[1:-1]]


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


def test_the_narrow_table_leaves_out_what_does_not_apply_and_lists_it(table):
    lines = atlas_table_markdown(table, link_prefix="atlas").splitlines()
    applying = [c for c in table.columns if c.applies]
    assert len(applying) == len(table.columns) - 1  # the normalisation rescaling: no normalisation layer
    assert cells_of(lines[0]) == ["measure", "tol"] + [c.short for c in applying]
    body = lines[2 : 2 + len(MEASURES)]
    assert [cells_of(line)[0] for line in body] == [
        "{ref}`tr H <atlas-trace>`",
        "{ref}`SAM <atlas-sam>`",
        "{ref}`Fisher-Rao <atlas-fisher-rao>`",
        "{ref}`B_raw <atlas-b-raw>`",
    ]
    assert "Not applicable here: norm. rescaling (no normalisation layer reads a Linear or Conv layer)." in lines
    assert lines[-1] == table.point_text()
    audit = cells_of(lines[2 + len(MEASURES)])
    assert audit[:2] == ["audit Δ/scale", "1e-10"] and all(cell == "<1e-13" for cell in audit[2:])


def test_the_narrow_table_says_what_the_wide_one_says_in_fewer_characters(table):
    """Each applicable cell: the same factor, or the same decade of an invariant change."""
    narrow = atlas_table_markdown(table).splitlines()
    wide = atlas_markdown(table).splitlines()
    applying = [j for j, c in enumerate(table.columns) if c.applies]
    for i, key in enumerate(MEASURES):
        short, long = cells_of(narrow[2 + i])[2:], [cells_of(wide[2 + i])[1 + j] for j in applying]
        assert short == [compact_cell_text(table.cell(key, table.columns[j].key)) for j in applying]
        for a, b in zip(short, long):
            if b.startswith("invariant (Δ < "):
                assert a == "inv. <" + b.removeprefix("invariant (Δ < ").removesuffix(")")
            else:
                assert a == b and a.startswith("×")
    widest = max(len(cell) for line in narrow[2 : 3 + len(MEASURES)] for cell in cells_of(line)[1:])
    assert len(cells_of(narrow[0])) <= 8 and widest <= 12  # fits a 1300 px window without scrolling


def test_a_narrow_row_marked_rounding_reads_rounding_and_says_why(table):
    lines = atlas_table_markdown(table, rounding={"sam": "a reason"}).splitlines()
    row = cells_of(lines[2 + MEASURES.index("sam")])
    assert row[2:] == [ROUNDING_TEXT] * (len(row) - 2)
    assert "Read as rounding here: SAM sharpness (a reason)." in lines
    with pytest.raises(KeyError, match="lambda_max"):
        atlas_table_markdown(table, rounding={"lambda_max": "not measured here"})


def test_the_fisher_cuts_by_column_are_the_cuts_table_transposed(fisher_table):
    by_cut = [cells_of(line) for line in fisher_cuts_markdown(fisher_table).splitlines()[2:]]
    by_column = [cells_of(line) for line in fisher_cuts_markdown(fisher_table, by_column=True).splitlines()]
    moved = [c for c, r in zip(fisher_table.columns, fisher_table.column_points) if r is not None]
    assert len(by_cut) == len(FISHER_CUTS) and len(by_column) == 3 + len(moved)
    assert by_column[0] == ["cut"] + [row[0] for row in by_cut]
    assert by_column[2] == ["at the model"] + [f"{row[2]} (rank {row[1]})" for row in by_cut]
    for j, column in enumerate(moved):
        assert by_column[3 + j] == [column.short] + [row[3 + j] for row in by_cut]


def test_verdicts_and_listed(table):
    assert verdicts(table, ["trace", "fisher_rao"], "permutation") == {"invariant"}
    assert verdicts(table, ["trace", "sam"], "normalisation_rescaling") == {"not applicable"}
    assert verdicts(table, ["fisher_rao", "b_raw"], "softmax_shift") == {"invariant", "moves"}
    assert [listed([]), listed(["a"]), listed(["a", "b"]), listed(("a", "b", "c"))] == [
        "",
        "a",
        "a and b",
        "a, b and c",
    ]


def test_the_sweep_table_has_a_row_per_measure_and_applying_column(sweep):
    lines = size_sweep_markdown(sweep, SWEPT, RESCALINGS).splitlines()
    assert cells_of(lines[0]) == ["measure", "column", "r = 1.5", "r = 2", "r = 3"]
    rows = [cells_of(line) for line in lines[2:]]
    assert [(row[0], row[1]) for row in rows] == [
        (title, column) for title in ("tr H", "SAM", "Fisher-Rao") for column in ("ReLU rescaling", "layer rescaling")
    ]
    for row, (key, column) in zip(rows, [(k, c) for k in SWEPT for c in RESCALINGS[:2]]):
        assert row[2:] == [compact_cell_text(sweep[r].cell(key, column)) for r in SIZES]
    assert {row[2] for row in rows if row[0] == "Fisher-Rao"} == {"inv. <1e-13"}


def test_the_sweep_follows_one_draw_and_the_trace_follows_its_closed_form(sweep):
    """The layer rescaling by c = r multiplies layer 1 by r and layer 2's weight by 1/r: tr H(r) is
    t1 / r^2 + t2 r^2 + t3 with t1, t2, t3 the Hessian's block traces of (0.weight, 0.bias), 2.weight, 2.bias."""
    model, data = small_problem()
    point = flatness.LossPoint(model, nn.CrossEntropyLoss(), data)
    t1, t2, t3 = (hessian_block_trace(point, names) for names in (["0.weight", "0.bias"], "2.weight", "2.bias"))
    theta = {name: p.detach() for name, p in model.named_parameters()}

    def log_scales(r, column):
        moved = sweep[r].column(column).symmetry(theta)
        return torch.cat([(moved[n] / theta[n]).abs().log().flatten() for n in theta])

    for r in SIZES:
        trace = sweep[r].cell("trace", "layer_rescaling")
        assert trace.after == pytest.approx(t1 / r**2 + t2 * r**2 + t3, rel=1e-9)
        assert trace.before == pytest.approx(t1 + t2 + t3, rel=1e-9)
        for column in RESCALINGS[:2]:  # the draw at r is the draw at 2 to the power log2 r
            assert torch.allclose(log_scales(r, column), np.log2(r) * log_scales(2.0, column), atol=1e-12)


def test_a_full_table_and_a_sweep_share_the_draw_at_one_size(table, sweep):
    """The page reuses its full table at r = 2 in the sweep: the measures asked for do not change the draw."""
    for key in ("trace", "sam"):
        for column in RESCALINGS[:2]:
            assert table.cell(key, column).after == sweep[2.0].cell(key, column).after


def test_the_sweep_figure_draws_the_factors_on_log_axes(sweep):
    fig = size_sweep_figure(sweep, SWEPT, RESCALINGS, title="small")
    axes = fig.axes
    assert len(axes) == len(SWEPT)
    for ax, key in zip(axes, SWEPT):
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
        lines = [line for line in ax.get_lines() if len(line.get_xdata()) == len(SIZES)]
        assert len(lines) == 2  # the two rescalings that apply, beside the dotted line at 1
        for line, column in zip(lines, RESCALINGS[:2]):
            assert list(line.get_xdata()) == list(SIZES)
            expected = [abs(sweep[r].cell(key, column).factor) for r in SIZES]
            assert np.allclose(line.get_ydata(), expected, rtol=0, atol=0)


def test_the_sweep_contract_states_the_sizes(sweep):
    contract = size_sweep_contract(sweep)
    first = sweep[1.5].contract()
    assert contract.centre == first.centre and contract.radius == first.radius
    assert contract.resolution.startswith("3 sizes r = 1.5, 2 and 3, one atlas at each (seed 0)")


def test_a_sweep_of_mismatched_tables_is_refused(sweep, table):
    with pytest.raises(ValueError, match="computed at size 2"):
        size_sweep_markdown({1.5: sweep[1.5], 3.0: sweep[2.0]}, SWEPT, RESCALINGS)
    model, (x, y) = small_problem()
    other_seed = atlas(
        model, nn.CrossEntropyLoss(), (x, y), probe=x[:12], measures=SWEPT, transforms=RESCALINGS, seed=1
    )
    with pytest.raises(ValueError, match="one seed"):
        size_sweep_figure({1.5: sweep[1.5], 2.0: other_seed}, SWEPT, RESCALINGS)
    with pytest.raises(ValueError, match="at least one"):
        size_sweep_contract({})


def test_the_layernorm_mlp_is_seeded_and_leaves_the_global_random_state_alone():
    state = torch.get_rng_state()
    first, again, other = layernorm_mlp(seed=0), layernorm_mlp(seed=0), layernorm_mlp(seed=1)
    assert torch.equal(state, torch.get_rng_state())
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), again.parameters()))
    assert not torch.equal(first[0].weight, other[0].weight)
    torch.manual_seed(0)  # the same draw as seeding the global generator and building in place
    assert torch.equal(nn.Linear(64, 10, **F64).weight, first[0].weight)
    assert first[3].eps == 1e-14 and layernorm_mlp(eps=1e-5)[3].eps == 1e-5
    assert first(torch.zeros(2, 64, **F64)).shape == (2, 10)


def test_full_batch_training_lowers_the_loss_and_returns_the_model_in_eval_mode():
    model, data = small_problem()
    loss = nn.CrossEntropyLoss()
    with torch.no_grad():
        before = float(loss(model(data[0]), data[1]))
    trained = train_full_batch(model.train(), loss, data, steps=30, learning_rate=0.05)
    assert trained is model and not trained.training
    with torch.no_grad():
        assert float(loss(trained(data[0]), data[1])) < 0.8 * before

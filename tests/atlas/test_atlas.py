"""The symmetry audit atlas: verdicts that theory fixes, factors recomputed by hand, receipts, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from small_models import two_layer_relu
from torch import nn

from lossgeom import atlas as atlas_module
from lossgeom import curvature, flatness, symmetries
from lossgeom.atlas import Measure, atlas
from lossgeom.atlas.columns import TRANSFORMS
from lossgeom.atlas.measures import MEASURES
from lossgeom.atlas.records import feature_norm_change as feature_norm
from lossgeom.contract import MeasurementContract
from lossgeom.formatting import fmt

from book_extra import from_book

atlas_heatmap = from_book("lossgeom_book.atlas_page", "atlas_heatmap")
atlas_markdown = from_book("lossgeom_book.atlas_page", "atlas_markdown")
fisher_cuts_markdown = from_book("lossgeom_book.atlas_page", "fisher_cuts_markdown")

F64 = dict(dtype=torch.float64)
CHEAP = ["trace", "sam", "fisher_rao", "relative_flatness", "kappa_exact", "b_raw", "b_quot", "flat_q"]


def classifier(bias_last: bool = True) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 5, **F64), nn.ReLU(), nn.Linear(5, 4, bias=bias_last, **F64))


def data(n: int = 24):
    gen = torch.Generator().manual_seed(1)
    return torch.randn(n, 3, generator=gen, **F64), torch.randint(0, 4, (n,), generator=gen)


@pytest.fixture(scope="module")
def table():
    x, y = data()
    return atlas(classifier(), nn.CrossEntropyLoss(), (x, y), probe=x[:12], measures=CHEAP, size=2.0, seed=0)


def test_every_applicable_column_carries_a_passing_receipt_and_absent_ones_say_why(table):
    assert [c.key for c in table.columns] == list(TRANSFORMS)
    for column in table.columns:
        if column.key == "normalisation_rescaling":
            assert not column.applies and column.receipt is None and "normalisation" in column.reason
            assert all(cell.status == "not applicable" for cell in (row[-1] for row in table.cells))
        else:
            assert column.receipt.is_symmetry
            assert column.receipt.relative_discrepancy <= column.receipt.relative_tolerance


def test_verdicts_that_the_mathematics_fixes(table):
    # a permutation relabels coordinates: every measure is kept
    assert all(table.cell(m, "permutation").status == "invariant" for m in CHEAP if m != "flat_q")
    # the common-row shift is a translation that keeps the loss everywhere: H, gradients and
    # per-example gradients are unchanged, B_quot and kappa_exact are built to survive it; B_raw is not
    for key in ("trace", "sam", "fisher_rao", "relative_flatness", "kappa_exact", "b_quot"):
        assert table.cell(key, "softmax_shift").status == "invariant", key
        assert table.cell(key, "reference_class").status == "invariant", key
    assert table.cell("b_raw", "softmax_shift").status == "moves"
    # a diagonal linear symmetry keeps every <theta, g_i> and the first layer's relative flatness
    for key in ("fisher_rao", "relative_flatness"):
        assert table.cell(key, "relu_rescaling").status == "invariant"
        assert table.cell(key, "layer_rescaling").status == "invariant"
    assert table.cell("trace", "layer_rescaling").status == "moves"
    assert table.cell("flat_q", "permutation").status == "not applicable"
    assert "square loss" in table.summary("flat_q")


def test_the_trace_factor_recomputed_from_the_base_hessian(table):
    """tr H' = sum_i H_ii / d_i^2 for the linear symmetry theta' = D theta (layer 0 times c, layer 2 weight / c)."""
    x, y = data()
    model = classifier()
    H = (
        curvature.closure_hessian(
            flatness.LossPoint(model, nn.CrossEntropyLoss(), (x, y)).loss_fn, dict(model.named_parameters())
        )
        .detach()
        .numpy()
    )
    scales = np.concatenate([np.full(15, 2.0), np.full(5, 2.0), np.full(20, 0.5), np.ones(4)])
    expected = float((np.diag(H) / scales**2).sum()) / float(np.trace(H))
    assert table.cell("trace", "layer_rescaling").factor == pytest.approx(expected, rel=1e-10)


def test_the_b_raw_factor_under_the_reference_class_is_the_closed_form_ratio(table):
    """B_raw(W - 1 w_r^T) / B_raw(W) = |W - 1 w_r^T|_F^2 / |W|_F^2 for the augmented classifier [W b]."""
    model = classifier()
    W = torch.cat([model[2].weight, model[2].bias[:, None]], dim=1).detach()
    shifted = W - W[0]
    expected = float((shifted**2).sum() / (W**2).sum())
    assert table.cell("b_raw", "reference_class").factor == pytest.approx(expected, rel=1e-10)


def test_flat_q_is_invariant_on_the_two_layer_regression_network_where_the_trace_is_not():
    model = two_layer_relu(3, 4, seed=2)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(15, 3, generator=gen, **F64)
    y = torch.randn(15, 1, generator=gen, **F64)
    table = atlas(model, nn.MSELoss(), (x, y), probe=x, measures=["flat_q", "trace", "b_raw"])
    assert table.cell("flat_q", "relu_rescaling").status == "invariant"
    assert table.cell("trace", "relu_rescaling").status == "moves"
    assert table.cell("b_raw", "relu_rescaling").status == "not applicable"
    assert not table.columns[3].applies and "softmax" in table.columns[3].reason


def test_normalisation_rescaling_scales_that_layers_curvature_like_one_over_c_squared():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4, **F64), nn.LayerNorm(4, eps=1e-14, **F64), nn.ReLU(), nn.Linear(4, 3, **F64))
    x, y = data()
    y = y % 3
    table = atlas(
        model,
        nn.CrossEntropyLoss(),
        (x, y),
        probe=x,
        measures=["trace", "fisher_rao"],
        transforms=["normalisation_rescaling"],
        size=2.0,
    )
    H = (
        curvature.closure_hessian(
            flatness.LossPoint(model, nn.CrossEntropyLoss(), (x, y)).loss_fn, dict(model.named_parameters())
        )
        .detach()
        .numpy()
    )
    d = np.concatenate([np.full(16, 2.0), np.ones(H.shape[0] - 16)])
    assert table.cell("trace", "normalisation_rescaling").factor == pytest.approx(
        float((np.diag(H) / d**2).sum() / np.trace(H)), rel=1e-8
    )
    assert table.cell("fisher_rao", "normalisation_rescaling").status == "invariant"


def test_a_measure_of_your_own_and_a_hand_written_transform():
    x, y = data()
    weight_norm = Measure(
        "weight_norm",
        "weight norm",
        "sum of squared parameters",
        "none",
        lambda model, loss, d: sum(float(p.detach().pow(2).sum()) for p in model.parameters()),
    )
    swap = symmetries.unit_permutation("0", "2", [1, 0, 2, 3, 4])
    table = atlas(
        classifier(),
        nn.CrossEntropyLoss(),
        (x, y),
        probe=x,
        measures=[weight_norm, "sam"],
        transforms=[swap, "layer_rescaling"],
    )
    assert table.cell("weight_norm", swap.name).status == "invariant"
    assert table.cell("weight_norm", "layer_rescaling").status == "moves"


def test_markdown_heatmap_and_contract(table):
    text = atlas_markdown(table, link_prefix="atlas")
    lines = text.splitlines()
    assert len(lines) == 2 + len(CHEAP) + 1 + 6
    assert all(line.count("|") == len(TRANSFORMS) + 2 for line in lines[:-6])
    assert lines[-5].startswith("Transformation sizes (seed 0): ReLU rescaling: c_j log-uniform in [1/2, 2];")
    assert lines[-3] == (
        "Not applicable here: norm. rescaling (no normalisation layer reads a Linear or Conv "
        "layer); Flat^Q (Flat^Q is derived for the square loss (nn.MSELoss))."
    )
    prefix = "Point measured (the model's parameters, mean over the 24 examples): "
    assert lines[-1] == table.point_text() and lines[-1].startswith(prefix + table.point.text())
    assert "{ref}`B_raw <atlas-b-raw>`" in text and "audit receipt" in lines[-7]
    values = table.log_factors()
    assert values.shape == (len(CHEAP), len(TRANSFORMS))
    assert values[CHEAP.index("b_raw"), 3] == pytest.approx(math.log10(table.cell("b_raw", "softmax_shift").factor))
    assert np.isnan(values[:, -1]).all() and (values[:, 2][:-1] == 0).all()
    fig = atlas_heatmap(table)
    assert len(fig.axes) == 2  # the map and its colour bar
    contract = table.contract()
    assert isinstance(contract, MeasurementContract)
    assert "SAM rho = 0.05" in contract.radius and "seed 0" in contract.resolution
    assert table.point.text() in contract.centre and "above 1e-09 x the largest" in contract.normalisation


def test_receipt_and_cell_texts_are_portable(table):
    cell = table.cell("trace", "permutation")
    assert cell.text() == "invariant (Δ < 1e-13)"
    assert table.cell("b_raw", "softmax_shift").text().startswith("×")
    assert table.columns[2].receipt_text() == "Δ/scale < 1e-13, tol 1e-10"


@pytest.mark.parametrize(
    ("before", "after", "shown"),
    [
        (1.0, 1.0 + 6.8e-13, "< 1e-12"),
        (2.0, 2.0 + 4.6e-12, "< 1e-11"),
        (1.0, 1.0 + 1e-16, "< 1e-13"),
        (3.0, 3.0, "< 1e-13"),
    ],
)
def test_a_change_within_tolerance_is_shown_by_its_decade_not_its_digits(before, after, shown):
    cell = atlas_module.columns.Cell("trace", "permutation", "invariant", before=before, after=after, tolerance=1e-9)
    assert cell.text() == f"invariant (Δ {shown})"


def test_unknown_names_bad_probe_and_a_transform_that_fails_the_audit():
    x, y = data()
    loss = nn.CrossEntropyLoss()
    with pytest.raises(ValueError, match="unknown measure 'sharpness'"):
        atlas(classifier(), loss, (x, y), probe=x, measures=["sharpness"])
    with pytest.raises(ValueError, match="unknown transformation 'rotation'"):
        atlas(classifier(), loss, (x, y), probe=x, measures=["sam"], transforms=["rotation"])
    with pytest.raises(ValueError, match="probe set of shape \\(12, 5\\)"):
        atlas(classifier(), loss, (x, y), probe=torch.randn(12, 5, **F64), measures=["sam"])
    with pytest.raises(TypeError, match="probe must be a torch.Tensor"):
        atlas(classifier(), loss, (x, y), probe=(x, y), measures=["sam"])
    not_a_symmetry = symmetries.Symmetry("scale the last layer", lambda p: {**p, "2.weight": 2 * p["2.weight"]})
    with pytest.raises(ValueError, match="scale the last layer is not a symmetry"):
        atlas(classifier(), loss, (x, y), probe=x, measures=["sam"], transforms=[not_a_symmetry])
    with pytest.raises(ValueError, match="size must be > 1"):
        atlas(classifier(), loss, (x, y), probe=x, measures=["sam"], size=1.0)
    with pytest.raises(ValueError, match="reference must be a class index in 0..3"):
        atlas(classifier(), loss, (x, y), probe=x, measures=["sam"], reference=4)
    with pytest.raises(TypeError, match="measures must hold"):
        atlas(classifier(), loss, (x, y), probe=x, measures=[flatness.sam_sharpness])
    with pytest.raises(ValueError, match="without repeats"):
        atlas(classifier(), loss, (x, y), probe=x, measures=["sam", "sam"])
    with pytest.raises(ValueError, match="no transformation of the atlas applies"):
        atlas(classifier(), loss, (x, y), probe=x, measures=["sam"], transforms=["normalisation_rescaling"])


def test_the_registry_lists_every_book_measure_once_with_a_citation():
    assert len(MEASURES) == 14
    for measure in MEASURES.values():
        assert measure.definition and measure.citation
        assert measure.tolerance_for(torch.float32) >= 1e-3
    assert symmetries.core.ROUNDING_FLOOR == symmetries.core.rounding_floor(torch.float64)


def test_a_move_never_reads_as_times_one():
    cell = atlas_module.columns.Cell("trace", "layer_rescaling", "moves", before=1.0, after=1.0004, tolerance=1e-9)
    assert cell.text() == "×1.0004"
    halved = atlas_module.columns.Cell("trace", "layer_rescaling", "moves", before=2.0, after=1.0, tolerance=1e-9)
    assert halved.text() == "×0.5"


def test_the_point_record_is_the_loss_and_gradient_at_each_point(table):
    """The loss and gradient norm, recomputed by hand at the model and at the layer-rescaled point."""
    x, y = data()
    model = classifier()
    params = dict(model.named_parameters())
    value = nn.functional.cross_entropy(model(x), y)
    gradient = torch.cat([g.reshape(-1) for g in torch.autograd.grad(value, list(params.values()))])
    assert table.point.loss == pytest.approx(float(value.detach()), rel=1e-14)
    assert table.point.gradient_norm == pytest.approx(float(gradient.norm()), rel=1e-12)
    assert table.point.fisher is None  # the Fisher-Riemannian row is not among CHEAP
    for column, record in zip(table.columns, table.column_points):
        assert (record is None) == (not column.applies)
        if record is not None:
            assert record.loss == pytest.approx(table.point.loss, rel=1e-12), column.key
    # a rescaling keeps the loss but not the gradient (g -> D^-1 g); a permutation keeps both
    assert table.column_point("layer_rescaling").gradient_norm != pytest.approx(table.point.gradient_norm, rel=1e-3)
    assert table.column_point("permutation").gradient_norm == pytest.approx(table.point.gradient_norm, rel=1e-12)
    assert table.column_point("normalisation_rescaling") is None


def test_the_fisher_record_agrees_with_flatness_at_every_cut():
    x, y = data()
    table = atlas(
        classifier(),
        nn.CrossEntropyLoss(),
        (x, y),
        probe=x[:12],
        measures=["fisher_riemannian"],
        transforms=["layer_rescaling", "permutation"],
    )
    point = flatness.LossPoint(classifier(), nn.CrossEntropyLoss(), (x, y))
    H, F = point.hessian(), point.fisher()
    record = table.point.fisher
    assert record.threshold == atlas_module.measures.FISHER_RANK_THRESHOLD == 1e-9
    assert record.n_parameters == 44 and [cut for cut, _, _ in record.cuts] == list(atlas_module.measures.FISHER_CUTS)
    for cut, rank, value in record.cuts:
        reference = flatness.fisher_riemannian_sharpness_from_matrices(H, F, rel_threshold=cut)
        assert rank == reference.rank and value == pytest.approx(reference.value, rel=1e-9), cut
    reference = flatness.fisher_riemannian_sharpness_from_matrices(H, F)
    assert record.rank == reference.rank and record.value() == pytest.approx(table.value("fisher_riemannian"), rel=1e-9)
    assert record.kernel_leakage == pytest.approx(reference.kernel_leakage, rel=1e-8)
    phi = np.sort(np.linalg.eigvalsh(F))[::-1] / np.linalg.eigvalsh(F).max()
    assert record.kept == pytest.approx(phi[record.rank - 1], rel=1e-8)
    assert 0 <= record.dropped < 1e-13 and record.gap > 1e6  # the dropped eigenvalues are rounding here
    assert record.dropped_text() == "< 1e-13" and record.gap_text() == f"more than {fmt(record.kept / 1e-13, 2)}"
    text = fisher_cuts_markdown(table)
    assert len(text.splitlines()) == 2 + len(atlas_module.measures.FISHER_CUTS) and "1e-09 (the row's)" in text
    assert "Fisher-Riemannian row: the Fisher has rank" in table.point_text()
    with pytest.raises(ValueError, match="cut must be one of"):
        record.value(1e-3)


def test_fisher_record_of_a_known_spectrum():
    """F = diag(1, 1e-3, 1e-12, 0): rank 2 at the cut 1e-9, kept 1e-3, dropped 1e-12; H couples the kernel."""
    F = np.diag([1.0, 1e-3, 1e-12, 0.0])
    H = np.diag([2.0, 5e-3, 0.0, 0.0])
    H[0, 3] = H[3, 0] = 0.5
    record = atlas_module.records.fisher_record(H, F)
    assert (record.rank, record.kept, record.dropped) == (2, 1e-3, 1e-12)
    assert record.gap == pytest.approx(1e9) and record.gap_text() == "1e+09" and record.dropped_text() == "1e-12"
    assert record.value() == pytest.approx(5.0)  # max(2 / 1, 5e-3 / 1e-3)
    assert record.rank_at(1e-11) == 2 and record.rank_at(1e-6) == 2
    # |H N|_2 / |H|_2 with N = (e_3, e_4): H N has the single entry 0.5
    assert record.kernel_leakage == pytest.approx(0.5 / np.abs(np.linalg.eigvalsh(H)).max())
    assert atlas_module.records.fisher_record(np.diag([1.0, 2.0]), np.eye(2)).gap == math.inf
    with pytest.raises(ValueError, match="positive eigenvalue"):
        atlas_module.records.fisher_record(H, -F)
    with pytest.raises(ValueError, match="square matrices of one size"):
        atlas_module.records.fisher_record(H, np.eye(3))


def test_feature_norm_change_and_the_hessian_block_trace():
    x, y = data()
    model, loss = classifier(), nn.CrossEntropyLoss()
    assert feature_norm(model, loss, (x, y), symmetry=symmetries.layer_rescaling("0", "2", 2.0)) > 0.1
    assert feature_norm(model, loss, (x, y), symmetry=symmetries.unit_permutation("0", "2", [4, 0, 1, 2, 3])) < 1e-14
    assert (
        feature_norm(
            model, loss, (x, y), symmetry=symmetries.layers.reference_class_shift("2.weight", 1, bias="2.bias")
        )
        == 0
    )
    with pytest.raises(TypeError, match="lossgeom Symmetry"):
        feature_norm(model, loss, (x, y), symmetry="permutation")
    point = flatness.LossPoint(model, loss, (x, y))
    H = point.hessian()
    index = np.concatenate([point.block_indices("0.weight"), point.block_indices("0.bias")])
    assert atlas_module.records.hessian_block_trace(point, ["0.weight", "0.bias"]) == pytest.approx(
        float(np.diag(H)[index].sum()), rel=1e-10
    )
    with pytest.raises(ValueError, match="at least one parameter"):
        atlas_module.records.hessian_block_trace(point, [])
    with pytest.raises(ValueError, match="not a parameter"):
        atlas_module.records.hessian_block_trace(point, "9.weight")


def test_two_transforms_of_one_name_are_refused_and_a_zero_feature_vector_has_no_nan_change():
    x, y = data()
    model, loss = classifier(), nn.CrossEntropyLoss()
    twice = [
        symmetries.unit_permutation("0", "2", [4, 0, 1, 2, 3]),
        symmetries.unit_permutation("0", "2", [1, 0, 2, 3, 4]),
    ]
    twice = [symmetries.Symmetry("swap", s.transform) for s in twice]
    with pytest.raises(ValueError, match="transforms name 'swap' more than once"):
        atlas(model, loss, (x, y), probe=x, measures=["trace"], transforms=twice)
    torch.manual_seed(0)
    dead = nn.Sequential(nn.Linear(3, 4, **F64), nn.ReLU(), nn.Linear(4, 2, bias=False, **F64))
    with torch.no_grad():
        dead[0].bias.fill_(-1e3)  # every unit off: every feature vector h_i is zero
    change = feature_norm(dead, loss, (x, y % 2), symmetry=symmetries.layer_rescaling("0", "2", 2.0))
    assert change == 0.0

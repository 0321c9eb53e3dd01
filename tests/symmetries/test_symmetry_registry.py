"""The symmetry registry and the module-first audit (issue 9): found, checked, refused, printed."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lossgeom.flatness.softmax_gauge import row_shift_symmetry
from lossgeom.symmetries import (
    Symmetry,
    audit,
    find_symmetries,
    relu_neuron_rescaling,
    softmax_row_shift,
    unit_permutation,
)
from lossgeom.symmetries.layers import centred_over_classes
from lossgeom.symmetries.module_audit import AuditTable


def mlp(activation=nn.ReLU, dtype=torch.float64, seed=0, widths=(5, 7, 4)):
    torch.manual_seed(seed)
    layers = []
    for i, (n_in, n_out) in enumerate(zip(widths[:-1], widths[1:])):
        if i:
            layers.append(activation())
        layers.append(nn.Linear(n_in, n_out, dtype=dtype))
    return nn.Sequential(*layers)


def probe_for(n_in=5, n=24, dtype=torch.float64, seed=1):
    return torch.randn(n, n_in, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def params_of(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def outputs(model, params, x):
    with torch.no_grad():
        return torch.func.functional_call(model, params, (x,))


def squared_weight_norm(m):
    return sum(float(p.detach().pow(2).sum()) for p in m.parameters())


class Named(nn.Module):
    """A module with named layers, a functional ReLU and a view-flatten."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.embed = nn.Linear(5, 6, dtype=torch.float64)
        self.hidden = nn.Linear(6, 4, dtype=torch.float64)
        self.head = nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, x):
        h = torch.relu(self.embed(x))
        h = torch.tanh(self.hidden(h))
        h = h.view(h.size(0), -1)
        return self.head(h)


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.fc1 = nn.Linear(5, 5, dtype=torch.float64)
        self.fc2 = nn.Linear(5, 5, dtype=torch.float64)
        self.out = nn.Linear(5, 2, dtype=torch.float64)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        return self.out(torch.relu(self.fc2(h) + h))


class Branchy(nn.Module):
    def forward(self, x):
        return x if x.sum() > 0 else -x


def cnn(dtype=torch.float32):
    torch.manual_seed(5)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, dtype=dtype),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(4, 5, 3, dtype=dtype),
        nn.LeakyReLU(0.1),
        nn.Flatten(),
        nn.Linear(5 * 2 * 2, 6, dtype=dtype),
        nn.Tanh(),
        nn.Linear(6, 3, dtype=dtype),
    )


# --- what the registry finds ---------------------------------------------------------------


def test_registry_finds_rescaling_permutation_and_shift_of_a_relu_classifier():
    model = mlp()
    found = find_symmetries(model, loss=nn.CrossEntropyLoss(), seed=7)
    names = [s.name for s in found]
    assert names == [
        "ReLU rescaling 0 -> 2 (7 units, c in [1/2, 2])",
        "permutation 0 -> 2 (7 units)",
        "softmax row shift of 2 (|shift| = 1 RMS row)",
    ]
    assert found.skipped == () and "seed 7" in found.sampling
    # every option of the cross-entropy reads the logits through the softmax: the shift stays;
    # a subclass that overrides forward may not, so the shift is not reported for it
    options = nn.CrossEntropyLoss(label_smoothing=0.1, ignore_index=0)
    assert [s.name for s in find_symmetries(model, loss=options, seed=7)] == names

    class Squared(nn.CrossEntropyLoss):
        def forward(self, out, y):
            return (out**2).mean()

    assert not any(s.name.startswith("softmax") for s in find_symmetries(model, loss=Squared(), seed=7))
    params = params_of(model)
    rescaled, permuted, shifted = (s(params) for s in found)
    # the rescaling, recovered from its action: one factor per unit, in [1/2, 2], applied to
    # the row and bias of layer 0 and (inverted) to the column of layer 2
    c = rescaled["0.bias"] / params["0.bias"]
    assert torch.allclose(rescaled["0.weight"], params["0.weight"] * c[:, None], rtol=1e-15, atol=0)
    assert torch.allclose(rescaled["2.weight"], params["2.weight"] / c[None, :], rtol=1e-15, atol=0)
    assert float(c.min()) >= 0.5 and float(c.max()) <= 2.0 and float(c.max() / c.min()) > 1.1
    # the permutation: rows of layer 0 and columns of layer 2 move together
    order = [int((params["0.bias"] == b).nonzero()) for b in permuted["0.bias"]]
    assert sorted(order) == list(range(7)) and order != list(range(7))
    assert torch.equal(permuted["0.weight"], params["0.weight"][order])
    assert torch.equal(permuted["2.weight"], params["2.weight"][:, order])
    # the shift: the same augmented row added to every row of [W b]
    delta = torch.cat([shifted["2.weight"] - params["2.weight"], (shifted["2.bias"] - params["2.bias"])[:, None]], 1)
    assert torch.allclose(delta, delta[:1].expand_as(delta), rtol=0, atol=1e-15)
    rows = torch.cat([params["2.weight"], params["2.bias"][:, None]], 1)
    assert float(delta[0].norm()) == pytest.approx(float(rows.norm()) / math.sqrt(4), rel=1e-12)
    assert all(torch.equal(shifted[k], params[k]) for k in ("0.weight", "0.bias"))


def test_found_symmetries_preserve_the_function_checked_by_hand():
    model, x = mlp(), probe_for()
    params, base = params_of(model), outputs(mlp(), params_of(mlp()), probe_for())
    rescaled, permuted, shifted = (s(params) for s in find_symmetries(model, loss=nn.CrossEntropyLoss()))
    assert torch.allclose(outputs(model, rescaled, x), base, rtol=0, atol=1e-13)
    assert torch.allclose(outputs(model, permuted, x), base, rtol=0, atol=1e-13)
    moved = outputs(model, shifted, x)
    assert (moved - base).abs().max() > 1e-2  # the logits move ...
    assert torch.allclose(torch.softmax(moved, -1), torch.softmax(base, -1), rtol=0, atol=1e-14)  # ... not p
    assert torch.allclose(centred_over_classes(moved), centred_over_classes(base), rtol=0, atol=1e-13)


def test_seed_and_generator_make_the_draws_repeatable():
    model = mlp()
    params = params_of(model)
    a, b = find_symmetries(model, seed=3), find_symmetries(model, seed=3)
    c = find_symmetries(model, generator=torch.Generator().manual_seed(3))
    d = find_symmetries(model, seed=4)
    assert torch.equal(a.symmetries[0](params)["0.bias"], b.symmetries[0](params)["0.bias"])
    assert torch.equal(a.symmetries[0](params)["0.bias"], c.symmetries[0](params)["0.bias"])
    assert not torch.equal(a.symmetries[0](params)["0.bias"], d.symmetries[0](params)["0.bias"])
    assert "the given generator" in c.sampling
    scales = find_symmetries(model, rescale=10.0).symmetries[0](params)["0.bias"] / params["0.bias"]
    assert float(scales.min()) >= 0.1 and float(scales.max()) <= 10.0
    with pytest.raises(ValueError, match="seed or generator, not both"):
        find_symmetries(model, seed=1, generator=torch.Generator())
    with pytest.raises(ValueError, match="rescale must be > 1"):
        find_symmetries(model, rescale=1.0)
    with pytest.raises(ValueError, match="shift must be > 0"):
        find_symmetries(model, shift=0.0)


def test_named_layers_functional_relu_tanh_and_view_flatten():
    found = find_symmetries(Named(), loss=nn.CrossEntropyLoss())
    assert [s.name.split(" (")[0] for s in found] == [
        "ReLU rescaling embed -> hidden",
        "permutation embed -> hidden",
        "permutation hidden -> head",
        "softmax row shift of head",
    ]
    assert found.skipped == (
        "rescaling hidden -> head: the activation (tanh) is not positively homogeneous",
        "sign flip hidden -> head: the activation (tanh) is odd, so negating a unit's incoming and outgoing "
        "weights keeps the function; the registry does not look for it (not audited)",
    )
    table = audit(Named(), squared_weight_norm, probe_for(), loss=nn.CrossEntropyLoss())
    assert len(table) == 4 and all(r.is_symmetry for r in table)


def test_conv_net_in_float32_rescaling_and_permutation_of_channels_across_pool_and_flatten():
    model, x = cnn(), torch.randn(12, 1, 10, 10, generator=torch.Generator().manual_seed(2))
    found = find_symmetries(model, loss=nn.CrossEntropyLoss())
    assert [s.name.split(" (")[0] for s in found] == [
        "ReLU rescaling 0 -> 3",
        "permutation 0 -> 3",
        "LeakyReLU rescaling 3 -> 6",
        "permutation 3 -> 6",
        "permutation 6 -> 8",
        "softmax row shift of 8",
    ]
    params = params_of(model)
    # the channel rescaling 3 -> 6 crosses the Flatten: channel j owns columns 4j..4j+3 of layer 6
    moved = found.symmetries[2](params)
    c = moved["3.bias"] / params["3.bias"]
    expected = (params["6.weight"].reshape(6, 5, 4) / c[None, :, None]).reshape(6, 20)
    assert torch.allclose(moved["6.weight"], expected, rtol=1e-6, atol=0)
    table = audit(model, squared_weight_norm, x, loss=nn.CrossEntropyLoss())
    assert table.dtype == "float32" and all(r.is_symmetry for r in table)
    assert all(r.relative_tolerance == 1e-4 and r.rounding_floor == 1e-4 for r in table)
    assert "below 0.0001 (rounding level)" in str(table)


def test_final_log_softmax_needs_no_loss_and_compares_outputs_themselves():
    model = nn.Sequential(mlp(), nn.LogSoftmax(dim=-1))
    found = find_symmetries(model)
    shift = found.symmetries[-1]
    assert shift.name.startswith("softmax row shift of 0.2") and shift.invariant is None
    table = audit(model, None, probe_for())
    assert table[-1].compared == "outputs" and table[-1].is_symmetry


def test_without_a_softmax_loss_no_shift_is_reported_and_the_receipt_says_why():
    found = find_symmetries(mlp(), loss=nn.MSELoss())
    assert not any("shift" in s.name for s in found)
    assert found.skipped == (
        (
            "softmax shift of '2': not looked for, since loss=MSELoss() is not a softmax cross-entropy "
            "(pass loss=nn.CrossEntropyLoss() if the outputs are its logits)"
        ),
    )


# --- what the registry refuses -------------------------------------------------------------


def test_relu_followed_by_layernorm_is_refused_and_rightly_so():
    torch.manual_seed(6)
    model = nn.Sequential(
        nn.Linear(5, 6, dtype=torch.float64),
        nn.ReLU(),
        nn.LayerNorm(6, dtype=torch.float64),
        nn.Linear(6, 3, dtype=torch.float64),
    )
    found = find_symmetries(model)
    assert not any("0 -> 3" in s.name for s in found)
    assert any("LayerNorm '2'" in r and "normalisation" in r for r in found.skipped)
    # the refusal is warranted: the rescaling it would have reported changes the outputs
    params, x = params_of(model), probe_for()
    moved = relu_neuron_rescaling("0", "3", torch.linspace(0.5, 2.0, 6))(params)
    assert (outputs(model, moved, x) - outputs(model, params, x)).abs().max() > 1e-3
    # what the registry reports instead is the layer norm's own rescaling against the layer reading it
    table = audit(model, squared_weight_norm, x)
    assert [r.symmetry.split(" (")[0] for r in table] == ["layer-norm rescaling 2 -> 3"] and table[0].is_symmetry


def test_batchnorm_residual_shared_layers_and_recurrent_layers_are_refused():
    torch.manual_seed(7)
    bn = nn.Sequential(nn.Linear(5, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2)).eval()
    # the rescaling of 0 -> 3 through the batch norm is not reported; its own symmetries are
    assert [s.name.split(" (")[0] for s in find_symmetries(bn)] == [
        "batch-norm scale invariance 0 -> 1",
        "ReLU rescaling 1 -> 3",
        "permutation 0 -> 3",
    ]
    residual = find_symmetries(Residual())  # h = relu(fc1 x) feeds fc2 and the sum fc2(h) + h
    assert len(residual) == 0
    assert any("'fc1'" in r and "feeds 2 operations" in r for r in residual.skipped)
    assert any("'fc2'" in r and "call_function 'add'" in r for r in residual.skipped)
    shared = nn.Linear(5, 5)
    assert any("called more than once" in r for r in find_symmetries(nn.Sequential(shared, nn.ReLU(), shared)).skipped)

    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.out = nn.LSTM(5, 4, batch_first=True), nn.Linear(4, 3)

        def forward(self, x):
            return self.out(self.rnn(x)[0])

    assert any("LSTM 'rnn'" in r and "does not find its symmetries" in r for r in find_symmetries(Tagger()).skipped)
    with pytest.raises(ValueError, match="cannot trace Branchy with torch.fx"):
        find_symmetries(Branchy())


def test_dropout_in_training_mode_is_refused():
    torch.manual_seed(8)
    model = nn.Sequential(
        nn.Linear(5, 6, dtype=torch.float64), nn.ReLU(), nn.Dropout(0.5), nn.Linear(6, 3, dtype=torch.float64)
    )
    assert any("training mode" in r for r in find_symmetries(model).skipped)
    with pytest.raises(ValueError, match=r"differ between two evaluations .*call model.eval\(\)"):
        audit(model, squared_weight_norm, probe_for())
    table = audit(model.eval(), squared_weight_norm, probe_for())
    assert [r.symmetry.split(" (")[0] for r in table] == ["ReLU rescaling 0 -> 3", "permutation 0 -> 3"]


# --- the audit: check first, measure after, caller untouched --------------------------------


def test_audit_measures_recomputed_by_hand_and_the_callers_model_untouched():
    model, x = mlp(), probe_for()
    state = {k: v.clone() for k, v in model.state_dict().items()}

    def sharpness_like(m):  # a measure that runs backward on the model it is given
        loss = m(x).logsumexp(-1).mean()
        loss.backward()
        return float(sum((p.grad**2).sum() for p in m.parameters()))

    table = audit(model, squared_weight_norm, x, loss=nn.CrossEntropyLoss(), seed=2)
    audit(model, sharpness_like, x, loss=nn.CrossEntropyLoss())
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    assert all(p.grad is None for p in model.parameters())
    params = params_of(model)
    for report, symmetry in zip(table, find_symmetries(model, loss=nn.CrossEntropyLoss(), seed=2)):
        moved = symmetry(params)
        assert report.symmetry == symmetry.name
        assert report.measure_before == pytest.approx(sum(float((v**2).sum()) for v in params.values()), rel=1e-14)
        assert report.measure_after == pytest.approx(sum(float((v**2).sum()) for v in moved.values()), rel=1e-14)
    assert table[1].measure_ratio == pytest.approx(1.0, rel=1e-14)  # a permutation keeps every norm
    assert table[0].measure_ratio != pytest.approx(1.0, rel=1e-3)
    on_params = audit(
        model,
        lambda p: sum(float((v**2).sum()) for v in p.values()),
        x,
        loss=nn.CrossEntropyLoss(),
        seed=2,
        measure_on="params",
        measure_name="norm",
    )
    assert [r.measure_after for r in on_params] == pytest.approx([r.measure_after for r in table], rel=1e-14)
    assert on_params[0].measure_name == "norm" and table[0].measure_name == "squared weight norm"


def test_a_hand_written_non_symmetry_is_caught_before_any_measure():
    model, x = mlp(), probe_for()
    flip = relu_neuron_rescaling("0", "2", [1.0] * 7)
    negate = Symmetry(
        "negate layer 0 (not a symmetry of ReLU)",
        lambda p: {**p, "0.weight": -p["0.weight"], "0.bias": -p["0.bias"], "2.weight": -p["2.weight"]},
    )
    with pytest.raises(ValueError, match=r"negate layer 0 .* is not a symmetry of Sequential .* exceeds rtol 1e-10"):
        audit(model, squared_weight_norm, x, symmetries=[flip, negate])
    table = audit(model, squared_weight_norm, x, symmetries=[flip, negate], require_symmetry=False)
    assert table[0].is_symmetry and table[0].max_output_discrepancy == 0.0
    assert not table[1].is_symmetry and table[1].measure_before is None
    assert "FAILED" in str(table).splitlines()[-1]
    # recomputed another way: the largest change of the logits over their largest magnitude
    base, moved = outputs(model, params_of(model), x), outputs(model, negate(params_of(model)), x)
    assert table[1].relative_discrepancy == pytest.approx(float((moved - base).abs().max() / base.abs().max()))


def test_the_receipt_is_portable_text():
    table = audit(mlp(), squared_weight_norm, probe_for(), loss=nn.CrossEntropyLoss(), sig=4)
    assert isinstance(table, AuditTable) and len(table) == 3
    text = str(table)
    lines = text.splitlines()
    assert lines[0] == "symmetry audit of Sequential (float64) on 24 probe inputs"
    assert text.count("below 1e-13 (rounding level)") == 3
    body = lines[3:6]
    assert len(body) == 3 and lines[6].startswith("sizes: ")  # one printed row per report, then the sizes
    for report, line in zip(table, body, strict=True):
        assert line.startswith(report.symmetry + "  ")
        assert line.split()[-3:] == [
            f"{report.measure_before:.4g}",
            f"{report.measure_after:.4g}",
            f"{report.measure_ratio:.4g}",
        ]
    single = str(table[0]).splitlines()
    expected = "largest discrepancy: below 1e-13 (rounding level) of the scale (same function on the probe set)"
    assert single[2] == expected
    rows = table.rows()
    assert [row["symmetry"] for row in rows] == [report.symmetry for report in table]
    assert [row["ratio"] for row in rows] == [report.measure_ratio for report in table]
    assert rows[2]["compared"] == "logits centred over classes"


def test_audit_works_in_the_models_dtype_and_converts_the_probe():
    model = mlp(dtype=torch.float32)
    seen = []

    def first_dtype(m):
        seen.append(next(m.parameters()).dtype)
        return 1.0

    table = audit(model, first_dtype, probe_for(dtype=torch.float64))
    assert table.dtype == "float32" and len(table) == 2
    assert seen == [torch.float32] * (1 + len(table))  # once before, once after each symmetry
    assert all(report.details["dtype"] == "float32" and report.measure_after == 1.0 for report in table)


def test_bad_input_is_named():
    model, x = mlp(), probe_for()
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        audit(lambda t: t, squared_weight_norm, x)
    with pytest.raises(TypeError, match="probe must be a tensor of inputs only"):
        audit(model, squared_weight_norm, (x, torch.zeros(24)))
    with pytest.raises(ValueError, match="probe must hold at least one input"):
        audit(model, squared_weight_norm, x[:0])
    with pytest.raises(ValueError, match="probe must contain only finite values"):
        audit(model, squared_weight_norm, x * float("nan"))
    with pytest.raises(ValueError, match="rtol must be > 0"):
        audit(model, squared_weight_norm, x, rtol=0.0)
    with pytest.raises(ValueError, match="measure_on must be 'model' or 'params'"):
        audit(model, squared_weight_norm, x, measure_on="weights")
    with pytest.raises(TypeError, match="measure must be callable"):
        audit(model, 3.0, x)
    with pytest.raises(ValueError, match="measure returned nan"):
        audit(model, lambda m: float("nan"), x)
    with pytest.raises(ValueError, match=r"one real number, got a tensor of shape \(2,\)"):
        audit(model, lambda m: torch.ones(2), x)
    with pytest.raises(ValueError, match="float32 or float64"):
        audit(mlp().half(), squared_weight_norm, x)
    with pytest.raises(ValueError, match=r"model failed on the probe set of shape \(24, 3\)"):
        audit(model, squared_weight_norm, x[:, :3])
    with pytest.raises(TypeError, match="loss must be a torch loss module or None, got the string 'cross_entropy'"):
        audit(model, squared_weight_norm, x, loss="cross_entropy")
    with pytest.raises(TypeError, match="non-empty list of lossgeom Symmetry"):
        audit(model, squared_weight_norm, x, symmetries=[lambda p: p])


# --- the named-layer symmetries behind the registry ------------------------------------------


def test_unit_permutation_and_its_errors():
    model, x = mlp(), probe_for()
    params = params_of(model)
    perm = [2, 0, 1, 3, 4, 6, 5]
    moved = unit_permutation("0", "2", perm)(params)
    assert torch.equal(moved["0.weight"][0], params["0.weight"][2])
    assert torch.equal(moved["2.weight"][:, 0], params["2.weight"][:, 2])
    assert torch.allclose(outputs(model, moved, x), outputs(model, params, x), rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="each of 0..2 exactly once"):
        unit_permutation("0", "2", [0, 0, 1])
    with pytest.raises(ValueError, match="1-D sequence of integers"):
        unit_permutation("0", "2", [0.0, 1.0])
    with pytest.raises(ValueError, match="must agree"):
        unit_permutation("0", "2", [1, 0])(params)


def test_softmax_row_shift_agrees_with_the_softmax_module():
    model = mlp()
    params = params_of(model)
    v = torch.linspace(-1.0, 1.0, 7)
    mine = softmax_row_shift("2.weight", v)(params)
    theirs = row_shift_symmetry(v, "2.weight")(params)
    assert torch.equal(mine["2.weight"], theirs["2.weight"])
    with_bias = softmax_row_shift("2.weight", v, bias="2.bias", beta=0.5)(params)
    assert torch.equal(with_bias["2.bias"], params["2.bias"] + 0.5)
    with pytest.raises(ValueError, match="give the bias's parameter name"):
        softmax_row_shift("2.weight", v, beta=1.0)
    with pytest.raises(ValueError, match=r"must be a \(K, 3\) classifier"):
        softmax_row_shift("2.weight", torch.ones(3))(params)
    with pytest.raises(ValueError, match="needs params"):
        softmax_row_shift("3.weight", v)(params)


def test_linear_units_on_a_sequence_axis_cross_a_flatten_as_the_last_axis():
    # hidden (N, T, 4) flattened to (N, 4 T): unit j owns columns j, 4 + j, 8 + j, ...
    torch.manual_seed(9)
    model = nn.Sequential(
        nn.Linear(3, 4, dtype=torch.float64), nn.ReLU(), nn.Flatten(), nn.Linear(5 * 4, 2, dtype=torch.float64)
    )
    x = torch.randn(8, 5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    rescaling, permutation = find_symmetries(model)
    params = params_of(model)
    moved = rescaling(params)
    c = moved["0.bias"] / params["0.bias"]
    assert torch.allclose(moved["3.weight"], params["3.weight"] / c.repeat(5)[None, :], rtol=1e-15, atol=0)
    for symmetry in (rescaling, permutation):
        assert torch.allclose(outputs(model, symmetry(params), x), outputs(model, params, x), rtol=0, atol=1e-13)
    assert all(r.is_symmetry for r in audit(model, None, x))


def test_tied_weights_are_listed_as_not_audited_never_reported():
    """A weight shared by two layers: transforming one layer's units alone is not a symmetry."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(4, 4, dtype=torch.float64),
        nn.ReLU(),
        nn.Linear(4, 4, dtype=torch.float64),
        nn.ReLU(),
        nn.Linear(4, 3, dtype=torch.float64),
    )
    model[2].weight = model[0].weight  # tied
    found = find_symmetries(model, loss=nn.CrossEntropyLoss())
    probe = torch.randn(10, 4, dtype=torch.float64)
    params = dict(model.named_parameters())
    for symmetry in found:  # whatever is reported keeps the predicted probabilities
        moved = torch.func.functional_call(model, symmetry(params), (probe,))
        assert torch.allclose(moved.softmax(-1), model(probe).softmax(-1), atol=1e-10), symmetry.name
    assert any("shared (tied) tensor" in reason for reason in found.skipped)
    assert not any("0 -> 2" in s.name or "2 -> 4" in s.name for s in found)
    # the untied model has both pairs
    untied = nn.Sequential(
        *[
            m if not isinstance(m, nn.Linear) else nn.Linear(m.in_features, m.out_features, dtype=torch.float64)
            for m in model
        ]
    )
    assert sum("rescaling" in s.name for s in find_symmetries(untied, loss=nn.CrossEntropyLoss())) == 2


def test_the_sign_flip_of_an_odd_activation_is_listed_as_not_audited():
    model = nn.Sequential(nn.Linear(3, 4, dtype=torch.float64), nn.Tanh(), nn.Linear(4, 2, dtype=torch.float64))
    found = find_symmetries(model)
    flips = [reason for reason in found.skipped if reason.startswith("sign flip 0 -> 2")]
    assert len(flips) == 1 and "not audited" in flips[0]
    relu = nn.Sequential(nn.Linear(3, 4, dtype=torch.float64), nn.ReLU(), nn.Linear(4, 2, dtype=torch.float64))
    assert not any(reason.startswith("sign flip") for reason in find_symmetries(relu).skipped)


def test_found_symmetries_grouped_by_kind_in_order_and_a_name_of_no_kind_refused():
    from lossgeom.symmetries import Symmetry, find_symmetries
    from lossgeom.symmetries.registry import KINDS, FoundSymmetries

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(3, 4, dtype=torch.float64),
        nn.ReLU(),
        nn.Linear(4, 4, dtype=torch.float64),
        nn.Tanh(),
        nn.Linear(4, 2, dtype=torch.float64),
    )
    groups = find_symmetries(model, loss=nn.CrossEntropyLoss()).by_kind()
    assert list(groups) == ["ReLU rescaling", "permutation", "softmax row shift"]
    assert [len(g) for g in groups.values()] == [1, 2, 1]  # the tanh pair is only permutable
    assert all(kind in KINDS for kind in groups)
    odd = FoundSymmetries((Symmetry("a hand-made swap", lambda p: dict(p)),), (), "")
    with pytest.raises(ValueError, match="'a hand-made swap' is of no kind"):
        odd.by_kind()

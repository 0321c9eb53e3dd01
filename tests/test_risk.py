"""Tests of lossgeom.risk: the one risk object every module-form curvature function is built on."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lossgeom.curvature import dense_hessian, hessian_operator
from lossgeom.losses import check_loss
from lossgeom.models import loss_closure
from lossgeom.risk import EmpiricalRisk, check_model, closure_risk_pieces

from conftest import assert_close


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()


def test_the_risk_of_unequal_batches_is_the_mean_over_all_terms():
    model = _model()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(7, 3, generator=g), torch.randint(0, 2, (7,), generator=g)
    whole = EmpiricalRisk(model, nn.CrossEntropyLoss(), (x, y))
    split = EmpiricalRisk(model, nn.CrossEntropyLoss(), [(x[:2], y[:2]), (x[2:], y[2:])])
    expected = nn.functional.cross_entropy(model(x), y)
    assert_close(whole.value(), expected, rtol=1e-14, atol=0)
    assert_close(split.value(), expected, rtol=1e-14, atol=0)
    assert split.weights == pytest.approx([2 / 7, 5 / 7]) and split.n_batches == 2
    summed = EmpiricalRisk(model, nn.CrossEntropyLoss(reduction="sum"), [(x[:2], y[:2]), (x[2:], y[2:])])
    assert_close(summed.value(), 7 * expected, rtol=1e-13, atol=0)


def test_params_are_keyword_only_and_set_the_point():
    model = _model()
    x, y = torch.randn(5, 3), torch.randn(5, 2)
    params = {name: 2.0 * p.detach() for name, p in model.named_parameters()}
    risk = EmpiricalRisk(model, nn.MSELoss(), (x, y), params=params)
    assert_close(
        risk.value(), nn.functional.mse_loss(torch.func.functional_call(model, params, (x,)), y), rtol=1e-14, atol=0
    )
    with pytest.raises(TypeError, match=r"takes \d+ positional arguments? but \d+ (were|was) given"):
        EmpiricalRisk(model, nn.MSELoss(), (x, y), params)


def test_loss_names_are_refused_with_the_module_to_pass():
    for name, module in (("cross_entropy", "nn.CrossEntropyLoss()"), ("mse", "nn.MSELoss()")):
        with pytest.raises(TypeError, match=f"loss must be a loss module, got the string '{name}'.*{module[:-2]}"):
            check_loss(name)
    with pytest.raises(TypeError, match="got a dict"):
        check_loss({"w": torch.zeros(1)})
    with pytest.raises(TypeError, match="got function"):
        check_loss(nn.functional.l1_loss)
    with pytest.raises(ValueError, match="got 'none'"):
        check_loss(nn.CrossEntropyLoss(reduction="none"))
    for module in (nn.CrossEntropyLoss(label_smoothing=0.1), nn.L1Loss(), nn.KLDivLoss(reduction="batchmean")):
        assert check_loss(module) is module


def test_data_forms_and_errors():
    model = _model()
    x, y = torch.zeros(3, 3, dtype=torch.float64), torch.zeros(3, dtype=torch.long)
    ce = nn.CrossEntropyLoss()
    assert EmpiricalRisk(model, ce, (x, y)).n_batches == 1
    assert EmpiricalRisk(model, ce, [(x, y), (x, y)]).n_batches == 2
    with pytest.raises(TypeError, match="got one tensor"):
        EmpiricalRisk(model, ce, x)
    with pytest.raises(ValueError, match="empty data"):
        EmpiricalRisk(model, ce, [])
    with pytest.raises(ValueError, match="one entry per example"):
        EmpiricalRisk(model, ce, (x, y[:2]))


def test_closure_pieces_refuse_a_model_and_non_scalars():
    model = _model()
    params = {name: p.detach() for name, p in model.named_parameters()}
    with pytest.raises(TypeError, match="got an nn.Module"):
        closure_risk_pieces(model, params)
    with pytest.raises(ValueError, match="scalar"):
        closure_risk_pieces(lambda p: p["0.bias"], params)
    point, unflatten, scalar = closure_risk_pieces(lambda p: (p["0.bias"] ** 2).sum(), params)
    assert point.numel() == sum(p.numel() for p in params.values())
    assert_close(scalar(point), (params["0.bias"] ** 2).sum(), rtol=0, atol=0)
    with pytest.raises(TypeError, match="closure form"):
        EmpiricalRisk(lambda p: p, nn.MSELoss(), (torch.zeros(2, 3), torch.zeros(2, 2)))


def _digits_like(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(12, 4, generator=gen, dtype=torch.float64), torch.randint(0, 3, (12,), generator=gen)


def test_train_mode_layers_are_refused_at_any_depth_naming_the_submodule():
    """A BatchNorm or Dropout left in training mode inside an eval-mode model is refused."""
    x, y = _digits_like()
    inner = nn.Sequential(nn.Linear(4, 5, dtype=torch.float64), nn.BatchNorm1d(5, dtype=torch.float64))
    model = nn.Sequential(inner, nn.ReLU(), nn.Linear(5, 3, dtype=torch.float64)).eval()
    inner[1].train()  # one submodule left in training mode, the model itself in eval mode
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    for entry in (
        lambda: hessian_operator(model, nn.CrossEntropyLoss(), (x, y)),
        lambda: dense_hessian(model, nn.CrossEntropyLoss(), (x, y)),
        lambda: loss_closure(model, nn.CrossEntropyLoss(), (x, y)),
        lambda: EmpiricalRisk(model, nn.CrossEntropyLoss(), (x, y)),
    ):
        with pytest.raises(ValueError, match=r"batch norm in training mode .* at submodule '0.1' \(BatchNorm1d\)"):
            entry()
    assert all(torch.equal(buffers[k], v) for k, v in model.named_buffers())  # running statistics untouched
    dropped = nn.Sequential(nn.Linear(4, 5, dtype=torch.float64), nn.Dropout(0.5), nn.Linear(5, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"dropout \(p = 0.5\) in training mode .* submodule '1' \(Dropout\)"):
        hessian_operator(dropped, nn.CrossEntropyLoss(), (x, y))
    attention = nn.TransformerEncoderLayer(4, 2, dim_feedforward=8, dropout=0.1, dtype=torch.float64)
    with pytest.raises(ValueError, match="dropout"):
        check_model(attention)
    # dropout with p = 0 and eval mode are fixed functions
    assert check_model(nn.Sequential(nn.Linear(4, 3), nn.Dropout(0.0))) is not None
    assert check_model(dropped.eval()) is dropped and check_model(attention.eval()) is attention


class _TupleOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, x):
        out = self.linear(x)
        return out, out.detach()


def test_a_model_with_tuple_outputs_is_refused_at_the_entry_point():
    x, y = _digits_like()
    for entry in (
        lambda: hessian_operator(_TupleOut(), nn.CrossEntropyLoss(), (x, y)).dense(),
        lambda: dense_hessian(_TupleOut(), nn.CrossEntropyLoss(), (x, y)),
        lambda: loss_closure(_TupleOut(), nn.CrossEntropyLoss(), (x, y))(dict(_TupleOut().named_parameters())),
    ):
        with pytest.raises(TypeError, match="returns a tuple, not one tensor of outputs"):
            entry()


def test_targets_the_loss_ignores_are_weighted_as_torch_weights_them():
    x, y = _digits_like()
    model = nn.Linear(4, 3, dtype=torch.float64)
    ignoring = nn.CrossEntropyLoss(ignore_index=1)
    assert bool((y == 1).any())
    kept = y != 1  # the risk is the ordinary one on the kept examples
    reference = dense_hessian(model, nn.CrossEntropyLoss(), (x[kept], y[kept]))
    split = [(x[:5], y[:5]), (x[5:], y[5:])]
    for entry in (
        lambda: hessian_operator(model, ignoring, (x, y)).dense(),
        lambda: hessian_operator(model, ignoring, split).dense(),
        lambda: dense_hessian(model, ignoring, split),
    ):
        assert_close(torch.as_tensor(entry()), reference, rtol=1e-12, atol=1e-15)
    closure = loss_closure(model, ignoring, (x, y))(dict(model.named_parameters()))
    assert_close(closure, nn.functional.cross_entropy(model(x[kept]), y[kept]), rtol=1e-14, atol=0)
    with pytest.raises(ValueError, match=r"class indices in \[0, 3\) or the loss's ignore_index -100"):
        dense_hessian(model, nn.CrossEntropyLoss(), (x, torch.where(y == 1, -5, y)))  # not torch's padding mark
    with pytest.raises(ValueError, match="every target of data is ignored"):
        dense_hessian(model, nn.CrossEntropyLoss(), (x, torch.full_like(y, -100)))


def test_a_model_on_the_meta_device_and_a_model_that_fails_on_a_batch_get_clear_errors():
    x, y = torch.randn(6, 3, dtype=torch.float64), torch.randint(0, 2, (6,))
    loss = nn.CrossEntropyLoss()
    meta = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double().to("meta")
    for entry in (check_model, lambda m: hessian_operator(m, loss, (x, y)), lambda m: loss_closure(m, loss, (x, y))):
        with pytest.raises(ValueError, match=r"'meta' device .* first '0.weight'"):
            entry(meta)
    # sequences of two lengths: a model that flattens them fails on the second batch, which is named
    model = nn.Sequential(nn.Embedding(5, 2, dtype=torch.float64), nn.Flatten(), nn.Linear(8, 2, dtype=torch.float64))
    batches = [
        (torch.randint(0, 5, (3, 4)), torch.randint(0, 2, (3,))),
        (torch.randint(0, 5, (3, 6)), torch.randint(0, 2, (3,))),
    ]
    with pytest.raises(ValueError, match=r"model failed on batch 1 of data \(inputs \{'x': \(3, 6\)\}\)"):
        hessian_operator(model, loss, batches)

"""Tests of lossgeom.curvature.hessian: the Hessian operator, closure and module forms.

Every product is compared with a dense float64 autograd reference on the book's digits
MLPs, with curvlinops where it computes the same matrix, and with the Taylor-remainder
slopes that a correct gradient and HVP must give.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from lossgeom import curvature as cv
from lossgeom.models import loss_closure
from lossgeom.parameters import params_of

from conftest import assert_close
from curvature_cases import DIGITS_CASES, curvlinops, digits_setup, loaded


def test_hvp_matches_dense_hessian(digits_case):
    _, model, params, x, y, loss_fn, criterion = digits_case
    dense = cv.closure_hessian(loss_fn, params).numpy()
    op = cv.HessianOperator.from_closure(loss_fn, params)
    assert op.shape == dense.shape and op.dtype == torch.float64 and op.mode == "reverse-over-reverse"
    assert_close(op.dense(), dense, rtol=1e-11, atol=1e-13)
    assert op.n_hvp == dense.shape[0]
    op.reset_count()
    v = np.random.default_rng(0).standard_normal(dense.shape[0])
    assert_close(op @ v, dense @ v, rtol=1e-11, atol=1e-13)
    assert op.n_hvp == 1
    assert_close(op.gradient(), cv.closure_gradient(loss_fn, params).numpy(), rtol=1e-13, atol=1e-15)
    # the module form computes the same matrix at the same point
    assert_close(cv.dense_hessian(model, criterion, (x, y), params=params), dense, rtol=1e-12, atol=1e-14)
    assert_close(
        cv.references.dense_gradient(model, criterion, (x, y), params=params).numpy(),
        op.gradient(),
        rtol=1e-12,
        atol=1e-15,
    )
    module_op = cv.hessian_operator(model, criterion, (x, y), params=params)
    assert_close(module_op @ v, dense @ v, rtol=1e-11, atol=1e-13)


@pytest.mark.parametrize("method", ["forward-over-reverse", "reverse-over-reverse"])
def test_hvp_methods_agree(method):
    model, params, x, y, loss_fn, _ = digits_setup(DIGITS_CASES[0])
    v = np.random.default_rng(4).standard_normal((sum(p.numel() for p in params.values()), 2))
    reference = cv.HessianOperator.from_closure(loss_fn, params)
    other = cv.HessianOperator.from_closure(loss_fn, params, method=method)
    assert reference.mode == "reverse-over-reverse" and other.mode == method
    assert_close(other @ v, reference @ v, rtol=1e-11, atol=1e-14)
    assert other.n_hvp == 2
    with pytest.raises(TypeError, match=r"takes \d+ positional arguments? but \d+ (were|was) given"):
        cv.HessianOperator.from_closure(loss_fn, params, method)  # method is keyword-only


def test_mse_hvp_by_the_default_method():
    model, params, x, y, loss_fn, _ = digits_setup(DIGITS_CASES[2])
    op = cv.HessianOperator.from_closure(loss_fn, params)
    v = np.random.default_rng(5).standard_normal(op.shape[0])
    hv = op @ v
    assert op.mode == "reverse-over-reverse" and op.keeps_graph
    assert_close(hv, cv.closure_hessian(loss_fn, params).numpy() @ v, rtol=1e-11, atol=1e-14)


def test_hessian_matches_curvlinops(digits_case):
    spec, model, params, x, y, loss_fn, criterion = digits_case
    cl = curvlinops()
    loaded(model, params)
    ref = cl.HessianLinearOperator(model, criterion, list(model.parameters()), [(x, y)]).to_scipy()
    op = cv.HessianOperator.from_closure(loss_fn, params)
    v = np.random.default_rng(1).standard_normal((op.shape[0], 3))
    assert_close(op @ v, ref @ v, rtol=1e-10, atol=1e-12)


def test_hessian_equals_ggn_at_zero_residual():
    model, params, x, _, _, _ = digits_setup(DIGITS_CASES[2])
    with torch.no_grad():
        y_zero = torch.func.functional_call(model, params, (x,))  # targets the model fits exactly
    hess = cv.closure_hessian(loss_closure(model, nn.MSELoss(), (x, y_zero)), params).numpy()
    ggn = cv.dense_ggn(model, nn.MSELoss(), (x, y_zero), params=params).numpy()
    assert_close(hess, ggn, rtol=0, atol=1e-13 * np.abs(ggn).max())
    # and with a nonzero residual they differ by the residual term
    y_off = y_zero + 0.5
    diff = (
        cv.dense_hessian(model, nn.MSELoss(), (x, y_off), params=params).numpy()
        - cv.dense_ggn(model, nn.MSELoss(), (x, y_off), params=params).numpy()
    )
    assert np.abs(diff).max() > 1e-3


def test_taylor_slopes_2_and_3():
    model, params, x, y, loss_fn, _ = digits_setup(DIGITS_CASES[1])  # smooth (tanh): third order holds
    n = sum(p.numel() for p in params.values())
    d = np.random.default_rng(3).standard_normal(n)
    d /= np.linalg.norm(d)
    steps = np.geomspace(1e-3, 1e-1, 6)
    r1, r2 = cv.references.closure_taylor_remainders(loss_fn, params, d, steps)
    slope1 = np.polyfit(np.log(steps), np.log(r1), 1)[0]
    slope2 = np.polyfit(np.log(steps), np.log(r2), 1)[0]
    assert abs(slope1 - 2) < 0.1 and abs(slope2 - 3) < 0.15
    # a wrong HVP (halved) breaks the third-order slope: the check can fail
    r2_wrong = np.abs(r2 + 0.25 * steps**2 * float(d @ cv.HessianOperator.from_closure(loss_fn, params).matvec(d)))
    assert np.polyfit(np.log(steps), np.log(r2_wrong), 1)[0] < 2.2


def test_errors_hessian_operator():
    model, params, x, y, loss_fn, criterion = digits_setup(DIGITS_CASES[0])
    with pytest.raises(ValueError, match="non-empty"):
        cv.HessianOperator.from_closure(loss_fn, {})
    with pytest.raises(ValueError, match="non-finite"):
        cv.HessianOperator.from_closure(lambda p: loss_fn(p) * float("nan"), params)
    with pytest.raises(ValueError, match="non-finite"):
        cv.HessianOperator.from_closure(lambda p: (p["0.weight"][:0] ** 2).mean(), params)  # empty mean
    with pytest.raises(ValueError, match="scalar"):
        cv.HessianOperator.from_closure(lambda p: p["0.bias"], params)
    with pytest.raises(TypeError, match="callable"):
        cv.HessianOperator.from_closure(3.0, params)
    with pytest.raises(ValueError, match="method must be one of"):
        cv.HessianOperator.from_closure(loss_fn, params, method="finite-difference")
    with pytest.raises(ValueError, match="method must be one of"):
        cv.hessian_operator(model, criterion, (x, y), method="finite-difference")
    op = cv.HessianOperator.from_closure(loss_fn, params)
    with pytest.raises(ValueError, match="entries"):
        op.matvec(np.ones(3))
    with pytest.raises(ValueError, match="linearized"):
        cv.HessianOperator.from_closure(loss_fn, params, method="linearized")


def test_the_two_forms_refuse_each_other():
    model, params, x, y, loss_fn, criterion = digits_setup(DIGITS_CASES[0])
    with pytest.raises(TypeError, match="closure form.*HessianOperator"):
        cv.hessian_operator(loss_fn, params, (x, y))  # a closure where a model belongs
    with pytest.raises(TypeError, match="got an nn.Module"):
        cv.HessianOperator.from_closure(model, params)  # a model where a closure belongs
    with pytest.raises(TypeError, match="'cross_entropy'.*nn.CrossEntropyLoss"):
        cv.hessian_operator(model, "cross_entropy", (x, y))
    with pytest.raises(TypeError, match="got a dict"):
        cv.hessian_operator(model, params, (x, y))  # the removed (model, params, ...) order
    with pytest.raises(TypeError, match="'mse'.*nn.MSELoss"):
        cv.dense_hessian(model, "mse", (x, y))
    with pytest.raises(TypeError, match="closure form"):
        cv.dense_hessian(loss_fn, params, (x, y))


def test_batch_norm_in_training_mode_is_rejected_by_the_closure():
    model = nn.Sequential(
        nn.Linear(4, 3, dtype=torch.float64),
        nn.BatchNorm1d(3, dtype=torch.float64),
        nn.ReLU(),
        nn.Linear(3, 2, dtype=torch.float64),
    )
    x, y = torch.randn(8, 4, generator=torch.Generator().manual_seed(0)), torch.zeros(8, dtype=torch.long)
    with pytest.raises(ValueError, match="batch norm in training mode"):
        cv.HessianOperator.from_closure(loss_closure(model, nn.CrossEntropyLoss(), (x, y)), params_of(model))
    with pytest.raises(ValueError, match="batch norm in training mode"):
        cv.hessian_operator(model, nn.CrossEntropyLoss(), (x, y))


def test_a_counting_view_of_a_hessian_operator_forms_it_densely_by_products():
    weights = {"w": torch.tensor([1.0, -2.0, 0.5])}
    view = cv.base.CountingView(cv.HessianOperator.from_closure(lambda p: (p["w"] ** 4).sum(), weights))
    dense = view.dense()
    assert torch.allclose(torch.as_tensor(dense), torch.diag(12 * weights["w"] ** 2))
    assert view.n_hvp >= 3

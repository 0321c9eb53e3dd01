"""Tests of lossgeom.curvature.ggn (and the Fisher beside it) on the book's digits MLPs.

The GGN and the Fishers are compared with their dense references and curvlinops, and
with the properties they must have (positive semi-definite, true Fisher = GGN for the
cross-entropy).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from lossgeom import curvature as cv
from lossgeom.parameters import params_of
from lossgeom.risk import EmpiricalRisk

from conftest import assert_close
from curvature_cases import DIGITS_CASES, curvlinops, digits_setup, loaded


def test_ggn_and_fisher_match_dense_and_curvlinops(digits_case):
    spec, model, params, x, y, _, criterion = digits_case
    cl = curvlinops()
    ggn = cv.ggn_operator(model, criterion, (x, y), params=params)
    dense = cv.dense_ggn(model, criterion, (x, y), params=params).numpy()
    assert_close(ggn.dense(), dense, rtol=1e-11, atol=1e-14)
    loaded(model, params)
    ref = cl.GGNLinearOperator(model, criterion, list(model.parameters()), [(x, y)]).to_scipy()
    v = np.random.default_rng(2).standard_normal((ggn.shape[0], 2))
    assert_close(ggn @ v, ref @ v, rtol=1e-10, atol=1e-13)
    ef = cv.fisher_operator(model, criterion, (x, y), params=params, kind="empirical")
    ef_dense = cv.dense_fisher(model, criterion, (x, y), params=params).numpy()
    assert_close(ef.dense(), ef_dense, rtol=1e-11, atol=1e-14)
    ef_ref = cl.EFLinearOperator(model, criterion, list(model.parameters()), [(x, y)]).to_scipy()
    # curvlinops sums the squared error over the K outputs of an example where our
    # per-example loss averages it, so for mse its empirical Fisher is K times ours.
    factor = 1.0 if spec["loss"] == "cross_entropy" else float(y.shape[1])
    assert_close(ef_ref @ v, factor * (ef @ v), rtol=1e-10, atol=1e-13)


def test_true_fisher_equals_ggn_for_cross_entropy():
    model, params, x, y, _, ce = digits_setup(DIGITS_CASES[0])
    fisher = cv.dense_fisher(model, ce, (x, y), params=params, kind="true").numpy()
    assert_close(fisher, cv.dense_ggn(model, ce, (x, y), params=params).numpy(), rtol=1e-11, atol=1e-14)


def test_ggn_and_fishers_are_psd_and_hessian_is_not():
    model, params, x, y, loss_fn, ce = digits_setup(DIGITS_CASES[0])
    hess = np.linalg.eigvalsh(cv.closure_hessian(loss_fn, params).numpy())
    assert hess[0] < -1e-3 * hess[-1]  # indefinite at this untrained point
    for mat in (
        cv.dense_ggn(model, ce, (x, y), params=params),
        cv.dense_fisher(model, ce, (x, y), params=params),
        cv.dense_fisher(model, ce, (x, y), params=params, kind="true"),
    ):
        ev = np.linalg.eigvalsh(mat.numpy())
        assert ev[0] >= -1e-12 * ev[-1]
        assert_close(mat.numpy(), mat.numpy().T, rtol=0, atol=1e-15)


def test_errors_model_operators():
    model, params, x, y, _, ce = digits_setup(DIGITS_CASES[0])
    mse = nn.MSELoss()
    with pytest.raises(ValueError, match="empty data"):
        cv.ggn_operator(model, ce, (x[:0], y[:0]), params=params)
    with pytest.raises(ValueError, match="loss HingeEmbeddingLoss failed on the outputs of batch 0"):
        cv.ggn_operator(model, nn.HingeEmbeddingLoss(), (x, y), params=params)
    for name in ("cross_entropy", "mse", "hinge"):
        with pytest.raises(TypeError, match=f"loss must be a loss module, got the string '{name}'"):
            cv.ggn_operator(model, name, (x, y))
    with pytest.raises(ValueError, match="one entry per example"):
        cv.ggn_operator(model, ce, (x, y[:3]), params=params)
    with pytest.raises(ValueError, match="outputs' shape"):
        cv.ggn_operator(model, mse, (x, y.to(torch.float64)), params=params)
    bad = dict(params)
    bad["2.bias"] = torch.full_like(params["2.bias"], 1e200)  # finite parameters, overflowing loss
    with pytest.raises(ValueError, match="non-finite"):
        cv.ggn_operator(model, mse, (x, torch.zeros(len(x), 10)), params=bad)
    with pytest.raises(ValueError, match="kind must be"):
        cv.fisher_operator(model, ce, (x, y), params=params, kind="mc")
    with pytest.raises(ValueError, match="kind must be"):
        cv.dense_fisher(model, ce, (x, y), params=params, kind="mc")
    with pytest.raises(ValueError, match="the loss L1Loss is not one the library knows"):
        cv.fisher_operator(model, nn.L1Loss(), (x, torch.zeros(len(x), 10)), params=params, kind="true")
    with pytest.raises(TypeError, match="nn.Module"):
        cv.ggn_operator(lambda z: z, ce, (x, y))
    with pytest.raises(ValueError, match="non-empty"):
        cv.ggn_operator(model, ce, (x, y), params={})
    with pytest.raises(TypeError, match="got a dict"):
        cv.ggn_operator(model, params, (x, y))  # the removed (model, params, x, y) order
    with pytest.raises(TypeError, match=r"takes \d+ positional arguments? but \d+ (were|was) given"):
        cv.ggn_operator(model, ce, (x, y), params)  # params is keyword-only


def test_batch_norm_in_training_mode_is_rejected():
    model = nn.Sequential(
        nn.Linear(4, 3, dtype=torch.float64),
        nn.BatchNorm1d(3, dtype=torch.float64),
        nn.ReLU(),
        nn.Linear(3, 2, dtype=torch.float64),
    )
    params = params_of(model)
    x, y = torch.randn(8, 4, generator=torch.Generator().manual_seed(0)), torch.zeros(8, dtype=torch.long)
    ce = nn.CrossEntropyLoss()
    for build in (cv.ggn_operator, cv.fisher_operator, cv.dense_ggn, cv.dense_fisher, cv.GGNOperator):
        with pytest.raises(ValueError, match="batch norm in training mode"):
            build(model, ce, (x, y), params=params)
    model.eval()
    op = cv.ggn_operator(model, ce, (x, y), params=params)  # eval mode: a fixed function, accepted
    assert op.shape == (sum(p.numel() for p in params.values()),) * 2


def test_operator_classes_and_their_risk_constructors():
    model, params, x, y, _, ce = digits_setup(DIGITS_CASES[0])
    v = np.random.default_rng(9).standard_normal(sum(p.numel() for p in params.values()))
    reference = cv.dense_ggn(model, ce, (x, y), params=params).numpy() @ v
    assert_close(cv.GGNOperator(model, ce, (x, y), params=params) @ v, reference, rtol=1e-11, atol=1e-14)
    risk = EmpiricalRisk(model, ce, (x, y), params=params)
    assert_close(cv.GGNOperator.from_risk(risk) @ v, reference, rtol=1e-11, atol=1e-14)
    true = cv.FisherOperator(model, ce, (x, y), params=params, kind="true")
    assert true.kind == "true"
    assert_close(true @ v, reference, rtol=1e-11, atol=1e-14)  # the true Fisher is the GGN here
    assert_close(cv.FisherOperator.from_risk(risk, kind="true") @ v, reference, rtol=1e-11, atol=1e-14)
    empirical = cv.dense_fisher(model, ce, (x, y), params=params).numpy() @ v
    assert_close(cv.FisherOperator.from_risk(risk) @ v, empirical, rtol=1e-11, atol=1e-14)
    assert_close(
        cv.HessianOperator.from_risk(risk) @ v,
        cv.dense_hessian(model, ce, (x, y), params=params).numpy() @ v,
        rtol=1e-11,
        atol=1e-14,
    )
    with pytest.raises(ValueError, match="kind must be"):
        cv.FisherOperator.from_risk(risk, kind="mc")

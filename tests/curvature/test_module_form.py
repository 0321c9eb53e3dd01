"""The module-first entry points: a torch.nn.Module, a loss module and data.

Checked against curvlinops (which takes the same inputs) and against the dense
references, in float64 and float32, for one batch and for batches of unequal size, for
mean and sum reduction; and the operators' torch-native interface: batched products
(one pass per block of columns, no loop over columns), ``@`` with tensors and arrays, the
``.to_scipy()`` view, spectral tools that take a model.
"""

from __future__ import annotations

import doctest

import numpy as np
import pytest
import torch
from scipy.sparse.linalg import eigsh
from torch import nn

from lossgeom import curvature as cv
from lossgeom.parameters import params_of

from conftest import assert_close
from curvature_cases import build, curvlinops

MODELS = ["cnn", "tanh-mlp-mse", "layernorm-mlp", "tagger"]
TOLERANCE = {torch.float64: 1e-10, torch.float32: 2e-4}


def _unequal_batches(x, y):
    return [(x[:5], y[:5]), (x[5:], y[5:])]  # 5 and 7 examples


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", MODELS)
def test_hessian_and_ggn_match_curvlinops(name, dtype):
    cl = curvlinops()
    model, loss, x, y = build(name, dtype)
    params = list(model.parameters())
    probe = torch.randn(sum(p.numel() for p in params), 3, generator=torch.Generator().manual_seed(0), dtype=dtype)
    # curvlinops' Hessian (jvp of jacrev, vmapped) inherits torch's wrong nested transforms
    # of LayerNorm (about 10% off against finite differences, like torch.func.hessian):
    # there the reference is our dense Hessian, which test_model_zoo checks against
    # finite differences.
    hessian_reference = cl.HessianLinearOperator
    if name == "layernorm-mlp":

        def hessian_reference(model, loss, params, batches):
            return cv.dense_hessian(model, loss, batches)

    for data in ((x, y), _unequal_batches(x, y)):
        batches = [data] if isinstance(data, tuple) else data
        for ours, theirs in (
            (cv.hessian_operator(model, loss, data), hessian_reference),
            (cv.ggn_operator(model, loss, data), cl.GGNLinearOperator),
        ):
            reference = theirs(model, loss, params, batches) @ probe
            result = ours @ probe
            assert result.dtype == dtype
            scale = float(reference.abs().max())
            assert_close(result, reference, rtol=0, atol=TOLERANCE[dtype] * scale)


@pytest.mark.parametrize("name", MODELS)
def test_unequal_batches_give_the_one_batch_matrices(name):
    model, loss, x, y = build(name)
    batches = _unequal_batches(x, y)
    assert_close(cv.dense_hessian(model, loss, batches), cv.dense_hessian(model, loss, (x, y)), rtol=1e-11, atol=1e-14)
    assert_close(cv.dense_ggn(model, loss, batches), cv.dense_ggn(model, loss, (x, y)), rtol=1e-11, atol=1e-14)
    one = cv.hessian_operator(model, loss, (x, y))
    several = cv.hessian_operator(model, loss, batches)
    assert one.keeps_graph and not several.keeps_graph
    probe = torch.randn(one.shape[0], 4, generator=torch.Generator().manual_seed(3))
    assert_close(several @ probe, one @ probe, rtol=1e-11, atol=1e-14)
    assert_close(
        cv.ggn_operator(model, loss, batches) @ probe,
        cv.ggn_operator(model, loss, (x, y)) @ probe,
        rtol=1e-11,
        atol=1e-14,
    )
    kinds = ["empirical", "true"] if isinstance(loss, nn.CrossEntropyLoss) else ["empirical"]
    for kind in kinds:
        assert_close(
            cv.dense_fisher(model, loss, batches, kind=kind),
            cv.dense_fisher(model, loss, (x, y), kind=kind),
            rtol=1e-11,
            atol=1e-14,
        )
        assert_close(
            cv.fisher_operator(model, loss, batches, kind=kind).dense(),
            cv.dense_fisher(model, loss, (x, y), kind=kind).numpy(),
            rtol=1e-10,
            atol=1e-14,
        )


@pytest.mark.parametrize("name", ["cnn", "tanh-mlp-mse", "tagger"])
def test_sum_reduction_is_respected(name):
    cl = curvlinops()
    model, mean_loss, x, y = build(name)
    sum_loss = type(mean_loss)(reduction="sum")
    n_terms = y.numel()  # loss terms: entries (mse), examples x positions (cross-entropy)
    for matrix in (cv.dense_hessian, cv.dense_ggn):
        assert_close(
            matrix(model, sum_loss, (x, y)), n_terms * matrix(model, mean_loss, (x, y)), rtol=1e-11, atol=1e-13
        )
    probe = np.random.default_rng(4).standard_normal((cv.hessian_operator(model, sum_loss, (x, y)).shape[0], 2))
    batches = _unequal_batches(x, y)
    reference = cl.GGNLinearOperator(model, sum_loss, list(model.parameters()), batches).to_scipy()
    assert_close(cv.ggn_operator(model, sum_loss, batches) @ probe, reference @ probe, rtol=1e-10, atol=1e-12)


def test_operator_interface_tensors_arrays_scipy_and_counts():
    model, loss, x, y = build("cnn")
    op = cv.hessian_operator(model, loss, (x, y))
    dense = cv.dense_hessian(model, loss, (x, y))
    v = torch.randn(op.shape[0], generator=torch.Generator().manual_seed(5))
    assert isinstance(op @ v, torch.Tensor) and (op @ v).shape == v.shape
    out = op @ v.numpy()
    assert isinstance(out, np.ndarray) and out.dtype == np.float64
    assert_close(out, dense @ v, rtol=1e-11, atol=1e-14)
    assert op.n_hvp == 3
    op.reset_count()
    scipy_view = op.to_scipy()
    values = eigsh(scipy_view, k=2, which="LA", tol=1e-10, return_eigenvectors=False)
    assert_close(np.sort(values), np.linalg.eigvalsh(dense.numpy())[-2:], rtol=1e-9, atol=0)
    assert op.n_hvp > 0
    assert op.T is op and op.adjoint() is op
    with pytest.raises(ValueError, match=f"shape \\({op.shape[0]}, k\\)"):
        op.matmat(torch.ones(3, 2))
    with pytest.raises(TypeError, match="torch.Tensor"):
        op.matmat(np.ones((op.shape[0], 2)))


@pytest.mark.parametrize("matrix", ["hessian", "ggn"])
def test_a_block_of_columns_costs_the_forward_passes_of_one_product(matrix, monkeypatch):
    model, loss, x, y = build("tanh-mlp-mse")
    op = cv.curvature_operator(model, loss, [(x[:5], y[:5]), (x[5:], y[5:])], matrix=matrix)
    calls = {"forward": 0}
    original = model.forward

    def counted_forward(*args, **kwargs):
        calls["forward"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(model, "forward", counted_forward)
    op @ torch.ones(op.shape[0], 1)
    per_product = calls["forward"]
    calls["forward"] = 0
    block = torch.randn(op.shape[0], 12, generator=torch.Generator().manual_seed(6))
    result = op @ block
    assert calls["forward"] == per_product  # 12 columns cost the forward passes of one
    assert op.n_hvp == 13
    columns = torch.stack([op @ block[:, j] for j in range(12)], dim=1)
    assert_close(result, columns, rtol=1e-12, atol=1e-15)


def test_hessian_block_rule_and_the_vmapped_alternative_agree():
    model, loss, x, y = build("layernorm-mlp")
    op = cv.hessian_operator(model, loss, (x, y))
    assert op.keeps_graph and not op.batched_columns  # CPU: one backward pass per column
    block = torch.randn(op.shape[0], 5, generator=torch.Generator().manual_seed(7))
    looped = op @ block
    op.batched_columns = True  # one backward pass vmapped over the columns
    assert_close(op @ block, looped, rtol=1e-12, atol=1e-15)
    assert cv.hessian_operator(model, loss, (x, y), method="forward-over-reverse").batched_columns


def test_spectral_tools_take_the_operator_of_a_model_loss_and_data():
    model, loss, x, y = build("layernorm-mlp")
    data = _unequal_batches(x, y)
    eigs = np.linalg.eigvalsh(cv.dense_hessian(model, loss, data).numpy())
    hessian = cv.hessian_operator(model, loss, data)
    top = cv.top_eigenpairs(hessian, k=2, tol=1e-12)
    assert_close(top.values, eigs[::-1][:2], rtol=1e-9, atol=0)
    ggn_eigs = np.linalg.eigvalsh(cv.dense_ggn(model, loss, data).numpy())
    top_ggn = cv.top_eigenpairs(cv.curvature_operator(model, loss, data, matrix="ggn"), k=1, tol=1e-12)
    assert_close(top_ggn.values, ggn_eigs[-1:], rtol=1e-9, atol=0)
    trace = cv.hutchinson_trace(hessian, n_probes=40, seed=0)
    assert abs(trace.estimate - eigs.sum()) <= 4 * trace.std_error
    hpp = cv.hutchpp_trace(hessian, n_probes=30, seed=0)
    assert abs(hpp.estimate - eigs.sum()) <= 4 * hpp.std_error
    density = cv.spectral_density(hessian, np.linspace(-1, 1, 5), n_probes=2, n_lanczos=5)
    assert density.n_hvp == 10
    for tool in (cv.top_eigenpairs, cv.hutchinson_trace, cv.spectra.power_iteration):
        with pytest.raises(TypeError, match=r"operator is a model \(Sequential\), not a matrix"):
            tool(model)
    with pytest.raises(ValueError, match="matrix must be one of"):
        cv.curvature_operator(model, loss, data, matrix="fisher")
    with pytest.raises(TypeError, match=r"takes \d+ positional arguments? but \d+ (were|was) given"):
        cv.curvature_operator(model, loss, data, "ggn")  # matrix is keyword-only
    scaled = {name: 2.0 * p.detach() for name, p in model.named_parameters()}
    at_scaled = cv.curvature_operator(model, loss, data, params=scaled, matrix="ggn").dense()
    assert_close(at_scaled, cv.dense_ggn(model, loss, data, params=scaled).numpy(), rtol=1e-10, atol=1e-13)
    assert np.abs(at_scaled - cv.dense_ggn(model, loss, data).numpy()).max() > 1e-3 * np.abs(at_scaled).max()


def test_model_operators_use_the_models_current_trainable_parameters():
    model, loss, x, y = build("cnn")
    ones = torch.ones(sum(p.numel() for p in model.parameters()))
    before = cv.hessian_operator(model, loss, (x, y)) @ ones
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    after = cv.hessian_operator(model, loss, (x, y)) @ ones
    assert float((after - before).abs().max()) > 1e-3 * float(before.abs().max())
    model[0].requires_grad_(False)  # a frozen convolution: only the head's rows remain
    head = cv.hessian_operator(model, loss, (x, y))
    assert head.shape == (2 * 4 * 4 * 3 + 3,) * 2
    assert list(params_of(model, trainable_only=True, copy=False)) == ["3.weight", "3.bias"]


def test_package_docstring_example_runs():
    failures, tried = doctest.testmod(cv, optionflags=doctest.ELLIPSIS, verbose=False)[:2]
    assert tried > 0 and failures == 0

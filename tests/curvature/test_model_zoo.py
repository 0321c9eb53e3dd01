"""Regression tests of issue 9's curvature defects, on plain torch.nn models.

Each test failed (or crashed) before its fix: a crash of the interpreter, a silently
wrong matrix, a silently accepted input, or an unrelated error deep inside torch. The
models (tests/curvature_cases.py) are what a researcher would audit: a small CNN, a tanh
MLP with the squared error, an LSTM, a LayerNorm MLP, a TransformerEncoderLayer and a
sequence tagger with (N, C, T) logits.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch import nn

from lossgeom import curvature as cv
from lossgeom.models import loss_closure
from lossgeom.parameters import flatten_params, params_of

from conftest import assert_close
from curvature_cases import CASES, build, curvlinops, finite_difference_hessian

ALL = list(CASES)


def _closure(name, dtype=torch.float64):
    model, loss, x, y = build(name, dtype)
    return model, loss, x, y, loss_closure(model, loss, (x, y)), params_of(model)


# --- crashes and silently wrong numbers ------------------------------------------------


def test_linearized_hvp_is_refused_instead_of_crashing_the_interpreter():
    # before: torch.func.linearize on the mse loss of a tanh MLP killed Python (SIGSEGV)
    script = textwrap.dedent("""
        import torch
        from lossgeom import curvature as cv
        from lossgeom.models import loss_closure
        from lossgeom.parameters import flatten_params, params_of
        import sys; sys.path.insert(0, "tests")
        from curvature_cases import build
        model, loss, x, y = build("tanh-mlp-mse")
        try:
            closure = loss_closure(model, torch.nn.MSELoss(), (x, y))
            cv.HessianOperator.from_closure(closure, params_of(model), method="linearized")
        except ValueError as err:
            print("refused:", err)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"the interpreter died (return code {done.returncode}): {done.stderr[-500:]}"
    assert "refused: method='linearized'" in done.stdout


def test_linearized_hvp_on_lstm_is_refused_not_silently_wrong():
    model, loss, x, y, loss_fn, params = _closure("lstm")
    with pytest.raises(ValueError, match="linearized.*nn.LSTM"):
        cv.HessianOperator.from_closure(loss_fn, params, method="linearized")
    # the default product is right and repeatable on the LSTM
    op = cv.HessianOperator.from_closure(loss_fn, params)
    v = torch.randn(op.shape[0], 2, generator=torch.Generator().manual_seed(0))
    first, second = op @ v, op @ v
    assert torch.equal(first, second)
    assert_close(first, cv.closure_hessian(loss_fn, params) @ v, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("name", ALL)
def test_dense_hessian_matches_finite_differences(name):
    # before: torch.func.hessian was about 1e-1 off (and asymmetric) with LayerNorm, and
    # crashed on the TransformerEncoderLayer (fused attention has no second derivative)
    model, loss, x, y = build(name)
    dense = cv.dense_hessian(model, loss, (x, y))
    reference = finite_difference_hessian(model, loss, x, y)
    scale = reference.abs().max()
    assert float((dense - reference).abs().max()) <= 1e-6 * float(scale)
    assert float((dense - dense.T).abs().max()) <= 1e-12 * float(scale)
    _, _, _, _, loss_fn, params = _closure(name)
    assert_close(cv.closure_hessian(loss_fn, params), dense, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("method", ["auto", "forward-over-reverse"])
def test_hessian_operator_matches_dense_on_every_model(name, method):
    model, loss, x, y = build(name)
    dense = cv.dense_hessian(model, loss, (x, y))
    if method == "forward-over-reverse" and isinstance(loss, nn.MSELoss):
        # the loss module is the definition: torch's forward-mode rule for mse_loss's double
        # backward fails, so the operator says so and uses reverse mode
        with pytest.warns(RuntimeWarning, match="forward mode failed.*ZeroTensor"):
            op = cv.hessian_operator(model, loss, (x, y), method=method)
        method = "reverse-over-reverse"
    else:
        op = cv.hessian_operator(model, loss, (x, y), method=method)
    assert op.mode == ("reverse-over-reverse" if method == "auto" else method)
    v = torch.randn(op.shape[0], 3, generator=torch.Generator().manual_seed(1))
    assert_close(op @ v, dense @ v, rtol=1e-10, atol=1e-12 * float(dense.abs().max()))
    assert op.n_hvp == 3


def test_forward_over_reverse_failing_on_mse_falls_back_at_set_up_and_says_so():
    # before: the operator silently switched to another method in the middle of a run; then
    # it failed at the first product; now set-up finds it and keeps the safe mode throughout
    model, loss, x, y, loss_fn, params = _closure("tanh-mlp-mse")
    with pytest.warns(RuntimeWarning, match="forward mode failed.*ZeroTensor.*reverse mode is used instead"):
        op = cv.HessianOperator.from_closure(loss_fn, params, method="forward-over-reverse")
    assert op.mode == "reverse-over-reverse" and op.n_hvp == 0
    ones = np.ones(op.shape[0])
    assert_close(op @ ones, cv.closure_hessian(loss_fn, params).numpy() @ ones, rtol=1e-10, atol=1e-12)


def test_ggn_and_fisher_of_sequence_logits_are_not_scaled_by_the_length():
    # before: for (N, C, T) logits the GGN was T times too large, the empirical Fisher T^2
    # times, and dense_ggn / the true Fisher crashed
    model, loss, x, y = build("tagger")
    n_steps = y.shape[1]
    cl = curvlinops()
    ggn = cv.ggn_operator(model, loss, (x, y))
    reference = cl.GGNLinearOperator(model, loss, list(model.parameters()), [(x, y)]).to_scipy()
    probe = np.random.default_rng(0).standard_normal((ggn.shape[0], 3))
    assert_close(ggn @ probe, reference @ probe, rtol=1e-10, atol=1e-13)
    dense = cv.dense_ggn(model, loss, (x, y))
    assert_close(dense, ggn.dense(), rtol=1e-11, atol=1e-14)
    # the GGN equals the Hessian of the loss linearised in the outputs: at zero residual
    # (targets the model predicts with probability -> 1) both vanish, so compare instead
    # the true Fisher, E_{y ~ p} of score outer products, which equals the GGN exactly
    assert_close(cv.dense_fisher(model, loss, (x, y), kind="true"), dense, rtol=1e-10, atol=1e-13)
    assert_close(cv.fisher_operator(model, loss, (x, y), kind="true").dense(), dense, rtol=1e-10, atol=1e-13)
    # empirical Fisher: (1/N) sum_i g_i g_i^T with g_i the gradient of example i's mean loss
    names = [n for n, _ in model.named_parameters()]
    point = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    sizes = [p.numel() for p in model.parameters()]
    shapes = [p.shape for p in model.parameters()]

    def example_losses(vector):
        pieces = {n: t.reshape(s) for n, t, s in zip(names, torch.split(vector, sizes), shapes)}
        out = torch.func.functional_call(model, pieces, (x,))
        return nn.functional.cross_entropy(out, y, reduction="none").mean(dim=1)

    gradients = torch.func.jacrev(example_losses)(point)  # (N, n), one row per sequence
    expected = gradients.T @ gradients / x.shape[0]
    assert_close(cv.dense_fisher(model, loss, (x, y)), expected, rtol=1e-10, atol=1e-14)
    assert_close(cv.fisher_operator(model, loss, (x, y)).dense(), expected, rtol=1e-10, atol=1e-14)
    assert n_steps == 7  # the length that used to scale the GGN (T) and the Fisher (T^2)


def test_dense_fisher_on_an_lstm_is_computed_not_a_vmap_crash():
    model, loss, x, y = build("lstm")
    dense = cv.dense_fisher(model, loss, (x, y))
    assert_close(dense, cv.fisher_operator(model, loss, (x, y)).dense(), rtol=1e-10, atol=1e-14)
    cl = curvlinops()
    reference = cl.EFLinearOperator(model, loss, list(model.parameters()), [(x, y)]).to_scipy()
    probe = np.random.default_rng(1).standard_normal((dense.shape[0], 2))
    assert_close(dense.numpy() @ probe, reference @ probe, rtol=1e-10, atol=1e-13)


# --- parameter names, dtypes --------------------------------------------------------------


def test_misspelt_or_extra_parameter_names_are_refused():
    model, loss, x, y, loss_fn, params = _closure("tanh-mlp-mse")
    misspelt = dict(params)
    misspelt["0.weigth"] = misspelt.pop("0.weight")
    with pytest.raises(ValueError, match="'0.weigth' \\(did you mean '0.weight'\\?\\)"):
        cv.HessianOperator.from_closure(loss_fn, misspelt)
    extra = dict(params, extra=torch.zeros(3))
    with pytest.raises(ValueError, match="not parameters of the model: 'extra'"):
        cv.closure_hessian(loss_fn, extra)
    with pytest.raises(ValueError, match="did you mean '0.weight'"):
        cv.ggn_operator(model, loss, (x, y), params=misspelt)
    with pytest.raises(ValueError, match="not parameters of the model"):
        cv.fisher_operator(model, loss, (x, y), params=extra)
    with pytest.raises(ValueError, match="not parameters of the model: 'extra'"):
        cv.dense_hessian(model, loss, (x, y), params=extra)
    # a subset of the real names is fine: the others are held at their stored values
    subset = {"2.weight": params["2.weight"], "2.bias": params["2.bias"]}
    assert cv.HessianOperator.from_closure(loss_fn, subset).shape == (3 * 6 + 3,) * 2
    assert cv.hessian_operator(model, loss, (x, y), params=subset).shape == (3 * 6 + 3,) * 2


def test_a_broadcastable_wrong_shape_is_refused_not_measured():
    model, loss, x, y, loss_fn, params = _closure("tanh-mlp-mse")
    wrong = dict(params, **{"0.bias": torch.zeros(1, dtype=params["0.bias"].dtype)})
    message = re.escape(f"params['0.bias'] has shape (1,), the model's has {tuple(params['0.bias'].shape)}")
    with pytest.raises(ValueError, match=message):
        cv.hessian_operator(model, loss, (x, y), params=wrong)
    with pytest.raises(ValueError, match="silently measure another model"):
        cv.lambda_max(model, loss, (x, y), params=wrong)
    with pytest.raises(ValueError, match="silently measure another model"):
        cv.HessianOperator.from_closure(loss_fn, wrong)


@pytest.mark.parametrize("name", ["tanh-mlp-mse", "cnn", "tagger"])
def test_float32_models_compute_in_float32(name):
    # before: "Float and Double" crashes in hessian_operator and ggn_operator
    model32, loss, x32, y32 = build(name, torch.float32)
    params32 = params_of(model32)
    assert all(p.dtype == torch.float32 for p in params32.values())  # params_of keeps the model's dtype
    model64, _, x64, y64 = build(name, torch.float64)
    v = torch.randn(sum(p.numel() for p in params32.values()), 2, generator=torch.Generator().manual_seed(2))
    for build_op in (
        lambda m, p, x, y: cv.HessianOperator.from_closure(loss_closure(m, loss, (x, y)), p),
        lambda m, p, x, y: cv.ggn_operator(m, loss, (x, y), params=p),
        lambda m, p, x, y: cv.hessian_operator(m, loss, (x, y)),
        lambda m, p, x, y: cv.ggn_operator(m, loss, (x, y)),
    ):
        op32, op64 = build_op(model32, params32, x32, y32), build_op(model64, params_of(model64), x64, y64)
        assert op32.dtype == torch.float32 and op64.dtype == torch.float64
        out32, out64 = op32 @ v, op64 @ v
        assert out32.dtype == torch.float32
        assert_close(out32, out64, rtol=0, atol=1e-4 * float(out64.abs().max()))


def test_dense_ggn_with_mse_does_not_depend_on_the_default_dtype():
    # before: dense_ggn with the squared error crashed unless torch's default dtype was float64
    model, loss, x, y = build("tanh-mlp-mse", torch.float64)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        dense = cv.dense_ggn(model, nn.MSELoss(), (x, y), params=params_of(model))
    finally:
        torch.set_default_dtype(previous)
    assert dense.dtype == torch.float64
    assert_close(dense, cv.ggn_operator(model, loss, (x, y)).dense(), rtol=1e-12, atol=1e-15)


def test_mismatched_dtypes_are_refused():
    model, loss, x, y = build("cnn", torch.float64)
    with pytest.raises(ValueError, match="x is torch.float32 but the parameters are torch.float64"):
        cv.hessian_operator(model, loss, (x.float(), y))
    params32 = {k: v.float() for k, v in params_of(model).items()}
    with pytest.raises(ValueError, match="params are torch.float32.*model's parameters are"):
        cv.ggn_operator(model, loss, (x, y), params=params32)
    mixed = dict(params_of(model))
    mixed["0.bias"] = mixed["0.bias"].float()
    with pytest.raises(ValueError, match="one dtype on one device"):
        flatten_params(mixed)


# --- clear errors instead of unrelated crashes --------------------------------------------


def test_clear_errors_instead_of_crashes():
    with pytest.raises(ValueError, match="zero matrix"):  # before: ARPACK error -9
        cv.top_eigenpairs(np.zeros((10, 10)), k=1, method="arpack")
    zero = cv.top_eigenpairs(np.zeros((10, 10)), k=2)  # Lanczos: an invariant space at once, eigenvalue 0
    assert zero.converged and zero.values.tolist() == [0.0, 0.0] and zero.residuals.tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="eigenvalues must not be empty"):  # before: ZeroDivisionError
        cv.spectra.dense_spectral_density([], [0.0, 1.0], 0.1)
    model, loss, x, y, loss_fn, params = _closure("cnn")
    with pytest.raises(TypeError, match="got a dict"):  # before: TypeError inside torch
        cv.hessian_operator(model, params, (x, y))
    with pytest.raises(TypeError, match="required positional argument: 'data'"):
        cv.hessian_operator(model, loss)
    with pytest.raises(ValueError, match="for L1Loss y must have the outputs' shape"):
        cv.ggn_operator(model, nn.L1Loss(), (x, y))
    with pytest.raises(ValueError, match="reduction must be one of \\['mean', 'sum'\\], got 'none'"):
        cv.ggn_operator(model, nn.CrossEntropyLoss(reduction="none"), (x, y))
    with pytest.raises(TypeError, match="loss must be an nn.Module called as loss\\(outputs, targets\\)"):
        cv.ggn_operator(model, nn.functional.cross_entropy, (x, y))


# --- silently accepted input ---------------------------------------------------------------


def test_non_symmetric_matrices_are_refused_by_the_symmetric_solvers():
    skew = np.triu(np.ones((10, 10)), 1)
    a = np.diag(np.arange(10.0)) + skew - skew.T  # symmetric part diagonal, plus a skew part
    for call in (
        lambda: cv.top_eigenpairs(a, k=1),
        lambda: cv.spectra.power_iteration(a),
        lambda: cv.spectral_density(a, [0.0, 1.0], n_probes=1, n_lanczos=3),
    ):
        with pytest.raises(ValueError, match="must be symmetric"):
            call()
    # a trace estimator takes any square matrix (z^T K z = 0 for the skew part K)
    assert cv.hutchinson_trace(a, n_probes=4).estimate == pytest.approx(45.0, rel=1e-14)


def test_targets_of_the_wrong_shape_are_refused_not_broadcast():
    model, loss, x, y, loss_fn, params = _closure("tanh-mlp-mse")
    with pytest.raises(ValueError, match="outputs' shape \\(12, 3\\), got \\(12, 1\\) \\(it would broadcast\\)"):
        loss_closure(model, nn.MSELoss(), (x, y[:, :1]))  # (N, 1) against (N, 3) outputs
    with pytest.raises(ValueError, match="it would broadcast"):
        cv.hessian_operator(model, loss, (x, y[:, :1]))
    tagger, ce, xt, yt = build("tagger")
    with pytest.raises(ValueError, match="must have shape \\(12, 7\\), got \\(12,\\)"):
        cv.ggn_operator(tagger, ce, (xt, yt[:, 0]))
    with pytest.raises(ValueError, match="class indices in \\[0, 4\\)"):
        cv.ggn_operator(tagger, ce, (xt, yt + 4))


def test_spectral_density_padding_is_documented_and_avoidable():
    a = np.diag([1.0, 1.0, 2.0, 2.0, 3.0])  # three distinct eigenvalues: Lanczos stops after 3 steps
    sd = cv.spectral_density(a, np.linspace(0, 3, 7), n_probes=2, n_lanczos=5, sigma=0.1)
    assert np.isnan(sd.nodes[:, 3:]).all() and np.all(sd.weights[:, 3:] == 0)
    nodes, weights = sd.quadrature(0)
    assert_close(np.sort(nodes), [1.0, 2.0, 3.0], rtol=1e-10, atol=0)
    assert_close(weights.sum(), 1.0, rtol=1e-12, atol=0)
    assert "padded with NaN" in cv.spectra.SpectralDensity.__doc__


def test_soft_cross_entropy_targets_give_the_hessian_or_a_clear_error():
    # a linear classifier: the GGN is the Hessian, also for class probabilities as targets
    gen = torch.Generator().manual_seed(0)
    model = nn.Linear(5, 4).double()
    x = torch.randn(9, 5, generator=gen, dtype=torch.float64)
    soft = torch.softmax(torch.randn(9, 4, generator=gen, dtype=torch.float64), dim=1)
    ce = nn.CrossEntropyLoss()
    hessian = cv.hessian_operator(model, ce, (x, soft)).dense()
    assert_close(cv.ggn_operator(model, ce, (x, soft)).dense(), hessian, rtol=1e-12, atol=1e-14)
    # rows summing to 2 double the Hessian, and the GGN (autograd of the loss module) with it
    assert_close(
        cv.ggn_operator(model, ce, (x, 2 * soft)).dense(),
        cv.hessian_operator(model, ce, (x, 2 * soft)).dense(),
        rtol=1e-12,
        atol=1e-14,
    )
    # but they are not probabilities, so the likelihood's Fisher is refused
    with pytest.raises(ValueError, match="must be class probabilities"):
        cv.fisher_operator(model, ce, (x, 2 * soft), kind="true")
    negative = soft.clone()
    negative[:, 0] += 0.5 + soft[:, 1]
    negative[:, 1] = -0.5  # rows still sum to 1
    with pytest.raises(ValueError, match="must be class probabilities"):
        cv.fisher_operator(model, ce, (x, negative), kind="true")
    with pytest.raises(ValueError, match="the loss is non-finite"):
        cv.hessian_operator(model, ce, (x, soft.where(soft > 0.9, torch.nan)))

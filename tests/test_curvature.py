"""Tests of lossgeom.curvature: operators, eigensolvers, trace and density estimators.

Every estimator is compared with a dense float64 autograd reference on a small model,
with curvlinops where it computes the same matrix, or with a property the matrix must
have (symmetry, positive semi-definiteness, Hessian = GGN at zero residual).
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from lossgeom import curvature as cv
from lossgeom_book.data import digits
from lossgeom.models import loss_closure, mlp, params_of

from conftest import assert_close

MODEL_CASES = [
    {"id": "relu-mlp-ce", "sizes": [64, 6, 10], "activation": "relu", "loss": "cross_entropy", "seed": 1},
    {"id": "tanh-mlp-ce", "sizes": [64, 5, 4, 10], "activation": "tanh", "loss": "cross_entropy", "seed": 2},
    {"id": "tanh-mlp-mse", "sizes": [64, 6, 10], "activation": "tanh", "loss": "mse", "seed": 3},
]


def _ids(cases):
    return [c["id"] for c in cases]


def _setup(case, n=120):
    split = digits(n, 10, seed=case["seed"])
    model = mlp(case["sizes"], activation=case["activation"], seed=case["seed"])
    x = split.x_train
    if case["loss"] == "mse":
        y = torch.nn.functional.one_hot(split.y_train, 10).to(torch.float64)
    else:
        y = split.y_train
    params = params_of(model)
    return model, params, x, y, loss_closure(model, x, y, loss=case["loss"])


@pytest.fixture(params=MODEL_CASES, ids=_ids(MODEL_CASES))
def case(request):
    return request.param, *_setup(request.param)


def _curvlinops():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # linear_operator uses torch.jit.script
        import curvlinops
    return curvlinops


def _loaded(model, params):
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[name])
    return model


# --- operators ------------------------------------------------------------------------


def test_hvp_matches_dense_hessian(case):
    _, model, params, x, y, loss_fn = case
    dense = cv.dense_hessian(loss_fn, params).numpy()
    op = cv.hessian_operator(loss_fn, params)
    assert op.shape == dense.shape and op.dtype == torch.float64 and op.mode == "reverse-over-reverse"
    assert_close(op.dense(), dense, rtol=1e-11, atol=1e-13)
    assert op.n_hvp == dense.shape[0]
    op.reset_count()
    v = np.random.default_rng(0).standard_normal(dense.shape[0])
    assert_close(op @ v, dense @ v, rtol=1e-11, atol=1e-13)
    assert op.n_hvp == 1
    assert_close(op.gradient(), cv.dense_gradient(loss_fn, params).numpy(), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("method", ["forward-over-reverse", "reverse-over-reverse"])
def test_hvp_methods_agree(method):
    model, params, x, y, loss_fn = _setup(MODEL_CASES[0])
    v = np.random.default_rng(4).standard_normal((sum(p.numel() for p in params.values()), 2))
    reference = cv.hessian_operator(loss_fn, params)
    other = cv.hessian_operator(loss_fn, params, method=method)
    assert reference.mode == "reverse-over-reverse" and other.mode == method
    assert_close(other @ v, reference @ v, rtol=1e-11, atol=1e-14)
    assert other.n_hvp == 2
    assert cv.hessian_operator(loss_fn, params, method).mode == method  # the positional form


def test_mse_hvp_by_the_default_method():
    model, params, x, y, loss_fn = _setup(MODEL_CASES[2])
    op = cv.hessian_operator(loss_fn, params)
    v = np.random.default_rng(5).standard_normal(op.shape[0])
    hv = op @ v
    assert op.mode == "reverse-over-reverse" and op.keeps_graph
    assert_close(hv, cv.dense_hessian(loss_fn, params).numpy() @ v, rtol=1e-11, atol=1e-14)


def test_hessian_matches_curvlinops(case):
    spec, model, params, x, y, loss_fn = case
    cl = _curvlinops()
    criterion = nn.CrossEntropyLoss() if spec["loss"] == "cross_entropy" else nn.MSELoss()
    _loaded(model, params)
    ref = cl.HessianLinearOperator(model, criterion, list(model.parameters()), [(x, y)]).to_scipy()
    op = cv.hessian_operator(loss_fn, params)
    v = np.random.default_rng(1).standard_normal((op.shape[0], 3))
    assert_close(op @ v, ref @ v, rtol=1e-10, atol=1e-12)


def test_ggn_and_fisher_match_dense_and_curvlinops(case):
    spec, model, params, x, y, _ = case
    cl = _curvlinops()
    loss = spec["loss"]
    criterion = nn.CrossEntropyLoss() if loss == "cross_entropy" else nn.MSELoss()
    ggn = cv.ggn_operator(model, params, x, y, loss=loss)
    dense = cv.dense_ggn(model, params, x, y, loss=loss).numpy()
    assert_close(ggn.dense(), dense, rtol=1e-11, atol=1e-14)
    _loaded(model, params)
    ref = cl.GGNLinearOperator(model, criterion, list(model.parameters()), [(x, y)]).to_scipy()
    v = np.random.default_rng(2).standard_normal((ggn.shape[0], 2))
    assert_close(ggn @ v, ref @ v, rtol=1e-10, atol=1e-13)
    ef = cv.fisher_operator(model, params, x, y, loss=loss, kind="empirical")
    ef_dense = cv.dense_fisher(model, params, x, y, loss=loss).numpy()
    assert_close(ef.dense(), ef_dense, rtol=1e-11, atol=1e-14)
    ef_ref = cl.EFLinearOperator(model, criterion, list(model.parameters()), [(x, y)]).to_scipy()
    # curvlinops sums the squared error over the K outputs of an example where our
    # per-example loss averages it, so for mse its empirical Fisher is K times ours.
    factor = 1.0 if loss == "cross_entropy" else float(y.shape[1])
    assert_close(ef_ref @ v, factor * (ef @ v), rtol=1e-10, atol=1e-13)


def test_true_fisher_equals_ggn_for_cross_entropy():
    model, params, x, y, _ = _setup(MODEL_CASES[0])
    fisher = cv.dense_fisher(model, params, x, y, kind="true").numpy()
    assert_close(fisher, cv.dense_ggn(model, params, x, y).numpy(), rtol=1e-11, atol=1e-14)


def test_ggn_and_fishers_are_psd_and_hessian_is_not():
    model, params, x, y, loss_fn = _setup(MODEL_CASES[0])
    hess = np.linalg.eigvalsh(cv.dense_hessian(loss_fn, params).numpy())
    assert hess[0] < -1e-3 * hess[-1]  # indefinite at this untrained point
    for mat in (cv.dense_ggn(model, params, x, y), cv.dense_fisher(model, params, x, y),
                cv.dense_fisher(model, params, x, y, kind="true")):
        ev = np.linalg.eigvalsh(mat.numpy())
        assert ev[0] >= -1e-12 * ev[-1]
        assert_close(mat.numpy(), mat.numpy().T, rtol=0, atol=1e-15)


def test_hessian_equals_ggn_at_zero_residual():
    spec = MODEL_CASES[2]
    model, params, x, _, _ = _setup(spec)
    with torch.no_grad():
        y_zero = torch.func.functional_call(model, params, (x,))  # targets the model fits exactly
    loss_fn = loss_closure(model, x, y_zero, loss="mse")
    hess = cv.dense_hessian(loss_fn, params).numpy()
    ggn = cv.dense_ggn(model, params, x, y_zero, loss="mse").numpy()
    assert_close(hess, ggn, rtol=0, atol=1e-13 * np.abs(ggn).max())
    # and with a nonzero residual they differ by the residual term
    y_off = y_zero + 0.5
    diff = cv.dense_hessian(loss_closure(model, x, y_off, loss="mse"), params).numpy() - cv.dense_ggn(
        model, params, x, y_off, loss="mse").numpy()
    assert np.abs(diff).max() > 1e-3


def test_taylor_slopes_2_and_3():
    spec = MODEL_CASES[1]  # smooth (tanh) so the Taylor model holds to third order
    model, params, x, y, loss_fn = _setup(spec)
    n = sum(p.numel() for p in params.values())
    d = np.random.default_rng(3).standard_normal(n)
    d /= np.linalg.norm(d)
    steps = np.geomspace(1e-3, 1e-1, 6)
    r1, r2 = cv.taylor_remainders(loss_fn, params, d, steps)
    slope1 = np.polyfit(np.log(steps), np.log(r1), 1)[0]
    slope2 = np.polyfit(np.log(steps), np.log(r2), 1)[0]
    assert abs(slope1 - 2) < 0.1 and abs(slope2 - 3) < 0.15
    # a wrong HVP (halved) breaks the third-order slope: the check can fail
    r2_wrong = np.abs(r2 + 0.25 * steps**2 * float(d @ cv.hessian_operator(loss_fn, params).matvec(d)))
    assert np.polyfit(np.log(steps), np.log(r2_wrong), 1)[0] < 2.2


# --- eigenpairs -------------------------------------------------------------------------


def test_top_eigenpairs_match_dense(case):
    _, model, params, x, y, loss_fn = case
    dense = np.linalg.eigvalsh(cv.dense_hessian(loss_fn, params).numpy())
    op = cv.hessian_operator(loss_fn, params)
    top = cv.top_eigenpairs(op, k=3, which="largest", tol=1e-12)
    assert_close(top.values, dense[::-1][:3], rtol=1e-9, atol=0)
    assert np.all(np.diff(top.values) <= 0)
    low = cv.top_eigenpairs(op, k=2, which="smallest", tol=1e-12)
    assert_close(low.values, dense[:2], rtol=1e-8, atol=1e-12 * dense[-1])
    assert np.all(np.diff(low.values) >= 0)
    assert np.all(top.residuals <= 1e-8 * dense[-1])
    assert top.n_hvp > 0 and op.n_hvp == top.n_hvp + low.n_hvp + 5  # 5 residual products
    assert_close(top.vectors.T @ top.vectors, np.eye(3), rtol=0, atol=1e-10)


def test_top_eigenpairs_is_deterministic_and_accepts_arrays():
    a = np.diag(np.arange(1.0, 21.0))
    r1 = cv.top_eigenpairs(a, k=2, seed=4)
    r2 = cv.top_eigenpairs(torch.from_numpy(a), k=2, seed=4)
    assert_close(r1.values, [20.0, 19.0], rtol=1e-12, atol=0)
    assert r1.n_hvp == r2.n_hvp and np.array_equal(r1.values, r2.values)


def test_lanczos_beats_power_iteration_on_a_clustered_spectrum():
    ev = np.concatenate([[1.0, 0.97], np.linspace(0.0, 0.9, 198)])
    a = np.diag(ev)
    lanczos = cv.top_eigenpairs(a, k=1, tol=1e-8)
    value, n_power = cv.power_iteration(a, rel_tol=1e-6, reference=1.0)
    assert abs(lanczos.values[0] - 1.0) <= 1e-6 and abs(value - 1.0) <= 1e-6
    assert 3 * lanczos.n_hvp <= n_power


def test_smaller_lanczos_basis_uses_fewer_products():
    a = np.diag(np.concatenate([[2.0], np.linspace(0.0, 1.0, 99)]))
    small = cv.top_eigenpairs(a, k=1, tol=1e-10, ncv=6)
    default = cv.top_eigenpairs(a, k=1, tol=1e-10)
    assert_close(small.values, [2.0], rtol=1e-10, atol=0)
    assert small.n_hvp < default.n_hvp


def test_power_iteration_relative_change_stop():
    value, used = cv.power_iteration(np.diag([3.0, 1.0, 0.5]), rel_tol=1e-12)
    assert abs(value - 3.0) <= 1e-10 and used < 100


# --- trace and density ---------------------------------------------------------------


def test_hutchinson_unbiased_within_se_and_target_stop():
    rng = np.random.default_rng(5)
    q, _ = np.linalg.qr(rng.standard_normal((60, 60)))
    a = q @ np.diag(rng.uniform(-1, 3, 60)) @ q.T
    exact = np.trace(a)
    est = cv.hutchinson_trace(a, n_probes=200, seed=1)
    assert est.n_hvp == 200 and est.n_probes == 200
    assert abs(est.estimate - exact) <= 4 * est.std_error
    stopped = cv.hutchinson_trace(a, n_probes=10, seed=2, target_rel_se=0.02, max_probes=5000)
    assert stopped.std_error <= 0.02 * abs(stopped.estimate)
    assert stopped.n_hvp == stopped.n_probes and abs(stopped.estimate - exact) <= 4 * stopped.std_error
    # Rademacher probes are exact for a diagonal matrix
    assert_close(cv.hutchinson_trace(np.diag(np.arange(5.0)), n_probes=3).estimate, 10.0, rtol=1e-14)


def test_hutchpp_on_low_rank_is_near_exact_and_counts():
    rng = np.random.default_rng(6)
    u = rng.standard_normal((80, 5))
    a = u @ u.T
    est = cv.hutchpp_trace(a, n_hvp=30, seed=0)
    assert est.n_hvp == 30
    assert_close(est.estimate, np.trace(a), rtol=1e-10, atol=0)


def test_hutchinson_on_hessian_operator(case):
    _, model, params, x, y, loss_fn = case
    exact = float(np.trace(cv.dense_hessian(loss_fn, params).numpy()))
    est = cv.hutchinson_trace(cv.hessian_operator(loss_fn, params), n_probes=100, seed=0)
    assert abs(est.estimate - exact) <= 4 * est.std_error


def test_slq_density_matches_dense_reference():
    rng = np.random.default_rng(7)
    ev = np.concatenate([rng.normal(0.0, 0.05, 150), [1.0, 2.0, 3.0]])
    q, _ = np.linalg.qr(rng.standard_normal((153, 153)))
    a = q @ np.diag(ev) @ q.T
    grid = np.linspace(-0.5, 3.5, 401)
    sd = cv.spectral_density(a, grid, n_probes=30, n_lanczos=60, sigma=0.05, seed=0)
    ref = cv.dense_spectral_density(ev, grid, 0.05)
    assert sd.n_hvp <= 30 * 60
    assert abs(np.trapezoid(sd.density, grid) - 1.0) <= 1e-6
    assert np.abs(sd.density - ref).max() <= 0.1 * ref.max()
    # first moment of each probe's quadrature is its Rayleigh quotient; averaged ~ tr(A)/n
    means = np.nansum(sd.nodes * sd.weights, axis=1)
    assert abs(means.mean() - ev.mean()) <= 4 * means.std(ddof=1) / np.sqrt(30)


def test_slq_full_lanczos_reproduces_spectrum_nodes():
    a = np.diag([1.0, 2.0, 4.0, 8.0])
    sd = cv.spectral_density(a, np.linspace(0, 9, 10), n_probes=1, n_lanczos=4, sigma=0.1)
    assert_close(np.sort(sd.nodes[0]), [1.0, 2.0, 4.0, 8.0], rtol=1e-10, atol=0)
    assert_close(sd.weights[0], np.full(4, 0.25), rtol=1e-10, atol=0)  # Rademacher: equal weights


def test_spectrum_summary():
    s = cv.spectrum_summary([-0.5, -1e-9, 0.0, 1e-3, 1.0, 10.0], rel_threshold=1e-6)
    assert s.largest == 10.0 and s.most_negative == -0.5 and s.n_negative == 1
    assert_close(s.trace, 10.501 - 1e-9, rtol=1e-14)
    assert s.condition_number == pytest.approx(1e4) and s.n_near_zero == 2
    assert cv.spectrum_summary([1.0, 2.0], rel_threshold=0.9).condition_number == 1.0


# --- error paths -----------------------------------------------------------------------


def test_errors_hessian_operator():
    model, params, x, y, loss_fn = _setup(MODEL_CASES[0])
    with pytest.raises(ValueError, match="non-empty"):
        cv.hessian_operator(loss_fn, {})
    with pytest.raises(ValueError, match="non-finite"):
        cv.hessian_operator(lambda p: loss_fn(p) * float("nan"), params)
    with pytest.raises(ValueError, match="non-finite"):
        cv.hessian_operator(lambda p: (p["0.weight"][:0] ** 2).mean(), params)  # empty mean
    with pytest.raises(ValueError, match="scalar"):
        cv.hessian_operator(lambda p: p["0.bias"], params)
    with pytest.raises(TypeError, match="callable"):
        cv.hessian_operator(3.0, params)
    with pytest.raises(ValueError, match="method must be one of"):
        cv.hessian_operator(loss_fn, params, method="finite-difference")
    op = cv.hessian_operator(loss_fn, params)
    with pytest.raises(ValueError, match="entries"):
        op.matvec(np.ones(3))
    with pytest.raises(ValueError, match="linearized"):
        cv.hessian_operator(loss_fn, params, method="linearized")


def test_errors_eigen_and_estimators():
    a = np.diag([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="k must be < n = 3.*eigh"):
        cv.top_eigenpairs(a, k=3)
    with pytest.raises(ValueError, match=">= 1"):
        cv.top_eigenpairs(a, k=0)
    with pytest.raises(ValueError, match="which must be"):
        cv.top_eigenpairs(a, which="LM")
    with pytest.raises(ValueError, match="square"):
        cv.top_eigenpairs(np.ones((3, 2)))
    with pytest.raises(ValueError, match="symmetric"):
        cv.top_eigenpairs(np.array([[1.0, 2.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 3.0]]))
    with pytest.raises(ValueError, match="ncv must satisfy"):
        cv.top_eigenpairs(np.diag(np.arange(1.0, 11.0)), k=2, ncv=2)
    with pytest.raises(ValueError, match="n_probes must be >= 2"):
        cv.hutchinson_trace(a, n_probes=1)
    with pytest.raises(ValueError, match="n_hvp must be >= 6"):
        cv.hutchpp_trace(a, n_hvp=5)
    with pytest.raises(ValueError, match="n_lanczos must be <= n"):
        cv.spectral_density(a, [0.0, 1.0], n_lanczos=4)
    with pytest.raises(ValueError, match="sigma must be > 0"):
        cv.spectral_density(a, [0.0, 1.0], n_lanczos=2, sigma=0.0)
    with pytest.raises(ValueError, match="rel_tol must be > 0"):
        cv.power_iteration(a, rel_tol=-1.0)
    with pytest.raises(ValueError, match="must not be empty"):
        cv.spectrum_summary([])
    with pytest.raises(ValueError, match="largest eigenvalue must be > 0"):
        cv.spectrum_summary([-1.0, -2.0])
    with pytest.raises(ValueError, match="direction must have"):
        model, params, x, y, loss_fn = _setup(MODEL_CASES[0])
        cv.taylor_remainders(loss_fn, params, np.ones(3), [0.1])


def test_errors_model_operators():
    model, params, x, y, _ = _setup(MODEL_CASES[0])
    with pytest.raises(ValueError, match="empty data"):
        cv.ggn_operator(model, params, x[:0], y[:0])
    with pytest.raises(ValueError, match="loss must be one of"):
        cv.ggn_operator(model, params, x, y, loss="hinge")
    with pytest.raises(ValueError, match="one entry per example"):
        cv.ggn_operator(model, params, x, y[:3])
    with pytest.raises(ValueError, match="output's shape"):
        cv.ggn_operator(model, params, x, y.to(torch.float64), loss="mse")
    bad = dict(params)
    bad["2.bias"] = torch.full_like(params["2.bias"], 1e200)  # finite parameters, overflowing loss
    with pytest.raises(ValueError, match="non-finite"):
        cv.ggn_operator(model, bad, x, torch.zeros(len(x), 10), loss="mse")
    with pytest.raises(ValueError, match="kind must be"):
        cv.fisher_operator(model, params, x, y, kind="mc")
    with pytest.raises(ValueError, match="kind must be"):
        cv.dense_fisher(model, params, x, y, kind="mc")
    with pytest.raises(ValueError, match="proportional to the GGN"):
        cv.fisher_operator(model, params, x, torch.zeros(len(x), 10), loss="mse", kind="true")
    with pytest.raises(TypeError, match="nn.Module"):
        cv.ggn_operator(lambda z: z, params, x, y)
    with pytest.raises(ValueError, match="non-empty"):
        cv.ggn_operator(model, {}, x, y)


def test_batch_norm_in_training_mode_is_rejected():
    model = nn.Sequential(nn.Linear(4, 3, dtype=torch.float64), nn.BatchNorm1d(3, dtype=torch.float64),
                          nn.ReLU(), nn.Linear(3, 2, dtype=torch.float64))
    params = params_of(model)
    x, y = torch.randn(8, 4, generator=torch.Generator().manual_seed(0)), torch.zeros(8, dtype=torch.long)
    for build in (cv.ggn_operator, cv.fisher_operator, cv.dense_ggn):
        with pytest.raises(ValueError, match="batch norm and is in training mode"):
            build(model, params, x, y)
    with pytest.raises(ValueError, match="batch norm and is in training mode"):
        cv.hessian_operator(loss_closure(model, x, y), params)
    model.eval()
    op = cv.ggn_operator(model, params, x, y)  # eval mode: a fixed function, accepted
    assert op.shape == (sum(p.numel() for p in params.values()),) * 2


def test_operator_classes_keep_their_explicit_constructors():
    model, params, x, y, _ = _setup(MODEL_CASES[0])
    v = np.random.default_rng(9).standard_normal(sum(p.numel() for p in params.values()))
    assert_close(cv.GGNOperator(model, params, x, y) @ v, cv.ggn_operator(model, params, x, y) @ v, rtol=1e-14,
                 atol=0)
    true = cv.FisherOperator(model, params, x, y, kind="true")
    assert true.kind == "true"
    assert_close(true @ v, cv.fisher_operator(model, params, x, y, kind="true") @ v, rtol=1e-14, atol=0)
    risk = cv.EmpiricalRisk(model, "cross_entropy", (x, y), params)
    assert_close(cv.FisherOperator(risk, "true") @ v, true @ v, rtol=1e-14, atol=0)

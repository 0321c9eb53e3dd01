#!/usr/bin/env python3
"""Benchmark lossgeom's curvature tools against PyHessian and curvlinops (a script, not a test).

On Chapter 4's digits MLP (same data, model, seed and training), for one fixed batch:

1. the top Hessian eigenvalue to 1e-6 relative accuracy: lossgeom's Lanczos
   (``top_eigenpairs``), plain power iteration (``power_iteration``, with an oracle stop
   at the true error, the fewest products it could need, and with a practical stop),
   PyHessian's power iteration, and ``eigsh`` on curvlinops' ``HessianLinearOperator``;
2. the trace to 1% standard error: Hutchinson and Hutch++ (lossgeom), curvlinops'
   ``hutchinson_trace`` at the same budget, PyHessian's ``trace`` with its own stop;
3. the wall time of one HVP relative to one gradient for each implementation.

Targets: Lanczos needs at most a third of power iteration's HVPs; one HVP costs at most
three gradients. (The scaling of these costs with model size, against PyHessian and
curvlinops, is measured by benchmarks/curvature_scale_benchmark.py.) Results go to
benchmarks/results/curvature_benchmark.json, which the appendix page
appendices/benchmarks.md renders (it never runs this script).

PyHessian (``pyhessian==0.1``) is not a dependency of the book: benchmarks/pyhessian_import.py
imports it or installs it into a throwaway directory; if that fails, the PyHessian rows are
skipped with a message.

Usage (from the repository root): ``.venv/bin/python benchmarks/curvature_benchmark.py``
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import scipy
import torch
from pyhessian_import import import_pyhessian
from scipy.sparse.linalg import eigsh

from lossgeom import curvature as cv
from lossgeom.models import loss_closure
from lossgeom.parameters import params_of
from lossgeom_book.data import digits
from lossgeom_book.models import mlp

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "curvature_benchmark.json"
REPEATS, TIMING_REPEATS = 5, 30
EIG_RTOL, TRACE_RSE = 1e-6, 0.01
N_TRAIN, WIDTH, SEED, STEPS, LR = 1000, 12, 1, 200, 0.5  # as in chapters/ch04_curvature_spectrum.md


def setup():
    split = digits(N_TRAIN, 500, seed=0)
    keep = split.x_train.std(dim=0) > 0
    x, y = split.x_train[:, keep], split.y_train
    model = mlp([x.shape[1], WIDTH, 10], activation="relu", seed=SEED)
    loss_fn = loss_closure(model, torch.nn.CrossEntropyLoss(), (x, y))
    grad_fn = torch.func.grad(loss_fn)
    params = init = params_of(model)
    for _ in range(STEPS):
        step = grad_fn(params)
        params = {k: p - LR * step[k] for k, p in params.items()}
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[name])
    return model, params, init, x, y, loss_fn, split.description


def median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main() -> int:
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    import curvlinops

    pyhessian, pyhessian_status = import_pyhessian()  # the module pyhessian.hessian
    model, params, init, x, y, loss_fn, data_desc = setup()
    n = sum(p.numel() for p in params.values())
    eigs = np.linalg.eigvalsh(cv.closure_hessian(loss_fn, params).numpy())
    lam_max, trace_exact = float(eigs[-1]), float(eigs.sum())
    op = cv.HessianOperator.from_closure(loss_fn, params)
    criterion = torch.nn.CrossEntropyLoss()
    cl_op = curvlinops.HessianLinearOperator(model, criterion, list(model.parameters()), [(x, y)])
    cl_scipy = cl_op.to_scipy()
    rel = lambda v: abs(v - lam_max) / lam_max
    rows_eig, rows_trace, rows_cost = [], [], []

    # --- top eigenvalue ------------------------------------------------------------
    lanczos_tol = 1e-4  # eigsh's residual tolerance; the Ritz value's error is far smaller
    res = cv.top_eigenpairs(op, k=1, tol=lanczos_tol, seed=0)
    t = median_time(lambda: cv.top_eigenpairs(op, k=1, tol=lanczos_tol, seed=0), REPEATS)
    rows_eig.append(
        {
            "method": f"lossgeom top_eigenpairs (Lanczos, eigsh tol {lanczos_tol:g}, default ncv 20)",
            "n_hvp": res.n_hvp,
            "rel_error": rel(res.values[0]),
            "median_seconds": t,
        }
    )
    best = None
    for ncv in (4, 5, 6, 8, 10, 12, 16):  # smallest restart basis reaching the accuracy with fewest products
        trial = cv.top_eigenpairs(op, k=1, tol=lanczos_tol, seed=0, ncv=ncv)
        if rel(trial.values[0]) <= EIG_RTOL and (best is None or trial.n_hvp < best[1].n_hvp):
            best = (ncv, trial)
    best_ncv, res_small = best
    t = median_time(lambda: cv.top_eigenpairs(op, k=1, tol=lanczos_tol, seed=0, ncv=best_ncv), REPEATS)
    rows_eig.append(
        {
            "method": f"lossgeom top_eigenpairs (Lanczos, ncv {best_ncv}: fewest HVPs over ncv 4..16)",
            "n_hvp": res_small.n_hvp,
            "rel_error": rel(res_small.values[0]),
            "median_seconds": t,
        }
    )
    lanczos_hvp = res_small.n_hvp

    power = cv.spectra.power_iteration(op, tol=EIG_RTOL, reference=lam_max, seed=0, max_iter=100_000)
    value, used = float(power.values[0]), power.n_hvp
    t = median_time(
        lambda: cv.spectra.power_iteration(op, tol=EIG_RTOL, reference=lam_max, seed=0, max_iter=100_000), REPEATS
    )
    rows_eig.append(
        {
            "method": "lossgeom power_iteration, oracle stop at true error 1e-6 (fewest HVPs possible)",
            "n_hvp": used,
            "rel_error": rel(value),
            "median_seconds": t,
        }
    )
    power_oracle = used
    power = cv.spectra.power_iteration(op, tol=1e-8, seed=0, max_iter=100_000)
    value, used = float(power.values[0]), power.n_hvp
    rows_eig.append(
        {
            "method": "lossgeom power_iteration, stop when the estimate changes < 1e-8",
            "n_hvp": used,
            "rel_error": rel(value),
            "median_seconds": None,
        }
    )

    counted = cv.factory.as_operator(cl_scipy)
    v0 = np.random.default_rng(0).standard_normal(n)
    w = eigsh(counted.to_scipy(), k=1, which="LA", tol=lanczos_tol, v0=v0)[0]
    t = median_time(lambda: eigsh(cl_scipy, k=1, which="LA", tol=lanczos_tol, v0=v0), REPEATS)
    rows_eig.append(
        {
            "method": f"curvlinops HessianLinearOperator + eigsh (tol {lanczos_tol:g})",
            "n_hvp": counted.n_hvp,
            "rel_error": rel(float(w[0])),
            "median_seconds": t,
        }
    )

    if pyhessian is not None:
        calls = {"n": 0}
        original = pyhessian.hessian_vector_product

        def counting(*args, **kwargs):
            calls["n"] += 1
            return original(*args, **kwargs)

        pyhessian.hessian_vector_product = counting
        for ph_tol in (1e-6, 1e-7, 1e-8, 1e-9):
            torch.manual_seed(0)
            calls["n"] = 0
            comp = pyhessian.hessian(model, criterion, data=(x, y), cuda=False)
            value = comp.eigenvalues(maxIter=100_000, tol=ph_tol, top_n=1)[0][0]
            if rel(value) <= EIG_RTOL:
                break
        ph_eig_tol, ph_used, ph_value = ph_tol, calls["n"], value

        def ph_run():
            torch.manual_seed(0)
            pyhessian.hessian(model, criterion, data=(x, y), cuda=False).eigenvalues(
                maxIter=100_000, tol=ph_eig_tol, top_n=1
            )

        t = median_time(ph_run, REPEATS)
        if rel(ph_value) <= EIG_RTOL:
            ph_label = (
                f"PyHessian eigenvalues (power iteration, its tol {ph_eig_tol:g}: loosest of 1e-6..1e-9 reaching 1e-6)"
            )
        else:
            ph_label = (
                f"PyHessian eigenvalues (power iteration, its tol {ph_eig_tol:g}; "
                "no tol in 1e-6..1e-9 reaches 1e-6: "
                "its normalisation v / (||v|| + 1e-6) biases the Rayleigh quotient by about 2e-6)"
            )
        rows_eig.append({"method": ph_label, "n_hvp": ph_used, "rel_error": rel(ph_value), "median_seconds": t})
        pyhessian.hessian_vector_product = original

    # --- trace -------------------------------------------------------------------
    start = time.perf_counter()
    hutch = cv.hutchinson_trace(op, n_probes=10, seed=0, target_rel_se=TRACE_RSE, max_probes=20_000, batch=10)
    t = time.perf_counter() - start  # one run (it takes many HVPs)
    rows_trace.append(
        {
            "method": "lossgeom hutchinson_trace (Rademacher, sequential stop at 1% SE)",
            "n_hvp": hutch.n_hvp,
            "estimate": hutch.estimate,
            "std_error": hutch.std_error,
            "rel_error": abs(hutch.estimate - trace_exact) / trace_exact,
            "median_seconds": t,
        }
    )
    for budget in range(30, 3001, 30):
        hpp = cv.hutchpp_trace(op, n_probes=budget, seed=0)
        if hpp.std_error <= TRACE_RSE * abs(hpp.estimate):
            break
    t = median_time(lambda: cv.hutchpp_trace(op, n_probes=budget, seed=0), REPEATS)
    rows_trace.append(
        {
            "method": "lossgeom hutchpp_trace (smallest budget in steps of 30 with SE <= 1%)",
            "n_hvp": hpp.n_hvp,
            "estimate": hpp.estimate,
            "std_error": hpp.std_error,
            "rel_error": abs(hpp.estimate - trace_exact) / trace_exact,
            "median_seconds": t,
        }
    )
    torch.manual_seed(0)
    start = time.perf_counter()
    cl_est = float(curvlinops.hutchinson_trace(cl_op, num_matvecs=min(hutch.n_hvp, n - 1)))
    rows_trace.append(
        {
            "method": "curvlinops hutchinson_trace (same budget as lossgeom's, at most n - 1; no SE reported)",
            "n_hvp": min(hutch.n_hvp, n - 1),
            "estimate": cl_est,
            "std_error": None,
            "rel_error": abs(cl_est - trace_exact) / trace_exact,
            "median_seconds": time.perf_counter() - start,
        }
    )
    if pyhessian is not None:
        torch.manual_seed(0)
        comp = pyhessian.hessian(model, criterion, data=(x, y), cuda=False)
        start = time.perf_counter()
        samples = comp.trace(maxIter=20_000, tol=1e-3)
        elapsed = time.perf_counter() - start
        se = float(np.std(samples, ddof=1) / np.sqrt(len(samples))) if len(samples) > 1 else None
        rows_trace.append(
            {
                "method": "PyHessian trace (its default stop: mean changes < 0.1%)",
                "n_hvp": len(samples),
                "estimate": float(np.mean(samples)),
                "std_error": se,
                "rel_error": abs(float(np.mean(samples)) - trace_exact) / trace_exact,
                "median_seconds": elapsed,
            }
        )

    # --- cost of one HVP relative to one gradient --------------------------------
    v = np.random.default_rng(1).standard_normal(n)
    grad_fn = torch.func.grad(loss_fn)
    t_grad = median_time(lambda: grad_fn(params), TIMING_REPEATS)

    def autograd_gradient():
        model.zero_grad()
        criterion(model(x), y).backward()

    t_grad_autograd = median_time(autograd_gradient, TIMING_REPEATS)
    t_hvp = median_time(lambda: op.matvec(v), TIMING_REPEATS)
    rows_cost.append(
        {
            "method": "lossgeom HVP (default: reverse-over-reverse, gradient graph kept)",
            "median_seconds": t_hvp,
            "gradient_seconds": t_grad,
            "gradient": "torch.func.grad",
            "ratio": t_hvp / t_grad,
        }
    )
    t_cl = median_time(lambda: cl_scipy.matvec(v), TIMING_REPEATS)
    rows_cost.append(
        {
            "method": "curvlinops HessianLinearOperator matvec (jvp of jacrev, via to_scipy)",
            "median_seconds": t_cl,
            "gradient_seconds": t_grad,
            "gradient": "torch.func.grad",
            "ratio": t_cl / t_grad,
        }
    )
    if pyhessian is not None:
        from pyhessian.utils import hessian_vector_product

        comp = pyhessian.hessian(model, criterion, data=(x, y), cuda=False)
        vec = [torch.randn_like(p) for p in comp.params]
        t_ph = median_time(lambda: hessian_vector_product(comp.gradsH, comp.params, vec), TIMING_REPEATS)
        rows_cost.append(
            {
                "method": "PyHessian HVP (reverse-over-reverse, graph of the gradient kept)",
                "median_seconds": t_ph,
                "gradient_seconds": t_grad_autograd,
                "gradient": "loss.backward()",
                "ratio": t_ph / t_grad_autograd,
            }
        )

    # --- the same comparison where the top of the spectrum is crowded --------------
    rows_gap = []
    for label, point in (("trained (the rows above)", params), ("at initialisation (step 0)", init)):
        ev = np.linalg.eigvalsh(cv.closure_hessian(loss_fn, point).numpy())
        point_op = cv.HessianOperator.from_closure(loss_fn, point)
        lz = cv.top_eigenpairs(point_op, k=1, tol=lanczos_tol, seed=0)
        pw = cv.spectra.power_iteration(point_op, tol=EIG_RTOL, reference=float(ev[-1]), seed=0, max_iter=100_000).n_hvp
        lz = min(
            (cv.top_eigenpairs(point_op, k=1, tol=lanczos_tol, seed=0, ncv=c) for c in (4, 5, 6, 8, 10, 12, 16, 20)),
            key=lambda r: r.n_hvp if abs(r.values[0] - ev[-1]) <= EIG_RTOL * ev[-1] else 10**9,
        )
        rows_gap.append(
            {
                "point": label,
                "lambda2_over_lambda1": float(ev[-2] / ev[-1]),
                "lanczos_hvp": lz.n_hvp,
                "lanczos_rel_error": abs(lz.values[0] - ev[-1]) / ev[-1],
                "power_oracle_hvp": pw,
                "power_over_lanczos": pw / lz.n_hvp,
            }
        )

    # most negative eigenvalue: a crowded end of the spectrum. Products with the stored
    # dense Hessian (the Krylov process and its count are the same as with HVPs).
    H_dense = cv.closure_hessian(loss_fn, params).numpy()
    bottom = cv.top_eigenpairs(H_dense, k=1, which="smallest", tol=1e-8, seed=0)
    shifted = lam_max * np.eye(n) - H_dense  # its top eigenvalue is lam_max - lambda_min
    pw = cv.spectra.power_iteration(
        shifted,
        tol=EIG_RTOL * abs(eigs[0]) / (lam_max - eigs[0]),
        reference=float(lam_max - eigs[0]),
        seed=0,
        max_iter=300_000,
    ).n_hvp
    rows_gap.append(
        {
            "point": "trained, most negative eigenvalue (power iteration on lambda_max I - H)",
            "lambda2_over_lambda1": float((lam_max - eigs[1]) / (lam_max - eigs[0])),
            "lanczos_hvp": bottom.n_hvp,
            "lanczos_rel_error": abs(bottom.values[0] - eigs[0]) / abs(eigs[0]),
            "power_oracle_hvp": pw,
            "power_over_lanczos": pw / bottom.n_hvp,
        }
    )

    for method in ("forward-over-reverse",):
        start = time.perf_counter()
        other = cv.HessianOperator.from_closure(loss_fn, params, method=method)
        setup_seconds = time.perf_counter() - start
        t_other = median_time(lambda op=other: op.matvec(v), TIMING_REPEATS)
        rows_cost.insert(
            1,
            {
                "method": f"lossgeom HVP, method='{method}' (one-off setup {setup_seconds:.2g} s)",
                "median_seconds": t_other,
                "gradient_seconds": t_grad,
                "gradient": "torch.func.grad",
                "ratio": t_other / t_grad,
            },
        )

    targets = {
        "lanczos_at_most_a_third_of_power_iteration": {
            "lanczos_hvp": lanczos_hvp,
            "power_iteration_hvp_oracle": power_oracle,
            "met": bool(3 * lanczos_hvp <= power_oracle),
            "met_at_initialisation": bool(rows_gap[1]["power_over_lanczos"] >= 3),
            "met_for_most_negative_eigenvalue": bool(rows_gap[2]["power_over_lanczos"] >= 3),
        },
        "lossgeom_hvp_at_most_3_gradients": {"ratio": t_hvp / t_grad, "met": bool(t_hvp / t_grad <= 3.0)},
    }
    result = {
        "what": "Hessian top eigenvalue (1e-6 relative) and trace (1% standard error) of Chapter 4's digits MLP",
        "model": (
            f"ReLU MLP [{x.shape[1]}, {WIDTH}, 10], {n} parameters, seed {SEED}, {STEPS} full-batch GD steps at lr {LR}"
        ),
        "data": data_desc + "; constant pixels dropped; one batch = the whole training set",
        "loss": "mean cross-entropy",
        "reference": {"lambda_max_dense": lam_max, "trace_dense": trace_exact},
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "scipy": scipy.__version__,
            "numpy": np.__version__,
            "curvlinops": importlib.metadata.version("curvlinops-for-pytorch"),
            "pyhessian": "0.1" if pyhessian is not None else None,
            "pyhessian_status": pyhessian_status,
            "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "machine": platform.machine(),
        },
        "repeats": {"eigen_and_trace_timings": REPEATS, "single_product_timings": TIMING_REPEATS},
        "top_eigenvalue": rows_eig,
        "spectral_gap": rows_gap,
        "trace": rows_trace,
        "hvp_cost": rows_cost,
        "targets": targets,
    }
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    for section in ("top_eigenvalue", "spectral_gap", "trace", "hvp_cost"):
        print(f"\n{section}:")
        for row in result[section]:
            print("  " + "; ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    print("\ntargets:", json.dumps(targets))
    return 0


if __name__ == "__main__":
    sys.exit(main())

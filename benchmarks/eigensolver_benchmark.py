#!/usr/bin/env python3
"""Eigensolvers at scale (issue 21, items 4 and 5): plain Lanczos against ARPACK, curvlinops and PyHessian.

Usage, from the repository root:

    PYTHONPATH=src .venv/bin/python benchmarks/eigensolver_benchmark.py            # the full run
    PYTHONPATH=src .venv/bin/python benchmarks/eigensolver_benchmark.py --quick    # a smoke test

It writes ``benchmarks/results/eigensolver_benchmark.json`` (``--quick`` writes
``eigensolver_benchmark_quick.json`` in the temporary directory instead). One thread.

1. The largest and the five largest Hessian eigenvalues to 1e-4 relative accuracy (against a
   tight ARPACK reference, tol 1e-10, float64) on the tanh MLPs ``64 -> w -> w -> 10`` of
   ``curvature_scale_benchmark.py`` at about 1e4 and 1e5 parameters (float64) and 1e6
   (float32: a float64 reference there costs minutes of products), with the mean
   cross-entropy on one seeded batch of 256: lossgeom's ``top_eigenpairs`` with
   ``method="lanczos"`` and ``method="arpack"`` (tol 1e-4, each with its k residual
   products), lossgeom's ``lanczos_eigenpairs`` alone (the solver, which states its residual
   bound, without the check), curvlinops' ``HessianLinearOperator`` through ``eigsh`` (same
   start vector, tol 1e-4) and PyHessian's power iteration with deflation (its tol 1e-5, or
   1e-6 where 1e-5 misses 1e-4; at most 200 products per eigenvalue, 100 at 1e6). Methods
   are run in rotating order, ``repeats`` times at each size; the medians are reported, with
   each method's time over the fastest peer's (curvlinops or PyHessian) in the same repeat.
2. Chapter 5's edge-of-stability runs (256 digits, tanh MLP 64-32-10, MSE on one-hot
   targets, full-batch gradient descent at eta 0.5, 1 and 2 for 500 steps, the sharpness
   every 50 steps to step 300 and every 5 from 335 to 500): ``lambda_max`` at every
   measurement to 1e-4 by ``closure_sharpness_during_training``, cold and warm-started, ARPACK and
   Lanczos; products summed over the measurements, and the largest relative difference
   from a cold ARPACK run at tol 1e-10.

PyHessian (``pyhessian==0.1``) is imported as ``curvature_scale_benchmark.py`` does, via
benchmarks/pyhessian_import.py (``PYHESSIAN_TARGET`` may name a directory holding its
source). Timings on a loaded machine are noisy: the load average is recorded, and the
ratios within one repeat are the numbers to compare.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import gc  # noqa: E402
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import scipy  # noqa: E402
import torch  # noqa: E402
from curvature_scale_benchmark import MLP_WIDTHS, CountingOperator, Methods, median, problem  # noqa: E402
from pyhessian_import import import_pyhessian  # noqa: E402
from scipy.sparse.linalg import eigsh  # noqa: E402
from torch import nn  # noqa: E402

from lossgeom import curvature as cv  # noqa: E402
from lossgeom import training  # noqa: E402
from lossgeom.curvature.lanczos import lanczos_eigenpairs  # noqa: E402
from lossgeom.parameters import params_of
from lossgeom_book.models import mlp

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
OUT_NAME = "eigensolver_benchmark.json"
EIG_RTOL = 1e-4
PEERS = ("curvlinops", "pyhessian")


# --- 1. top eigenvalues ------------------------------------------------------------------


def rel_error(values, reference) -> float:
    values = np.sort(np.asarray(values, dtype=float))[::-1]
    return float(np.max(np.abs(values - reference[: len(values)]) / np.abs(reference[: len(values)])))


def run_lossgeom(methods: Methods, k: int, reference, method: str) -> dict:
    op = methods.lossgeom()
    start = time.perf_counter()
    result = cv.top_eigenpairs(op, k=k, tol=EIG_RTOL, seed=0, method=method)
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "n_hvp": int(result.n_hvp) + k,
        "n_hvp_solver": int(result.n_hvp),
        "rel_error": rel_error(result.values, reference),
        "max_residual_over_value": float(np.max(result.residuals / np.abs(result.values))),
        "max_bound_over_value": float(np.max(result.residual_bounds / np.abs(result.values))),
    }


def run_lanczos_solver(methods: Methods, k: int, reference) -> dict:
    op = methods.lossgeom()
    start = time.perf_counter()
    run = lanczos_eigenpairs(op, k=k, tol=EIG_RTOL, seed=0)
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "n_hvp": int(run.n_hvp),
        "rel_error": rel_error(run.values, reference),
        "max_bound_over_value": float(np.max(run.residual_bounds / np.abs(run.values))),
    }


def run_curvlinops(methods: Methods, k: int, reference) -> dict:
    theirs = methods.curvlinops_operator()
    view = theirs.to_scipy()
    counting = CountingOperator(view)
    v0 = np.random.default_rng(0).standard_normal(methods.n).astype(view.dtype)
    start = time.perf_counter()
    values = eigsh(counting, k=k, which="LA", tol=EIG_RTOL, v0=v0)[0]
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "n_hvp": counting.n_matvec, "rel_error": rel_error(values, reference)}


def run_pyhessian(methods: Methods, k: int, reference, max_iter: int) -> dict:
    module = methods.pyhessian_module
    calls = {"n": 0}
    original = module.hessian_vector_product

    def counting(*args, **kwargs):
        calls["n"] += 1
        return original(*args, **kwargs)

    module.hessian_vector_product = counting
    try:
        for tol in (1e-5, 1e-6):  # the looser first; the tighter only if 1e-4 was missed
            torch.manual_seed(0)
            comp = methods.pyhessian()
            calls["n"] = 0
            start = time.perf_counter()
            found = comp.eigenvalues(maxIter=max_iter, tol=tol, top_n=k)[0]
            seconds = time.perf_counter() - start
            err = rel_error(found, reference)
            del comp
            methods.release_pyhessian()
            if err <= EIG_RTOL:
                break
    finally:
        module.hessian_vector_product = original
    return {"seconds": seconds, "n_hvp": calls["n"], "rel_error": err, "tol": tol, "max_iter": max_iter}


def eigen_rows(size: float, dtype_name: str, repeats: int, pyhessian_module, curvlinops) -> dict:
    """Top-1 and top-5 by every method at one size, in rotating order, ``repeats`` times."""
    torch.set_default_dtype(torch.float64)
    model, x, y = problem("mlp", size, torch.float64)
    reference_op = cv.hessian_operator(model, nn.CrossEntropyLoss(), (x, y))
    start = time.perf_counter()
    reference = cv.top_eigenpairs(reference_op, k=5, tol=1e-10, seed=1)
    row = {
        "size": size,
        "dtype": dtype_name,
        "n_params": int(reference_op.shape[0]),
        "reference_values": reference.values.tolist(),
        "reference": {"method": "arpack", "tol": 1e-10, "seconds": time.perf_counter() - start},
    }
    del reference_op, model
    dtype = {"float32": torch.float32, "float64": torch.float64}[dtype_name]
    torch.set_default_dtype(dtype)
    model, x, y = problem("mlp", size, dtype)
    methods = Methods(model, x, y, pyhessian_module, curvlinops)
    runners = {
        "lossgeom_lanczos": lambda k: run_lossgeom(methods, k, reference.values, "lanczos"),
        "lossgeom_lanczos_solver_only": lambda k: run_lanczos_solver(methods, k, reference.values),
        "lossgeom_arpack": lambda k: run_lossgeom(methods, k, reference.values, "arpack"),
    }
    if curvlinops is not None:
        runners["curvlinops"] = lambda k: run_curvlinops(methods, k, reference.values)
    if pyhessian_module is not None:
        max_iter = 100 if size >= 1e6 else 200
        runners["pyhessian"] = lambda k: run_pyhessian(methods, k, reference.values, max_iter)
    names = list(runners)
    methods.gradient()  # warm-up
    for k in (1, 5):
        per_repeat = []
        for repeat in range(repeats):
            order = names[repeat % len(names) :] + names[: repeat % len(names)]
            per_repeat.append({name: runners[name](k) for name in order})
            gc.collect()
        entry = {}
        for name in names:
            runs = [r[name] for r in per_repeat]
            entry[name] = {**runs[-1], "seconds": median([r["seconds"] for r in runs])}
            entry[name]["seconds_each_repeat"] = [r["seconds"] for r in runs]
            peers = [p for p in PEERS if p in names]
            if peers:
                ratios = [r[name]["seconds"] / min(r[p]["seconds"] for p in peers) for r in per_repeat]
                entry[name]["time_over_fastest_peer"] = median(ratios)
        row[f"top{k}"] = entry
    runners.clear()  # releases the operators before the next size
    gc.collect()
    torch.set_default_dtype(torch.float64)
    return row


# --- 2. warm-started tracking along chapter 5's edge of stability ------------------------------


def edge_of_stability(step_sizes, steps: int, late: int) -> list[dict]:
    """Cold against warm-started sharpness tracking on chapter 5's runs."""
    from lossgeom_book import data

    torch.set_default_dtype(torch.float64)
    split = data.digits(256, 100, seed=0)
    targets = torch.nn.functional.one_hot(split.y_train, 10).double()
    measure_at = list(range(0, late, 50)) + list(range(late, steps + 1, 5))
    rows = []
    for step_size in step_sizes:
        net = mlp([64, 32, 10], "tanh", seed=0, init_scale=0.5)
        start = params_of(net)
        loss = training.indexed_loss(net, nn.MSELoss(), (split.x_train, targets))

        def track(tol, eigensolver="arpack", warm_start=False, loss=loss, start=start, step_size=step_size):
            began = time.perf_counter()
            run = cv.closure_sharpness_during_training(
                loss,
                start,
                training.sgd(step_size),
                steps,
                measure_at,
                tol=tol,
                eigensolver=eigensolver,
                warm_start=warm_start,
            )
            return run, time.perf_counter() - began

        reference, _ = track(1e-10)
        row = {"step_size": step_size, "n_measurements": len(measure_at), "steps": steps, "variants": {}}
        for eigensolver in ("arpack", "lanczos"):
            for warm in (False, True):
                run, seconds = track(EIG_RTOL, eigensolver, warm)
                err = np.abs(run.sharpness / reference.sharpness - 1)
                row["variants"][f"{eigensolver}_{'warm' if warm else 'cold'}"] = {
                    "n_hvp_total": int(run.n_hvp.sum()),
                    "n_hvp_per_measurement": run.n_hvp.tolist(),
                    "n_hvp_after_the_first": int(run.n_hvp[1:].sum()),
                    "max_rel_error": float(err.max()),
                    "seconds_with_training": seconds,
                }
        v = row["variants"]
        row["lanczos_warm_over_cold"] = v["lanczos_warm"]["n_hvp_total"] / v["lanczos_cold"]["n_hvp_total"]
        row["lanczos_warm_over_arpack_cold"] = v["lanczos_warm"]["n_hvp_total"] / v["arpack_cold"]["n_hvp_total"]
        row["arpack_warm_over_cold"] = v["arpack_warm"]["n_hvp_total"] / v["arpack_cold"]["n_hvp_total"]
        row["sharpness_over_2_over_eta_late_median"] = float(
            np.median(reference.sharpness[reference.measured_at >= late]) * step_size / 2
        )
        rows.append(row)
        print(
            f"eos eta {step_size:g}: products "
            + ", ".join(f"{name} {e['n_hvp_total']}" for name, e in row["variants"].items())
            + f"; lanczos warm/cold {row['lanczos_warm_over_cold']:.2f}",
            flush=True,
        )
    return rows


# --- main ------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1e4 parameters only, one repeat, a short run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import curvlinops
    except ImportError:
        curvlinops = None
    pyhessian_module, pyhessian_status = import_pyhessian()
    target = os.environ.get("PYHESSIAN_TARGET")
    if pyhessian_module is not None and target and pyhessian_module.__file__.startswith(target):
        pyhessian_status = "imported from PYHESSIAN_TARGET"  # import_pyhessian names every target an install
    plan = [(1e4, "float64", 1)] if args.quick else [(1e4, "float64", 5), (1e5, "float64", 3), (1e6, "float32", 1)]
    started = time.perf_counter()
    result = {
        "what": "top-1 and top-5 Hessian eigenvalues to 1e-4 by five solvers, and cold against warm-started "
        "sharpness tracking, one thread",
        "setting": {
            "mlp": "tanh MLP 64 -> w -> w -> 10, widths " + str({f"{k:g}": v for k, v in MLP_WIDTHS.items()}),
            "data": "one batch of 256 standard normal inputs and uniform random labels (seeded), mean cross-entropy",
            "eigen_rel_tol": EIG_RTOL,
            "sizes": [{"size": s, "dtype": d, "repeats": r} for s, d, r in plan],
            "lossgeom_n_hvp": "top_eigenpairs' products including its k residual products "
            "(n_hvp_solver without them); seconds include them",
            "quick": args.quick,
        },
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "scipy": scipy.__version__,
            "numpy": np.__version__,
            "curvlinops": importlib.metadata.version("curvlinops-for-pytorch") if curvlinops else None,
            "pyhessian": "0.1" if pyhessian_module is not None else None,
            "pyhessian_status": pyhessian_status,
            "pyhessian_source": os.environ.get("PYHESSIAN_TARGET"),
            "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "machine": platform.machine(),
            "load_average_at_start": list(os.getloadavg()),
            "note": "a shared two-core machine: another process ran tests alongside; compare ratios within a repeat",
        },
        "eigenvalues": [],
    }
    for size, dtype_name, repeats in plan:
        row = eigen_rows(size, dtype_name, repeats, pyhessian_module, curvlinops)
        row["load_average_after"] = list(os.getloadavg())
        result["eigenvalues"].append(row)
        for k in (1, 5):
            print(
                f"eigen {size:g} {dtype_name} top{k}: "
                + "; ".join(
                    f"{m} {v['seconds']:.2f}s/{v['n_hvp']}/{v['rel_error']:.1e}"
                    + (f"/x{v['time_over_fastest_peer']:.2f}" if "time_over_fastest_peer" in v else "")
                    for m, v in row[f"top{k}"].items()
                )
                + f"; {time.perf_counter() - started:.0f} s",
                flush=True,
            )
    steps, late = (120, 80) if args.quick else (500, 335)
    result["edge_of_stability"] = {
        "setting": "chapter 5: 256 digits (seed 0), tanh MLP 64-32-10 (init_scale 0.5, seed 0), MSE on one-hot "
        f"targets, full-batch GD, {steps} steps, sharpness every 50 steps to {late} and every 5 after, tol 1e-4; "
        "reference: cold ARPACK at tol 1e-10",
        "runs": edge_of_stability((1.0,) if args.quick else (0.5, 1.0, 2.0), steps, late),
    }
    result["load_average_at_end"] = list(os.getloadavg())
    result["total_seconds"] = time.perf_counter() - started
    out = Path(tempfile.gettempdir()) / "eigensolver_benchmark_quick.json" if args.quick else RESULTS / OUT_NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out} after {result['total_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

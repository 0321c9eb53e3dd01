#!/usr/bin/env python3
"""Eigensolvers side by side: lossgeom's default Lanczos against curvlinops, PyHessian and hessian-eigenthings.

Usage, from the repository root:

    PYTHONPATH=src:benchmarks .venv/bin/python benchmarks/eigensolver_benchmark.py            # the full run
    PYTHONPATH=src:benchmarks .venv/bin/python benchmarks/eigensolver_benchmark.py --quick    # seconds

with ``PEERS_TARGET=DIR`` in front to take the peers from DIR (installed there if missing).

``--sizes 1e5 1e6`` keeps only those sizes of the plan (1e4, 1e5: float64, three repeats;
1e6: float32, two repeats); ``--out PATH`` writes the JSON there.

The full run writes ``benchmarks/results/eigensolver_benchmark.json``; ``--quick`` (1e3 and
1e4 parameters, one repeat, a short edge-of-stability run) writes
``eigensolver_benchmark_quick.json`` in the temporary directory, or where ``--out`` says.
One thread.

1. **The goal** (issue 30): the largest and the five largest Hessian eigenvalues to 1e-4
   with lossgeom's default solver in at most half the time of the fastest of three peers,
   at 1e5 and 1e6 parameters. Tanh MLPs ``64 -> w -> w -> 10`` of
   ``curvature_scale_benchmark.py`` at about 1e4 and 1e5 parameters (float64) and 1e6
   (float32), mean cross-entropy on one seeded batch of 256; the relative error is the
   largest over the k values against a tight float64 ARPACK reference (tol 1e-10, seed 1).
   Rows:

   - ``lossgeom_default``: ``top_eigenpairs(op, k, tol=1e-4)`` as a user calls it (Lanczos,
     stop on the eigenvalue error bound, partial reorthogonalisation); its k residual
     products are in the time and in ``n_hvp`` (``n_hvp_solver`` without them);
   - ``lossgeom_residual_stop``: the same with ``stop="residual"``;
   - ``lossgeom_arpack``: the same with ``method="arpack"`` (``eigsh``);
   - ``lanczos_partial`` and ``lanczos_full``: the solver alone, ``lanczos_eigenpairs``, with
     partial and full reorthogonalisation (no residual products): the cost of the step;
   - ``curvlinops``: its ``HessianLinearOperator`` through ``eigsh`` (same start vector as
     ours, ``which="LA"``, tol 1e-4);
   - ``pyhessian``: its power iteration with deflation (its tol 1e-5, or 1e-6 where 1e-5
     misses 1e-4 in the first repeat, then that tol in the others; only the last attempt
     timed; at most 200 products per eigenvalue, 100 at 1e6);
   - ``hessian_eigenthings``: ``lanczos(op, k=k, max_iter=m, tol=1e-4, which="LA", seed=0)``
     on its own ``HessianOperator``. It runs exactly ``m`` steps (default ``2k``) and only
     reports convergence, so ``m`` is chosen by an oracle that favours it: the smallest
     ``m`` of the schedule ``2k, 2k + 5, 2k + 10, ...`` whose result is within 1e-4 of the
     reference (with its default reorthogonalisation, full up to 50 steps and none beyond,
     or full reorthogonalisation where that needs fewer steps). The search (untimed)
     predicts each ``m`` from the prefixes of one ``lanczos_tridiagonal`` run from the same
     start and confirms the choice with ``lanczos`` itself; only that final run is timed.

   Methods run in rotating order, ``repeats`` times at each size; each row reports the
   median seconds and the median over repeats of its time over the fastest peer's in the
   same repeat (``time_over_fastest_peer``), and ``within_goal`` (at most 0.5 of it, and
   within 1e-4 of the reference).
2. Chapter 5's edge-of-stability runs (256 digits, tanh MLP 64-32-10, MSE on one-hot
   targets, full-batch gradient descent at eta 0.5, 1 and 2 for 500 steps, the sharpness
   every 50 steps to step 335 and every 5 after): ``lambda_max`` at every measurement to
   1e-4 by ``closure_sharpness_during_training`` with the default Lanczos, cold and
   warm-started (and ARPACK for comparison); products summed over the measurements, the
   largest relative error against a reference of the two largest eigenpairs at every
   measurement (ARPACK, tol 1e-10), and the eigenvalue crossings the reference shows
   (where the new top eigenvector lies mostly along the previous second one: an overlap of
   at least 1/sqrt(2), and larger than with the previous top one), with the warm start's
   error there and every measurement that missed the tolerance.

curvlinops comes from the environment; PyHessian (``pyhessian==0.1``) and
hessian-eigenthings (``hessian-eigenthings==1.0.0a5``) are imported by
benchmarks/pyhessian_import.py, from ``PEERS_TARGET`` (or ``PYHESSIAN_TARGET``) where set,
else installed with ``pip install --no-deps --target`` into a throwaway directory. Timings on
a loaded machine are noisy: the load average is recorded at the start, after each size
and at the end, and the ratios within one repeat are the numbers to compare.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import gc  # noqa: E402
import importlib.metadata  # noqa: E402
import inspect  # noqa: E402
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
from pyhessian_import import HESSIAN_EIGENTHINGS, PYHESSIAN, import_hessian_eigenthings, import_pyhessian  # noqa: E402
from scipy.sparse.linalg import eigsh  # noqa: E402
from torch import nn  # noqa: E402

from lossgeom import curvature as cv  # noqa: E402
from lossgeom import training  # noqa: E402
from lossgeom.curvature.lanczos import lanczos_eigenpairs  # noqa: E402
from lossgeom.parameters import params_of  # noqa: E402
from lossgeom_book.models import mlp  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
OUT_NAME = "eigensolver_benchmark.json"
EIG_RTOL = 1e-4
GOAL_RATIO = 0.5  # the default solver's time over the fastest peer's, at most
GOAL_SIZES = (1e5, 1e6)
PEERS = ("curvlinops", "pyhessian", "hessian_eigenthings")
CROSSING_OVERLAP = 2**-0.5  # a crossing: the new top eigenvector is mostly the previous second one
HE_STEP, HE_MAX_STEPS, HE_FULL_TO = 5, 300, 50  # its schedule; it reorthogonalises by default to 50 steps


# --- 1. top eigenvalues ------------------------------------------------------------------


def rel_error(values, reference) -> float:
    values = np.sort(np.asarray(values, dtype=float))[::-1]
    return float(np.max(np.abs(values - reference[: len(values)]) / np.abs(reference[: len(values)])))


def max_over_value(bounds, values) -> float | None:
    if bounds is None:
        return None
    return float(np.max(np.asarray(bounds, dtype=float) / np.abs(np.asarray(values, dtype=float))))


def bound_holds(values, bounds, reference, dtype: torch.dtype) -> bool | None:
    """Whether every pair's stated eigenvalue error bound covers its actual error (pairs in descending order).

    Up to a slack of ``(1e-10 + 10 eps) |lambda|``: the reference's tolerance, and the rounding of
    the operator's dtype (a float32 Hessian is not the float64 one).
    """
    if bounds is None:
        return None
    order = np.argsort(np.asarray(values, dtype=float))[::-1]
    values, bounds = np.asarray(values, dtype=float)[order], np.asarray(bounds, dtype=float)[order]
    ref = reference[: len(values)]
    slack = (1e-10 + 10 * torch.finfo(dtype).eps) * np.abs(ref)
    return bool(np.all(np.abs(values - ref) <= bounds + slack))


def run_lossgeom(methods: Methods, k: int, reference, **options) -> dict:
    op = methods.lossgeom()
    start = time.perf_counter()
    result = cv.top_eigenpairs(op, k=k, tol=EIG_RTOL, seed=0, **options)
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "n_hvp": int(result.n_hvp) + k,
        "n_hvp_solver": int(result.n_hvp),
        "residual_products": k,
        "method": result.method,
        "stop": options.get("stop", "gap") if result.method == "lanczos" else "residual (ARPACK)",
        "converged": bool(result.converged),
        "rel_error": rel_error(result.values, reference),
        "max_error_bound_over_value": max_over_value(result.error_bounds, result.values),
        "error_bound_holds": bound_holds(result.values, result.error_bounds, reference, methods.params[0].dtype),
        "max_residual_bound_over_value": max_over_value(result.residual_bounds, result.values),
        "max_residual_over_value": max_over_value(result.residuals, result.values),
    }


def run_lanczos_solver(methods: Methods, k: int, reference, reorthogonalise: str) -> dict:
    op = methods.lossgeom()
    start = time.perf_counter()
    run = lanczos_eigenpairs(op, k=k, tol=EIG_RTOL, seed=0, reorthogonalise=reorthogonalise)
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "n_hvp": int(run.n_hvp),
        "full_passes": int(run.full_passes),
        "reorthogonalise": reorthogonalise,
        "stop": run.stop,
        "converged": bool(run.converged),
        "rel_error": rel_error(run.values, reference),
        "max_error_bound_over_value": max_over_value(run.error_bounds, run.values),
        "error_bound_holds": bound_holds(run.values, run.error_bounds, reference, methods.params[0].dtype),
        "max_residual_bound_over_value": max_over_value(run.residual_bounds, run.values),
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


def run_pyhessian(methods: Methods, k: int, reference, max_iter: int, chosen: dict) -> dict:
    """PyHessian's power iteration; its tol 1e-5, or 1e-6 where 1e-5 misses, chosen once per ``k`` (in ``chosen``)."""
    module = methods.pyhessian_module
    calls = {"n": 0}
    original = module.hessian_vector_product

    def counting(*args, **kwargs):
        calls["n"] += 1
        return original(*args, **kwargs)

    module.hessian_vector_product = counting
    try:
        for tol in (chosen[k],) if k in chosen else (1e-5, 1e-6):  # the tighter only if 1e-4 was missed
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
    chosen[k] = tol
    return {"seconds": seconds, "n_hvp": calls["n"], "rel_error": err, "tol": tol, "max_iter": max_iter}


class HessianEigenthings:
    """hessian-eigenthings' Lanczos on its own ``HessianOperator``, its step count chosen by an oracle."""

    def __init__(self, he, methods: Methods) -> None:
        self.he, self.methods = he, methods
        loss_fn = he.supervised_loss(methods.criterion)
        self.operator = he.HessianOperator(methods.model, [(methods.x, methods.y)], loss_fn)

    def schedule(self, k: int) -> list[int]:
        return list(range(2 * k, min(HE_MAX_STEPS, self.operator.size - 1) + 1, HE_STEP))

    def prefix_errors(self, k: int, steps: int, reorthogonalize: bool, reference) -> dict:
        """The error of ``lanczos(max_iter=m)`` for every scheduled ``m <= steps``, from one run's prefixes.

        ``lanczos`` draws its start as ``torch.randn(n, generator=Generator().manual_seed(seed))``
        and runs ``lanczos_tridiagonal`` from it; the first ``m`` steps of a longer run are the
        same computation, so ``T_m`` is the leading block of the longer run's tridiagonal.
        """
        op = self.operator
        v0 = torch.randn(op.size, dtype=op.dtype, generator=torch.Generator().manual_seed(0))
        td = self.he.lanczos_tridiagonal(op, v0, steps, reorthogonalize=reorthogonalize)
        alphas, betas = td.alphas.double().numpy(), td.betas.double().numpy()
        errors = {}
        for m in self.schedule(k):
            if m > td.iterations:
                break
            tri = np.diag(alphas[:m]) + np.diag(betas[: m - 1], 1) + np.diag(betas[: m - 1], -1)
            errors[m] = rel_error(np.linalg.eigvalsh(tri)[::-1][:k], reference)
        return errors

    def search(self, k: int, reference) -> dict:
        """The smallest scheduled ``max_iter`` within tolerance (untimed): ``{"max_iter", "reorthogonalize", ...}``.

        Predicted from prefixes (full reorthogonalisation, and none beyond 50 steps, its
        default there), with a doubling run length; then confirmed by ``lanczos`` itself,
        going on along the schedule if the prediction was short.
        """
        schedule = self.schedule(k)
        products, steps = 0, min(schedule[-1], max(4 * k + 40, 60))
        while True:
            full = self.prefix_errors(k, steps, True, reference)
            products += steps
            candidates = [(m, None) for m, e in full.items() if m <= HE_FULL_TO and e <= EIG_RTOL]
            if not candidates and steps > HE_FULL_TO:
                plain = self.prefix_errors(k, steps, False, reference)
                products += steps
                candidates += [(m, None) for m, e in plain.items() if m > HE_FULL_TO and e <= EIG_RTOL]
                candidates += [(m, True) for m, e in full.items() if m > HE_FULL_TO and e <= EIG_RTOL]
            if candidates or steps >= schedule[-1]:
                break
            steps = min(2 * steps, schedule[-1])
        if not candidates:
            return {"max_iter": schedule[-1], "reorthogonalize": None, "met": False, "search_products": products}
        max_iter, reorthogonalize = min(candidates, key=lambda c: (c[0], c[1] is not None))
        for m in (s for s in schedule if s >= max_iter):  # confirm, and go on where the prediction was short
            choice = {"max_iter": m, "reorthogonalize": reorthogonalize if m > HE_FULL_TO else None}
            confirmed = self.run(k, reference, choice)
            products += confirmed["n_hvp"]
            if confirmed["rel_error"] <= EIG_RTOL:
                return {**choice, "met": True, "predicted_max_iter": max_iter, "search_products": products}
        return {**choice, "met": False, "predicted_max_iter": max_iter, "search_products": products}

    def run(self, k: int, reference, choice: dict) -> dict:
        options = {} if choice["reorthogonalize"] is None else {"reorthogonalize": True}
        start = time.perf_counter()
        result = self.he.lanczos(
            self.operator, k=k, max_iter=choice["max_iter"], tol=EIG_RTOL, which="LA", seed=0, **options
        )
        seconds = time.perf_counter() - start
        return {
            "seconds": seconds,
            "n_hvp": int(result.iterations),
            "rel_error": rel_error(result.eigenvalues.double().numpy(), reference),
            "reports_converged": bool(result.converged.all()),
            "max_iter": choice["max_iter"],
            "reorthogonalize": "full" if choice["reorthogonalize"] or choice["max_iter"] <= HE_FULL_TO else "none",
            "reorthogonalize_is_its_default": choice["reorthogonalize"] is None,
            "oracle_met": choice.get("met"),
            "oracle_search_products": choice.get("search_products"),
        }


def eigen_rows(size: float, dtype_name: str, repeats: int, peers: dict) -> dict:
    """Top-1 and top-5 by every method at one size, in rotating order, ``repeats`` times."""
    torch.set_default_dtype(torch.float64)
    model, x, y = problem("mlp", size, torch.float64)
    reference_op = cv.hessian_operator(model, nn.CrossEntropyLoss(), (x, y))
    start = time.perf_counter()
    reference = cv.top_eigenpairs(reference_op, k=5, tol=1e-10, seed=1, method="arpack")
    row = {
        "size": size,
        "dtype": dtype_name,
        "n_params": int(reference_op.shape[0]),
        "reference_values": reference.values.tolist(),
        "reference": {"method": "arpack", "tol": 1e-10, "seed": 1, "seconds": time.perf_counter() - start},
        "load_average_before": list(os.getloadavg()),
    }
    del reference_op, model
    dtype = {"float32": torch.float32, "float64": torch.float64}[dtype_name]
    torch.set_default_dtype(dtype)
    model, x, y = problem("mlp", size, dtype)
    methods = Methods(model, x, y, peers["pyhessian"], peers["curvlinops"])
    ref = reference.values
    runners = {
        "lossgeom_default": lambda k, _: run_lossgeom(methods, k, ref),
        "lossgeom_residual_stop": lambda k, _: run_lossgeom(methods, k, ref, stop="residual"),
        "lossgeom_arpack": lambda k, _: run_lossgeom(methods, k, ref, method="arpack"),
        "lanczos_partial": lambda k, _: run_lanczos_solver(methods, k, ref, "partial"),
        "lanczos_full": lambda k, _: run_lanczos_solver(methods, k, ref, "full"),
    }
    if peers["curvlinops"] is not None:
        runners["curvlinops"] = lambda k, _: run_curvlinops(methods, k, ref)
    if peers["pyhessian"] is not None:
        max_iter = 100 if size >= 1e6 else 200
        chosen_tol = {}
        runners["pyhessian"] = lambda k, _: run_pyhessian(methods, k, ref, max_iter, chosen_tol)
    he = None
    if peers["hessian_eigenthings"] is not None:
        he = HessianEigenthings(peers["hessian_eigenthings"], methods)
        runners["hessian_eigenthings"] = lambda k, choice: he.run(k, ref, choice)
    names = list(runners)
    peer_names = [p for p in PEERS if p in names]
    methods.gradient()  # warm-up
    for k in (1, 5):
        choice = he.search(k, ref) if he is not None else None
        per_repeat = []
        for repeat in range(repeats):
            order = names[repeat % len(names) :] + names[: repeat % len(names)]
            per_repeat.append({name: runners[name](k, choice) for name in order})
            gc.collect()
        entry = {}
        fastest = [min(peer_names, key=lambda p, r=r: r[p]["seconds"]) for r in per_repeat] if peer_names else []
        accurate = [[p for p in peer_names if r[p]["rel_error"] <= EIG_RTOL] for r in per_repeat]
        fastest_accurate = [
            min(a, key=lambda p, r=r: r[p]["seconds"]) if a else None for r, a in zip(per_repeat, accurate)
        ]
        for name in names:
            runs = [r[name] for r in per_repeat]
            entry[name] = {**runs[-1], "seconds": median([r["seconds"] for r in runs])}
            entry[name]["seconds_each_repeat"] = [r["seconds"] for r in runs]
            entry[name]["within_tolerance"] = bool(max(r["rel_error"] for r in runs) <= EIG_RTOL)
            if peer_names:
                ratios = [r[name]["seconds"] / r[f]["seconds"] for r, f in zip(per_repeat, fastest)]
                entry[name]["time_over_fastest_peer"] = median(ratios)
                entry[name]["time_over_fastest_peer_each_repeat"] = ratios
                entry[name]["within_goal"] = bool(
                    entry[name]["within_tolerance"] and entry[name]["time_over_fastest_peer"] <= GOAL_RATIO
                )
            if all(fastest_accurate):
                ratios = [r[name]["seconds"] / r[f]["seconds"] for r, f in zip(per_repeat, fastest_accurate)]
                entry[name]["time_over_fastest_accurate_peer"] = median(ratios)
        row[f"top{k}"] = {
            "fastest_peer_each_repeat": fastest,
            "fastest_accurate_peer_each_repeat": fastest_accurate,
            "methods": entry,
        }
    runners.clear()  # releases the operators before the next size
    gc.collect()
    torch.set_default_dtype(torch.float64)
    return row


def goal(rows: list[dict]) -> dict:
    """The goal per (size, k) at the goal sizes, from the default solver's rows."""
    checks = []
    for row in rows:
        if row["size"] not in GOAL_SIZES:
            continue
        for k in (1, 5):
            mine = row[f"top{k}"]["methods"]["lossgeom_default"]
            checks.append(
                {
                    "size": row["size"],
                    "n_params": row["n_params"],
                    "k": k,
                    "time_over_fastest_peer": mine.get("time_over_fastest_peer"),
                    "rel_error": mine["rel_error"],
                    "met": bool(mine.get("within_goal", False)),
                }
            )
    return {
        "what": f"lossgeom's default top_eigenpairs(op, k, tol={EIG_RTOL:g}) in at most {GOAL_RATIO:g} of the "
        "fastest peer's time, within the tolerance, at top-1 and top-5",
        "sizes": list(GOAL_SIZES),
        "ratio": GOAL_RATIO,
        "checks": checks,
        "met": bool(checks) and all(c["met"] for c in checks) if checks else None,
    }


# --- 2. warm-started tracking along chapter 5's edge of stability ------------------------------


def reference_track(loss, start, step_size: float, steps: int, measure_at) -> dict:
    """The two largest eigenpairs (ARPACK, tol 1e-10) at every measurement of the same trajectory."""
    wanted, calls, found = set(measure_at), [0], []

    def monitor(point):
        step = calls[0]  # as closure_sharpness_during_training counts: every step, then after the last
        calls[0] += 1
        if step in wanted:
            op = cv.HessianOperator.from_closure(lambda p: loss(p, None), point)
            pair = cv.top_eigenpairs(op, k=2, tol=1e-10, seed=1, method="arpack")
            found.append((step, pair.values.copy(), pair.vectors.copy()))

    training.train(loss, start, training.sgd(step_size), steps, monitor=monitor, monitor_every=1)
    values = np.array([v for _, v, _ in found])
    crossings = []
    for (_, _, before), (step, _, after) in zip(found, found[1:]):
        with_top, with_second = abs(after[:, 0] @ before[:, 0]), abs(after[:, 0] @ before[:, 1])
        if with_second > max(with_top, CROSSING_OVERLAP):
            crossings.append(
                {"step": step, "overlap_with_previous_top": with_top, "overlap_with_previous_second": with_second}
            )
    steps = [s for s, _, _ in found]
    return {"steps": steps, "lambda_1": values[:, 0], "lambda_2": values[:, 1], "crossings": crossings}


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
        reference = reference_track(loss, start, step_size, steps, measure_at)
        lam1 = reference["lambda_1"]
        row = {
            "step_size": step_size,
            "n_measurements": len(measure_at),
            "steps": steps,
            "crossings": reference["crossings"],
            "min_relative_gap": float(np.min((lam1 - reference["lambda_2"]) / lam1)),
            "variants": {},
        }
        crossing_at = [reference["steps"].index(c["step"]) for c in reference["crossings"]]
        for eigensolver in ("lanczos", "arpack"):
            for warm in (False, True):
                began = time.perf_counter()
                run = cv.closure_sharpness_during_training(
                    loss, start, training.sgd(step_size), steps, measure_at,
                    tol=EIG_RTOL, eigensolver=eigensolver, warm_start=warm,
                )  # fmt: skip
                seconds = time.perf_counter() - began
                err = np.abs(run.sharpness / lam1 - 1)
                row["variants"][f"{eigensolver}_{'warm' if warm else 'cold'}"] = {
                    "n_hvp_total": int(run.n_hvp.sum()),
                    "n_hvp_per_measurement": run.n_hvp.tolist(),
                    "n_hvp_after_the_first": int(run.n_hvp[1:].sum()),
                    "max_rel_error": float(err.max()),
                    "max_rel_error_at_crossings": float(err[crossing_at].max()) if crossing_at else None,
                    "above_tolerance": [
                        {"step": int(t), "rel_error": float(e), "n_hvp": int(n)}
                        for t, e, n in zip(run.measured_at, err, run.n_hvp)
                        if e > EIG_RTOL
                    ],
                    "seconds_with_training": seconds,
                }
        v = row["variants"]
        row["lanczos_warm_over_cold"] = v["lanczos_warm"]["n_hvp_total"] / v["lanczos_cold"]["n_hvp_total"]
        row["lanczos_warm_over_arpack_cold"] = v["lanczos_warm"]["n_hvp_total"] / v["arpack_cold"]["n_hvp_total"]
        row["warm_fewer_products_than_cold"] = bool(v["lanczos_warm"]["n_hvp_total"] < v["lanczos_cold"]["n_hvp_total"])
        row["warm_correct"] = bool(v["lanczos_warm"]["max_rel_error"] <= EIG_RTOL)
        row["sharpness_over_2_over_eta_late_median"] = float(
            np.median(lam1[np.array(reference["steps"]) >= late]) * step_size / 2
        )
        rows.append(row)
        print(
            f"eos eta {step_size:g}: products "
            + ", ".join(f"{name} {e['n_hvp_total']}" for name, e in row["variants"].items())
            + f"; lanczos warm/cold {row['lanczos_warm_over_cold']:.2f}; crossings at "
            + str([c["step"] for c in row["crossings"]])
            + f"; warm max error {v['lanczos_warm']['max_rel_error']:.1e}",
            flush=True,
        )
    return rows


# --- main ------------------------------------------------------------------------------------


def load_peers() -> tuple[dict, dict]:
    """The three peers (None where unavailable) and how each was obtained."""
    peers, status = {}, {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import curvlinops

        peers["curvlinops"], status["curvlinops"] = curvlinops, "from the environment"
    except ImportError as err:
        peers["curvlinops"], status["curvlinops"] = None, f"not importable ({err})"
    peers["pyhessian"], status["pyhessian"] = import_pyhessian()
    peers["hessian_eigenthings"], status["hessian_eigenthings"] = import_hessian_eigenthings()
    return peers, status


def lossgeom_defaults() -> dict:
    """What ``top_eigenpairs(op, k, tol=...)`` runs when nothing else is asked, read from the signatures."""
    top = inspect.signature(cv.top_eigenpairs).parameters
    solver = inspect.signature(lanczos_eigenpairs).parameters
    return {
        "method": top["method"].default,
        "stop": top["stop"].default,
        "reorthogonalise": solver["reorthogonalise"].default,
    }


def print_size(row: dict, started: float) -> None:
    for k in (1, 5):
        print(
            f"eigen {row['size']:g} {row['dtype']} top{k}: "
            + "; ".join(
                f"{m} {v['seconds']:.2f}s/{v['n_hvp']}/{v['rel_error']:.1e}"
                + (f"/x{v['time_over_fastest_peer']:.2f}" if "time_over_fastest_peer" in v else "")
                for m, v in row[f"top{k}"]["methods"].items()
            )
            + f"; {time.perf_counter() - started:.0f} s",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1e3 and 1e4 parameters, one repeat, a short run")
    parser.add_argument("--out", type=Path, default=None, help="where to write the JSON (default: see the docstring)")
    parser.add_argument(
        "--sizes", type=float, nargs="+", default=None, help="only these sizes of the plan (e.g. 1e5 1e6)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    load_at_start = list(os.getloadavg())
    peers, status = load_peers()
    plan = (
        [(1e3, "float64", 1), (1e4, "float64", 1)]
        if args.quick
        else [(1e4, "float64", 3), (1e5, "float64", 3), (1e6, "float32", 2)]
    )
    if args.sizes:
        plan = [entry for entry in plan if entry[0] in args.sizes]
        if not plan:
            parser.error(f"--sizes must name sizes of the plan, got {args.sizes}")
    started = time.perf_counter()
    he = peers["hessian_eigenthings"]
    result = {
        "what": "top-1 and top-5 Hessian eigenvalues to 1e-4: lossgeom's default Lanczos, its variants and three "
        "peers side by side; cold against warm-started sharpness tracking; one thread",
        "setting": {
            "mlp": "tanh MLP 64 -> w -> w -> 10, widths " + str({f"{k:g}": v for k, v in MLP_WIDTHS.items()}),
            "data": "one batch of 256 standard normal inputs and uniform random labels (seeded), mean cross-entropy",
            "eigen_rel_tol": EIG_RTOL,
            "reference": "float64 ARPACK (top_eigenpairs(method='arpack'), tol 1e-10, seed 1) at every size",
            "sizes": [{"size": s, "dtype": d, "repeats": r} for s, d, r in plan],
            "peers": list(PEERS),
            "lossgeom_defaults": lossgeom_defaults(),
            "lossgeom_n_hvp": "top_eigenpairs' products including its k residual products "
            "(n_hvp_solver without them); seconds include them",
            "hessian_eigenthings_oracle": f"its lanczos runs exactly max_iter steps; max_iter is the smallest of 2k, "
            f"2k+{HE_STEP}, ... (to {HE_MAX_STEPS}) whose result is within {EIG_RTOL:g} of the reference, with its "
            "default reorthogonalisation or full reorthogonalisation where that needs fewer steps; the search is "
            "not timed, only the final run",
            "pyhessian_tolerance": "its tol 1e-5, or 1e-6 where 1e-5 misses 1e-4 in the first repeat (then that tol; "
            "only the last attempt timed); "
            "at most 200 products per eigenvalue (100 at 1e6)",
            "ratio": "each method's time over the fastest peer's time in the same repeat, whatever that peer's "
            "accuracy; median over repeats (methods in rotating order); time_over_fastest_accurate_peer counts only "
            "the peers within the tolerance; within_goal: within the tolerance and at most the goal ratio",
            "quick": args.quick,
        },
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "scipy": scipy.__version__,
            "numpy": np.__version__,
            "curvlinops": importlib.metadata.version("curvlinops-for-pytorch") if peers["curvlinops"] else None,
            "pyhessian": PYHESSIAN.split("==")[1] if peers["pyhessian"] is not None else None,
            "hessian_eigenthings": he.__version__ if he is not None else None,
            "peer_status": status,
            "peers_target": os.environ.get("PEERS_TARGET"),
            "pyhessian_target": os.environ.get("PYHESSIAN_TARGET"),
            "hessian_eigenthings_requirement": HESSIAN_EIGENTHINGS,
            "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "machine": platform.machine(),
            "load_average_at_start": load_at_start,
        },
        "eigenvalues": [],
    }
    for size, dtype_name, repeats in plan:
        row = eigen_rows(size, dtype_name, repeats, peers)
        row["load_average_after"] = list(os.getloadavg())
        result["eigenvalues"].append(row)
        print_size(row, started)
    result["goal"] = goal(result["eigenvalues"])
    steps, late = (120, 80) if args.quick else (500, 335)
    result["edge_of_stability"] = {
        "setting": "chapter 5: 256 digits (seed 0), tanh MLP 64-32-10 (init_scale 0.5, seed 0), MSE on one-hot "
        f"targets, full-batch GD, {steps} steps, sharpness every 50 steps to {late} and every 5 after, tol 1e-4; "
        "reference: the two largest eigenpairs by ARPACK at tol 1e-10 at every measurement",
        "crossing_rule": "a crossing at a measurement whose top eigenvector has an overlap of at least 1/sqrt(2) with "
        "the previous measurement's second eigenvector, and a larger one than with its top eigenvector",
        "runs": edge_of_stability((1.0,) if args.quick else (0.5, 1.0, 2.0), steps, late),
    }
    result["load_average_at_end"] = list(os.getloadavg())
    result["total_seconds"] = time.perf_counter() - started
    default_out = Path(tempfile.gettempdir()) / "eigensolver_benchmark_quick.json" if args.quick else RESULTS / OUT_NAME
    out = args.out or default_out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"goal met: {result['goal']['met']}; wrote {out} after {result['total_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

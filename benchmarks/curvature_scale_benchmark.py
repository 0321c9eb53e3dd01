#!/usr/bin/env python3
"""Curvature at scale: lossgeom against PyHessian and curvlinops, side by side, one thread.

Usage, from the repository root (no make needed):

    .venv/bin/python benchmarks/curvature_scale_benchmark.py            # the full run
    .venv/bin/python benchmarks/curvature_scale_benchmark.py --quick    # 1e3 and 1e4 only, a smoke test

It writes ``benchmarks/results/curvature_scale_benchmark.json``, which the appendix page
``appendices/benchmarks.md`` renders (the page never runs this script). The full run takes
about 15 minutes on an idle two-core machine.

Models: tanh MLPs ``64 -> w -> w -> 10`` and a small tanh CNN (two 3x3 convolutions with
``c`` channels on 3x8x8 inputs, 2x2 average pooling, a linear head), at initialisation,
with the mean cross-entropy on one batch of 256 seeded random inputs and labels (for the
traces, 256 of sklearn's bundled digits, whose curvature has a decaying spectrum); widths
chosen for about 1e3, 1e4, 1e5 and 1e6 parameters (the CNN up to 1e5: at 1e6 one of its
gradients alone takes seconds on one thread); float32 and float64. What is measured:

1. cost of one Hessian-vector product (HVP) relative to one gradient
   (``loss.backward()``), timed interleaved (an untimed gradient, a timed gradient, one
   product; methods in rotating order; repeated) so that the load of a shared machine
   hits numerator and denominator alike; the median of the per-repeat ratios is the
   primary number. Methods: lossgeom's default
   (reverse-over-reverse, graph kept), lossgeom's forward-over-reverse, PyHessian's
   product (graph kept between products) and curvlinops' ``HessianLinearOperator``.
   Also the peak resident memory added by each method's set-up and three products, and
   the per-column cost of a block product (``matmat`` of 8 columns);
2. the largest and the five largest eigenvalues to 1e-4 relative accuracy (against a
   tight float64 Lanczos reference): lossgeom's ``top_eigenpairs`` and curvlinops'
   operator through the same ``eigsh`` call (same start vector and tolerance), and
   PyHessian's power iteration (its ``tol`` 1e-5, or 1e-6 where 1e-5 misses 1e-4; at most
   200 products per eigenvalue, 100 at 1e6); the CNN at 1e4 parameters, the MLPs at 1e4,
   1e5 and (float32) 1e6;
3. traces: products to a 1% standard error by Hutchinson (sequential stop) and by
   Hutch++ (smallest budget of a doubling sequence) for the GGN (positive semi-definite,
   its spectrum decays) and the Hessian of the MLPs at 1e3 and 1e4 parameters, at most
   1600 products, with the effective rank ``tr(A)^2 / ||A||_F^2``; the calibration of both
   standard errors (z-scores against the exact trace of the 1e3-parameter MLP's Hessian
   over 100 seeds); and Hutch++ with 99 products at 1e6 parameters (time and peak memory).

PyHessian (``pyhessian==0.1``) is not a dependency of the book: benchmarks/pyhessian_import.py
imports it or installs it into a throwaway directory. Timings on a loaded
machine are noisy; ratios measured interleaved are the numbers to compare.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import gc  # noqa: E402
import importlib  # noqa: E402
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import scipy  # noqa: E402
import torch  # noqa: E402
from pyhessian_import import import_pyhessian  # noqa: E402
from scipy.sparse.linalg import eigsh  # noqa: E402
from torch import nn  # noqa: E402

from lossgeom import curvature as cv  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "curvature_scale_benchmark.json"
BATCH, N_CLASSES, SEED = 256, 10, 0
MLP_WIDTHS = {1e3: 12, 1e4: 70, 1e5: 280, 1e6: 963}  # 64 -> w -> w -> 10
CNN_CHANNELS = {1e3: 5, 1e4: 25, 1e5: 95}  # 3x8x8 -> c -> c -> pool -> 10
EIG_RTOL = 1e-4
DTYPES = {"float32": torch.float32, "float64": torch.float64}


# --- models and data ------------------------------------------------------------------


def tanh_mlp(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, N_CLASSES)
    )


def tanh_cnn(channels: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, channels, 3, padding=1),
        nn.Tanh(),
        nn.Conv2d(channels, channels, 3, padding=1),
        nn.Tanh(),
        nn.AvgPool2d(2),
        nn.Flatten(),
        nn.Linear(channels * 16, N_CLASSES),
    )


def problem(kind: str, size: float, dtype: torch.dtype):
    """A seeded model at initialisation and one batch of seeded random data, in ``dtype``.

    Built in float64 and then converted, so both dtypes hold the same model and data.
    """
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with torch.random.fork_rng():
            torch.manual_seed(SEED)
            model = (tanh_mlp(MLP_WIDTHS[size]) if kind == "mlp" else tanh_cnn(CNN_CHANNELS[size])).to(dtype)
    finally:
        torch.set_default_dtype(previous)
    generator = torch.Generator().manual_seed(SEED)
    shape = (BATCH, 64) if kind == "mlp" else (BATCH, 3, 8, 8)
    x = torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype)
    y = torch.randint(0, N_CLASSES, (BATCH,), generator=generator)
    return model, x, y


def digits_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """256 of sklearn's bundled 8x8 digits (64 inputs, 10 classes; lossgeom_book.data, no download)."""
    from lossgeom_book.data import digits

    split = digits(BATCH, 100, seed=SEED)
    return split.x_train.to(torch.float64), split.y_train


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# --- tools ------------------------------------------------------------------------------


def status_mb(field: str) -> float:
    """A memory field of /proc/self/status (``VmRSS``: resident now, ``VmHWM``: peak) in MB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # resets the peak resident set size (VmHWM) to the current one
        return True
    except OSError:
        return False


def added_peak_memory(build_and_use) -> float | None:
    """Peak resident memory (MB) added while ``build_and_use()`` runs (None where unmeasurable).

    Meant for a fresh process started by :func:`memory_in_subprocess`: there, with a fixed
    glibc mmap threshold, every block above 64 kB goes back to the system when freed, so
    the peak counts what the method allocates, not what the heap kept from before.
    """
    gc.collect()
    base = status_mb("VmRSS")
    if not reset_peak():
        return None
    keep = build_and_use()
    added = status_mb("VmHWM") - base
    del keep
    return float(added)


def memory_in_subprocess(kind: str, size: float, dtype_name: str, method: str) -> float | None:
    """Run ``--memory-probe`` in a fresh interpreter and return its peak memory (MB)."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--memory-probe", kind, f"{size:g}", dtype_name, method]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        print(f"memory probe {kind} {size:g} {dtype_name} {method} failed: {done.stderr[-300:]}")
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_added_mb"]


def memory_probe(kind: str, size: float, dtype_name: str, method: str) -> None:
    """The body of ``--memory-probe``: build the problem, then measure one method."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    dtype = DTYPES[dtype_name]
    torch.set_default_dtype(dtype)
    model, x, y = problem(kind, size, dtype)
    pyhessian_module = curvlinops = None
    if method == "pyhessian":
        pyhessian_module, _ = import_pyhessian()
    if method == "curvlinops":
        import curvlinops
    methods = Methods(model, x, y, pyhessian_module, curvlinops)
    methods.gradient()

    def use():
        if method == "lossgeom":
            op = methods.lossgeom()
            for _ in range(3):
                op @ methods.v
            return op
        if method == "pyhessian":
            comp = methods.pyhessian()
            for _ in range(3):
                methods.pyhessian_product(comp)
            return comp
        if method == "curvlinops":
            op = methods.curvlinops_operator()
            for _ in range(3):
                op @ methods.v
            return op
        if method == "hutchpp99":
            op = methods.lossgeom()
            return op, cv.hutchpp_trace(op, n_probes=99, seed=0)
        raise ValueError(method)

    print(json.dumps({"peak_added_mb": added_peak_memory(use)}))


def median(values) -> float:
    return float(np.median(np.asarray(values, dtype=float)))


def growth_exponent(sizes, times) -> float | None:
    """The slope of log(time) against log(size), by least squares."""
    pairs = [(s, t) for s, t in zip(sizes, times) if t is not None and t > 0]
    if len(pairs) < 2:
        return None
    s, t = np.log([p[0] for p in pairs]), np.log([p[1] for p in pairs])
    return float(np.polyfit(s, t, 1)[0])


# --- 1. per-product cost -----------------------------------------------------------------


class Methods:
    """The four HVPs and the reference gradient on one problem."""

    def __init__(self, model, x, y, pyhessian_module, curvlinops) -> None:
        self.model, self.x, self.y = model, x, y
        self.criterion = nn.CrossEntropyLoss()
        self.params = list(model.parameters())
        self.n = n_params(model)
        self.pyhessian_module, self.curvlinops = pyhessian_module, curvlinops
        generator = torch.Generator().manual_seed(1)
        self.v = torch.randn(self.n, generator=generator, dtype=torch.float64).to(self.params[0].dtype)
        self.v_list = [
            t.reshape(p.shape) for t, p in zip(torch.split(self.v, [p.numel() for p in self.params]), self.params)
        ]
        self.block = torch.randn(self.n, 8, generator=generator, dtype=torch.float64).to(self.params[0].dtype)

    def gradient(self):
        self.model.zero_grad(set_to_none=True)
        self.criterion(self.model(self.x), self.y).backward()
        self.model.zero_grad(set_to_none=True)

    def lossgeom(self, method="auto"):
        return cv.hessian_operator(self.model, self.criterion, (self.x, self.y), method=method)

    def pyhessian(self):
        torch.set_default_dtype(self.params[0].dtype)  # PyHessian draws its vectors in the default dtype
        comp = self.pyhessian_module.hessian(self.model, self.criterion, data=(self.x, self.y), cuda=False)
        return comp

    def pyhessian_product(self, comp):
        from pyhessian.utils import hessian_vector_product

        return hessian_vector_product(comp.gradsH, comp.params, self.v_list)

    def release_pyhessian(self):
        for p in self.params:
            p.grad = None  # PyHessian leaves the gradient's graph in .grad

    def curvlinops_operator(self):
        return self.curvlinops.HessianLinearOperator(
            self.model, self.criterion, self.params, [(self.x, self.y)], check_deterministic=False
        )


def time_once(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def cost_of_products(methods: Methods, repeats: int, with_memory: bool, label: dict) -> dict:
    """Interleaved timings of one gradient and one product of each method; memory; block products."""
    row: dict = {"n_params": methods.n, **label}
    setups = {}
    start = time.perf_counter()
    ours = methods.lossgeom()
    setups["lossgeom"] = time.perf_counter() - start
    start = time.perf_counter()
    ours_forward = methods.lossgeom("forward-over-reverse")
    setups["lossgeom_forward_over_reverse"] = time.perf_counter() - start
    products = {"lossgeom": lambda: ours @ methods.v, "lossgeom_forward_over_reverse": lambda: ours_forward @ methods.v}
    if methods.curvlinops is not None:
        start = time.perf_counter()
        theirs = methods.curvlinops_operator()
        setups["curvlinops"] = time.perf_counter() - start
        products["curvlinops"] = lambda: theirs @ methods.v
    comp = None
    if methods.pyhessian_module is not None:
        start = time.perf_counter()
        comp = methods.pyhessian()
        setups["pyhessian"] = time.perf_counter() - start
        products["pyhessian"] = lambda: methods.pyhessian_product(comp)
    for fn in products.values():  # warm-up
        fn()
    methods.gradient()
    ratios = {name: [] for name in products}
    times = {name: [] for name in products}
    grads = []
    names = list(products)
    for repeat in range(repeats):
        # the order rotates, and an untimed gradient runs first: what ran just before (a
        # torch.func transform, say) changes the cache state the next gradient finds
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            methods.gradient()
            t_grad = time_once(methods.gradient)
            t_product = time_once(products[name])
            grads.append(t_grad)
            times[name].append(t_product)
            ratios[name].append(t_product / t_grad)
    row["gradient_seconds"] = median(grads)
    row["methods"] = {
        name: {"seconds": median(times[name]), "ratio_to_gradient": median(ratios[name]), "setup_seconds": setups[name]}
        for name in products
    }
    # block product: 8 columns in one matmat, per column: the default (a backward pass per
    # column through the kept graph) and one backward pass vmapped over the 8 columns
    t_block, t_vmapped = [], []
    for _ in range(max(1, repeats // 2)):
        ours.batched_columns = False
        t_block.append(time_once(lambda: ours @ methods.block) / 8)
        ours.batched_columns = True
        t_vmapped.append(time_once(lambda: ours @ methods.block) / 8)
    ours.batched_columns = False
    row["lossgeom_block8_seconds_per_column"] = median(t_block)
    row["lossgeom_block8_vmapped_seconds_per_column"] = median(t_vmapped)
    if comp is not None:
        del comp
        methods.release_pyhessian()
    # release both operators; the lambdas above read these names when called, so rebind them rather than del
    ours = ours_forward = None
    if methods.curvlinops is not None:
        del theirs
    gc.collect()
    if with_memory:
        row["peak_memory_mb"] = {
            name: memory_in_subprocess(row["model"], row["size"], row["dtype"], name)
            for name in ("lossgeom", "pyhessian", "curvlinops")
            if name == "lossgeom" or name in products
        }
    return row


# --- 2. eigenvalues -------------------------------------------------------------------------


class CountingOperator(scipy.sparse.linalg.LinearOperator):
    """A scipy operator (symmetric) that forwards to ``inner.matvec`` and counts the products."""

    def __init__(self, inner) -> None:
        super().__init__(dtype=inner.dtype, shape=inner.shape)
        self.inner_matvec = inner.matvec
        self.n_matvec = 0

    def _matvec(self, v):
        self.n_matvec += 1
        return self.inner_matvec(v)

    def _adjoint(self):
        return self


def eigen_comparison(methods: Methods, reference: np.ndarray, pyhessian_max_iter: int) -> dict:
    """Top-1 and top-5 eigenvalues to EIG_RTOL: lossgeom, curvlinops (same eigsh call), PyHessian."""
    row = {}
    v0 = np.random.default_rng(0).standard_normal(methods.n)
    tol = EIG_RTOL
    for k in (1, 5):
        entry = {}
        op = methods.lossgeom()
        start = time.perf_counter()
        result = cv.top_eigenpairs(op, k=k, tol=tol, seed=0)
        elapsed = time.perf_counter() - start
        err = float(np.max(np.abs(result.values - reference[:k]) / np.abs(reference[:k])))
        entry["lossgeom"] = {"seconds": elapsed, "n_hvp": int(result.n_hvp) + k, "rel_error": err}
        del op
        if methods.curvlinops is not None:
            theirs = methods.curvlinops_operator()
            view = theirs.to_scipy()
            counting_view = CountingOperator(view)
            start = time.perf_counter()
            values = eigsh(counting_view, k=k, which="LA", tol=tol, v0=v0.astype(view.dtype))[0]
            elapsed = time.perf_counter() - start
            values = np.sort(values)[::-1]
            err = float(np.max(np.abs(values - reference[:k]) / np.abs(reference[:k])))
            entry["curvlinops"] = {"seconds": elapsed, "n_hvp": counting_view.n_matvec, "rel_error": err}
            del theirs, view, counting_view
        if methods.pyhessian_module is not None:
            calls = {"n": 0}
            module = methods.pyhessian_module
            original = module.hessian_vector_product

            def counting(*args, calls=calls, original=original, **kwargs):
                calls["n"] += 1
                return original(*args, **kwargs)

            module.hessian_vector_product = counting
            try:
                for ph_tol in (1e-5, 1e-6):  # the looser first; the tighter only if 1e-4 was missed
                    torch.manual_seed(0)
                    comp = methods.pyhessian()
                    calls["n"] = 0
                    start = time.perf_counter()
                    found = comp.eigenvalues(maxIter=pyhessian_max_iter, tol=ph_tol, top_n=k)[0]
                    elapsed = time.perf_counter() - start
                    values = np.sort(np.asarray(found))[::-1]
                    err = float(np.max(np.abs(values - reference[:k]) / np.abs(reference[:k])))
                    del comp
                    methods.release_pyhessian()
                    if err <= EIG_RTOL:
                        break
            finally:
                module.hessian_vector_product = original
            entry["pyhessian"] = {
                "seconds": elapsed,
                "n_hvp": calls["n"],
                "rel_error": err,
                "tol": ph_tol,
                "max_iter": pyhessian_max_iter,
            }
        gc.collect()
        row[f"top{k}"] = entry
    return row


# --- 3. traces -------------------------------------------------------------------------------


def products_to_one_percent(op, max_products: int) -> dict:
    """Hutchinson (sequential stop) and Hutch++ (budgets growing by 25%) to a 1% standard error.

    Also the effective rank ``tr(A)^2 / ||A||_F^2`` from 30 probes (``E ||A z||^2 = ||A||_F^2``):
    small where a few eigenvalues carry the trace, which is where Hutch++ pays off.
    """
    probes = rank_probes(op.shape[0], 30)
    products = op @ probes
    effective_rank = float((probes * products).sum(0).mean()) ** 2 / float((products**2).sum(0).mean())
    start = time.perf_counter()
    hutch = cv.hutchinson_trace(op, n_probes=10, seed=0, target_rel_se=0.01, max_probes=max_products, batch=10)
    t_hutch = time.perf_counter() - start
    out = {
        "effective_rank": effective_rank,
        "hutchinson": {
            "n_hvp": hutch.n_hvp,
            "estimate": hutch.estimate,
            "std_error": hutch.std_error,
            "reached": bool(hutch.std_error <= 0.01 * abs(hutch.estimate)),
            "seconds": t_hutch,
        },
    }
    budget, spent = 12, 0
    while True:
        start = time.perf_counter()
        hpp = cv.hutchpp_trace(op, n_probes=budget, seed=0)
        seconds = time.perf_counter() - start
        spent += hpp.n_hvp
        following = 3 * round(budget * 1.25 / 3)
        if hpp.std_error <= 0.01 * abs(hpp.estimate) or following > max_products:
            break
        budget = following
    out["hutchpp"] = {
        "n_hvp": hpp.n_hvp,
        "estimate": hpp.estimate,
        "std_error": hpp.std_error,
        "reached": bool(hpp.std_error <= 0.01 * abs(hpp.estimate)),
        "seconds": seconds,
        "products_over_the_budget_search": spent,
    }
    return out


def rank_probes(n: int, m: int) -> torch.Tensor:
    """``m`` seeded Rademacher probes (float64) for the effective-rank estimate."""
    generator = torch.Generator().manual_seed(12345)
    return torch.randint(0, 2, (n, m), generator=generator).to(torch.float64) * 2 - 1


def calibration(op, exact: float, seeds: int, budgets) -> list[dict]:
    """z-scores (estimate - exact) / std_error over seeds, for both estimators."""
    rows = []
    for budget in budgets:
        for name, run in (
            ("hutchinson", lambda s, budget=budget: cv.hutchinson_trace(op, n_probes=budget, seed=s)),
            ("hutchpp", lambda s, budget=budget: cv.hutchpp_trace(op, n_probes=budget, seed=s)),
        ):
            z = []
            for seed in range(seeds):
                est = run(seed)
                z.append((est.estimate - exact) / est.std_error)
            z = np.asarray(z)
            rows.append(
                {
                    "estimator": name,
                    "n_hvp": budget,
                    "seeds": seeds,
                    "z_mean": float(z.mean()),
                    "z_sd": float(z.std(ddof=1)),
                    "share_abs_z_above_2": float(np.mean(np.abs(z) > 2)),
                }
            )
    return rows


# --- main ----------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="sizes 1e3 and 1e4 only (a smoke test)")
    parser.add_argument(
        "--memory-probe", nargs=4, metavar=("KIND", "SIZE", "DTYPE", "METHOD"), help=argparse.SUPPRESS
    )  # used by the script itself, in a fresh process
    args = parser.parse_args()
    if args.memory_probe:
        kind, size, dtype_name, method = args.memory_probe
        memory_probe(kind, float(size), dtype_name, method)
        return 0
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import curvlinops
    except ImportError:
        curvlinops = None
    pyhessian_module, pyhessian_status = import_pyhessian()
    sizes = [1e3, 1e4] if args.quick else [1e3, 1e4, 1e5, 1e6]
    started = time.perf_counter()
    result = {
        "what": "cost per Hessian-vector product, eigenvalues and traces at scale, one thread",
        "setting": {
            "batch": BATCH,
            "classes": N_CLASSES,
            "loss": "mean cross-entropy",
            "seed": SEED,
            "mlp": "tanh MLP 64 -> w -> w -> 10, widths " + str({f"{k:g}": v for k, v in MLP_WIDTHS.items()}),
            "cnn": "tanh CNN 3x8x8 -> conv3x3(c) -> conv3x3(c) -> avgpool2 -> linear, channels "
            + str({f"{k:g}": v for k, v in CNN_CHANNELS.items()}),
            "data": "one batch of standard normal inputs and uniform random labels (seeded)",
            "trace_data": "256 of sklearn's bundled 8x8 digits (lossgeom_book.data.digits, seed 0)",
            "eigen_rel_tol": EIG_RTOL,
            "quick": args.quick,
        },
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "scipy": scipy.__version__,
            "numpy": np.__version__,
            "curvlinops": (importlib.metadata.version("curvlinops-for-pytorch") if curvlinops else None),
            "pyhessian": "0.1" if pyhessian_module is not None else None,
            "pyhessian_status": pyhessian_status,
            "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "machine": platform.machine(),
            "load_average_at_start": list(os.getloadavg()),
        },
        "products": [],
        "eigenvalues": [],
        "traces": {},
    }

    # 1. per-product cost
    for kind in ("mlp", "cnn"):
        for size in sizes:
            if kind == "cnn" and size not in CNN_CHANNELS:
                continue
            for dtype_name, dtype in DTYPES.items():
                torch.set_default_dtype(dtype)
                model, x, y = problem(kind, size, dtype)
                methods = Methods(model, x, y, pyhessian_module, curvlinops)
                repeats = 21 if size <= 1e4 else (8 if size <= 1e5 and kind == "mlp" else 4)
                label = {"model": kind, "size": size, "dtype": dtype_name, "repeats": repeats}
                row = cost_of_products(methods, repeats, with_memory=size >= 1e5, label=label)
                result["products"].append(row)
                print(
                    f"products {kind} {size:g} {dtype_name}: n={row['n_params']}, "
                    + ", ".join(f"{k} {v['ratio_to_gradient']:.2f}" for k, v in row["methods"].items())
                    + f"; memory {row.get('peak_memory_mb')}; {time.perf_counter() - started:.0f} s",
                    flush=True,
                )
                del methods, model
                gc.collect()
    torch.set_default_dtype(torch.float64)
    exponents = {}
    for kind in ("mlp", "cnn"):
        for dtype_name in DTYPES:
            rows = [r for r in result["products"] if r["model"] == kind and r["dtype"] == dtype_name]
            if not rows:
                continue
            sizes_here = [r["n_params"] for r in rows]
            entry = {"gradient": growth_exponent(sizes_here, [r["gradient_seconds"] for r in rows])}
            for name in rows[0]["methods"]:
                entry[name] = growth_exponent(sizes_here, [r["methods"][name]["seconds"] for r in rows])
            exponents[f"{kind} {dtype_name}"] = entry
    result["growth_exponents"] = exponents

    # 2. eigenvalues at 1e4 and above (the CNN at 1e4 only: its products cost 10-40 gradients' time
    # in float64 at 1e5, and PyHessian's deflated power iteration needs hundreds of them)
    for kind in ("mlp", "cnn"):
        for size in sizes:
            if size < 1e4 or (kind == "cnn" and (size != 1e4 or args.quick)):
                continue
            torch.set_default_dtype(torch.float64)
            model, x, y = problem(kind, size, torch.float64)
            reference_op = cv.hessian_operator(model, nn.CrossEntropyLoss(), (x, y))
            start = time.perf_counter()
            reference = cv.top_eigenpairs(reference_op, k=5, tol=1e-9, seed=1)
            ref_seconds = time.perf_counter() - start
            del reference_op
            for dtype_name, dtype in DTYPES.items():
                if size >= 1e6 and dtype_name == "float64" and not args.quick:
                    continue  # the float32 row covers 1e6: a float64 PyHessian top-5 alone takes minutes
                torch.set_default_dtype(dtype)
                model_d, x_d, y_d = problem(kind, size, dtype)
                methods = Methods(model_d, x_d, y_d, pyhessian_module, curvlinops)
                row = eigen_comparison(methods, reference.values, pyhessian_max_iter=100 if size >= 1e6 else 200)
                row.update(
                    {
                        "model": kind,
                        "size": size,
                        "dtype": dtype_name,
                        "n_params": methods.n,
                        "reference_values": reference.values.tolist(),
                        "reference_seconds": ref_seconds,
                        "reference_n_hvp": int(reference.n_hvp),
                    }
                )
                result["eigenvalues"].append(row)
                print(
                    f"eigen {kind} {size:g} {dtype_name}: "
                    + "; ".join(
                        f"{k}: "
                        + ", ".join(
                            f"{m} {v['seconds']:.2f}s/{v['n_hvp']}/{v['rel_error']:.1e}" for m, v in row[k].items()
                        )
                        for k in ("top1", "top5")
                    )
                    + f"; {time.perf_counter() - started:.0f} s",
                    flush=True,
                )
                del methods, model_d
                gc.collect()
    torch.set_default_dtype(torch.float64)

    # 3. traces
    traces = {"to_one_percent": [], "calibration": None, "hutchpp_at_scale": []}
    digits_x, digits_y = digits_batch()
    for matrix, trace_sizes in (("ggn", (1e3, 1e4, 1e5)), ("hessian", (1e3, 1e4))):
        for size in trace_sizes:
            if args.quick and size > 1e4:
                continue
            model = problem("mlp", size, torch.float64)[0]
            op = cv.curvature_operator(model, nn.CrossEntropyLoss(), (digits_x, digits_y), matrix=matrix)
            row = products_to_one_percent(op, max_products=1600)
            row.update(
                {
                    "model": "mlp",
                    "size": size,
                    "dtype": "float64",
                    "n_params": op.shape[0],
                    "matrix": matrix,
                    "data": "digits",
                }
            )
            traces["to_one_percent"].append(row)
            print(
                f"trace {matrix} mlp {size:g}: effective rank {row['effective_rank']:.3g}, hutchinson "
                f"{row['hutchinson']['n_hvp']} (reached {row['hutchinson']['reached']}), hutch++ "
                f"{row['hutchpp']['n_hvp']} (reached {row['hutchpp']['reached']}); "
                f"{time.perf_counter() - started:.0f} s",
                flush=True,
            )
    model, x, y = problem("mlp", 1e3, torch.float64)
    dense = cv.dense_hessian(model, nn.CrossEntropyLoss(), (x, y)).numpy()
    exact = float(np.trace(dense))
    traces["calibration"] = {
        "model": "mlp",
        "size": 1e3,
        "n_params": dense.shape[0],
        "exact_trace": exact,
        "rows": calibration(dense, exact, seeds=100, budgets=(12, 30, 99)),
    }
    print(
        f"calibration: {[(r['estimator'], r['n_hvp'], round(r['z_sd'], 2)) for r in traces['calibration']['rows']]}",
        flush=True,
    )
    for dtype_name, dtype in DTYPES.items():
        size = 1e6 if not args.quick else 1e4
        torch.set_default_dtype(dtype)
        model, x, y = problem("mlp", size, dtype)
        op = cv.hessian_operator(model, nn.CrossEntropyLoss(), (x, y))
        start = time.perf_counter()
        est = cv.hutchpp_trace(op, n_probes=99, seed=0)
        seconds = time.perf_counter() - start
        del op  # released before the memory probe runs, in a fresh process
        memory = memory_in_subprocess("mlp", size, dtype_name, "hutchpp99")
        traces["hutchpp_at_scale"].append(
            {
                "model": "mlp",
                "size": size,
                "dtype": dtype_name,
                "n_params": n_params(model),
                "n_hvp": est.n_hvp,
                "estimate": est.estimate,
                "std_error": est.std_error,
                "seconds": seconds,
                "peak_memory_mb": memory,
            }
        )
        print(f"hutch++ at {size:g} {dtype_name}: {seconds:.1f} s, peak +{memory} MB", flush=True)
        del model, est
        gc.collect()
    torch.set_default_dtype(torch.float64)
    result["traces"] = traces
    result["total_seconds"] = time.perf_counter() - started
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)} after {result['total_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

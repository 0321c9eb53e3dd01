#!/usr/bin/env python3
"""Curvature at the size people train: a ResNet-18 and a GPT-2-shaped decoder, four tools side by side.

Usage, from the repository root:

    .venv/bin/python benchmarks/scale_benchmark.py            # the full run
    .venv/bin/python benchmarks/scale_benchmark.py --quick    # the same code at batch 2, one repeat (a smoke test)

The full run takes about half an hour on an idle machine (estimated from single products:
a ResNet gradient about 1 s, a product 1.7 to 5 gradients; per model about 1.5 minutes of
timings, 1.5 of memory probes, up to 6 of eigenvalue solvers, 4 of traces and 2-3 of
``torch.compile``); ``--max-eig-products 24 --trace-budget 12 --repeats 2`` brings it to
about 20 minutes. ``--quick`` takes about 7 minutes on two busy cores, two of them compiling.

It writes ``benchmarks/results/scale_benchmark.json`` (``--quick`` writes
``scale_benchmark_quick.json`` in the temporary directory unless ``--out`` names a path),
which the appendix page ``appendices/scale.md`` renders; the page never runs this script.

Models (``benchmarks/scale_models.py``, float32, CPU, one thread): a ResNet-18 in
torchvision's layout with the CIFAR stem (11,173,962 parameters, batch norm in eval mode)
on a batch of 32 seeded random 32x32 images, mean cross-entropy; a GPT-2-shaped
HuggingFace decoder (13.8M parameters, eager attention) on 8 seeded random sequences of 128
tokens, the next-token cross-entropy. For each model, side by side in one run:

1. the time of one gradient (the model's own ``loss.backward()``) and of one Hessian-vector
   (and, where a tool has one, GGN-vector) product of each tool, as a ratio to the gradient
   timed just before it: repeats in rotating order, medians; set-up times apart. Each
   tool's product is compared with ``lossgeom``'s on the same vector (relative difference);
2. the peak resident memory (the kernel's high-water mark, reset after the model and data
   are built) added by each tool's set-up and two products, over that of the model's own
   gradient step, each in a fresh interpreter so that peaks do not mix;
3. ``lambda_max`` to relative 1e-3: ``lossgeom.curvature.top_eigenpairs(H, k=1, tol=1e-3)``
   (its default method), PyHessian's power iteration (``tol`` 1e-3, its relative change of
   the estimate), hessian-eigenthings' Lanczos (a fixed number of steps: 10, then 20, then
   40 until it reports its residual within ``tol``) and curvlinops' operator through
   ``scipy.sparse.linalg.eigsh`` (``tol`` 1e-3); at most ``--max-eig-products`` products
   each. Every pair's residual is then measured with one more product, and each value is
   compared with that of the pair with the smallest relative residual;
4. a trace with ``--trace-budget`` products: Hutch++ of ``lossgeom``, hessian-eigenthings
   and curvlinops (which returns no standard error; it gets its blocks ``--curvlinops-columns``
   columns at a time, since one call vmaps over all of them and ten columns of the ResNet at
   batch 32 would need about 15 GB), PyHessian's Hutchinson (it has no Hutch++);
5. ``torch.compile`` of a ``torch.func`` Hessian-vector product (forward-over-reverse,
   then reverse-over-reverse if that fails), in a fresh interpreter with a cold inductor
   cache and a time limit: compile time, and the compiled product's time over a gradient,
   or the exception's first line.

Where a tool cannot run a case, the JSON records the exception's type and first line.
Peers: curvlinops from the environment; PyHessian 0.1 and hessian-eigenthings 1.0.0a5 are
imported, or installed with ``pip install --no-deps --target`` into a throwaway directory
or the directory named by ``PEERS_TARGET`` (``benchmarks/pyhessian_import.py``). The
``run_model`` function also runs on a CUDA device (``benchmarks/gpu_check.py`` calls it),
with CUDA's allocator statistics in place of the resident set size.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import gc  # noqa: E402
import importlib.metadata  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import scale_models  # noqa: E402
import scipy  # noqa: E402
import torch  # noqa: E402
from curvature_scale_benchmark import added_peak_memory  # noqa: E402
from pyhessian_import import import_hessian_eigenthings, import_pyhessian  # noqa: E402
from scipy.sparse.linalg import LinearOperator, eigsh  # noqa: E402
from torch import nn  # noqa: E402

from lossgeom import curvature as cv  # noqa: E402
from lossgeom.losses import CausalLMLoss  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "scale_benchmark.json"
MODELS = ("resnet18", "gpt2_decoder")
HE_STEPS = (10, 20, 40)  # hessian-eigenthings' Lanczos: steps tried in turn until it reports convergence
COMPILE_VARIANTS = ("forward-over-reverse", "reverse-over-reverse")


@dataclasses.dataclass
class Settings:
    """What one run measures, and at what size."""

    resnet_batch: int = 32
    decoder_batch: int = 8
    decoder_length: int = 128
    repeats: int = 3
    eig_tol: float = 1e-3
    max_eig_products: int = 40
    trace_budget: int = 30
    compile_timeout: float = 180.0
    curvlinops_columns: int = 2
    memory: bool = True
    quick: bool = False


def quick_settings() -> Settings:
    """The same measurements at batch 2 (sequences of 16 tokens), one repeat, no memory probes."""
    return Settings(
        resnet_batch=2,
        decoder_batch=2,
        decoder_length=16,
        repeats=1,
        max_eig_products=20,
        trace_budget=12,
        compile_timeout=60.0,
        memory=False,
        quick=True,
    )


# --- peers ---------------------------------------------------------------------------------------


def first_line(err: BaseException) -> str:
    """``Type: first line of the message`` (at most 200 characters)."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {(text[0] if text else '')[:200]}"


@dataclasses.dataclass
class Peers:
    """The peer libraries (None where unavailable) and how each was obtained."""

    curvlinops: object = None
    pyhessian: object = None
    hessian_eigenthings: object = None
    status: dict = dataclasses.field(default_factory=dict)


def load_peers() -> Peers:
    """Import curvlinops, PyHessian and hessian-eigenthings (see benchmarks/pyhessian_import.py)."""
    peers = Peers()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import curvlinops

        peers.curvlinops, peers.status["curvlinops"] = curvlinops, "from the environment"
    except ImportError as err:
        peers.status["curvlinops"] = first_line(err)
    peers.pyhessian, peers.status["pyhessian"] = import_pyhessian()
    peers.hessian_eigenthings, peers.status["hessian_eigenthings"] = import_hessian_eigenthings()
    return peers


def versions(peers: Peers) -> dict:
    """Versions of the tools and the libraries under them."""

    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    he = peers.hessian_eigenthings
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "lossgeom": version("lossgeom"),
        "curvlinops": version("curvlinops-for-pytorch") if peers.curvlinops else None,
        "pyhessian": "0.1" if peers.pyhessian is not None else None,
        "hessian_eigenthings": getattr(he, "__version__", None) if he is not None else None,
        "peer_status": peers.status,
    }


# --- the two problems --------------------------------------------------------------------------


class LogitsOf(nn.Module):
    """A HuggingFace causal LM as ``input_ids -> logits (N (T - 1), V)``, the shifted positions flattened.

    curvlinops and PyHessian take ``model(X)`` and ``loss(output, y)`` with one output row per
    target: this wrapper, with ``nn.CrossEntropyLoss()`` on the flattened shifted labels, is
    the model's own next-token loss.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        logits = self.model(input_ids=input_ids).logits[:, :-1]
        return logits.reshape(-1, logits.shape[-1])


class Problem:
    """One model, one batch, and how each tool is handed them."""

    def __init__(self, name: str, settings: Settings, device: torch.device) -> None:
        self.name, self.device = name, device
        criterion = nn.CrossEntropyLoss()
        if name == "resnet18":
            self.model = scale_models.resnet18().to(device)
            x, y = scale_models.resnet_batch(settings.resnet_batch)
            x, y = x.to(device), y.to(device)
            self.batch_text = f"{settings.resnet_batch} seeded random 3x32x32 images, labels in 0..9"
            self.loss_text = "mean cross-entropy (nn.CrossEntropyLoss)"
            self.lossgeom_loss, self.lossgeom_data = criterion, (x, y)
            self.peer_model, self.peer_data = self.model, (x, y)
            self._own_loss = lambda: criterion(self.model(x), y)
            self.functional_inputs = ((x,), {})
            self.functional_loss = lambda out: criterion(out, y)
        elif name == "gpt2_decoder":
            self.model = scale_models.gpt2_decoder().to(device)
            batch = scale_models.decoder_batch(settings.decoder_batch, settings.decoder_length)
            batch = {key: value.to(device) for key, value in batch.items()}
            self.batch_text = (
                f"{settings.decoder_batch} seeded random sequences of {settings.decoder_length} tokens "
                "(input_ids; labels = input_ids)"
            )
            self.loss_text = "next-token cross-entropy (the model's own loss; lossgeom.losses.CausalLMLoss)"
            self.lossgeom_loss, self.lossgeom_data = CausalLMLoss(), batch
            self.peer_model = LogitsOf(self.model)
            self.peer_data = (batch["input_ids"], batch["labels"][:, 1:].reshape(-1))
            self._own_loss = lambda: self.model(**batch).loss
            self.hf_batch = batch
            self.functional_inputs = ((), {"input_ids": batch["input_ids"]})
            causal = CausalLMLoss()
            self.functional_loss = lambda out: causal(out.logits, batch["labels"])
        else:
            raise ValueError(f"model must be one of {MODELS}, got {name!r}")
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.n = sum(p.numel() for p in self.params)
        generator = torch.Generator().manual_seed(1)
        self.v = torch.randn(self.n, generator=generator).to(device)

    def gradient(self) -> None:
        """The model's own gradient step: forward, ``loss.backward()``, gradients released."""
        self.model.zero_grad(set_to_none=True)
        self._own_loss().backward()
        self.model.zero_grad(set_to_none=True)

    def split(self, v: torch.Tensor) -> list[torch.Tensor]:
        """A flat vector as a list shaped like the parameters."""
        return [t.reshape(p.shape) for t, p in zip(torch.split(v, [p.numel() for p in self.params]), self.params)]

    def release(self) -> None:
        """Drop PyHessian's gradient graph, which it leaves in ``.grad``."""
        for p in self.params:
            p.grad = None

    # -- each tool's operators: a builder returns (what to keep alive, flat-vector product) ------
    def lossgeom(self, matrix: str):
        make = cv.hessian_operator if matrix == "hessian" else cv.ggn_operator
        op = make(self.model, self.lossgeom_loss, self.lossgeom_data)
        return op, lambda v: op @ v

    def curvlinops(self, peers: Peers, matrix: str):
        cls = peers.curvlinops.HessianLinearOperator if matrix == "hessian" else peers.curvlinops.GGNLinearOperator
        op = cls(self.peer_model, nn.CrossEntropyLoss(), self.params, [self.peer_data], check_deterministic=False)
        return op, lambda v: op @ v

    def pyhessian(self, peers: Peers, matrix: str):
        if matrix != "hessian":
            raise NotImplementedError("PyHessian has no GGN product")
        from pyhessian.utils import hessian_vector_product

        self.release()
        comp = peers.pyhessian.hessian(self.peer_model, nn.CrossEntropyLoss(), data=self.peer_data, cuda=self.cuda)
        flat = lambda v: torch.cat(
            [t.reshape(-1) for t in hessian_vector_product(comp.gradsH, comp.params, self.split(v))]
        )
        return comp, flat

    def hessian_eigenthings(self, peers: Peers, matrix: str):
        he = peers.hessian_eigenthings
        if self.name == "gpt2_decoder":
            data = [self.hf_batch]
            if matrix == "hessian":
                op = he.HessianOperator(self.model, data, he.hf_lm_loss())
            else:
                op = he.GGNOperator(self.model, data, he.hf_lm_forward(), he.hf_lm_loss_of_output())
        else:
            data = [self.lossgeom_data]
            if matrix == "hessian":
                op = he.HessianOperator(self.model, data, he.supervised_loss(nn.CrossEntropyLoss()))
            else:
                loss_of_output = he.supervised_loss_of_output(nn.CrossEntropyLoss())
                op = he.GGNOperator(self.model, data, he.supervised_forward, loss_of_output)
        return op, lambda v: op.matvec(v)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def builder(self, peers: Peers, tool: str, matrix: str):
        """The set-up of ``tool``'s ``matrix`` product, or raise if the tool is unavailable."""
        if tool == "lossgeom":
            return self.lossgeom(matrix)
        module = getattr(peers, tool)
        if module is None:
            raise ImportError(f"{tool} is not available ({peers.status.get(tool)})")
        return getattr(self, tool)(peers, matrix)


TOOLS = ("lossgeom", "curvlinops", "pyhessian", "hessian_eigenthings")
MATRICES = ("hessian", "ggn")


# --- 1. cost of a product ------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device):
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - start, out


def median(values) -> float | None:
    return float(np.median(np.asarray(values, dtype=float))) if len(values) else None


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).norm() / b.detach().double().norm().clamp_min(1e-300))


def product_costs(problem: Problem, peers: Peers, settings: Settings) -> dict:
    """Set-up time, product time over the gradient's (interleaved, rotating), agreement with lossgeom."""
    device = problem.device
    out: dict = {matrix: {} for matrix in MATRICES}
    products, kept, first = {}, [], {}
    for matrix in MATRICES:
        for tool in TOOLS:
            try:
                seconds, (keep, product) = timed(
                    lambda tool=tool, matrix=matrix: problem.builder(peers, tool, matrix), device
                )
                warm, value = timed(lambda product=product: product(problem.v), device)  # the first product
            except Exception as err:  # noqa: BLE001 - every failure is recorded, never skipped
                out[matrix][tool] = {"error": first_line(err)}
                continue
            kept.append(keep)
            products[(matrix, tool)] = product
            first[(matrix, tool)] = value.detach()
            out[matrix][tool] = {"setup_seconds": seconds, "first_product_seconds": warm}
            if tool == "lossgeom" and matrix == "hessian":
                out[matrix][tool]["mode"] = getattr(keep, "mode", None)
    for matrix, tool in products:
        reference = first.get((matrix, "lossgeom"))
        if reference is not None and tool != "lossgeom":
            out[matrix][tool]["relative_difference_to_lossgeom"] = relative_difference(first[(matrix, tool)], reference)
    first.clear()
    problem.gradient()  # warm
    names = list(products)
    times = {name: [] for name in names}
    ratios = {name: [] for name in names}
    grads = []
    for repeat in range(settings.repeats):
        problem.gradient()  # untimed: what ran before (a torch.func transform, say) changes the caches
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            t_grad, _ = timed(problem.gradient, device)
            t_product, _ = timed(lambda name=name: products[name](problem.v), device)
            grads.append(t_grad)
            times[name].append(t_product)
            ratios[name].append(t_product / t_grad)
    for matrix, tool in names:
        out[matrix][tool].update(
            {
                "seconds": median(times[(matrix, tool)]),
                "ratio_to_gradient": median(ratios[(matrix, tool)]),
                "ratios": ratios[(matrix, tool)],
            }
        )
    out["pyhessian_ggn_note"] = "PyHessian computes Hessian products only"
    products.clear()
    del kept
    problem.release()
    gc.collect()
    return {"gradient_seconds": median(grads), "gradient_times": grads, **out}


# --- 2. peak memory ----------------------------------------------------------------------------


def memory_use(problem: Problem, peers: Peers, what: str):
    """What a memory probe runs: the model's gradient step, or a tool's set-up and two products."""
    if what == "gradient":
        return lambda: problem.gradient()
    matrix, tool = what.split("/")

    def use():
        keep, product = problem.builder(peers, tool, matrix)
        for _ in range(2):
            product(problem.v)
        return keep

    return use


def memory_probe(model: str, what: str, settings: Settings) -> None:
    """The body of ``--memory-probe``: build the problem, one gradient, then measure ``what`` (MB)."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    peers = load_peers() if what != "gradient" else Peers()
    problem = Problem(model, settings, torch.device("cpu"))
    problem.gradient()
    try:
        print(json.dumps({"peak_added_mb": added_peak_memory(memory_use(problem, peers, what))}))
    except Exception as err:  # noqa: BLE001
        print(json.dumps({"error": first_line(err)}))


def settings_args(settings: Settings) -> list[str]:
    return [
        f"--resnet-batch={settings.resnet_batch}",
        f"--decoder-batch={settings.decoder_batch}",
        f"--decoder-length={settings.decoder_length}",
    ]


def memory_in_subprocess(model: str, what: str, settings: Settings) -> dict:
    """Run ``--memory-probe`` in a fresh interpreter (glibc returns every block above 64 kB)."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--memory-probe", model, what, *settings_args(settings)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": f"the probe failed (exit {done.returncode}): {done.stderr.strip()[-200:]}"}
    return json.loads(lines[-1])


def cuda_memory(problem: Problem, peers: Peers, what: str) -> dict:
    """Peak CUDA memory (MB) added by ``what``, from the allocator's statistics."""
    device = problem.device
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    try:
        keep = memory_use(problem, peers, what)()
    except Exception as err:  # noqa: BLE001
        return {"error": first_line(err)}
    sync(device)
    added = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    del keep
    problem.release()
    return {"peak_added_mb": added}


def peak_memory(problem: Problem, peers: Peers, settings: Settings) -> dict:
    """Peak memory added by the gradient step and by each tool's set-up and two products."""
    whats = ["gradient"] + [f"{matrix}/{tool}" for matrix in MATRICES for tool in TOOLS]
    found = {}
    for what in whats:
        tool = what.split("/")[-1]
        if what == "ggn/pyhessian":
            found[what] = {"error": "NotImplementedError: PyHessian has no GGN product"}
        elif tool in TOOLS and tool != "lossgeom" and getattr(peers, tool) is None:
            found[what] = {"error": f"ImportError: {tool} is not available ({peers.status.get(tool)})"}
        elif problem.cuda:
            found[what] = cuda_memory(problem, peers, what)
        else:
            found[what] = memory_in_subprocess(problem.name, what, settings)
    if problem.cuda:
        unit = "peak CUDA memory allocated (torch.cuda.max_memory_allocated), MB"
    else:
        unit = "peak resident set size (VmHWM) added, MB, each in a fresh interpreter"
    gradient = found["gradient"].get("peak_added_mb")
    out = {"unit": unit, "gradient_mb": gradient, "hessian": {}, "ggn": {}}
    for what in whats[1:]:
        matrix, tool = what.split("/")
        entry = found[what]
        if "peak_added_mb" in entry and entry["peak_added_mb"] is not None and gradient:
            entry["over_gradient"] = entry["peak_added_mb"] / gradient
        out[matrix][tool] = entry
    return out


# --- 3. lambda_max ---------------------------------------------------------------------------------


class ColumnBlocks:
    """A curvlinops operator that multiplies at most ``columns`` columns per call.

    curvlinops multiplies a block as one call vmapped over all its columns, whose memory grows
    with the number of columns (about ten times a product's for the ten columns of a sketch);
    ``hutchpp_trace`` gets the operator through this, so that its blocks come in pieces.
    """

    def __init__(self, operator, columns: int) -> None:
        self.operator, self.columns = operator, columns
        self.shape, self.device, self.dtype = operator.shape, operator.device, operator.dtype

    def __matmul__(self, m: torch.Tensor) -> torch.Tensor:
        pieces = [self.operator @ m[:, j : j + self.columns] for j in range(0, m.shape[1], self.columns)]
        return torch.cat(pieces, dim=1)


class ProductCap(RuntimeError):
    """Raised by a counting wrapper when a solver asks for more products than allowed."""


class CountingScipy(LinearOperator):
    """A float64 scipy view that counts products and stops the solver at ``cap``."""

    def __init__(self, inner: LinearOperator, cap: int) -> None:
        super().__init__(dtype=np.dtype(np.float64), shape=inner.shape)
        self.inner, self.cap, self.n = inner, cap, 0

    def _matvec(self, v):
        if self.n >= self.cap:
            raise ProductCap(f"no convergence within {self.cap} products")
        self.n += 1
        return np.asarray(self.inner.matvec(np.asarray(v, dtype=np.float64).reshape(-1)), dtype=np.float64)

    def _adjoint(self):
        return self


def lossgeom_lambda_max(problem: Problem, peers: Peers, settings: Settings) -> dict:
    op = cv.hessian_operator(problem.model, problem.lossgeom_loss, problem.lossgeom_data)
    kwargs = {}
    if inspect.signature(cv.top_eigenpairs).parameters["method"].default == "lanczos":
        kwargs["max_hvp"] = settings.max_eig_products  # the same cap as the peers (ARPACK takes none)
    before = op.n_hvp
    seconds, result = timed(lambda: cv.top_eigenpairs(op, k=1, tol=settings.eig_tol, seed=0, **kwargs), problem.device)
    vector = torch.as_tensor(np.asarray(result.vectors[:, 0]), dtype=problem.v.dtype, device=problem.device)
    return {
        "value": float(result.values[0]),
        "n_hvp": int(op.n_hvp - before),
        "n_hvp_solver": int(result.n_hvp),
        "seconds": seconds,
        "method": result.method,
        "converged": bool(result.converged),
        "settings": f"top_eigenpairs(H, k=1, tol={settings.eig_tol:g}) (its default method"
        + (f", max_hvp={settings.max_eig_products}" if kwargs else "")
        + "); the products include its residual check",
        "_vector": vector,
    }


def curvlinops_lambda_max(problem: Problem, peers: Peers, settings: Settings) -> dict:
    op, _ = problem.curvlinops(peers, "hessian")
    counting = CountingScipy(op.to_scipy(), settings.max_eig_products)
    v0 = np.random.default_rng(0).standard_normal(problem.n)
    seconds, (values, vectors) = timed(
        lambda: eigsh(counting, k=1, which="LA", tol=settings.eig_tol, v0=v0), problem.device
    )
    return {
        "value": float(values[0]),
        "n_hvp": counting.n,
        "seconds": seconds,
        "method": "scipy eigsh (ARPACK) on HessianLinearOperator.to_scipy()",
        "settings": f"eigsh(k=1, which='LA', tol={settings.eig_tol:g}), seeded start vector",
        "_vector": torch.as_tensor(vectors[:, 0], dtype=problem.v.dtype, device=problem.device),
    }


def pyhessian_lambda_max(problem: Problem, peers: Peers, settings: Settings) -> dict:
    module = peers.pyhessian
    calls = {"n": 0}
    original = module.hessian_vector_product

    def counting(*args, **kwargs):
        calls["n"] += 1
        return original(*args, **kwargs)

    comp, _ = problem.pyhessian(peers, "hessian")
    module.hessian_vector_product = counting
    torch.manual_seed(0)  # PyHessian draws its start vector from torch's global generator
    try:
        seconds, (values, vectors) = timed(
            lambda: comp.eigenvalues(maxIter=settings.max_eig_products, tol=settings.eig_tol, top_n=1), problem.device
        )
    finally:
        module.hessian_vector_product = original
    vector = torch.cat([t.reshape(-1) for t in vectors[0]]).detach()
    problem.release()
    return {
        "value": float(values[0]),
        "n_hvp": calls["n"],
        "seconds": seconds,
        "method": "power iteration (hessian.eigenvalues)",
        "settings": f"eigenvalues(maxIter={settings.max_eig_products}, tol={settings.eig_tol:g}, top_n=1); "
        "tol bounds the relative change of the estimate between iterations",
        "converged": calls["n"] < settings.max_eig_products,
        "_vector": vector,
    }


def counting_hessian_eigenthings(problem: Problem, peers: Peers) -> tuple[object, dict]:
    """hessian-eigenthings' Hessian operator wrapped so that its products are counted (``calls["n"]``)."""
    op, _ = problem.hessian_eigenthings(peers, "hessian")
    calls = {"n": 0}

    def matvec(v):
        calls["n"] += 1
        return op.matvec(v)

    return peers.hessian_eigenthings.LambdaOperator(matvec, op.size, device=op.device, dtype=op.dtype), calls


def hessian_eigenthings_lambda_max(problem: Problem, peers: Peers, settings: Settings) -> dict:
    he = peers.hessian_eigenthings
    counting, calls = counting_hessian_eigenthings(problem, peers)
    steps = [s for s in HE_STEPS if s < settings.max_eig_products] + [settings.max_eig_products]
    total_seconds, tried = 0.0, []
    for max_iter in steps:
        before = calls["n"]
        seconds, result = timed(
            lambda max_iter=max_iter: he.lanczos(
                counting, k=1, max_iter=max_iter, tol=settings.eig_tol, which="LA", seed=0
            ),
            problem.device,
        )
        total_seconds += seconds
        tried.append(max_iter)
        if bool(result.converged[0]):
            break
    return {
        "value": float(result.eigenvalues[0]),
        "n_hvp": calls["n"] - before,
        "seconds": seconds,
        "n_hvp_search": calls["n"],
        "seconds_search": total_seconds,
        "steps_tried": tried,
        "converged": bool(result.converged[0]),
        "method": "lanczos (full reorthogonalisation, fixed number of steps)",
        "settings": f"lanczos(k=1, max_iter in {tried}, tol={settings.eig_tol:g}, which='LA', seed=0): "
        "its steps are fixed, so the steps grow until it reports its residual within tol; "
        "n_hvp and seconds are those of the accepted run, the search's in n_hvp_search",
        "_vector": result.eigenvectors[0].detach(),
    }


LAMBDA_MAX = {
    "lossgeom": lossgeom_lambda_max,
    "curvlinops": curvlinops_lambda_max,
    "pyhessian": pyhessian_lambda_max,
    "hessian_eigenthings": hessian_eigenthings_lambda_max,
}


def lambda_max(problem: Problem, peers: Peers, settings: Settings) -> dict:
    """Each tool's largest eigenvalue, its residual (one more product) and its distance to the best converged."""
    out: dict = {
        "tol": settings.eig_tol,
        "max_products": settings.max_eig_products,
        "hessian_eigenthings_steps": [s for s in HE_STEPS if s < settings.max_eig_products]
        + [settings.max_eig_products],
        "tools": {},
    }
    for tool, run in LAMBDA_MAX.items():
        if tool != "lossgeom" and getattr(peers, tool) is None:
            out["tools"][tool] = {"error": f"ImportError: {tool} is not available ({peers.status.get(tool)})"}
            continue
        try:
            out["tools"][tool] = run(problem, peers, settings)
        except Exception as err:  # noqa: BLE001
            out["tools"][tool] = {"error": first_line(err)}
        problem.release()
        gc.collect()
    check = cv.hessian_operator(problem.model, problem.lossgeom_loss, problem.lossgeom_data)
    for entry in out["tools"].values():
        vector = entry.pop("_vector", None)
        if vector is None:
            continue
        u = vector.to(problem.v.dtype).to(problem.device)
        u = u / u.norm()
        residual = (check @ u - entry["value"] * u).norm()
        entry["relative_residual"] = float(residual / abs(entry["value"]))
    del check
    converged = {t: e for t, e in out["tools"].items() if "relative_residual" in e}
    if converged:
        best = min(converged, key=lambda t: converged[t]["relative_residual"])
        out["most_converged"] = best
        for entry in converged.values():
            entry["relative_difference_to_most_converged"] = abs(entry["value"] - converged[best]["value"]) / abs(
                converged[best]["value"]
            )
    return out


# --- 4. trace ----------------------------------------------------------------------------------------


def trace_estimates(problem: Problem, peers: Peers, settings: Settings) -> dict:
    """Each tool's trace of the Hessian with a fixed budget of products."""
    budget = settings.trace_budget
    device = problem.device
    out: dict = {"budget": budget, "matrix": "hessian", "tools": {}}

    def run_lossgeom():
        op = cv.hessian_operator(problem.model, problem.lossgeom_loss, problem.lossgeom_data)
        seconds, est = timed(lambda: cv.hutchpp_trace(op, n_probes=budget, seed=0), device)
        return {
            "estimator": "Hutch++ (hutchpp_trace)",
            "estimate": est.estimate,
            "std_error": est.std_error,
            "n_hvp": est.n_hvp,
            "seconds": seconds,
        }

    def run_curvlinops():
        from curvlinops import hutchpp_trace

        op, _ = problem.curvlinops(peers, "hessian")
        blocked = ColumnBlocks(op, settings.curvlinops_columns)
        torch.manual_seed(0)  # curvlinops draws from torch's global generator
        seconds, est = timed(lambda: hutchpp_trace(blocked, num_matvecs=budget - budget % 3), device)
        return {
            "estimator": "Hutch++ (curvlinops.hutchpp_trace)",
            "estimate": float(est),
            "std_error": None,
            "std_error_note": "curvlinops' hutchpp_trace returns the estimate only",
            "columns_per_call": settings.curvlinops_columns,
            "columns_note": "curvlinops multiplies a block of columns in one vmapped call; here at most "
            f"{settings.curvlinops_columns} columns per call, to bound memory",
            "n_hvp": budget - budget % 3,
            "seconds": seconds,
        }

    def run_pyhessian():
        comp, _ = problem.pyhessian(peers, "hessian")
        torch.manual_seed(0)
        # tol=-inf: its relative-change stop never fires, so it spends the whole budget
        seconds, samples = timed(lambda: comp.trace(maxIter=budget, tol=-math.inf), device)
        samples = np.asarray(samples, dtype=float)
        return {
            "estimator": "Hutchinson (hessian.trace; PyHessian has no Hutch++)",
            "estimate": float(samples.mean()),
            "std_error": float(samples.std(ddof=1) / math.sqrt(len(samples))),
            "n_hvp": len(samples),
            "seconds": seconds,
        }

    def run_hessian_eigenthings():
        he = peers.hessian_eigenthings
        counting, calls = counting_hessian_eigenthings(problem, peers)
        seconds, est = timed(lambda: he.hutch_plus_plus(counting, num_matvecs=budget, seed=0), device)
        return {
            "estimator": "Hutch++ (hutch_plus_plus)",
            "estimate": est.estimate,
            "std_error": est.stderr,
            "n_hvp": calls["n"],
            "seconds": seconds,
        }

    runs = {"lossgeom": run_lossgeom, "curvlinops": run_curvlinops, "pyhessian": run_pyhessian,
            "hessian_eigenthings": run_hessian_eigenthings}  # fmt: skip
    for tool, run in runs.items():
        if tool != "lossgeom" and getattr(peers, tool) is None:
            out["tools"][tool] = {"error": f"ImportError: {tool} is not available ({peers.status.get(tool)})"}
            continue
        try:
            out["tools"][tool] = run()
        except Exception as err:  # noqa: BLE001
            out["tools"][tool] = {"error": first_line(err)}
        problem.release()
        gc.collect()
    return out


# --- 5. torch.compile -------------------------------------------------------------------------------


def compile_probe(model: str, variants: list[str], settings: Settings, device_name: str) -> None:
    """The body of ``--compile-probe``: compile a torch.func HVP, time it against the gradient; a JSON line per variant.

    Stops after the first variant that compiles and runs.
    """
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    device = torch.device(device_name)
    problem = Problem(model, settings, device)
    params = {name: p.detach() for name, p in problem.model.named_parameters()}
    buffers = dict(problem.model.named_buffers())
    args, kwargs = problem.functional_inputs
    tangent = dict(zip(params, problem.split(problem.v)))

    def loss_of(p):
        return problem.functional_loss(torch.func.functional_call(problem.model, {**p, **buffers}, args, kwargs))

    def forward_over_reverse(p, v):
        return torch.func.jvp(torch.func.grad(loss_of), (p,), (v,))[1]

    def reverse_over_reverse(p, v):
        return torch.func.vjp(torch.func.grad(loss_of), p)[1](v)[0]

    functions = {"forward-over-reverse": forward_over_reverse, "reverse-over-reverse": reverse_over_reverse}
    flat = lambda d: torch.cat([t.reshape(-1) for t in d.values()])
    for variant in variants:
        entry: dict = {"variant": variant}
        try:
            eager = functions[variant]
            t_eager, reference = timed(lambda eager=eager: eager(params, tangent), device)
            compiled = torch.compile(eager)
            t_compile, value = timed(lambda compiled=compiled: compiled(params, tangent), device)
            entry["compile_seconds"] = t_compile
            entry["relative_difference_to_eager"] = relative_difference(flat(value), flat(reference))
            ratios, eager_ratios = [], []
            problem.gradient()
            for _ in range(max(2, settings.repeats)):
                t_grad, _ = timed(problem.gradient, device)
                t_product, _ = timed(lambda compiled=compiled: compiled(params, tangent), device)
                ratios.append(t_product / t_grad)
                t_grad, _ = timed(problem.gradient, device)
                t_eager, _ = timed(lambda eager=eager: eager(params, tangent), device)
                eager_ratios.append(t_eager / t_grad)
            entry["ratio_to_gradient"] = median(ratios)
            entry["eager_ratio_to_gradient"] = median(eager_ratios)
            entry["ok"] = True
        except Exception as err:  # noqa: BLE001
            entry["error"] = first_line(err)
            entry["ok"] = False
        print(json.dumps(entry), flush=True)
        if entry["ok"]:
            return


def compile_attempts(model: str, settings: Settings, device: torch.device) -> dict:
    """Run ``--compile-probe`` in a fresh interpreter, cold inductor cache, within ``compile_timeout`` seconds."""
    cache = tempfile.mkdtemp(prefix="inductor-cache-")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TORCHINDUCTOR_COMPILE_THREADS="1")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--compile-probe", model, f"--device={device.type}",
           *settings_args(settings), f"--repeats={settings.repeats}"]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # fmt: skip
    timed_out = False
    try:
        stdout, stderr = proc.communicate(timeout=settings.compile_timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)  # the probe and the compile workers it started
        stdout, stderr = proc.communicate()
    shutil.rmtree(cache, ignore_errors=True)
    attempts = []
    for line in stdout.splitlines():
        try:
            attempts.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    out = {
        "what": "torch.compile (default inductor backend) of a torch.func HVP of a functional_call loss",
        "timeout_seconds": settings.compile_timeout,
        "wall_seconds": time.perf_counter() - start,
        "attempts": attempts,
    }
    if timed_out:
        tried = {a["variant"] for a in attempts}
        running = next((v for v in COMPILE_VARIANTS if v not in tried), None)
        out["timed_out"] = f"{running} had not finished within {settings.compile_timeout:g} s (stopped)"
    elif proc.returncode != 0 and not any(a.get("ok") for a in attempts):
        out["error"] = f"the probe exited with {proc.returncode}: {stderr.strip()[-300:]}"
    return out


# --- a check of torch.func --------------------------------------------------------------------------


def layer_norm_check() -> dict:
    """Forward mode over ``jacrev`` against forward mode over ``grad`` on a layer norm's weight, float64.

    curvlinops' Hessian product is ``torch.func.jvp`` of ``torch.func.jacrev``; lossgeom's
    forward-over-reverse is ``jvp`` of ``grad``. Both against central differences of the gradient.
    """
    generator = torch.Generator().manual_seed(0)
    draw = lambda *shape: torch.randn(*shape, dtype=torch.float64, generator=generator)
    x, w, b, c = draw(4, 6), draw(6), draw(6), draw(4, 6)
    f = lambda x, w: (nn.functional.layer_norm(x, (6,), w, b) * c).sum() ** 2
    tangents = (draw(4, 6), draw(6))
    over_grad = torch.func.jvp(torch.func.grad(f, argnums=(0, 1)), (x, w), tangents)[1]
    over_jacrev = torch.func.jvp(torch.func.jacrev(f, argnums=(0, 1)), (x, w), tangents)[1]
    eps = 1e-6
    plus = torch.func.grad(f, argnums=(0, 1))(x + eps * tangents[0], w + eps * tangents[1])
    minus = torch.func.grad(f, argnums=(0, 1))(x - eps * tangents[0], w - eps * tangents[1])
    difference = [(p - m) / (2 * eps) for p, m in zip(plus, minus)]
    return {
        "what": "d/dt of the gradient of (layer_norm(x, w, b) * c).sum()**2 along (dx, dw), the w block, float64: "
        "relative difference of torch.func.jvp over grad and over jacrev to central differences (step 1e-6)",
        "jvp_of_grad": relative_difference(over_grad[1], difference[1]),
        "jvp_of_jacrev": relative_difference(over_jacrev[1], difference[1]),
    }


# --- driver --------------------------------------------------------------------------------------


def run_model(name: str, settings: Settings, peers: Peers, device: torch.device | str = "cpu", log=print) -> dict:
    """Every measurement on one model; a dict for the JSON."""
    device = torch.device(device)
    started = time.perf_counter()
    problem = Problem(name, settings, device)
    row = {
        "model": name,
        "n_params": problem.n,
        "batch": problem.batch_text,
        "loss": problem.loss_text,
        "device": str(device),
        "dtype": str(problem.v.dtype).replace("torch.", ""),
    }
    row["products"] = product_costs(problem, peers, settings)
    p = row["products"]
    log(
        f"{name}: gradient {p['gradient_seconds']:.3f} s; HVP/gradient "
        + ", ".join(f"{t} {e['ratio_to_gradient']:.2f}" for t, e in p["hessian"].items() if "ratio_to_gradient" in e)
        + "; GGN "
        + ", ".join(f"{t} {e['ratio_to_gradient']:.2f}" for t, e in p["ggn"].items() if "ratio_to_gradient" in e)
        + f" ({time.perf_counter() - started:.0f} s)"
    )
    if settings.memory:
        row["memory"] = peak_memory(problem, peers, settings)
        m = row["memory"]
        log(
            f"{name}: memory gradient {m['gradient_mb']} MB; "
            + ", ".join(f"{t} {e.get('peak_added_mb')}" for t, e in m["hessian"].items())
            + f" ({time.perf_counter() - started:.0f} s)"
        )
    else:
        row["memory"] = None
    row["lambda_max"] = lambda_max(problem, peers, settings)
    log(
        f"{name}: lambda_max "
        + ", ".join(
            f"{t} {e['value']:.6g} ({e['n_hvp']} products, {e['seconds']:.1f} s)"
            if "value" in e
            else f"{t} {e['error']}"
            for t, e in row["lambda_max"]["tools"].items()
        )
        + f" ({time.perf_counter() - started:.0f} s)"
    )
    row["trace"] = trace_estimates(problem, peers, settings)
    log(
        f"{name}: trace "
        + ", ".join(
            f"{t} {e['estimate']:.5g}" if "estimate" in e else f"{t} {e['error']}"
            for t, e in row["trace"]["tools"].items()
        )
        + f" ({time.perf_counter() - started:.0f} s)"
    )
    del problem
    gc.collect()
    row["compile"] = compile_attempts(name, settings, device)
    log(f"{name}: torch.compile {json.dumps(row['compile'])[:300]} ({time.perf_counter() - started:.0f} s)")
    row["seconds"] = time.perf_counter() - started
    return row


def finite(value):
    """NaN and infinities as None, recursively (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="batch 2, one repeat, no memory probes (a smoke test)")
    parser.add_argument("--out", type=Path, help="where to write the JSON (default: see the docstring)")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--resnet-batch", type=int, help="images per ResNet batch (default 32)")
    parser.add_argument("--decoder-batch", type=int, help="sequences per decoder batch (default 8)")
    parser.add_argument("--decoder-length", type=int, help="tokens per sequence, at most 128 (default 128)")
    parser.add_argument("--repeats", type=int, help="interleaved timing repeats (default 3)")
    parser.add_argument("--max-eig-products", type=int, help="products allowed to each lambda_max solver (default 40)")
    parser.add_argument("--trace-budget", type=int, help="products of each trace estimate (default 30)")
    parser.add_argument("--compile-timeout", type=float, help="seconds for each model's torch.compile probe")
    parser.add_argument("--curvlinops-columns", type=int, help="columns per curvlinops call in its Hutch++ (default 2)")
    parser.add_argument("--memory-probe", nargs=2, metavar=("MODEL", "WHAT"), help=argparse.SUPPRESS)
    parser.add_argument("--compile-probe", metavar="MODEL", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    settings = quick_settings() if args.quick else Settings()
    for field in ("resnet_batch", "decoder_batch", "decoder_length", "repeats", "max_eig_products", "trace_budget",
                  "compile_timeout", "curvlinops_columns"):  # fmt: skip
        if getattr(args, field, None) is not None:
            setattr(settings, field, getattr(args, field))
    if not 2 <= settings.decoder_length <= 128:
        raise SystemExit(f"--decoder-length must be in 2..128 (the decoder's positions), got {settings.decoder_length}")
    if settings.trace_budget < 6:
        raise SystemExit(
            f"--trace-budget must be at least 6 (Hutch++ needs three blocks of two), got {settings.trace_budget}"
        )
    return settings


def main(argv=None) -> int:
    args = parse(argv)
    settings = settings_from(args)
    if args.memory_probe:
        memory_probe(*args.memory_probe, settings)
        return 0
    if args.compile_probe:
        compile_probe(args.compile_probe, list(COMPILE_VARIANTS), settings, args.device)
        return 0
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    peers = load_peers()
    out = args.out or (Path(tempfile.gettempdir()) / "scale_benchmark_quick.json" if args.quick else OUT)
    started = time.perf_counter()
    result = {
        "what": "curvature products, peak memory, lambda_max, traces and torch.compile at the size people train",
        "quick": settings.quick,
        "settings": dataclasses.asdict(settings),
        "setting": {
            "device": "cpu",
            "dtype": "float32",
            "threads": torch.get_num_threads(),
            "resnet18": "ResNet-18, torchvision's layout with the CIFAR stem (benchmarks/scale_models.py), batch norm "
            "in eval mode",
            "gpt2_decoder": "GPT2LMHeadModel: 6 layers, width 384, 6 heads, vocabulary 8192, 128 positions, tied "
            "embeddings, eager attention (benchmarks/scale_models.py)",
            "peers_on_the_decoder": "curvlinops and PyHessian take model(X) and loss(output, y): they get a wrapper "
            "module returning the logits of the shifted positions flattened to (N (T - 1), V), with "
            "nn.CrossEntropyLoss on the flattened shifted labels; hessian-eigenthings takes the HuggingFace "
            "batch (hf_lm_loss, hf_lm_forward, hf_lm_loss_of_output); lossgeom the batch dict and CausalLMLoss()",
            "curvlinops_options": "check_deterministic=False (its determinism checks at set-up are skipped)",
        },
        "environment": {
            **versions(peers),
            "cpu_count": os.cpu_count(),
            "machine": platform.machine(),
            "processor": platform.processor() or None,
            "load_average_at_start": list(os.getloadavg()),
        },
        "checks": {"torch_func_layer_norm": layer_norm_check()},
        "command": shlex.join(["python", "benchmarks/scale_benchmark.py", *(sys.argv[1:] if argv is None else argv)]),
        "models": {},
    }
    for name in args.models:
        result["models"][name] = run_model(name, settings, peers, "cpu", log=lambda text: print(text, flush=True))
    result["environment"]["load_average_at_end"] = list(os.getloadavg())
    result["total_seconds"] = time.perf_counter() - started
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(finite(result), indent=1) + "\n")
    print(f"wrote {out} after {result['total_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

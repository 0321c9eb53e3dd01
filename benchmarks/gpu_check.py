#!/usr/bin/env python3
"""The curvature operators on a GPU: agreement with CPU float64, and the cost of a product.

Usage, from the repository root, on a machine with CUDA (never needed by ``make test``):

    .venv/bin/python benchmarks/gpu_check.py                 # writes benchmarks/results/gpu_check.json
    .venv/bin/python benchmarks/gpu_check.py --device cpu    # a smoke test of the script itself

Model: a tanh MLP ``64 -> 256 -> 256 -> 10`` (85,002 parameters) and a small tanh CNN, the
mean cross-entropy on 512 seeded random examples in two batches. On the device, in float32
and float64, it compares with the CPU float64 result: Hessian, GGN, empirical and true
Fisher products on three seeded directions (relative error of the block), the top two
Hessian eigenvalues by Lanczos and a seeded Hutch++ trace. It then times, on the device, one
Hessian-vector product against one gradient (``loss.backward()``), interleaved, medians of
20 after warm-up with ``torch.cuda.synchronize()`` around each, and records the device's
name and peak memory.

Then the scale benchmark (``benchmarks/scale_benchmark.py``) on the device: the ResNet-18 and
the GPT-2-shaped decoder of ``benchmarks/scale_models.py`` at the benchmark's full batch, every
tool's Hessian- and GGN-vector product over a gradient, peak CUDA memory (the allocator's
statistics), ``lambda_max``, a Hutch++ trace and ``torch.compile`` on the product, side by side
with the peers that import (``PEERS_TARGET`` may name a directory holding PyHessian's and
hessian-eigenthings' sources: the device machine may not reach the package index; a peer that
is missing is recorded as such). ``--skip-scale`` leaves it out; with ``--device cpu`` it runs
at the benchmark's quick size. The first part takes well under a minute on a current GPU, the
scale part a few minutes (mostly ``torch.compile``, bounded by ``--compile-timeout``).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from torch import nn

from lossgeom import curvature

RESULT = Path(__file__).resolve().parent / "results" / "gpu_check.json"


def models() -> dict[str, nn.Module]:
    torch.manual_seed(0)
    f64 = torch.float64
    mlp = nn.Sequential(
        nn.Linear(64, 256, dtype=f64),
        nn.Tanh(),
        nn.Linear(256, 256, dtype=f64),
        nn.Tanh(),
        nn.Linear(256, 10, dtype=f64),
    )
    cnn = nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, 8, 3, padding=1, dtype=f64),
        nn.Tanh(),
        nn.Conv2d(8, 8, 3, padding=1, dtype=f64),
        nn.Tanh(),
        nn.AvgPool2d(2),
        nn.Flatten(),
        nn.Linear(128, 10, dtype=f64),
    )
    return {"mlp": mlp.eval(), "cnn": cnn.eval()}


def data(dtype, device):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 64, dtype=torch.float64, generator=g)
    y = torch.randint(0, 10, (512,), generator=g)
    x = x.to(dtype=dtype, device=device)
    y = y.to(device)
    return [(x[:256], y[:256]), (x[256:], y[256:])]


def measures(model, dtype, device) -> dict:
    model = copy.deepcopy(model).to(dtype=dtype, device=device)
    batches = data(dtype, device)
    loss = nn.CrossEntropyLoss()
    n = sum(p.numel() for p in model.parameters())
    m = torch.randn(n, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).to(
        dtype=dtype, device=device
    )
    out = {}
    for matrix in curvature.factory.MATRICES:
        operator = curvature.curvature_operator(model, loss, batches, matrix=matrix)
        out[matrix] = operator.matmat(m).to(device="cpu", dtype=torch.float64)
    hessian = curvature.hessian_operator(model, loss, batches)
    out["top2"] = torch.from_numpy(curvature.top_eigenpairs(hessian, k=2, tol=1e-6, seed=0).values.copy())
    out["hutchpp"] = torch.tensor(curvature.hutchpp_trace(hessian, n_probes=30, seed=0).estimate)
    return out


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timing(model, dtype, device, repeats: int = 20) -> dict:
    model = copy.deepcopy(model).to(dtype=dtype, device=device)
    batch = data(dtype, device)[:1]
    x, y = batch[0]
    loss = nn.CrossEntropyLoss()
    hessian = curvature.hessian_operator(model, loss, batch)
    v = torch.randn(hessian.shape[0], dtype=dtype, device=device)

    def gradient():
        model.zero_grad(set_to_none=True)
        loss(model(x), y).backward()

    grads, hvps = [], []
    for i in range(repeats + 3):
        sync(device)
        start = time.perf_counter()
        gradient()
        sync(device)
        middle = time.perf_counter()
        hessian.matvec(v)
        sync(device)
        end = time.perf_counter()
        if i >= 3:
            grads.append(middle - start)
            hvps.append(end - middle)
    model.zero_grad(set_to_none=True)
    return {
        "gradient_seconds": statistics.median(grads),
        "hvp_seconds": statistics.median(hvps),
        "hvp_over_gradient": statistics.median(h / g for h, g in zip(hvps, grads, strict=True)),
    }


def scale_check(device: torch.device, compile_timeout: float) -> dict:
    """The scale benchmark's measurements on ``device``: full size on a GPU, the quick size on the CPU."""
    import scale_benchmark

    if device.type == "cuda":
        settings = scale_benchmark.Settings(repeats=5, compile_timeout=compile_timeout)
    else:
        settings = scale_benchmark.quick_settings()
        settings.compile_timeout = min(settings.compile_timeout, compile_timeout)
    peers = scale_benchmark.load_peers()
    out = {
        "settings": dataclasses.asdict(settings),
        "versions": scale_benchmark.versions(peers),
        "models": {},
    }
    for name in scale_benchmark.MODELS:
        out["models"][name] = scale_benchmark.run_model(name, settings, peers, device)
    return scale_benchmark.finite(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu for a smoke test")
    parser.add_argument("--skip-scale", action="store_true", help="leave out the scale benchmark's measurements")
    parser.add_argument(
        "--compile-timeout",
        type=float,
        default=90.0,
        help="seconds for each model's torch.compile attempt (scale part)",
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device here; run it on a GPU machine (or --device cpu to smoke-test)")
    start = time.perf_counter()
    result = {
        "what": "lossgeom's curvature operators on a device against CPU float64; HVP vs gradient timing",
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
            "cuda": torch.version.cuda,
        },
        "models": {},
    }
    for name, model in models().items():
        reference = measures(model, torch.float64, torch.device("cpu"))
        entry = {"parameters": sum(p.numel() for p in model.parameters())}
        for dtype in (torch.float32, torch.float64):
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            got = measures(model, dtype, device)
            entry[str(dtype).split(".")[1]] = {
                "relative_error_vs_cpu_float64": {key: relative(got[key], reference[key]) for key in reference},
                "timing": timing(model, dtype, device),
                "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
            }
        result["models"][name] = entry
    if not args.skip_scale:
        result["scale"] = scale_check(device, args.compile_timeout)
    result["total_seconds"] = time.perf_counter() - start
    text = json.dumps(result, indent=1)
    if device.type == "cuda":
        RESULT.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

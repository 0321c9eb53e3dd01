"""The GGN, the Fisher and the flatness measures on the architectures of ``test_architectures``.

Each is compared with a dense float64 reference built here from ``torch.autograd.functional``
and per-example loops over the loss module itself (nothing of lossgeom), to 1e-10 of the
reference's scale; and the model's parameters and buffers are bit-identical after every
entry point.
"""

from __future__ import annotations

import math

import pytest
import torch
from architecture_cases import ARCHITECTURES, LOSSES, inputs_for, reference_hessian, state_of, targets_for
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from lossgeom import curvature, flatness


def _trainable(model):
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def _functional(model):
    """``f(vector, x)``: the model at a flat vector of its trainable parameters."""
    names, shapes = zip(*[(n, p.shape) for n, p in _trainable(model)])

    def call(vector, x):
        pieces, i = {}, 0
        for name, shape in zip(names, shapes):
            pieces[name] = vector[i : i + shape.numel()].reshape(shape)
            i += shape.numel()
        with sdpa_kernel([SDPBackend.MATH]):
            return torch.func.functional_call(model, pieces, (x,))

    flat = torch.cat([p.detach().reshape(-1) for _, p in _trainable(model)])
    return call, flat


def _reference_ggn(model, loss, x, y):
    """``J^T H_out J``: the Jacobian from torch.autograd.functional, ``H_out`` from the dense reference helper."""
    call, flat = _functional(model)
    out = call(flat, x).detach()
    jac = torch.autograd.functional.jacobian(lambda v: call(v, x), flat).reshape(out.numel(), -1)
    h_out = curvature.closure_hessian(lambda p: loss(p["out"].reshape(out.shape), y), {"out": out.reshape(-1)})
    return jac.T @ h_out @ jac


def _per_example_gradients(model, loss, x, y):
    """``g_i``: the gradient of the loss module on example ``i`` alone, one row per example."""
    call, flat = _functional(model)
    rows = []
    for i in range(x.shape[0]):
        v = flat.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(loss(call(v, x[i : i + 1]), y[i : i + 1]), v)
        rows.append(g)
    return torch.stack(rows), flat


def _risk(model, loss, x, y):
    call, flat = _functional(model)
    return (lambda v: loss(call(v, x), y)), flat


def _close(value, expected, scale):
    return abs(value - expected) <= 1e-10 * max(scale, abs(expected))


@pytest.mark.parametrize("loss_name", list(LOSSES))
@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_ggn_and_fisher_operators_match_independent_references(name, loss_name):
    make, kind = ARCHITECTURES[name]
    torch.manual_seed(0)
    model, loss = make(), LOSSES[loss_name]()
    gen = torch.Generator().manual_seed(3)
    x, y = inputs_for(kind, 7, gen), targets_for(loss, 7, gen)
    before = state_of(model)
    batches = [(x[:3], y[:3]), (x[3:], y[3:])]  # unequal batches
    ggn = _reference_ggn(model, loss, x, y)
    scale = float(ggn.abs().max())
    assert torch.allclose(
        torch.as_tensor(curvature.ggn_operator(model, loss, batches).dense()), ggn, rtol=0, atol=1e-10 * scale
    )
    g, _ = _per_example_gradients(model, loss, x, y)
    share = 1.0 / x.shape[0] if loss.reduction == "mean" else 1.0
    empirical = share * g.T @ g
    fisher = torch.as_tensor(curvature.fisher_operator(model, loss, batches).dense())
    assert torch.allclose(fisher, empirical, rtol=0, atol=1e-10 * float(empirical.abs().max()))
    if isinstance(loss, nn.CrossEntropyLoss):  # the true Fisher of a softmax likelihood is its GGN
        true = torch.as_tensor(curvature.fisher_operator(model, loss, batches, kind="true").dense())
        assert torch.allclose(true, ggn, rtol=0, atol=1e-10 * scale)
    after = state_of(model)
    assert all(torch.equal(before[k], after[k]) for k in before), "parameters or buffers changed"


MEAN_LOSSES = [key for key in LOSSES if "sum" not in key]


@pytest.mark.parametrize("loss_name", MEAN_LOSSES)
@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_flatness_measures_match_their_definitions(name, loss_name):
    make, kind = ARCHITECTURES[name]
    torch.manual_seed(0)
    model, loss = make(), LOSSES[loss_name]()
    gen = torch.Generator().manual_seed(4)
    x, y = inputs_for(kind, 7, gen), targets_for(loss, 7, gen)
    before = state_of(model)
    hessian = reference_hessian(model, loss, x, y)
    scale = float(hessian.abs().max())
    risk, flat = _risk(model, loss, x, y)
    base = float(risk(flat))
    data = [(x[:3], y[:3]), (x[3:], y[3:])]
    point = flatness.LossPoint(model, loss, data)
    top = float(torch.linalg.eigvalsh(hessian)[-1])  # to lambda_max's default tol, 1e-8, on the eigenvalue
    assert abs(flatness.measure_at(point, curvature.lambda_max) - top) <= 1e-8 * abs(top) + 1e-12 * scale
    assert _close(flatness.hessian_trace(model, loss, data, method="exact"), float(torch.trace(hessian)), scale)
    v = flat.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(risk(v), v)
    with torch.no_grad():
        sam = float(risk(flat + 0.05 * grad / grad.norm())) - base
    assert _close(flatness.sam_sharpness(model, loss, data, rho=0.05), sam, abs(base))
    t = torch.cat(
        [(p.detach().abs() + 0.01 if "weight" in n else torch.ones_like(p)).reshape(-1) for n, p in _trainable(model)]
    )
    step = 0.5 * t**2 * grad / (t * grad).norm()
    with torch.no_grad():
        asam = float(risk(flat + step)) - base
    assert _close(flatness.adaptive_sharpness(model, loss, data, rho=0.5, eta=0.01), asam, abs(base))
    g, _ = _per_example_gradients(model, loss, x, y)  # the loss module on one example: its mean over outputs
    fisher_rao = math.sqrt(float((g @ flat).pow(2).mean()))
    assert _close(flatness.fisher_rao_norm(model, loss, data), fisher_rao, fisher_rao)
    after = state_of(model)
    assert all(torch.equal(before[k], after[k]) for k in before), "parameters or buffers changed"

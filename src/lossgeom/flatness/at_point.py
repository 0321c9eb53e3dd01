"""The flatness measures at a stored :class:`~lossgeom.flatness.loss_point.LossPoint`.

The computations behind :mod:`lossgeom.flatness.measures`: each ``_<measure>_at(point,
**options)`` evaluates one measure at a point whose dense Hessian and Fisher are kept, so
that :func:`lossgeom.flatness.measures.measure_at` can share them across measures. The
public forms are the model-first functions of :mod:`lossgeom.flatness.measures`.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.optimize import Bounds, minimize
from torch import nn

from lossgeom._validation import positive, positive_int
from lossgeom.curvature import HessianOperator, closure_lambda_max, fisher_operator, hutchpp_trace
from lossgeom.flatness.loss_point import LossPoint, NotApplicable
from lossgeom.flatness.relu_quotient import quotient_flatness, two_layer_weights
from lossgeom.flatness.riemannian import (
    diagonal_fisher_sharpness_from_matrices,
    fisher_riemannian_sharpness_from_matrices,
)
from lossgeom.flatness.softmax_head import b_quot, b_raw, kappa_exact
from lossgeom.flatness.spectral import wolkowicz_styan_bound
from lossgeom.types import Data, Group, Output, Params

__all__: list[str] = []

#: The largest parameter count for which a measure forms a dense ``n x n`` Hessian or Fisher.
MAX_DENSE = 5000


def _point(
    name: str,
    model: nn.Module,
    loss: nn.Module,
    data: Data,
    params: Params | None,
    group: Group,
    output: Output,
    max_dense: int = MAX_DENSE,
) -> LossPoint:
    """The loss point of a measure that needs all examples on one process (refusing a process group)."""
    if group is not None:
        raise ValueError(
            f"group: {name} needs every example on one process and takes no process group; gather the "
            "data on one rank and pass group=None (hessian_trace and lossgeom.curvature.lambda_max sum "
            "over the ranks of a group)"
        )
    return LossPoint(model, loss, data, params=params, max_dense=max_dense, output=output)


def _dense_check(name: str, n: int, max_dense: int) -> None:
    if n > max_dense:
        raise NotApplicable(
            f"{name}(method='exact') needs the dense {n} x {n} Hessian, above max_dense = {max_dense}; pass "
            f"max_dense={n} if memory allows, or use the matrix-free estimate method='hutchpp' (the default)"
        )


def _lambda_max_at(
    point: LossPoint, *, tol: float = 1e-8, seed: int = 0, method: str = "reverse-over-reverse"
) -> float:
    if point.n_parameters < 2:
        raise ValueError("lambda_max needs at least two parameters (Lanczos)")
    return closure_lambda_max(point.loss_fn, point.params, tol=positive("tol", tol), seed=seed, method=method)


def _hessian_trace_at(point: LossPoint, *, method: str = "hutchpp", n_probes: int = 99, seed: int = 0) -> float:
    if method == "exact":
        _dense_check("hessian_trace", point.n_parameters, point.max_dense)
        return float(np.trace(point.hessian()))
    if method == "hutchpp":
        operator = HessianOperator.from_closure(point.loss_fn, point.params)
        return float(hutchpp_trace(operator, n_probes=n_probes, seed=seed).estimate)
    raise ValueError(f"method must be 'hutchpp' or 'exact', got {method!r}")


def _keskar_sharpness_at(point: LossPoint, *, epsilon: float = 1e-3, max_iter: int = 20) -> float:
    epsilon, max_iter = positive("epsilon", epsilon), positive_int("max_iter", max_iter)
    theta = point.flat()
    base = point.value()
    half_width = (epsilon * (theta.abs() + 1.0)).numpy()

    def negative(z: np.ndarray) -> tuple[float, np.ndarray]:
        value, grad = point.value_and_gradient(theta + torch.from_numpy(z))
        return -value, -grad.numpy()

    # no stopping on a small projected gradient or a small decrease: a box of width 1e-3
    # around a trained point has both, and the search would stop at z = 0
    result = minimize(
        negative,
        np.zeros(theta.numel()),
        jac=True,
        method="L-BFGS-B",
        bounds=Bounds(-half_width, half_width),
        options={"maxiter": max_iter, "gtol": 0.0, "ftol": 0.0},
    )
    highest = max(-float(result.fun), base)
    return 100.0 * (highest - base) / (1.0 + base)


def _sam_sharpness_at(point: LossPoint, *, rho: float = 0.05) -> float:
    rho = positive("rho", rho)
    theta = point.flat()
    base, grad = point.value_and_gradient(theta)
    norm = float(grad.norm())
    if norm == 0.0:
        return 0.0
    with torch.no_grad():
        return float(point.loss_fn(point.unflatten(theta + (rho / norm) * grad))) - base


def _asam_scale(point: LossPoint, eta: float) -> torch.Tensor:
    """ASAM's ``T_w``: ``|w| + eta`` on weights (parameters named ``*weight*``), 1 on the others.

    The rule is the authors' implementation's: it reads names, so the gains of a
    normalisation layer (``LayerNorm.weight``, ``BatchNorm.weight``) count as weights too.
    """
    pieces = [
        (p.detach().to(torch.float64).abs() + eta) if "weight" in name else torch.ones(p.numel(), dtype=torch.float64)
        for name, p in point.params.items()
    ]
    return torch.cat([piece.reshape(-1) for piece in pieces])


def _adaptive_sharpness_at(point: LossPoint, *, rho: float = 0.5, eta: float = 0.01) -> float:
    rho, eta = positive("rho", rho), float(eta)
    if not (math.isfinite(eta) and eta >= 0):
        raise ValueError(f"eta must be finite and >= 0, got {eta}")
    theta = point.flat()
    base, grad = point.value_and_gradient(theta)
    scale = _asam_scale(point, eta)
    norm = float((scale * grad).norm())
    if norm == 0.0:
        return 0.0
    with torch.no_grad():
        return float(point.loss_fn(point.unflatten(theta + (rho / norm) * scale**2 * grad))) - base


def _fisher_rao_norm_at(point: LossPoint) -> float:
    """``sqrt(theta . F theta)`` with the empirical Fisher of :func:`lossgeom.curvature.fisher_operator`.

    Its products are checked against reverse mode at set-up, so a forward-mode rule that
    disagrees (``nn.Embedding(padding_idx=...)``) cannot give a wrong value.
    """
    point.likelihood("the Fisher-Rao norm")
    operator = fisher_operator(point.model, point.loss, point.data, params=point.params, kind="empirical")
    theta = point.flat().to(dtype=operator.dtype, device=operator.device)
    value = float(theta @ operator.matvec(theta))
    return math.sqrt(max(value, 0.0))


def _first_weight(point: LossPoint) -> str:
    for name, value in point.params.items():
        if name.endswith("weight") and value.ndim >= 2:
            return name.removesuffix(".weight").removesuffix("weight")
    raise NotApplicable(
        "relative flatness needs a layer with a weight matrix (a parameter '<layer>.weight' of two or more dimensions)"
    )


def _relative_flatness_at(point: LossPoint, *, layer: str | None = None) -> float:
    layer = _first_weight(point) if layer is None else layer
    name = f"{layer}.weight" if layer else "weight"
    if name not in point.params or point.params[name].ndim < 2:
        raise ValueError(
            f"layer {layer!r} has no weight matrix {name!r}; weights are "
            f"{[k for k, v in point.params.items() if v.ndim >= 2]}"
        )
    weight = point.params[name].detach().to(torch.float64)
    rows, width = weight.shape[0], weight[0].numel()
    index = point.block_indices(name)
    block = point.hessian()[np.ix_(index, index)].reshape(rows, width, rows, width)
    traces = np.einsum("sjtj->st", block)
    W = weight.reshape(rows, width).numpy()
    return float(((W @ W.T) * traces).sum())


def _classifier_kappa_exact_at(point: LossPoint) -> float:
    W, h = point.classifier()
    return float(kappa_exact(W, h))


def _classifier_b_raw_at(point: LossPoint) -> float:
    W, h = point.classifier()
    return float(b_raw(W, h))


def _classifier_b_quot_at(point: LossPoint) -> float:
    W, h = point.classifier()
    return float(b_quot(W, h))


def _model_quotient_flatness_at(point: LossPoint) -> float:
    if not isinstance(point.loss, nn.MSELoss):
        raise NotApplicable("Flat^Q is derived for the square loss (nn.MSELoss)")
    point.likelihood("Flat^Q")  # refuses a subclass that overrides forward: the formula is the square loss's
    try:
        a, W = two_layer_weights(point.params)
        two_layer_weights(point.model)
    except (TypeError, ValueError) as err:
        raise NotApplicable(f"Flat^Q is defined for two-layer bias-free ReLU networks: {err}") from None
    if a.ndim != 1:
        raise NotApplicable("Flat^Q is derived for one output")
    if not isinstance(point.x, torch.Tensor):
        raise NotApplicable("Flat^Q is derived for a network of one input tensor, not keyword inputs")
    x = point.x.to(torch.float64).reshape(point.x.shape[0], -1)
    return 2.0 * float(
        quotient_flatness(a.to(torch.float64), W.to(torch.float64), x, point.y.to(torch.float64).reshape(-1))
    )


def _riemannian_sharpness_at(point: LossPoint, *, fisher: str = "true") -> float:
    if fisher not in ("true", "diagonal"):
        raise ValueError(f"fisher must be 'true' or 'diagonal', got {fisher!r}")
    H, F = point.hessian(), point.fisher()
    if fisher == "true":
        return fisher_riemannian_sharpness_from_matrices(H, F).value
    diagonal = np.diag(F)
    seen = diagonal > 0
    if not seen.any():
        raise ValueError("the Fisher is zero: there is no metric to measure the Hessian in")
    blind = ~seen
    if blind.any() and np.abs(H[blind]).max() > 1e-12 * np.abs(H).max():
        raise ValueError(
            "the Hessian has curvature in parameters the Fisher does not see (zero Fisher "
            "diagonal): the diagonal-Fisher sharpness is infinite there"
        )
    if seen.sum() < 2:
        return float(H[seen][:, seen].item() / diagonal[seen].item())
    return diagonal_fisher_sharpness_from_matrices(H[np.ix_(seen, seen)], diagonal[seen])


def _model_wolkowicz_styan_bound_at(point: LossPoint) -> float:
    return wolkowicz_styan_bound(point.hessian())

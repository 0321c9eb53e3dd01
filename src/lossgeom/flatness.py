"""Flatness and sharpness measures, as functions of curvature matrices and losses.

The home of the book's flatness measures; each says what it reads from the loss and the
chapter that derives it (``chapters/ch12_high_dimensions`` for the ones here):

- the Wolkowicz-Styan bound (Wolkowicz and Styan 1980): for a real symmetric ``n x n``
  matrix ``A`` with ``m = tr(A) / n`` and ``s^2 = tr(A^2) / n - m^2``,
  ``lambda_max(A) <= m + s sqrt(n - 1)`` (:func:`wolkowicz_styan_bound`, also from the two
  traces alone, :func:`wolkowicz_styan_from_traces`); its gradient in ``A``
  (:func:`wolkowicz_styan_gradient`) and, through the Hessian, in the parameters
  (:func:`hessian_wolkowicz_styan`);
- Fisher-Riemannian sharpness: the largest eigenvalue of the Hessian measured in the
  Fisher metric, ``sup_v v^T H v / v^T F v`` over directions the Fisher sees
  (:func:`fisher_riemannian_sharpness`), and the same with a diagonal estimate of the
  Fisher in place of ``F`` (:func:`diagonal_fisher_sharpness`).

Matrices are float64 torch tensors (or arrays); results are Python floats unless a
function says it stays differentiable.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
import torch

from lossgeom._checks import finite_tensor, positive, positive_int
from lossgeom.curvature import flatten_params

Params = Mapping[str, torch.Tensor]


def _symmetric(name: str, matrix, tol: float = 1e-10) -> torch.Tensor:
    A = finite_tensor(name, matrix)
    if A.dtype != torch.float64:
        A = A.to(torch.float64)
    if A.ndim != 2 or A.shape[0] != A.shape[1] or A.shape[0] < 2:
        raise ValueError(f"{name} must be a square matrix of size >= 2, got shape {tuple(A.shape)}")
    scale = float(A.abs().max())
    if float((A - A.T).abs().max()) > tol * max(scale, 1e-300):
        raise ValueError(f"{name} must be symmetric (the bound is about real symmetric matrices)")
    return A


def _moments(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(m, s)`` without checks, differentiable (also inside torch.func transforms)."""
    n = A.shape[0]
    m = torch.diagonal(A).sum() / n
    second = (A * A).sum() / n  # tr(A^2) for symmetric A
    return m, torch.sqrt(torch.clamp(second - m * m, min=0.0))


def spectral_moments(matrix) -> tuple[float, float]:
    """``m = tr(A) / n`` and ``s = sqrt(tr(A^2) / n - m^2)``: mean and spread of the spectrum."""
    m, s = _moments(_symmetric("matrix", matrix))
    return float(m), float(s)


def wolkowicz_styan_from_traces(trace: float, trace_of_square: float, n: int) -> float:
    """``m + s sqrt(n - 1)`` from ``tr(A)``, ``tr(A^2)`` and the size ``n`` (no matrix needed).

    Both traces can be estimated matrix-free (Hutchinson: ``E[z^T A z]`` and
    ``E[|A z|^2]``), which is what makes the bound cheap for a large Hessian.

    Raises:
        ValueError: if ``n < 2`` or the traces are inconsistent (``tr(A^2) < tr(A)^2 / n``).
    """
    n = positive_int("n", n)
    if n < 2:
        raise ValueError(f"n must be >= 2, got {n}")
    trace, trace_of_square = float(trace), float(trace_of_square)
    m = trace / n
    variance = trace_of_square / n - m * m
    if variance < -1e-12 * max(1.0, trace_of_square / n):
        raise ValueError(f"trace_of_square must be >= trace^2 / n (Cauchy-Schwarz), got {trace_of_square} "
                         f"with trace {trace} and n {n}")
    return m + math.sqrt(max(variance, 0.0)) * math.sqrt(n - 1)


def wolkowicz_styan_bound(matrix) -> float:
    """The Wolkowicz-Styan upper bound ``lambda_max(A) <= m + s sqrt(n - 1)`` (chapter ``ch12_high_dimensions``).

    With ``x_i = lambda_i - m``: ``sum x_i = 0`` and ``sum x_i^2 = n s^2``; Cauchy-Schwarz on
    the other ``n - 1`` deviations gives ``x_max^2 <= (n - 1)(n s^2 - x_max^2)``, that is
    ``x_max <= s sqrt(n - 1)``. Equality holds when the other ``n - 1`` eigenvalues coincide.
    """
    A = _symmetric("matrix", matrix)
    m, s = _moments(A)
    return float(m + s * math.sqrt(A.shape[0] - 1))


def wolkowicz_styan_gradient(matrix) -> torch.Tensor:
    """``d/dA (m + s sqrt(n - 1)) = I / n + sqrt(n - 1) (A - m I) / (n s)`` (chapter ``ch12_high_dimensions``).

    From ``dm/dA = I / n`` and ``d tr(A^2) / dA = 2 A``, so ``ds/dA = (A - m I) / (n s)``.

    Raises:
        ValueError: where ``s = 0`` (all eigenvalues equal), where the bound is not
            differentiable.
    """
    A = _symmetric("matrix", matrix)
    n = A.shape[0]
    m, s = _moments(A)
    if float(s) <= 1e-14 * max(1.0, float(A.abs().max())):
        raise ValueError("the bound is not differentiable where all eigenvalues coincide (s = 0)")
    eye = torch.eye(n, dtype=torch.float64)
    return eye / n + math.sqrt(n - 1) * (A - m * eye) / (n * s)


def hessian_wolkowicz_styan(loss_fn: Callable[[dict[str, torch.Tensor]], torch.Tensor],
                            params: Params) -> tuple[float, dict[str, torch.Tensor]]:
    """``WS(theta) = m(H) + s(H) sqrt(n - 1)`` of the loss Hessian ``H(theta)`` and its gradient.

    The gradient ``dWS/dtheta = sum_ij (dWS/dH_ij) dH_ij/dtheta`` needs third derivatives of
    the loss; it is taken by reverse-mode autograd through ``torch.func.hessian`` (the
    closed form of the seed's HSR regulariser is this chain rule written out for one
    architecture). Small models only: the dense Hessian is formed.

    Returns:
        ``(value, gradient)`` with the gradient as a dict shaped like ``params``.
    """
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable as loss_fn(params) -> scalar tensor")
    flat, unflatten = flatten_params(params)
    flat = flat.detach().to(torch.float64)
    n = flat.numel()
    if n < 2:
        raise ValueError("params must hold at least two parameters")

    def bound_at(vector: torch.Tensor) -> torch.Tensor:
        H = torch.func.hessian(lambda v: loss_fn(unflatten(v)).reshape(()))(vector)
        m, s = _moments(0.5 * (H + H.T))
        return m + s * math.sqrt(n - 1)

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*", category=DeprecationWarning)
        grad, value = torch.func.grad_and_value(bound_at)(flat)
    if not torch.isfinite(value) or not torch.isfinite(grad).all():
        raise ValueError("the bound or its gradient is not finite at params")
    return float(value), unflatten(grad.detach())


@dataclass(frozen=True)
class RiemannianSharpness:
    """The Hessian measured in the Fisher metric (chapter ``ch12_high_dimensions``).

    Attributes:
        value: ``max_v v^T H v / v^T F v`` over ``v`` in the range of ``F``: the largest
            eigenvalue of ``F^(+1/2) H F^(+1/2)``.
        trace: the sum of those eigenvalues, ``tr(F^+ H)`` on the range of ``F``.
        rank: the dimension of the range of ``F`` (eigenvalues above the threshold).
        kernel_leakage: ``|H N|_2 / |H|_2`` for an orthonormal basis ``N`` of the kernel of
            ``F``: the curvature in directions the Fisher does not see. The definition is
            a function of the point (invariant under reparametrisation) when this is zero,
            as at a critical point whose Fisher kernel consists of symmetry directions.
    """

    value: float
    trace: float
    rank: int
    kernel_leakage: float


def fisher_riemannian_sharpness(hessian, fisher, rel_threshold: float = 1e-9) -> RiemannianSharpness:
    """Fisher-Riemannian sharpness: the largest eigenvalue of ``H`` in the metric ``F``.

    With ``F = U diag(phi) U^T`` and ``R = U_+ diag(phi_+)^(-1/2)`` over the eigenvalues
    ``phi > rel_threshold * max(phi)``, the value is ``lambda_max(R^T H R)``. Under a
    reparametrisation with invertible Jacobian ``J`` at a critical point, ``H -> J^T H J``
    and ``F -> J^T F J``; the generalised eigenvalues of ``(H, F)`` do not change
    (``det(J^T (H - mu F) J) = det(J)^2 det(H - mu F)``), so neither does the value.

    Raises:
        ValueError: if the matrices are not symmetric of one size, or ``F`` is zero.
    """
    H, F = _symmetric("hessian", hessian), _symmetric("fisher", fisher)
    if H.shape != F.shape:
        raise ValueError(f"hessian and fisher must have the same shape, got {tuple(H.shape)} and {tuple(F.shape)}")
    rel_threshold = positive("rel_threshold", rel_threshold)
    phi, U = np.linalg.eigh(F.numpy())
    if phi[-1] <= 0:
        raise ValueError("fisher must have a positive eigenvalue")
    keep = phi > rel_threshold * phi[-1]
    R = U[:, keep] / np.sqrt(phi[keep])
    mu = np.linalg.eigvalsh(R.T @ H.numpy() @ R)
    kernel = U[:, ~keep]
    h_norm = np.linalg.norm(H.numpy(), 2)
    leakage = float(np.linalg.norm(H.numpy() @ kernel, 2) / h_norm) if kernel.size and h_norm > 0 else 0.0
    return RiemannianSharpness(float(mu[-1]), float(mu.sum()), int(keep.sum()), leakage)


def diagonal_fisher_sharpness(hessian, fisher_diagonal) -> float:
    """``lambda_max(D^(-1/2) H D^(-1/2))`` with ``D`` a diagonal Fisher estimate (chapter ``ch12_high_dimensions``).

    A diagonal reparametrisation ``theta = S psi`` maps ``H -> S H S`` and the Fisher's
    diagonal to ``S D S``, so the value is kept; a non-diagonal ``J`` maps the diagonal of
    ``J^T F J`` to something that is not ``J^T D J``, and the value moves.

    Raises:
        ValueError: if ``fisher_diagonal`` has an entry <= 0 or the wrong length.
    """
    H = _symmetric("hessian", hessian)
    D = finite_tensor("fisher_diagonal", fisher_diagonal).to(torch.float64)
    if D.shape != (H.shape[0],):
        raise ValueError(f"fisher_diagonal must have shape ({H.shape[0]},), got {tuple(D.shape)}")
    if not bool((D > 0).all()):
        raise ValueError("fisher_diagonal must be > 0 everywhere (add damping where a parameter has no Fisher mass)")
    scale = D.rsqrt()
    return float(torch.linalg.eigvalsh(scale[:, None] * H * scale[None, :])[-1])


def hessian_sharpness(loss_fn: Callable[[dict[str, torch.Tensor]], torch.Tensor], params: Params,
                      tol: float = 1e-6, seed: int = 0) -> float:
    """``lambda_max`` of the loss Hessian by Lanczos on Hessian-vector products (the raw sharpness).

    :func:`lossgeom.curvature.top_eigenpairs` of :func:`lossgeom.curvature.hessian_operator`;
    no dense matrix is formed, so it serves networks with thousands of parameters.
    """
    from lossgeom.curvature import hessian_operator, top_eigenpairs

    return float(top_eigenpairs(hessian_operator(loss_fn, params), k=1, tol=positive("tol", tol), seed=seed).values[0])


def scale_to_loss(loss_fn: Callable[[dict[str, torch.Tensor]], torch.Tensor], params: Params, name: str,
                  target: float) -> dict[str, torch.Tensor]:
    """``params`` with ``params[name]`` multiplied by the ``t > 0`` that makes the loss ``target``.

    For a bias-free last layer ``name`` this multiplies every logit by ``t``: the predicted
    classes (and so every accuracy) are kept while the cross-entropy moves monotonically,
    which lets two interpolants be compared at the same training loss. ``t`` is found by
    ``scipy.optimize.brentq`` on ``log t`` in ``[-20, 20]``.

    Raises:
        ValueError: if ``name`` is not a parameter or no ``t`` in ``[e^-20, e^20]`` reaches
            ``target``.
    """
    from scipy.optimize import brentq

    if name not in params:
        raise ValueError(f"name must be one of the parameters {sorted(params)}, got {name!r}")
    target = positive("target", target)

    def scaled(log_t: float) -> dict[str, torch.Tensor]:
        return {**params, name: params[name] * math.exp(log_t)}

    gap = lambda log_t: float(loss_fn(scaled(log_t))) - target
    if gap(-20.0) * gap(20.0) > 0:
        raise ValueError(f"no scale of {name!r} in [e^-20, e^20] brings the loss to target {target}")
    return scaled(brentq(gap, -20.0, 20.0, xtol=1e-12))

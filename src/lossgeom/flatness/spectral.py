r"""Spectral moments of a curvature matrix and the Wolkowicz-Styan bound on its largest eigenvalue.

For a real symmetric :math:`n \times n` matrix :math:`A` with :math:`m = \operatorname{tr}(A) / n`
and :math:`s^2 = \operatorname{tr}(A^2) / n - m^2` (:func:`spectral_moments`),
:math:`\lambda_{\max}(A) \le m + s\sqrt{n - 1}` (Wolkowicz and Styan 1980). One family of
functions computes the bound:

- :func:`wolkowicz_styan_bound`: the bound of a matrix;
- :func:`wolkowicz_styan_bound_from_traces`: the bound from :math:`\operatorname{tr}(A)`,
  :math:`\operatorname{tr}(A^2)` and :math:`n` alone (both traces can be estimated matrix-free);
- :func:`wolkowicz_styan_bound_gradient`: its gradient in :math:`A`;
- :func:`closure_wolkowicz_styan_bound`: the bound of the Hessian of a loss closure
  ``loss_fn(params)`` and its gradient in the parameters;
- :func:`lossgeom.flatness.measures.model_wolkowicz_styan_bound`: the bound of a model's
  loss Hessian, ``(model, loss, data)``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch
from numpy.typing import ArrayLike

from lossgeom._validation import finite_tensor, positive_int
from lossgeom.parameters import flatten_params
from lossgeom.types import Params


def _symmetric(name: str, matrix: ArrayLike, tol: float = 1e-10) -> torch.Tensor:
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


def spectral_moments(matrix: ArrayLike) -> tuple[float, float]:
    """``m = tr(A) / n`` and ``s = sqrt(tr(A^2) / n - m^2)``: mean and spread of the spectrum.

    Args:
        matrix: a finite real symmetric matrix ``A``, ``(n, n)`` with ``n >= 2`` (computed in float64).

    Returns:
        ``(m, s)``, floats.

    Raises:
        ValueError: if ``matrix`` is not square of size >= 2 or not symmetric.
    """
    m, s = _moments(_symmetric("matrix", matrix))
    return float(m), float(s)


def wolkowicz_styan_bound_from_traces(trace: float, trace_of_square: float, n: int) -> float:
    """``m + s sqrt(n - 1)`` from ``tr(A)``, ``tr(A^2)`` and the size ``n`` (no matrix needed).

    Both traces can be estimated matrix-free (Hutchinson: ``E[z^T A z]`` and
    ``E[|A z|^2]``), which is what makes the bound cheap for a large Hessian.

    Args:
        trace: ``tr(A)``.
        trace_of_square: ``tr(A^2)``.
        n: the size of ``A``, an integer >= 2.

    Returns:
        ``m + s sqrt(n - 1)`` with ``m = tr(A) / n`` and ``s^2 = tr(A^2) / n - m^2``, a float.

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
        raise ValueError(
            f"trace_of_square must be >= trace^2 / n (Cauchy-Schwarz), got {trace_of_square} "
            f"with trace {trace} and n {n}"
        )
    return m + math.sqrt(max(variance, 0.0)) * math.sqrt(n - 1)


def wolkowicz_styan_bound(matrix: ArrayLike) -> float:
    r"""The Wolkowicz-Styan upper bound :math:`\lambda_{\max}(A) \le m + s\sqrt{n - 1}`.

    With ``x_i = lambda_i - m``: ``sum x_i = 0`` and ``sum x_i^2 = n s^2``; Cauchy-Schwarz on
    the other ``n - 1`` deviations gives ``x_max^2 <= (n - 1)(n s^2 - x_max^2)``, that is
    ``x_max <= s sqrt(n - 1)``. Equality holds when the other ``n - 1`` eigenvalues coincide.

    Args:
        matrix: a finite real symmetric matrix ``A``, ``(n, n)`` with ``n >= 2`` (computed in float64).

    Returns:
        ``m + s sqrt(n - 1)``, a float.

    Raises:
        ValueError: if ``matrix`` is not square of size >= 2 or not symmetric.
    """
    A = _symmetric("matrix", matrix)
    m, s = _moments(A)
    return float(m + s * math.sqrt(A.shape[0] - 1))


def wolkowicz_styan_bound_gradient(matrix: ArrayLike) -> torch.Tensor:
    r""":math:`\frac{\partial}{\partial A}(m + s\sqrt{n - 1}) = I / n + \sqrt{n - 1}\,(A - m I) / (n s)`.

    From ``dm/dA = I / n`` and ``d tr(A^2) / dA = 2 A``, so ``ds/dA = (A - m I) / (n s)``.

    Args:
        matrix: a finite real symmetric matrix ``A``, ``(n, n)`` with ``n >= 2`` (computed in float64).

    Returns:
        the gradient, a float64 tensor of shape ``(n, n)``.

    Raises:
        ValueError: where ``s = 0`` (all eigenvalues equal), where the bound is not
            differentiable; if ``matrix`` is not square of size >= 2 or not symmetric.
    """
    A = _symmetric("matrix", matrix)
    n = A.shape[0]
    m, s = _moments(A)
    if float(s) <= 1e-14 * max(1.0, float(A.abs().max())):
        raise ValueError("the bound is not differentiable where all eigenvalues coincide (s = 0)")
    eye = torch.eye(n, dtype=torch.float64)
    return eye / n + math.sqrt(n - 1) * (A - m * eye) / (n * s)


def closure_wolkowicz_styan_bound(
    loss_fn: Callable[[dict[str, torch.Tensor]], torch.Tensor], params: Params
) -> tuple[float, dict[str, torch.Tensor]]:
    r""":math:`WS(\theta) = m(H) + s(H)\sqrt{n - 1}` of a loss closure's Hessian :math:`H(\theta)`, and its gradient.

    The gradient :math:`\partial WS / \partial\theta = \sum_{ij} (\partial WS / \partial H_{ij})\,
    \partial H_{ij} / \partial\theta` needs third derivatives of the loss; it is taken by
    reverse-mode autograd through ``torch.func.hessian`` (the closed form of a Hessian
    spectral regulariser is this chain rule written out for one architecture). Small models
    only: the dense Hessian is formed.

    Args:
        loss_fn: the loss as a function of a parameter dict, ``loss_fn(params) -> scalar tensor``.
        params: the parameter dict ``theta`` (at least two parameters; computed in float64).

    Returns:
        ``(value, gradient)`` with the gradient as a dict shaped like ``params``.

    Raises:
        ValueError: if ``params`` holds fewer than two parameters, or the bound or its gradient
            is not finite.
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

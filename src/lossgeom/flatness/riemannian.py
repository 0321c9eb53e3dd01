"""Sharpness in the Fisher metric.

The chapter *Flatness in high dimensions, and other measures* (``ch12_high_dimensions``)
measures the Hessian ``H`` in the Fisher metric ``F``: :func:`fisher_riemannian_sharpness`
is ``sup_v v^T H v / v^T F v`` over directions the Fisher sees (a
:class:`RiemannianSharpness`), :func:`diagonal_fisher_sharpness` the same with a diagonal
estimate of ``F``. The Euclidean ``lambda_max`` it is set against is
:func:`lossgeom.curvature.sharpness.lambda_max` (closure form
:func:`lossgeom.curvature.sharpness.closure_lambda_max`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lossgeom._validation import finite_tensor, positive
from lossgeom.flatness.spectral import _symmetric


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

    Args:
        hessian: the symmetric Hessian ``H``, ``(n, n)``.
        fisher: the symmetric positive semi-definite Fisher ``F``, ``(n, n)``.
        rel_threshold: the eigenvalues of ``F`` above ``rel_threshold * max(phi)`` span its range (positive).

    Returns:
        a :class:`RiemannianSharpness` (value, trace, rank and kernel leakage).

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

    Args:
        hessian: the symmetric Hessian ``H``, ``(n, n)``.
        fisher_diagonal: the diagonal ``D`` of a Fisher estimate, ``(n,)``, every entry > 0.

    Returns:
        ``lambda_max(D^(-1/2) H D^(-1/2))``, a float.

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

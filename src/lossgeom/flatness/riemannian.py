r"""Sharpness in the Fisher metric, from the Hessian and Fisher matrices.

The Hessian :math:`H` measured in the Fisher metric :math:`F`:
:func:`fisher_riemannian_sharpness_from_matrices` is :math:`\sup_v v^\top H v / v^\top F v`
over directions the Fisher sees (a :class:`RiemannianSharpness`),
:func:`diagonal_fisher_sharpness_from_matrices` the same with a diagonal estimate of
:math:`F`. Both take matrices; the measure of a model is
:func:`lossgeom.flatness.measures.riemannian_sharpness` ``(model, loss, data)``. The
Euclidean :math:`\lambda_{\max}` it is set against is :func:`lossgeom.curvature.lambda_max`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import ArrayLike
from torch import nn

from lossgeom._validation import finite_tensor, positive
from lossgeom.flatness.spectral import _symmetric


@dataclass(frozen=True)
class RiemannianSharpness:
    r"""The Hessian measured in the Fisher metric (Ahmed et al. 2026).

    Attributes:
        value: :math:`\max_v v^\top H v / v^\top F v` over :math:`v` in the range of
            :math:`F`: the largest eigenvalue of :math:`F^{+1/2} H F^{+1/2}`.
        trace: the sum of those eigenvalues, :math:`\operatorname{tr}(F^+ H)` on the range of :math:`F`.
        rank: the dimension of the range of :math:`F` (eigenvalues above the threshold).
        kernel_leakage: :math:`\lVert H N \rVert_2 / \lVert H \rVert_2` for an orthonormal
            basis :math:`N` of the kernel of :math:`F`: the curvature in directions the Fisher
            does not see. The definition is a function of the point (invariant under
            reparametrisation) when this is zero, as at a critical point whose Fisher kernel
            consists of symmetry directions.
    """

    value: float
    trace: float
    rank: int
    kernel_leakage: float


def _not_a_model(name: str, value: object, measure: str) -> None:
    if isinstance(value, nn.Module):
        raise TypeError(
            f"{name} must be a matrix, got a {type(value).__name__}; for a model use "
            f"lossgeom.flatness.riemannian_sharpness(model, loss, data{measure})"
        )


def fisher_riemannian_sharpness_from_matrices(
    hessian: ArrayLike, fisher: ArrayLike, *, rel_threshold: float = 1e-9
) -> RiemannianSharpness:
    r"""Fisher-Riemannian sharpness of given matrices: the largest eigenvalue of :math:`H` in the metric :math:`F`.

    With :math:`F = U \operatorname{diag}(\phi) U^\top` and :math:`R = U_+
    \operatorname{diag}(\phi_+)^{-1/2}` over the eigenvalues :math:`\phi >` ``rel_threshold``
    :math:`\cdot \max \phi`, the value is :math:`\lambda_{\max}(R^\top H R)`. Under a
    reparametrisation with invertible Jacobian :math:`J` at a critical point, :math:`H \to
    J^\top H J` and :math:`F \to J^\top F J`; the generalised eigenvalues of :math:`(H, F)`
    do not change (:math:`\det(J^\top (H - \mu F) J) = \det(J)^2 \det(H - \mu F)`), so neither
    does the value.

    With :math:`H = \operatorname{diag}(2, 3)` and :math:`F = \operatorname{diag}(1, 4)` the
    generalised eigenvalues are :math:`2` and :math:`3/4`:

    >>> import torch
    >>> from lossgeom.flatness import fisher_riemannian_sharpness_from_matrices
    >>> H = torch.diag(torch.tensor([2.0, 3.0], dtype=torch.float64))
    >>> F = torch.diag(torch.tensor([1.0, 4.0], dtype=torch.float64))
    >>> result = fisher_riemannian_sharpness_from_matrices(H, F)
    >>> round(result.value, 12), round(result.trace, 12), result.rank
    (2.0, 2.75, 2)

    Args:
        hessian: the symmetric Hessian :math:`H`, ``(n, n)``.
        fisher: the symmetric positive semi-definite Fisher :math:`F`, ``(n, n)``.
        rel_threshold: the eigenvalues of :math:`F` above ``rel_threshold`` times the largest
            span its range (positive).

    Returns:
        a :class:`RiemannianSharpness` (value, trace, rank and kernel leakage).

    Raises:
        TypeError: if ``hessian`` or ``fisher`` is a model rather than a matrix.
        ValueError: if the matrices are not symmetric of one size, or :math:`F` is zero.
    """
    _not_a_model("hessian", hessian, "")
    _not_a_model("fisher", fisher, "")
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


def diagonal_fisher_sharpness_from_matrices(hessian: ArrayLike, fisher_diagonal: ArrayLike) -> float:
    r""":math:`\lambda_{\max}(D^{-1/2} H D^{-1/2})` of given matrices, :math:`D` a diagonal Fisher estimate.

    A diagonal reparametrisation :math:`\theta = S \psi` maps :math:`H \to S H S` and the
    Fisher's diagonal to :math:`S D S`, so the value is kept; a non-diagonal :math:`J` maps
    the diagonal of :math:`J^\top F J` to something that is not :math:`J^\top D J`, and the
    value moves.

    Args:
        hessian: the symmetric Hessian :math:`H`, ``(n, n)``.
        fisher_diagonal: the diagonal :math:`D` of a Fisher estimate, ``(n,)``, every entry > 0.

    Returns:
        :math:`\lambda_{\max}(D^{-1/2} H D^{-1/2})`, a float.

    Raises:
        TypeError: if ``hessian`` is a model rather than a matrix.
        ValueError: if ``fisher_diagonal`` has an entry <= 0 or the wrong length.
    """
    _not_a_model("hessian", hessian, ', fisher="diagonal"')
    H = _symmetric("hessian", hessian)
    D = finite_tensor("fisher_diagonal", fisher_diagonal).to(torch.float64)
    if D.shape != (H.shape[0],):
        raise ValueError(f"fisher_diagonal must have shape ({H.shape[0]},), got {tuple(D.shape)}")
    if not bool((D > 0).all()):
        raise ValueError("fisher_diagonal must be > 0 everywhere (add damping where a parameter has no Fisher mass)")
    scale = D.rsqrt()
    return float(torch.linalg.eigvalsh(scale[:, None] * H * scale[None, :])[-1])

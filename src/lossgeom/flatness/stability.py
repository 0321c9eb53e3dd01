r"""Linear stability of SGD on the active subspace of a Jacobian (Wu et al. 2018; Miyagawa 2026).

The one-step mean-square stability operator :math:`\mathbb E[M_I^2] = I - 2\eta \bar A +
\eta^2 \mathbb E[A_I^2]` of linearised SGD, :math:`M_I = I - \eta A_I` with :math:`A_I =
\frac1B \sum_{i \in I} g_i g_i^\top`, on the
active subspace of the per-example gradients ``g_i`` (:func:`active_jacobian`,
:func:`batch_moments`, :func:`stability_operator`, :func:`stability_lambda_max`,
:func:`critical_learning_rate`, :func:`stable_pairs`), for batches drawn with or without
replacement. The functions of a Jacobian apply to any model; :func:`stable_pair_grid`
applies them to the quotient gradients of two-layer ReLU networks
(:func:`lossgeom.flatness.relu_quotient.quotient_jacobian`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.linalg
import torch
from numpy.typing import ArrayLike

from lossgeom._validation import finite_tensor, positive, positive_int
from lossgeom.flatness.relu_quotient import _checked, quotient_jacobian


def active_jacobian(jacobian: ArrayLike, rel_threshold: float = 1e-6) -> np.ndarray:
    """The rows of ``jacobian`` (n, p) in an orthonormal basis of its row space: (n, k).

    The basis is the right singular vectors with singular value above
    ``rel_threshold * sigma_1`` (the seed's threshold is ``1e-6 sigma_1``). Every per-batch
    Hessian ``A_I`` acts on this subspace and vanishes on its complement, where the
    linearised dynamics is the identity.

    Args:
        jacobian: the per-example gradients ``g_i`` as rows, a finite ``(n, p)`` tensor, ``n >= 1``.
        rel_threshold: singular values above ``rel_threshold * sigma_1`` span the active subspace (positive).

    Returns:
        the active Jacobian, an ``(n, k)`` array with ``k`` the number of singular values kept.

    Raises:
        ValueError: if ``jacobian`` is not ``(n, p)`` with ``n >= 1``, or is zero.
    """
    J = _jacobian(jacobian)
    thr = positive("rel_threshold", rel_threshold)
    _, sigma, Vt = np.linalg.svd(J, full_matrices=False)
    if sigma[0] == 0:
        raise ValueError("jacobian is zero: there is no active subspace")
    return J @ Vt[sigma > thr * sigma[0]].T


def _jacobian(jacobian: ArrayLike) -> np.ndarray:
    J = finite_tensor("jacobian", jacobian).detach().numpy()
    if J.ndim != 2 or J.shape[0] == 0:
        raise ValueError(f"jacobian must have shape (n, p) with n >= 1, got {J.shape}")
    return J


def _batch_size(batch_size: int, n: int) -> int:
    b = positive_int("batch_size", batch_size)
    if b > n:
        raise ValueError(f"batch_size must be <= n = {n} (the number of examples), got {b}")
    return b


def batch_moments(jacobian: ArrayLike, batch_size: int, replacement: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``(A_bar, E[A_I^2])`` for ``A_I = (1/B) sum_{i in I} g_i g_i^T`` over random batches I.

    With ``S = (1/n) sum_i ||g_i||^2 g_i g_i^T``: drawn with replacement,
    ``E[A_I^2] = S / B + (1 - 1/B) A_bar^2``; without replacement (a uniform B-subset),
    ``E[A_I^2] = (n - B) / (B (n - 1)) S + n (B - 1) / (B (n - 1)) A_bar^2``.

    Args:
        jacobian: the per-example gradients ``g_i`` as rows, a finite ``(n, p)`` tensor, ``n >= 1``.
        batch_size: ``B``, a positive integer ``<= n``.
        replacement: whether batches are drawn with replacement (else a uniform B-subset).

    Returns:
        ``(A_bar, E[A_I^2])``, two ``(p, p)`` arrays, ``A_bar = J^T J / n``.

    Raises:
        ValueError: if ``jacobian`` is not ``(n, p)`` with ``n >= 1``, or ``batch_size > n``.
    """
    J = _jacobian(jacobian)
    n = J.shape[0]
    b = _batch_size(batch_size, n)
    A_bar = J.T @ J / n
    S = (J * (J * J).sum(1, keepdims=True)).T @ J / n
    if replacement:
        return A_bar, S / b + (1 - 1 / b) * A_bar @ A_bar
    if n == 1:
        return A_bar, A_bar @ A_bar
    return A_bar, (n - b) / (b * (n - 1)) * S + n * (b - 1) / (b * (n - 1)) * A_bar @ A_bar


def stability_operator(
    jacobian: ArrayLike, learning_rate: float, batch_size: int, replacement: bool = True
) -> np.ndarray:
    """``E[M_I^2] = I - 2 eta A_bar + eta^2 E[A_I^2]`` with ``M_I = I - eta A_I`` (one SGD step, linearised).

    Args:
        jacobian: the per-example gradients ``g_i`` as rows, a finite ``(n, p)`` tensor, ``n >= 1``.
        learning_rate: ``eta`` (positive).
        batch_size: ``B``, a positive integer ``<= n``.
        replacement: whether batches are drawn with replacement (else a uniform B-subset).

    Returns:
        ``E[M_I^2]``, a symmetric ``(p, p)`` array.
    """
    eta = positive("learning_rate", learning_rate)
    A_bar, second = batch_moments(jacobian, batch_size, replacement)
    return np.eye(A_bar.shape[0]) - 2 * eta * A_bar + eta**2 * second


def stability_lambda_max(jacobian: ArrayLike, learning_rate: float, batch_size: int, replacement: bool = True) -> float:
    """``lambda_max(E[M_I^2])``; one-step mean-square stability is ``lambda_max <= 1``.

    Args:
        jacobian: the per-example gradients ``g_i`` as rows, a finite ``(n, p)`` tensor, ``n >= 1``.
        learning_rate: ``eta`` (positive).
        batch_size: ``B``, a positive integer ``<= n``.
        replacement: whether batches are drawn with replacement (else a uniform B-subset).

    Returns:
        the largest eigenvalue of :func:`stability_operator`, a float.
    """
    return float(np.linalg.eigvalsh(stability_operator(jacobian, learning_rate, batch_size, replacement))[-1])


def critical_learning_rate(jacobian: ArrayLike, batch_size: int, replacement: bool = True) -> float:
    """The largest stable ``eta``: ``2 / mu_max`` with ``E[A_I^2] v = mu A_bar v`` (generalised eigenproblem).

    ``v^T E[M_I^2] v <= v^T v`` for all v is ``eta v^T E[A_I^2] v <= 2 v^T A_bar v``, so the
    stable learning rates form the interval ``(0, 2 / mu_max]``. ``jacobian`` must be an
    active Jacobian (:func:`active_jacobian`), so that ``A_bar`` is positive definite.

    Args:
        jacobian: an active Jacobian, a finite ``(n, k)`` tensor (rows ``g_i``), ``n >= 1``.
        batch_size: ``B``, a positive integer ``<= n``.
        replacement: whether batches are drawn with replacement (else a uniform B-subset).

    Returns:
        ``2 / mu_max``, a float.

    Raises:
        ValueError: if ``A_bar`` is singular (the Jacobian is not an active one).
    """
    A_bar, second = batch_moments(jacobian, batch_size, replacement)
    eig_A = np.linalg.eigvalsh(A_bar)
    if eig_A[0] <= 1e-12 * eig_A[-1]:
        raise ValueError("A_bar is singular: pass active_jacobian(jacobian) so the subspace is the active one")
    return float(2.0 / scipy.linalg.eigh(second, A_bar, eigvals_only=True)[-1])


def stable_pairs(
    jacobian: ArrayLike, learning_rates: Sequence[float], batch_sizes: Sequence[int], replacement: bool = True
) -> np.ndarray:
    """Which ``(B, eta)`` are one-step mean-square stable: ``lambda_max(E[M_I^2]) <= 1``.

    Returns a boolean array of shape ``(len(batch_sizes), len(learning_rates))``; pass an
    active Jacobian (:func:`active_jacobian`) so that the subspace is the seed's.

    Args:
        jacobian: the per-example gradients ``g_i`` as rows, a finite ``(n, p)`` tensor, ``n >= 1``.
        learning_rates: the ``eta`` to test (each positive).
        batch_sizes: the ``B`` to test (each a positive integer ``<= n``).
        replacement: whether batches are drawn with replacement (else a uniform B-subset).

    Returns:
        a boolean array ``(len(batch_sizes), len(learning_rates))``, entry ``[b, e]`` true when
        ``lambda_max(E[M_I^2]) <= 1`` at ``batch_sizes[b]`` and ``learning_rates[e]``.
    """
    return np.array(
        [[stability_lambda_max(jacobian, eta, b, replacement) <= 1.0 for eta in learning_rates] for b in batch_sizes]
    )


def stable_pair_grid(
    a: torch.Tensor,
    W: torch.Tensor,
    x: torch.Tensor,
    learning_rates: Sequence[float],
    batch_sizes: Sequence[int],
    replacement: bool = True,
) -> np.ndarray:
    """:func:`stable_pairs` of every model in a batch, from its weights: ``(..., len(B), len(eta))``.

    Each model's quotient Jacobian on ``x`` is cut to its active subspace
    (:func:`active_jacobian`, threshold ``1e-6 sigma_1``) before the test.

    Args:
        a: output weights ``(..., m)`` (one output; leading dimensions batch models).
        W: input weights ``(..., m, d)``.
        x: inputs ``(n, d)``.
        learning_rates: the ``eta`` to test (each positive).
        batch_sizes: the ``B`` to test (each a positive integer ``<= n``).
        replacement: whether batches are drawn with replacement (else a uniform B-subset).

    Returns:
        a boolean array ``(..., len(batch_sizes), len(learning_rates))``.

    Raises:
        ValueError: for a k-output network, or if the shapes do not match.
    """
    a, W, vector = _checked(a, W)
    if vector:
        raise ValueError("stable_pair_grid needs one-output networks (a of shape (..., m))")
    jacobians = quotient_jacobian(a, W, x)
    flat = jacobians.reshape(-1, *jacobians.shape[-2:])
    grids = [stable_pairs(active_jacobian(J), learning_rates, batch_sizes, replacement) for J in flat]
    return np.stack(grids).reshape(*jacobians.shape[:-2], len(batch_sizes), len(learning_rates))

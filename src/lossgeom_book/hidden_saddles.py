"""What a random plane shows: how often a landscape picture through a saddle shows it.

``chapters/ch07_landscape_pictures`` derives :func:`saddle_visibility_probability` and
checks it against sampled planes (:func:`random_plane_hessians`,
:func:`shows_negative_curvature`); :func:`lossgeom.landscape.closure_projected_hessian` gives the
2 x 2 curvature of an actual slice.
"""

from __future__ import annotations

import math

import numpy as np

from lossgeom_book.checks import as_real, finite_array, positive, positive_int


def saddle_visibility_probability(n: int, positive_eigenvalue: float, negative_eigenvalue: float) -> float:
    """P(a uniformly random 2-D plane contains a direction of negative curvature).

    For a Hessian on R^n with n - 1 eigenvalues ``lambda = positive_eigenvalue > 0`` and
    one eigenvalue ``-mu = negative_eigenvalue < 0``, a plane contains a unit u with
    u^T H u < 0 iff the squared cosine between the negative eigenvector and the plane
    exceeds lambda / (lambda + mu); that squared cosine is Beta(1, (n - 2)/2), so

        P = (mu / (lambda + mu)) ** ((n - 2) / 2)

    (``chapters/ch07_landscape_pictures`` derives it with sympy). Raw Gaussian and
    orthonormalised planes give the same answer (Sylvester's law of inertia).
    """
    n = positive_int("n", n)
    if n < 2:
        raise ValueError(f"n must be >= 2 (a plane needs two dimensions), got {n}")
    lam = positive("positive_eigenvalue", positive_eigenvalue)
    mu = as_real("negative_eigenvalue", negative_eigenvalue)
    if mu >= 0:
        raise ValueError(f"negative_eigenvalue must be < 0, got {mu}")
    mu = -mu
    return math.exp((n - 2) / 2 * math.log(mu / (lam + mu)))


def random_plane_hessians(hessian, n_planes: int, seed: int) -> np.ndarray:
    """Projected Hessians G^T H G of ``n_planes`` raw Gaussian planes, shape (n_planes, 2, 2).

    Each plane is spanned by two i.i.d. N(0, I) vectors (the columns of G) drawn with
    ``numpy.random.default_rng(seed)``; the 2 x 2 matrix is the curvature of the slice
    at its centre, (s, t) -> 1/2 [s t] G^T H G [s t]^T. ``hessian`` is either a
    symmetric (n, n) matrix or its n eigenvalues (a 1-D array): since V^T G is again a
    matrix of i.i.d. N(0, 1) entries for orthogonal V, sampling G in the eigenbasis
    gives the same distribution of G^T H G at O(n) rather than O(n^2) cost per plane.
    """
    H = finite_array("hessian", hessian)
    n_planes = positive_int("n_planes", n_planes)
    if H.ndim == 1:
        if H.shape[0] < 2:
            raise ValueError(f"hessian eigenvalues must number n >= 2, got {H.shape[0]}")
        G = np.random.default_rng(seed).standard_normal((n_planes, H.shape[0], 2))
        return np.einsum("pia,i,pib->pab", G, H, G, optimize=True)
    if H.ndim != 2 or H.shape[0] != H.shape[1] or H.shape[0] < 2:
        raise ValueError(f"hessian must be a square (n, n) matrix or n eigenvalues with n >= 2, got shape {H.shape}")
    if not np.allclose(H, H.T, rtol=1e-12, atol=1e-12 * max(1.0, float(np.abs(H).max()))):
        raise ValueError("hessian must be symmetric")
    G = np.random.default_rng(seed).standard_normal((n_planes, H.shape[0], 2))
    return np.einsum("pia,ij,pjb->pab", G, H, G, optimize=True)


def shows_negative_curvature(projected) -> np.ndarray:
    """Whether each 2 x 2 projected Hessian has a negative eigenvalue (the plane shows a saddle).

    For a symmetric 2 x 2 matrix: det < 0 (one negative eigenvalue) or det >= 0 with
    trace < 0 (two). ``projected`` has shape (2, 2) or (m, 2, 2).
    """
    M = finite_array("projected", projected)
    if M.shape[-2:] != (2, 2):
        raise ValueError(f"projected must have shape (2, 2) or (m, 2, 2), got {M.shape}")
    det = M[..., 0, 0] * M[..., 1, 1] - M[..., 0, 1] * M[..., 1, 0]
    return (det < 0) | ((det >= 0) & (M[..., 0, 0] + M[..., 1, 1] < 0))

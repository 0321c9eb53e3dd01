r"""Spectra of symmetric operators: extreme eigenpairs, power iteration, densities, summaries.

A curvature matrix is read through its spectrum, seen without forming the matrix:

- :func:`top_eigenpairs`: the k largest (or most negative) eigenpairs by plain Lanczos
  stopped at the fewest products for an eigenvalue tolerance (the default,
  :mod:`lossgeom.curvature.lanczos`) or implicitly restarted Lanczos (ARPACK through
  ``scipy.sparse.linalg.eigsh``, ``method="arpack"``), with the products used, the
  eigenvalue error bounds and the residuals :math:`\lVert A v - \lambda v \rVert`;
- :func:`power_iteration`: the dominant eigenvalue by
  :math:`v \leftarrow A v / \lVert A v \rVert`, the baseline Lanczos is compared with;
- :func:`spectral_density`: stochastic Lanczos quadrature (Lin, Saad and Yang 2016;
  Ghorbani et al. 2019), a Gaussian-smoothed density
  :math:`\phi(x) = \frac{1}{n} \sum_i \mathcal{N}(x; \lambda_i, \sigma^2)`;
  :func:`dense_spectral_density` is the same density from all eigenvalues;
- :func:`spectrum_summary`: largest, most negative, trace, negative mass and a restricted
  condition number of a full spectrum.

Every function takes a curvature operator, a NumPy array or torch tensor (checked to be
symmetric), or a scipy ``LinearOperator`` or curvlinops operator (assumed symmetric); see
:func:`lossgeom.curvature.factory.as_operator`. For a model, build its operator first:
``top_eigenpairs(hessian_operator(model, loss, data))``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import ArrayLike
from scipy.linalg import eigh_tridiagonal
from scipy.sparse.linalg import ArpackError, LinearOperator, eigsh
from tqdm import tqdm

from lossgeom._validation import finite_array, positive, positive_int
from lossgeom.curvature.base import CurvatureOperator, OperatorLike
from lossgeom.curvature.factory import as_operator
from lossgeom.curvature.lanczos import lanczos_eigenpairs, start_vector
from lossgeom.progress import advance_to, progress_bar

#: the eigensolvers of :func:`top_eigenpairs`
EIGENSOLVERS = ("lanczos", "arpack")


@dataclass(frozen=True)
class EigenResult:
    """Extreme eigenpairs of a symmetric operator and what they cost.

    Attributes:
        values: eigenvalues, descending for ``which="largest"``, ascending for ``"smallest"``.
        vectors: (n, k) orthonormal eigenvectors, column j for ``values[j]``.
        n_hvp: products the eigensolver used (the k residual checks excluded).
        residuals: ||A v_j - lambda_j v_j|| for each pair, computed by one more product
            of the k vectors (k products, not in ``n_hvp``).
        residual_bounds: the residual bound of each pair, without extra products: for
            ``"lanczos"`` the Lanczos bound ``|beta_m s_{m,j}|`` (see
            :mod:`lossgeom.curvature.lanczos`); for ``"arpack"`` ARPACK's acceptance test
            ``tol * max(eps^(2/3), |lambda_j|)``, which its own Ritz estimates met. ``None``
            when built by hand.
        error_bounds: what each eigenvalue is guaranteed to, ``|lambda_j - theta_j|``: for
            ``"lanczos"`` ``min(r, r^2 / gap)`` with the gap read from the Ritz values, ``r``
            where it is not resolved (the default stop accepts a pair once this is at most
            ``tol |lambda_j|``); for ``"arpack"`` and power iteration the residual bound
            (a symmetric matrix has an eigenvalue within ``r`` of ``theta``). ``None`` when
            built by hand.
        method: the eigensolver, one of ``EIGENSOLVERS``, or ``"power"`` for
            :func:`power_iteration`.
        converged: whether every pair met the tolerance (ARPACK raises otherwise; Lanczos
            returns ``False`` when ``max_hvp`` ran out first, power iteration when
            ``max_iter`` did).
    """

    values: np.ndarray
    vectors: np.ndarray
    n_hvp: int
    residuals: np.ndarray
    residual_bounds: np.ndarray | None = None
    method: str = "lanczos"
    converged: bool = True
    error_bounds: np.ndarray | None = None


def top_eigenpairs(
    operator: OperatorLike,
    k: int = 1,
    which: str = "largest",
    tol: float = 1e-10,
    seed: int = 0,
    ncv: int | None = None,
    *,
    method: str = "lanczos",
    v0: ArrayLike | None = None,
    max_hvp: int | None = None,
    stop: str = "gap",
    progress: bool | None = None,
) -> EigenResult:
    r"""The k largest (or smallest, i.e. most negative) eigenpairs by Lanczos.

    ``method="lanczos"`` (the default): plain Lanczos with partial reorthogonalisation in
    the operator's dtype, :func:`lossgeom.curvature.lanczos.lanczos_eigenpairs`, which tests
    its stop after every product and so takes the fewest products for ``tol`` (at most
    ``max_hvp``). With ``stop="gap"`` (the default) ``tol`` is on the eigenvalue: a pair
    is accepted once its error bound :math:`\min(r, r^2/\mathrm{gap})` is at most
    :math:`\mathrm{tol}\, |\lambda|` (``error_bounds``); the vectors are then accurate to
    about :math:`\sqrt{\mathrm{tol}}`. ``stop="residual"`` asks for a residual
    :math:`r \le \mathrm{tol}\, |\lambda|`, which makes the vectors accurate too.

    ``method="arpack"``: implicitly restarted Lanczos (Lehoucq, Sorensen and Yang 1998),
    ``scipy.sparse.linalg.eigsh`` with ``which='LA'`` or ``'SA'``, in float64, which stops
    when each pair's residual estimate is at most :math:`\mathrm{tol}\, |\lambda|`. ``ncv``
    is the Lanczos basis kept between restarts (eigsh's default ``max(2k + 1, 20)`` when
    None); the first restart cycle alone costs ``ncv`` products.

    On :math:`A = \operatorname{diag}(1, \dots, 10)` the two largest eigenpairs are 10 and 9
    with the last two coordinate axes:

    >>> import numpy as np
    >>> from lossgeom.curvature import top_eigenpairs
    >>> top = top_eigenpairs(np.diag(np.arange(1.0, 11.0)), k=2, tol=1e-10, seed=0)
    >>> top.values.round(8).tolist(), np.abs(top.vectors[[9, 8], [0, 1]]).round(8).tolist()
    ([10.0, 9.0], [1.0, 1.0])

    The start vector is drawn by ``numpy.random.default_rng(seed)`` unless ``v0`` is given:
    an ``(n,)`` vector, or an ``(n, j)`` block of previous eigenvectors, from which both
    methods start at the sum of the columns (see :func:`lossgeom.curvature.lanczos.start_vector`);
    ``"lanczos"`` mixes a seeded random unit vector of equal weight into it and takes at
    least ``k + 3`` steps, so that a start on another eigenvector (or orthogonal to the
    wanted ones) cannot make it accept the wrong eigenvalues (see :mod:`lossgeom.curvature.lanczos`).

    Args:
        operator: a symmetric operator (see :func:`lossgeom.curvature.factory.as_operator`).
        k: the number of eigenpairs, ``1 <= k < n``.
        which: ``"largest"`` (algebraically largest) or ``"smallest"`` (most negative).
        tol: the relative tolerance, on the eigenvalue error bound (``"lanczos"`` with
            ``stop="gap"``) or on the residual (``stop="residual"``, ``"arpack"``).
        seed: seed of the start vector.
        ncv: the number of Lanczos vectors, ``k < ncv <= n`` (``None``: eigsh's default);
            ``"arpack"`` only.
        method: ``"lanczos"`` or ``"arpack"`` (``EIGENSOLVERS``).
        v0: a start vector or block (warm start), or ``None``.
        max_hvp: the most products, ``>= k`` (``None``: ``min(n, max(10 k, 300))``);
            ``"lanczos"`` only.
        stop: ``"gap"`` or ``"residual"`` (see :mod:`lossgeom.curvature.lanczos`);
            ``"lanczos"`` only.
        progress: a bar of the products on stderr: ``None`` in interactive use only,
            ``True`` always, ``False`` never (see ``lossgeom.progress``).

    Returns:
        An :class:`EigenResult`: the eigenpairs ordered by ``which``, the products used,
        the residuals ``||A v_j - lambda_j v_j||``, and the residual and eigenvalue error
        bounds of the pairs.

    Raises:
        TypeError: if ``operator`` is not one of the forms
            :func:`lossgeom.curvature.factory.as_operator` takes, ``k``, ``ncv`` or ``max_hvp``
            is not an int, ``v0`` is not array-like, or ``progress`` is not a bool or None.
        ValueError: if ``k < 1``, ``k >= n`` (use ``numpy.linalg.eigh`` of a dense reference
            instead), ``which`` or ``method`` is unknown, ``tol`` is not positive, ``ncv`` is
            outside ``(k, n]``, ``ncv`` is given with ``"lanczos"``, ``max_hvp`` or a
            ``stop`` other than ``"gap"`` with ``"arpack"``, ``stop`` is unknown, ``v0``
            has the wrong shape or is zero, a stored matrix is not symmetric, or
            (``"arpack"``) the operator maps the start vector to zero.
    """
    if method not in EIGENSOLVERS:
        raise ValueError(f"method must be one of {list(EIGENSOLVERS)}, got {method!r}")
    if which not in ("largest", "smallest"):
        raise ValueError(f"which must be 'largest' or 'smallest', got {which!r}")
    counted = as_operator(operator)
    if method == "lanczos":
        if ncv is not None:
            raise ValueError("ncv applies to method='arpack' only (plain Lanczos keeps every vector)")
        run = lanczos_eigenpairs(
            counted, k=k, which=which, tol=tol, seed=seed, v0=v0, max_hvp=max_hvp, stop=stop, progress=progress
        )
        residuals = _residuals(counted, run.values, run.vectors)
        return EigenResult(
            run.values,
            run.vectors,
            run.n_hvp,
            residuals,
            run.residual_bounds,
            "lanczos",
            run.converged,
            run.error_bounds,
        )
    if max_hvp is not None:
        raise ValueError("max_hvp applies to method='lanczos' only (bound ARPACK's basis with ncv instead)")
    if stop != "gap":
        raise ValueError("stop applies to method='lanczos' only (ARPACK stops on its residual estimates)")
    n = counted.shape[0]
    k = positive_int("k", k)
    if k >= n:
        raise ValueError(
            f"k must be < n = {n} for Lanczos (eigsh needs k < n), got k = {k}; "
            "for all eigenvalues of a small model use numpy.linalg.eigh on a dense "
            "reference (dense_hessian)"
        )
    tol = positive("tol", tol)
    start = np.random.default_rng(seed).standard_normal(n) if v0 is None else start_vector(v0, n, seed)
    if ncv is not None:
        ncv = positive_int("ncv", ncv)
        if not k < ncv <= n:
            raise ValueError(f"ncv must satisfy k < ncv <= n = {n}, got ncv = {ncv} with k = {k}")
    try:
        with progress_bar(progress, total=None, desc="ARPACK eigenpairs", unit="product") as bar:
            view = counted.to_scipy() if bar.disable else _counting_bar(counted, bar)
            values, vectors = eigsh(view, k=k, which="LA" if which == "largest" else "SA", tol=tol, v0=start, ncv=ncv)
    except ArpackError as err:
        if "-9" in str(err) or "zero" in str(err).lower():
            raise ValueError(
                "the operator maps the Lanczos start vector to zero: it looks like the zero "
                "matrix (all eigenvalues 0), which has no distinguished eigenvectors"
            ) from err
        raise
    order = np.argsort(values)[::-1] if which == "largest" else np.argsort(values)
    values, vectors = values[order], vectors[:, order]
    used = counted.n_hvp
    residuals = _residuals(counted, values, vectors)
    bounds = tol * np.maximum(np.finfo(np.float64).eps ** (2 / 3), np.abs(values))
    return EigenResult(values, vectors, used, residuals, bounds, "arpack", True, bounds)


def _residuals(counted: CurvatureOperator, values: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """``||A v_j - lambda_j v_j||`` by one block product in the operator's dtype (k products), in float64."""
    block = torch.as_tensor(vectors).to(dtype=counted.dtype, device=counted.device)
    image = counted.matmat(block).double().cpu().numpy()
    return np.linalg.norm(image - vectors * values, axis=0)


def _counting_bar(counted: CurvatureOperator, bar: tqdm) -> LinearOperator:
    """The scipy view of ``counted``, moving ``bar`` to the products spent after each product."""
    view, start = counted.to_scipy(), counted.n_hvp

    def matvec(v: np.ndarray) -> np.ndarray:
        out = view.matvec(v)
        advance_to(bar, counted.n_hvp - start)
        return out

    def matmat(m: np.ndarray) -> np.ndarray:
        out = view.matmat(m)
        advance_to(bar, counted.n_hvp - start)
        return out

    return LinearOperator(view.shape, matvec=matvec, rmatvec=matvec, matmat=matmat, dtype=view.dtype)


def power_iteration(
    operator: OperatorLike,
    tol: float = 1e-8,
    max_iter: int = 10_000,
    seed: int = 0,
    reference: float | None = None,
    *,
    progress: bool | None = None,
) -> EigenResult:
    r"""The dominant eigenvalue by plain power iteration (the baseline Lanczos is compared with).

    Iterates :math:`v \leftarrow A v / \lVert A v \rVert` and the Rayleigh quotient
    :math:`v^\top A v`. Stops when it changes by less than ``tol`` relatively or, if
    ``reference`` is given, as soon as it is within ``tol`` of it (an oracle stop: the
    fewest products power iteration could need). It converges like
    :math:`|\lambda_2 / \lambda_1|^{k}` to the eigenvalue of largest magnitude (Golub and
    Van Loan 2013, section 8.2).

    On :math:`A = \operatorname{diag}(3, 1, 1/2)` the dominant eigenvalue is 3 and its
    eigenvector the first coordinate axis:

    >>> import numpy as np
    >>> from lossgeom.curvature.spectra import power_iteration
    >>> result = power_iteration(np.diag([3.0, 1.0, 0.5]), tol=1e-12, seed=0)
    >>> round(float(result.values[0]), 8), round(abs(float(result.vectors[0, 0])), 6), result.converged
    (3.0, 1.0, True)

    Args:
        operator: a symmetric operator (see :func:`~lossgeom.curvature.factory.as_operator`).
        tol: the relative stopping tolerance.
        max_iter: the most products.
        seed: seed of the start vector.
        reference: the eigenvalue to stop at (an oracle stop), or ``None``.
        progress: a bar of the products on stderr (at most ``max_iter``): ``None`` in
            interactive use only, ``True`` always, ``False`` never (see ``lossgeom.progress``).

    Returns:
        An :class:`EigenResult` with one pair (``method="power"``): the estimate, its unit
        vector, the products used (the residual check excluded), the residual
        :math:`\lVert A v - \lambda v \rVert` and ``converged`` (False when ``max_iter``
        ran out first).

    Raises:
        TypeError: if ``progress`` is not a bool or None.
        ValueError: if ``tol`` or ``max_iter`` is not positive.
    """
    counted = as_operator(operator)
    tol = positive("tol", tol)
    max_iter = positive_int("max_iter", max_iter)
    v = np.random.default_rng(seed).standard_normal(counted.shape[0])
    v /= np.linalg.norm(v)
    estimate = None

    def result(value: float, vector: np.ndarray, converged: bool) -> EigenResult:
        used = counted.n_hvp
        residual = np.linalg.norm(counted @ vector - value * vector)
        bound = np.array([residual])  # a symmetric matrix has an eigenvalue within the residual
        return EigenResult(np.array([value]), vector[:, None], used, bound, None, "power", converged, bound)

    with progress_bar(progress, total=max_iter, desc="power iteration", unit="product") as bar:
        for _ in range(max_iter):
            w = counted @ v
            bar.update(1)
            new = float(v @ w)
            if reference is not None:
                if abs(new - reference) <= tol * abs(reference):
                    return result(new, v, True)
            elif estimate is not None and abs(new - estimate) <= tol * abs(new):
                return result(new, v, True)
            estimate = new
            norm = np.linalg.norm(w)
            if norm == 0:
                return result(0.0, v, True)
            v = w / norm
    return result(float(estimate), v, False)


@dataclass(frozen=True)
class SpectralDensity:
    """A smoothed spectral density ``phi(x) = (1/n) sum_i N(x; lambda_i, sigma^2)``, estimated.

    Attributes:
        grid: the points x where the density is evaluated.
        density: phi on the grid (integrates to about 1 over a wide enough grid).
        nodes, weights: per probe (one row each), the Ritz values and quadrature weights.
            A probe whose Lanczos run stopped early (its Krylov space was invariant, e.g.
            when the operator has fewer distinct eigenvalues than ``n_lanczos``) has fewer
            nodes: its row is padded with NaN nodes and zero weights. Use
            :meth:`quadrature` for one probe without padding, or ``np.nansum``.
        sigma: the Gaussian broadening.
        n_hvp: products used (n_probes * n_lanczos at most).
    """

    grid: np.ndarray
    density: np.ndarray
    nodes: np.ndarray
    weights: np.ndarray
    sigma: float
    n_hvp: int

    def quadrature(self, probe: int) -> tuple[np.ndarray, np.ndarray]:
        """The nodes and weights of one probe, without the NaN padding.

        Args:
            probe: the index of the probe (a row of ``nodes`` and ``weights``).

        Returns:
            ``(nodes, weights)``: the probe's Ritz values and quadrature weights, the padded
            entries dropped.
        """
        keep = ~np.isnan(self.nodes[probe])
        return self.nodes[probe][keep], self.weights[probe][keep]


def _lanczos(counted: CurvatureOperator, v: np.ndarray, steps: int, bar: tqdm) -> tuple[np.ndarray, np.ndarray]:
    """Lanczos tridiagonalisation with full reorthogonalisation; returns (alpha, beta); one ``bar`` step a product."""
    n = counted.shape[0]
    basis = np.zeros((n, steps))
    alpha, beta = [], []
    q = v / np.linalg.norm(v)
    for j in range(steps):
        basis[:, j] = q
        w = counted @ q
        bar.update(1)
        alpha.append(float(q @ w))
        w = w - basis[:, : j + 1] @ (basis[:, : j + 1].T @ w)
        w = w - basis[:, : j + 1] @ (basis[:, : j + 1].T @ w)
        b = float(np.linalg.norm(w))
        if j == steps - 1 or b <= 1e-12 * max(1.0, abs(alpha[0])):
            break
        beta.append(b)
        q = w / b
    return np.asarray(alpha), np.asarray(beta)


def gaussian_broadening(points: np.ndarray, weights: np.ndarray, grid: np.ndarray, sigma: float) -> np.ndarray:
    """``sum_k w_k N(x; points_k, sigma^2)`` evaluated on ``grid``.

    ``N(x; mu, sigma^2) = exp(-(x - mu)^2 / (2 sigma^2)) / (sigma sqrt(2 pi))``, the normal density.

    Args:
        points: the centres ``points_k``.
        weights: the weights ``w_k``, one per point.
        grid: the points ``x`` where the sum is evaluated.
        sigma: the width of the Gaussians (not checked: pass ``sigma > 0``).

    Returns:
        The weighted sum of Gaussians at each grid point, an array of the grid's length.
    """
    z = (np.asarray(grid)[:, None] - np.asarray(points)[None, :]) / sigma
    return (np.exp(-0.5 * z**2) @ np.asarray(weights)) / (sigma * math.sqrt(2 * math.pi))


def spectral_density(
    operator: OperatorLike,
    grid: ArrayLike,
    n_probes: int = 10,
    n_lanczos: int = 80,
    sigma: float = 0.01,
    seed: int = 0,
    *,
    progress: bool | None = None,
) -> SpectralDensity:
    """Stochastic Lanczos quadrature (Lin, Saad and Yang 2016; Ghorbani et al. 2019).

    For each Rademacher probe z, ``n_lanczos`` Lanczos steps from ``z / ||z||`` give a
    tridiagonal ``T = U diag(theta) U^T``; the quadrature nodes are ``theta_k`` with weights
    ``U[0, k]^2``, so ``sum_k U[0,k]^2 f(theta_k) ~ z^T f(A) z / ||z||^2``. The density is the
    probe average of the nodes broadened by Gaussians of width ``sigma``.

    Args:
        operator: a symmetric operator (see :func:`lossgeom.curvature.factory.as_operator`).
        grid: the one-dimensional grid of points ``x`` where the density is evaluated.
        n_probes: the number of Rademacher probes.
        n_lanczos: the Lanczos steps per probe, at most ``n``.
        sigma: the width of the Gaussian broadening, > 0.
        seed: seed of the probes.
        progress: a bar of the products on stderr (at most ``n_probes * n_lanczos``):
            ``None`` in interactive use only, ``True`` always, ``False`` never (see
            ``lossgeom.progress``).

    Returns:
        A :class:`SpectralDensity` with the density on ``grid``, the nodes and weights of
        every probe and the products used.

    Raises:
        TypeError: if ``operator`` is not one of the forms
            :func:`lossgeom.curvature.factory.as_operator` takes, ``n_probes`` or
            ``n_lanczos`` is not an int, or ``progress`` is not a bool or None.
        ValueError: if ``grid`` is not a finite one-dimensional array, ``n_probes`` or
            ``n_lanczos`` is below 1, ``n_lanczos > n``, ``sigma`` is not positive, or a
            stored matrix is not symmetric.
    """
    counted = as_operator(operator)
    n = counted.shape[0]
    grid = finite_array("grid", grid, ndim=1)
    n_probes = positive_int("n_probes", n_probes)
    n_lanczos = positive_int("n_lanczos", n_lanczos)
    if n_lanczos > n:
        raise ValueError(f"n_lanczos must be <= n = {n}, got {n_lanczos}")
    sigma = positive("sigma", sigma)
    rng = np.random.default_rng(seed)
    nodes = np.full((n_probes, n_lanczos), np.nan)
    weights = np.zeros((n_probes, n_lanczos))
    density = np.zeros_like(grid)
    with progress_bar(progress, total=n_probes * n_lanczos, desc="spectral density (SLQ)", unit="product") as bar:
        for p in range(n_probes):
            probe = rng.choice(np.array([-1.0, 1.0]), size=(n, 1))[:, 0]
            alpha, beta = _lanczos(counted, probe, n_lanczos, bar)
            theta, u = eigh_tridiagonal(alpha, beta) if len(alpha) > 1 else (alpha, np.ones((1, 1)))
            w = u[0, :] ** 2
            nodes[p, : len(theta)], weights[p, : len(theta)] = theta, w
            density += gaussian_broadening(theta, w, grid, sigma) / n_probes
    return SpectralDensity(grid, density, nodes, weights, sigma, counted.n_hvp)


def dense_spectral_density(eigenvalues: ArrayLike, grid: ArrayLike, sigma: float) -> np.ndarray:
    """The exact smoothed density ``(1/n) sum_i N(x; lambda_i, sigma^2)`` from all eigenvalues.

    Args:
        eigenvalues: all ``n`` eigenvalues, a one-dimensional array-like.
        grid: the one-dimensional grid of points ``x`` where the density is evaluated.
        sigma: the width of the Gaussian broadening, > 0.

    Returns:
        The density on ``grid``, an array of the grid's length.

    Raises:
        ValueError: if ``eigenvalues`` is empty or not finite, or ``sigma <= 0``.
    """
    ev = finite_array("eigenvalues", eigenvalues, ndim=1)
    if ev.size == 0:
        raise ValueError("eigenvalues must not be empty (the density of no eigenvalues is undefined)")
    sigma = positive("sigma", sigma)
    return gaussian_broadening(ev, np.full(len(ev), 1.0 / len(ev)), finite_array("grid", grid, ndim=1), sigma)


@dataclass(frozen=True)
class SpectrumSummary:
    """Statistics of a symmetric matrix's spectrum that answer different questions (claim M2).

    With ``threshold = rel_threshold * largest``: ``largest`` and ``most_negative`` are
    the extreme eigenvalues, ``trace`` their sum, ``n_negative`` and ``negative_mass`` the
    count and sum of eigenvalues below ``-threshold``, ``condition_number`` is the largest
    over the smallest eigenvalue above ``threshold`` (the positive part only), and
    ``n_near_zero`` counts eigenvalues with ``abs(lambda) <= threshold``.
    """

    largest: float
    most_negative: float
    trace: float
    n_negative: int
    negative_mass: float
    condition_number: float
    n_near_zero: int
    rel_threshold: float


def spectrum_summary(eigenvalues: ArrayLike, rel_threshold: float = 1e-6) -> SpectrumSummary:
    """Summarise a full spectrum; the condition number is restricted to eigenvalues > threshold.

    With ``threshold = rel_threshold * lambda_max`` the condition number is
    ``lambda_max / min {lambda_i : lambda_i > threshold}`` (see :class:`SpectrumSummary`).

    Args:
        eigenvalues: all eigenvalues, a one-dimensional array-like (any order).
        rel_threshold: the threshold relative to the largest eigenvalue, > 0.

    Returns:
        The :class:`SpectrumSummary`.

    Raises:
        ValueError: if ``eigenvalues`` is empty, not one-dimensional or not finite,
            ``rel_threshold`` is not positive, or the largest eigenvalue is not > 0.
    """
    ev = np.sort(finite_array("eigenvalues", eigenvalues, ndim=1))
    if ev.size == 0:
        raise ValueError("eigenvalues must not be empty")
    rel_threshold = positive("rel_threshold", rel_threshold)
    if ev[-1] <= 0:
        raise ValueError("the largest eigenvalue must be > 0 for a relative threshold")
    thr = rel_threshold * ev[-1]
    above = ev[ev > thr]
    negative = ev[ev < -thr]
    return SpectrumSummary(
        float(ev[-1]),
        float(ev[0]),
        float(ev.sum()),
        int(negative.size),
        float(negative.sum()),
        float(ev[-1] / above[0]),
        int(np.sum(np.abs(ev) <= thr)),
        rel_threshold,
    )

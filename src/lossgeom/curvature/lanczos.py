"""Plain Lanczos for a few extreme eigenpairs: the fewest products for a stated eigenvalue tolerance.

:func:`lanczos_eigenpairs` runs the symmetric Lanczos recurrence one product at a time
through the operator's counted ``@``, in the operator's own dtype and on its device (the
basis is a torch tensor: ``n`` entries of the parameters' dtype per vector), and after every
step computes the Ritz pairs ``(theta_j, y_j = Q s_j)`` of the tridiagonal ``T_m`` by
``scipy.linalg.eigh_tridiagonal``.

**The stop.** Each Ritz pair has the Lanczos residual bound

    ``r_j = ||A y_j - theta_j y_j|| = |beta_m s_{m,j}|``

(Saad, *Numerical Methods for Large Eigenvalue Problems*, sec. 6.3; exact in exact
arithmetic with an orthonormal basis; rounding adds about ``eps ||A||``). For a symmetric
matrix a residual ``r`` puts an eigenvalue within ``r`` of ``theta_j``, and within
``r^2 / delta`` when ``delta`` is the distance from ``theta_j`` to the rest of the spectrum
(Kato-Temple; Parlett, *The Symmetric Eigenvalue Problem*, sec. 11-7). ``stop="gap"`` (the
default) accepts a pair once its **eigenvalue error bound**

    ``e_j = min(r_j, r_j^2 / gap_j) <= tol * |theta_j|``,

with the gap taken from the other Ritz values, each moved towards ``theta_j`` by its own
residual bound, and divided by ``GAP_SAFETY`` (4): ``gap_j = min_{i != j} (|theta_j -
theta_i| - r_i) / 4``. Where that gap is not resolved (``gap_j <= r_j``, or no other Ritz
value yet) the bound falls back to the residual, ``e_j = r_j``.

What each bound guarantees. The residual bound is unconditional: some eigenvalue lies
within ``r_j`` of ``theta_j``. The gap bound holds only if no other eigenvalue lies within
``delta`` of ``theta_j`` that the Ritz values have not yet shown, and the Ritz values cannot
tell: an eigenvalue the Krylov space has not resolved, a near-degenerate partner of the
wanted one above all, makes the estimated gap too large, and the Ritz value, a mixture of
the two eigenvectors, stops early with an error near the true gap. The factor 4 is a
measured margin, not a proof: on gradient descent at the edge of stability (a tanh MLP whose
top two Hessian eigenvalues come within 0.3% and cross; ``benchmarks/eigensolver_benchmark.py``)
the gap taken whole let 6 of 164 sharpness measurements (cold and warm, two step sizes)
at ``tol = 1e-4`` exceed the tolerance, by up to 3.3 times, and the factor 4 none (largest error 0.21 ``tol``); but on
random spectra with a top pair closer than about ``tol * sqrt(n)`` (relative) the gap stop
accepts the wrong eigenvalue more often than the residual stop, as every Krylov method with a
loose tolerance can. ``stop="residual"`` demands ``r_j <= tol * |theta_j|`` instead: more
products, and the vectors accurate too (their angle to the eigenvectors is about
``r_j / delta``, while the gap rule's eigenvalue ``tol`` leaves them at about
``sqrt(tol |theta| / delta)``). Use it where the vectors matter or the top of the spectrum
may be clustered.

**The step.** Partial reorthogonalisation (Simon 1984): the recurrence of Paige's analysis
tracks an estimate ``omega_{m+1, i}`` of every inner product ``q_{m+1}^T q_i`` (O(m) work per
step, no pass over the basis), each estimate enlarged by ``2 eps ||T||`` per step so that it
errs high; only when one exceeds ``sqrt(eps)`` is the new vector orthogonalised against the
whole basis (classical Gram-Schmidt, a second pass where the DGKS test asks for it), on that
step and the next, and the estimates reset to ``eps``. The basis so stays **semi-orthogonal**,
``|q_i^T q_j| <= sqrt(eps)`` for ``i != j``, which is enough for ``T_m`` to be the projection
of ``A`` on the Krylov space up to rounding, so that the Ritz values and the residual bounds
are as accurate as with full reorthogonalisation (Simon 1984, theorem 4; Parlett sec. 13-8),
and no spurious copies of converged eigenvalues appear. A step therefore costs its product
plus a few vector operations; the full pass (``reorthogonalise="full"`` on every step, two
reads of the basis) is paid only where orthogonality is about to be lost, typically once an
eigenvalue converges. ``eps`` is the operator dtype's machine epsilon.

There is no restart: the basis grows by one vector per product (``max_hvp`` bounds it). A
zero ``beta_m`` (below ``1e-12`` of the largest Ritz value in magnitude) means the Krylov
space is invariant: its Ritz pairs are eigenpairs to rounding (their bounds count as met).
Lanczos then goes on from a seeded random vector orthogonal to the basis (``T`` becomes
block diagonal), since one Krylov space holds one copy of a repeated eigenvalue (the zero
eigenvalue of a low-rank matrix, say) and a warm start's space only the directions it
started in; it stops at an invariant space only once a new invariant block leaves the ``k``
wanted values unchanged, and otherwise at the first ordinary step, at least the
``k + MIN_EXTRA_STEPS``-th (and at most ``n``), where they meet ``tol``.

Start vectors (:func:`start_vector`, shared with the ARPACK path): ``v0=None`` draws
``numpy.random.default_rng(seed).standard_normal(n)``; an ``(n,)`` vector is used as
given; an ``(n, j)`` block, e.g. the eigenvectors of a previous measurement, is started
from the sum of its columns. If the columns are eigenvectors with distinct eigenvalues,
the Krylov space of their sum is their span after ``j`` products, so all ``j`` pairs are
recovered at once; if they are approximate, it holds good approximations of each.

A warm start alone cannot be trusted: the residual bound certifies that a Ritz pair is
near *an* eigenpair, and the Krylov space of an exact eigenvector ``u`` is ``span{u}``, so
a start on the second eigenvector (the previous top one after two eigenvalues crossed) or
orthogonal to the top one would be accepted with the wrong value. Lanczos therefore
starts a warm run from ``(u + r) / sqrt(2)``: the unit warm start ``u`` and a seeded random
unit vector ``r`` orthogonal to it, with equal weights (``WARM_MIXING``, the weight of
``r``, is 1). Where ``u`` has no component along the top eigenvector (a start on another
eigenvector, or orthogonal to it), the start's component along it is ``r_1 / sqrt(2)``,
distributed as a cold start's ``g_1 / sqrt(n)`` up to about ``1 / sqrt(2)``; ``r_1`` is
symmetric about zero whatever ``u``, so it enlarges a component ``u_1`` as often as it
reduces it. A good warm start still begins with half its squared norm on the wanted
vector instead of about ``1 / n``, which is what it saves. (For an exact eigenvector
``u`` with eigenvalue ``theta``, the ``m``-dimensional Krylov space of ``u + r`` is
``span{u + r}`` plus the ``(m - 1)``-dimensional one of ``(A - theta) r``: the random part
is explored as by a cold start, and the pair near ``theta`` keeps a residual until it is.)
The weight is a trade: a smaller one saves more products on a good warm start and
accepts the start's own eigenvalue sooner on a bad one. And no run stops before its basis
has ``k + MIN_EXTRA_STEPS`` (3) vectors, or ``n``, so a loose ``tol`` cannot accept the
start before the random part has been explored at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import ArrayLike
from scipy.linalg import eigh_tridiagonal

from lossgeom._validation import finite_array, positive, positive_int
from lossgeom.curvature.base import CurvatureOperator, OperatorLike
from lossgeom.curvature.factory import as_operator
from lossgeom.progress import progress_bar

#: ``beta_m`` below this fraction of the largest |Ritz value| counts as an invariant subspace
BREAKDOWN = 1e-12
#: a second Gram-Schmidt pass where the first left less than this fraction of the norm (DGKS)
DGKS = 1 / math.sqrt(2)
#: what the default ``max_hvp`` allows per wanted pair, and at least
PRODUCTS_PER_PAIR, MIN_PRODUCTS = 10, 300
#: no run stops on its bound before ``k + MIN_EXTRA_STEPS`` products (or ``n``)
MIN_EXTRA_STEPS = 3
#: the weight of the random unit vector added to a warm start's unit vector (see the module docstring)
WARM_MIXING = 1.0
#: the Ritz gap is divided by this before it enters ``r^2 / gap``: a measured margin (see the module docstring)
GAP_SAFETY = 4.0
#: the stopping rules of :func:`lanczos_eigenpairs`
STOPS = ("gap", "residual")
#: the reorthogonalisation schemes of :func:`lanczos_eigenpairs`
REORTHOGONALISATIONS = ("partial", "full")


@dataclass(frozen=True)
class LanczosRun:
    """The wanted Ritz pairs of a Lanczos run, what they are guaranteed to, and what they cost.

    Attributes:
        values: the ``k`` Ritz values, descending for ``which="largest"``, ascending for ``"smallest"``.
        vectors: ``(n, k)`` float64 Ritz vectors ``Q s_j`` of unit norm, column j for ``values[j]``.
        residual_bounds: ``|beta_m s_{m,j}|``, the residual norm ``||A y_j - theta_j y_j||``
            of each pair as the recurrence gives it (without further products).
        error_bounds: the eigenvalue error bound of each pair, ``min(r, r^2 / gap)`` where the
            Ritz gap is resolved and ``r`` elsewhere (see the module docstring); with
            ``stop="gap"`` the run stopped when ``error_bounds <= tol * |values|``.
        n_hvp: products used (one per Lanczos step).
        converged: whether every pair met the stop (bounds at rounding level count as met);
            ``False`` only when ``max_hvp`` ran out first.
        invariant: whether the run ended on an invariant Krylov space (``beta_m = 0``).
        full_passes: the steps that orthogonalised against the whole basis.
        stop: the rule the run stopped by, ``"gap"`` or ``"residual"``.
    """

    values: np.ndarray
    vectors: np.ndarray
    residual_bounds: np.ndarray
    error_bounds: np.ndarray
    n_hvp: int
    converged: bool
    invariant: bool
    full_passes: int = 0
    stop: str = "gap"


def start_vector(v0: ArrayLike | None, n: int, seed: int) -> np.ndarray:
    """The unit start vector of a Lanczos run: random, given, or the sum of a block's columns.

    Args:
        v0: ``None`` (``numpy.random.default_rng(seed).standard_normal(n)``), an ``(n,)``
            vector, or an ``(n, j)`` block (e.g. previous eigenvectors), whose column sum is used.
        n: the dimension.
        seed: the seed of the random start (``v0=None``).

    Returns:
        The float64 ``(n,)`` start vector of norm 1.

    Raises:
        TypeError: if ``v0`` is not array-like of real numbers or ``seed`` is not an int.
        ValueError: if ``v0`` does not have shape ``(n,)`` or ``(n, j)`` with ``j >= 1``,
            is not finite, or is (or sums to) the zero vector.
    """
    seed = _seed(seed)
    if v0 is None:
        v = np.random.default_rng(seed).standard_normal(n)
    else:
        v = finite_array("v0", v0)
        if v.ndim not in (1, 2) or v.shape[0] != n or (v.ndim == 2 and v.shape[1] < 1):
            raise ValueError(f"v0 must have shape ({n},) or ({n}, j) with j >= 1, got {v.shape}")
        scale = float(np.abs(v).max()) if v.size else 0.0
        if v.ndim == 2:
            v = v.sum(axis=1)
        if not np.linalg.norm(v) > 1e-12 * scale * math.sqrt(n) or scale == 0.0:
            raise ValueError("v0 must not be the zero vector (for a block: its columns must not sum to zero)")
    return v / np.linalg.norm(v)


def _mixed_start(q: np.ndarray, seed: int) -> np.ndarray:
    """``(q + WARM_MIXING r) / ||.||``, ``r`` a seeded random unit vector orthogonal to the unit ``q``."""
    r = np.random.default_rng([seed, 2]).standard_normal(q.shape[0])  # apart from the start's and restarts' streams
    r -= (q @ r) * q
    norm = float(np.linalg.norm(r))
    if not norm > 0.0:  # pragma: no cover - only for n = 1, which k < n excludes
        return q
    v = q + WARM_MIXING * (r / norm)
    return v / np.linalg.norm(v)


def _seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    return int(seed)


def default_max_hvp(k: int, n: int) -> int:
    """``min(n, max(10 k, 300))``: the default cap on the products of :func:`lanczos_eigenpairs`.

    Args:
        k: the number of wanted eigenpairs.
        n: the operator's dimension.

    Returns:
        The most products a run may take.
    """
    return min(n, max(PRODUCTS_PER_PAIR * k, MIN_PRODUCTS))


class _Basis:
    """An orthonormal basis stored as rows of a growing ``(capacity, n)`` tensor in the operator's dtype."""

    def __init__(self, n: int, capacity: int, dtype: torch.dtype, device: torch.device) -> None:
        self.rows = torch.empty((max(1, capacity), n), dtype=dtype, device=device)
        self.size = 0

    def append(self, q: torch.Tensor) -> None:
        if self.size == self.rows.shape[0]:
            grown = self.rows.new_empty((2 * self.rows.shape[0], self.rows.shape[1]))
            grown[: self.size] = self.rows[: self.size]
            self.rows = grown
        self.rows[self.size] = q
        self.size += 1

    def orthogonalise(self, w: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
        """``w`` minus its projection on the basis; returns (w, coefficients).

        Classical Gram-Schmidt with the DGKS test: a second pass only where the first
        removed more than ``1 - 1/sqrt(2)`` of the norm (where rounding could have left a
        component along the basis). Each pass reads the basis twice.
        """
        q = self.rows[: self.size]
        before = float(torch.linalg.vector_norm(w))
        h = q @ w
        w = w - q.T @ h
        if float(torch.linalg.vector_norm(w)) < DGKS * before:
            h2 = q @ w
            w = w - q.T @ h2
            h = h + h2
        return w, h.double().cpu().numpy()


def _random_orthogonal(basis: _Basis, rng: np.random.Generator) -> torch.Tensor | None:
    """A seeded random unit vector orthogonal to the basis (None when the basis spans everything)."""
    n = basis.rows.shape[1]
    for _ in range(3):
        draw = torch.as_tensor(rng.standard_normal(n)).to(basis.rows)
        w, _ = basis.orthogonalise(draw)
        norm = float(torch.linalg.vector_norm(w))
        if norm > 1e-8 * float(torch.linalg.vector_norm(draw)):
            return w / norm
    return None


class _Orthogonality:
    """Simon's (1984) estimates ``omega_i ~ q_{m+1}^T q_i`` of the newest vector against the basis.

    The recurrence follows from ``A q_j = beta_{j-1} q_{j-1} + alpha_j q_j + beta_j q_{j+1}``
    holding for every ``j`` (Paige): ``beta_m omega_{m+1, j} = beta_j omega_{m, j+1} +
    (alpha_j - alpha_m) omega_{m, j} + beta_{j-1} omega_{m, j-1} - beta_{m-1} omega_{m-1, j}``,
    each estimate enlarged in magnitude by ``2 eps ||T||`` (rounding), so that it errs high.
    """

    def __init__(self, eps: float) -> None:
        self.eps = eps
        self.previous = np.zeros(0)  # omega_{m-1, 0..m-2}
        self.current = np.ones(1)  # omega_{m, 0..m-1}, the last entry 1
        self.norm = 0.0  # a running bound on ||T|| (Gershgorin)

    def next(self, alpha: list, beta: list, b: float) -> np.ndarray:
        """The estimates of the next vector ``w / b`` against the basis ``q_0..q_m`` (length m + 1)."""
        m = len(alpha) - 1
        a, bt = np.asarray(alpha), np.asarray(beta + [b])
        self.norm = max(self.norm, abs(a[m]) + b + (bt[m - 1] if m else 0.0))
        out = np.empty(m + 1)
        cur, prev = self.current, self.previous
        if m:
            j = np.arange(m)
            below = np.concatenate([[0.0], bt[: m - 1] * cur[: m - 1]])  # beta_{j-1} omega_{m, j-1}
            older = bt[m - 1] * np.concatenate([prev, [1.0]])[:m]  # beta_{m-1} omega_{m-1, j}
            t = bt[j] * cur[j + 1] + (a[j] - a[m]) * cur[j] + below - older
            out[:m] = (t + np.sign(t) * 2 * self.eps * self.norm) / b
        out[m] = self.eps * self.norm / b  # local orthogonality, to rounding
        return out

    def advance(self, omega: np.ndarray) -> None:
        """Make ``omega`` (the new vector's estimates) the current row."""
        self.previous, self.current = self.current, np.concatenate([omega, [1.0]])

    def reset(self, m: int) -> np.ndarray:
        """The estimates after a full pass: ``eps`` against each of the ``m`` basis vectors."""
        return np.full(m, self.eps)


def _ritz(alpha: list, beta: list) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (ascending) and eigenvectors of the tridiagonal with diagonal alpha, off-diagonal beta."""
    if len(alpha) == 1:
        return np.asarray(alpha, dtype=float), np.ones((1, 1))
    return eigh_tridiagonal(np.asarray(alpha), np.asarray(beta))


def _wanted(theta: np.ndarray, k: int, which: str) -> np.ndarray:
    """Indices of the k wanted Ritz values (theta ascending), in the order of ``which``."""
    return np.arange(len(theta) - 1, len(theta) - 1 - k, -1) if which == "largest" else np.arange(k)


def error_bounds(theta: np.ndarray, residuals: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``min(r_j, r_j^2 / gap_j)`` for the Ritz pairs ``idx``; ``r_j`` where the gap is not resolved.

    ``gap_j = min_{i != j} (|theta_j - theta_i| - r_i)`` over all Ritz pairs (see the module
    docstring); the gap is resolved when it exceeds ``r_j``.

    Args:
        theta: all Ritz values.
        residuals: all residual bounds ``|beta_m s_{m,i}|``, in the order of ``theta``.
        idx: the indices of the pairs wanted.

    Returns:
        The eigenvalue error bounds of the pairs ``idx``.
    """
    out = residuals[idx].copy()
    for position, j in enumerate(idx):
        others = np.delete(np.arange(len(theta)), j)
        if others.size:
            gap = float(np.min(np.abs(theta[j] - theta[others]) - residuals[others])) / GAP_SAFETY
            if gap > out[position]:
                out[position] = min(out[position], out[position] ** 2 / gap)
    return out


def _check_arguments(
    counted: CurvatureOperator, k: int, which: str, tol: float, max_hvp: int | None, stop: str, reorthogonalise: str
) -> tuple[int, float, int]:
    n = counted.shape[0]
    if which not in ("largest", "smallest"):
        raise ValueError(f"which must be 'largest' or 'smallest', got {which!r}")
    if stop not in STOPS:
        raise ValueError(f"stop must be one of {list(STOPS)}, got {stop!r}")
    if reorthogonalise not in REORTHOGONALISATIONS:
        raise ValueError(f"reorthogonalise must be one of {list(REORTHOGONALISATIONS)}, got {reorthogonalise!r}")
    k = positive_int("k", k)
    if k >= n:
        raise ValueError(f"k must be < n = {n}, got k = {k}; for all eigenvalues use numpy.linalg.eigh")
    tol = positive("tol", tol)
    if max_hvp is None:
        max_hvp = default_max_hvp(k, n)
    else:
        max_hvp = positive_int("max_hvp", max_hvp)
        if max_hvp < k:
            raise ValueError(f"max_hvp must be >= k = {k} (one product per Lanczos step), got {max_hvp}")
    return k, tol, min(max_hvp, n)


def lanczos_eigenpairs(
    operator: OperatorLike,
    k: int = 1,
    which: str = "largest",
    tol: float = 1e-10,
    seed: int = 0,
    v0: ArrayLike | None = None,
    max_hvp: int | None = None,
    *,
    stop: str = "gap",
    reorthogonalise: str = "partial",
    progress: bool | None = None,
) -> LanczosRun:
    """The k largest (or smallest) eigenpairs by plain Lanczos, stopped by an eigenvalue error bound.

    One product per step; after every step with at least ``k`` basis vectors, the Ritz
    pairs of ``T_m`` are computed and the run stops as soon as every wanted pair meets the
    stop (``stop="gap"``: eigenvalue error bound ``min(r, r^2 / gap) <= tol |theta|``;
    ``"residual"``: ``r <= tol |theta|``; see the module docstring) and the basis has at
    least ``min(n, k + MIN_EXTRA_STEPS)`` vectors, or ``max_hvp`` products are spent
    (``converged=False`` then). A pair that meets its bound is near *an* eigenvalue: a larger
    one not yet visible in the Krylov space can be missed (as with ARPACK). A warm start
    ``v0`` is mixed with a seeded random unit vector of equal weight first, so that a start
    on another eigenvector, or orthogonal to the wanted ones, cannot hide a larger eigenvalue
    better than a cold start.

    Args:
        operator: a symmetric operator (see :func:`lossgeom.curvature.factory.as_operator`).
        k: the number of eigenpairs, ``1 <= k < n``.
        which: ``"largest"`` (algebraically largest) or ``"smallest"`` (most negative).
        tol: the relative tolerance, > 0: on the eigenvalue error bound (``stop="gap"``) or
            on the residual (``"residual"``).
        seed: seed of the random start vector (``v0=None``), of a warm start's random part
            and of any restart after an invariant subspace.
        v0: the start: ``None``, an ``(n,)`` vector, or an ``(n, j)`` block of previous
            eigenvectors (a warm start from their sum, see :func:`start_vector`, mixed with
            a random unit vector of equal weight; see the module docstring).
        max_hvp: the most products, ``>= k`` (``None``: ``min(n, max(10 k, 300))``).
        stop: ``"gap"`` (default) or ``"residual"`` (``STOPS``).
        reorthogonalise: ``"partial"`` (default: a full pass only where Simon's estimates
            exceed ``sqrt(eps)``) or ``"full"`` (every step).
        progress: a bar of the Lanczos steps (products) on stderr, out of at most
            ``max_hvp``: ``None`` in interactive use only, ``True`` always, ``False`` never
            (see ``lossgeom.progress``).

    Returns:
        A :class:`LanczosRun` with the pairs, their residual and eigenvalue error bounds and
        the products used.

    Raises:
        TypeError: if ``operator`` is not one of the forms :func:`as_operator` takes, or
            ``k``, ``max_hvp`` or ``seed`` is not an int, ``v0`` is not array-like, or
            ``progress`` is not a bool or None.
        ValueError: if ``k`` is outside ``[1, n)``, ``which``, ``stop`` or
            ``reorthogonalise`` is unknown, ``tol`` is not positive, ``max_hvp < k``, ``v0``
            has the wrong shape or is zero, or a stored matrix is not symmetric.
    """
    counted = as_operator(operator)
    n = counted.shape[0]
    k, tol, max_hvp = _check_arguments(counted, k, which, tol, max_hvp, stop, reorthogonalise)
    start = start_vector(v0, n, seed)
    if v0 is not None:  # a warm start explores a random part too (see the module docstring)
        start = _mixed_start(start, _seed(seed))
    rng = np.random.default_rng([_seed(seed), 1])  # restarts: a stream apart from the start vector's
    basis = _Basis(n, min(max_hvp, 2 * k + 30), counted.dtype, counted.device)
    q = torch.as_tensor(start).to(basis.rows)
    q = q / torch.linalg.vector_norm(q)
    omega = _Orthogonality(float(torch.finfo(counted.dtype).eps))
    alpha: list[float] = []
    beta: list[float] = []
    used0, full_passes, force = counted.n_hvp, 0, reorthogonalise == "full"
    at_last_breakdown = None  # the wanted Ritz values when the latest invariant space was found
    with progress_bar(progress, total=max_hvp, desc="Lanczos eigenpairs", unit="product") as bar:
        while True:  # returns once k pairs meet tol, the space is invariant (see above), or max_hvp is spent
            basis.append(q)
            w = counted.matvec(q)
            bar.update(1)
            a = float(q @ w)
            w = w - a * q
            if beta and beta[-1] != 0.0:
                w -= beta[-1] * basis.rows[basis.size - 2]
            b = float(torch.linalg.vector_norm(w))
            estimates = omega.next([*alpha, a], beta, b) if b > 0.0 else np.zeros(basis.size)
            if force or float(np.abs(estimates).max()) > math.sqrt(omega.eps):
                w, h = basis.orthogonalise(w)  # a full pass, on this step and the next (Simon)
                a += float(h[-1])
                b = float(torch.linalg.vector_norm(w))
                full_passes += 1
                force = reorthogonalise == "full" or not force
                estimates = omega.reset(basis.size)
            alpha.append(a)
            theta, s = _ritz(alpha, beta)
            floor = BREAKDOWN * float(np.abs(theta).max())  # residuals at rounding level count as exact
            invariant = b <= floor or b == 0.0
            steps, done = basis.size, False
            if steps >= k:
                idx = _wanted(theta, k, which)
                residuals = np.abs(b * s[-1, :])
                errors = error_bounds(theta, residuals, idx) if stop == "gap" else residuals[idx]
                met = bool(np.all(errors <= np.maximum(tol * np.abs(theta[idx]), floor)))
                if invariant:
                    # stop only if this invariant block left the wanted values as they were: a block
                    # that changed them (the first one, or a copy of a repeated eigenvalue) may have more
                    unchanged = at_last_breakdown is not None and np.allclose(
                        theta[idx], at_last_breakdown, rtol=tol, atol=floor
                    )
                    done, at_last_breakdown = met and unchanged, theta[idx]
                explored = steps >= min(n, k + MIN_EXTRA_STEPS)  # the minimum Krylov dimension
                done = done or (met and explored and not invariant) or steps >= max_hvp or steps == n
                if done:
                    coefficients = torch.as_tensor(s[:, idx]).to(basis.rows)
                    vectors = (basis.rows[:steps].T @ coefficients).double()
                    vectors /= torch.linalg.vector_norm(vectors, dim=0)
                    bounds = error_bounds(theta, residuals, idx)
                    return LanczosRun(
                        theta[idx],
                        vectors.cpu().numpy(),
                        residuals[idx],
                        bounds,
                        counted.n_hvp - used0,
                        met,
                        invariant,
                        full_passes,
                        stop,
                    )
            if invariant:  # go on from a fresh vector orthogonal to the invariant space (T becomes block diagonal)
                q = _random_orthogonal(basis, rng)
                if q is None:  # pragma: no cover - a basis of fewer than n vectors leaves a complement
                    raise RuntimeError("Lanczos could not draw a vector orthogonal to its basis")
                beta.append(0.0)
                omega.advance(omega.reset(basis.size))
            else:
                q = w / b
                beta.append(b)
                omega.advance(estimates)


__all__ = [
    "REORTHOGONALISATIONS",
    "STOPS",
    "LanczosRun",
    "default_max_hvp",
    "error_bounds",
    "lanczos_eigenpairs",
    "start_vector",
]

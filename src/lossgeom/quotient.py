"""The symmetry quotient of two-layer ReLU networks: coordinates, SGD stability, smoothness (claims Q1-Q6).

A two-layer ReLU network ``F(x) = sum_r a_r ReLU(w_r^T x)`` (no biases) is unchanged by
the positive rescaling ``(a_r, w_r) -> (a_r / c_r, c_r w_r)``, ``c_r > 0``
(:func:`lossgeom.symmetries.relu_neuron_rescaling` with layers ``"0"`` and ``"2"``). On
the regular part of the quotient (every ``w_r != 0``) the invariants

    alpha_r = a_r ||w_r||,    u_r = w_r / ||w_r||  in the unit sphere S^{d-1},

are coordinates, and ``F(x) = sum_r alpha_r ReLU(u_r^T x)``. The quotient carries the
product metric: Euclidean in each ``alpha_r``, the round metric of the unit sphere in
each ``u_r``. For the square loss ``L = (1/2n) sum_i (F(x_i) - y_i)^2`` the quotient
flatness ``Flat^Q`` is the trace of the Riemannian Hessian of ``L`` in that metric. The
chapter ``chapters/ch11_quotient_flatness`` derives, and this module computes:

- the quotient coordinates (:func:`quotient_coordinates`, :func:`representative`) and
  the quotient gradient ``g_i^Q`` (:func:`quotient_jacobian`); the flatness measures built
  on them, ``Flat^Q`` (the closed form and its autograd reference) and the raw Hessian
  trace, live in :mod:`lossgeom.flatness` (:func:`lossgeom.flatness.quotient_flatness`,
  :func:`lossgeom.flatness.quotient_flatness_autograd`,
  :func:`lossgeom.flatness.raw_hessian_trace`);
- the one-step mean-square stability operator ``E[M_I^2] = I - 2 eta A_bar + eta^2 E[A_I^2]``
  of linearised SGD on the active subspace (:func:`active_jacobian`,
  :func:`batch_moments`, :func:`stability_operator`, :func:`stability_lambda_max`,
  :func:`critical_learning_rate`), for batches drawn with or without replacement;
- input smoothness ``(1/n) sum_i ||grad_x F(x_i)||^2`` (:func:`input_smoothness`) and the
  constants ``kappa_* = ||U||_op^2``, ``A_* = max_r |alpha_r|``, ``rho = min_i ||x_i||``
  of the bound ``smoothness <= kappa_* max(1, A_*^2) rho^-2 Flat^Q_GN``
  (:func:`smoothness_constants`);
- the teacher-student task, the test distribution uniform on a union of balls, and a
  generalisation bound built from the same constants (:func:`generalisation_bound`);
- :func:`train_students`: many small students trained at once by
  :func:`lossgeom.optimisers.train`, each frozen at the first check where its loss is
  below its target; :func:`fit_students` does the same with any update rule of
  :mod:`lossgeom.optimisers` on closed-form gradients (:func:`student_gradients`), faster;
- what to read off such runs: :func:`first_check_below`, :func:`stable_counts` (stable pairs
  along a run), :func:`loss_pace` and :func:`steps_at_recent_pace`, :func:`fitting_profile`
  (how a measure moves while the loss falls) and :func:`tangent_departure` (the kink lemma
  of the generalisation bound on test draws).

Shapes: ``W`` is ``(..., m, d)`` (row r is ``w_r``); for a scalar output ``a`` is
``(..., m)`` with the same leading dimensions, so many models are handled at once; for a
``k``-output network ``a`` is ``(m, k)`` (row r is the outgoing vector ``a_r``). A neuron
with ``w_r = 0`` and ``a_r = 0`` is absent (it is how narrower students are padded to a
common width): it contributes nothing to any quantity here.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import torch
from torch import nn

from lossgeom._validation import finite_tensor, positive, positive_int
from lossgeom.models import mlp
from lossgeom.optimisers import Monitor, StopWhen, sgd, train

# ---------------------------------------------------------------------------------------
# The network and its weights
# ---------------------------------------------------------------------------------------


def two_layer_relu(d: int, m: int, k: int = 1, seed: int = 0, init_scale: float = 1.0) -> nn.Sequential:
    """The network ``x -> sum_r a_r ReLU(w_r^T x)`` as ``Linear(d, m) - ReLU - Linear(m, k)``, no biases.

    PyTorch's default initialisation (``w_r`` uniform in ``[-1/sqrt(d), 1/sqrt(d)]^d``,
    ``a_r`` uniform in ``[-1/sqrt(m), 1/sqrt(m)]``) times ``init_scale``, seeded.
    """
    for name, value in (("d", d), ("m", m), ("k", k)):
        positive_int(name, value)
    return mlp([d, m, k], activation="relu", seed=seed, bias=False, init_scale=positive("init_scale", init_scale))


def two_layer_weights(network: nn.Module | Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(a, W)`` of a two-layer ReLU network without biases (a module or its parameter dict).

    ``a`` is ``(m,)`` for one output and ``(m, k)`` for ``k`` outputs; ``W`` is ``(m, d)``.

    Raises:
        TypeError: if ``network`` is not ``Sequential(Linear(d, m, bias=False), ReLU(),
            Linear(m, k, bias=False))`` or a dict with exactly ``"0.weight"`` and ``"2.weight"``.
        ValueError: if the two weight shapes do not chain.
    """
    if isinstance(network, nn.Module):
        layers = list(network.children()) if isinstance(network, nn.Sequential) else []
        ok = (len(layers) == 3 and isinstance(layers[0], nn.Linear) and isinstance(layers[1], nn.ReLU)
              and isinstance(layers[2], nn.Linear) and layers[0].bias is None and layers[2].bias is None)
        if not ok:
            raise TypeError("network must be a two-layer ReLU network: Sequential(Linear(d, m, bias=False), "
                            f"ReLU(), Linear(m, k, bias=False)), got {network.__class__.__name__} {network}")
        params = {n: p.detach() for n, p in network.named_parameters()}
    elif isinstance(network, Mapping):
        params = dict(network)
    else:
        raise TypeError(f"network must be an nn.Module or a dict of parameters, got {type(network).__name__}")
    if set(params) != {"0.weight", "2.weight"}:
        raise TypeError(f"a two-layer ReLU network without biases has parameters ['0.weight', '2.weight'], "
                        f"got {sorted(params)}")
    W = finite_tensor("params['0.weight']", params["0.weight"])
    out = finite_tensor("params['2.weight']", params["2.weight"])
    if W.ndim != 2 or out.ndim != 2 or out.shape[1] != W.shape[0]:
        raise ValueError(f"'0.weight' must be (m, d) and '2.weight' (k, m), "
                         f"got {tuple(W.shape)} and {tuple(out.shape)}")
    return (out[0] if out.shape[0] == 1 else out.T), W


def as_params(a: torch.Tensor, W: torch.Tensor) -> dict[str, torch.Tensor]:
    """The parameter dict of :func:`two_layer_relu` holding ``(a, W)`` (inverse of :func:`two_layer_weights`)."""
    a, W, vector = _checked(a, W)
    if W.ndim != 2:
        raise ValueError(f"as_params takes one network: W must be (m, d), got {tuple(W.shape)}")
    return {"0.weight": W, "2.weight": a.T if vector else a[None, :]}


def _checked(a, W) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Validate ``(a, W)``; return them as float64 and whether the output is a vector."""
    a, W = finite_tensor("a", a), finite_tensor("W", W)
    if W.ndim < 2:
        raise ValueError(f"W must have shape (..., m, d), got {tuple(W.shape)}")
    if a.shape == W.shape[:-1]:
        return a, W, False
    if W.ndim == 2 and a.ndim == 2 and a.shape[0] == W.shape[0]:
        return a, W, True
    raise ValueError(f"a must have shape {tuple(W.shape[:-1])} (one output) or ({W.shape[0]}, k) (k outputs) "
                     f"for W of shape {tuple(W.shape)}, got {tuple(a.shape)}")


def _inputs(x, d: int) -> torch.Tensor:
    x = finite_tensor("x", x)
    if x.ndim != 2 or x.shape[1] != d or x.shape[0] == 0:
        raise ValueError(f"x must have shape (n, {d}) with n >= 1, got {tuple(x.shape)}")
    return x


def relu_network(a: torch.Tensor, W: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``F(x_i) = sum_r a_r ReLU(w_r^T x_i)``: shape ``(..., n)`` for one output, ``(n, k)`` for k."""
    a, W, vector = _checked(a, W)
    x = _inputs(x, W.shape[-1])
    hidden = torch.relu(W @ x.T)  # (..., m, n)
    return hidden.T @ a if vector else (a.unsqueeze(-1) * hidden).sum(-2)


def regression_loss(a: torch.Tensor, W: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The square loss ``L = (1/2n) sum_i (F(x_i) - y_i)^2`` of every model in the batch."""
    F = relu_network(a, W, x)
    y = finite_tensor("y", y)
    if y.shape != F.shape[-1:]:
        raise ValueError(f"y must have shape ({F.shape[-1]},), got {tuple(y.shape)}")
    return 0.5 * ((F - y) ** 2).mean(-1)


# ---------------------------------------------------------------------------------------
# Quotient coordinates and quotient flatness
# ---------------------------------------------------------------------------------------


def _norms(a, W, vector: bool) -> torch.Tensor:
    norms = W.norm(dim=-1)
    absent = norms == 0
    if absent.any():
        a_abs = a.norm(dim=-1) if vector else a.abs()
        if (a_abs[absent] != 0).any():
            raise ValueError("a neuron with w_r = 0 but a_r != 0 is not on the regular quotient "
                             "(alpha_r = 0 but u_r is undefined); only absent neurons (w_r = 0, a_r = 0) are allowed")
    return norms


def quotient_coordinates(a: torch.Tensor, W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(alpha, U)`` with ``alpha_r = a_r ||w_r||`` and rows ``u_r = w_r / ||w_r||``.

    Both are invariant under ``(a_r, w_r) -> (a_r / c_r, c_r w_r)`` for every ``c_r > 0``.
    Absent neurons (``w_r = 0``, ``a_r = 0``) get ``alpha_r = 0`` and ``u_r = 0``.
    """
    a, W, vector = _checked(a, W)
    norms = _norms(a, W, vector)
    U = torch.where(norms[..., None] > 0, W / norms.clamp_min(1e-300)[..., None], torch.zeros_like(W))
    alpha = a * norms[:, None] if vector else a * norms
    return alpha, U


def representative(alpha: torch.Tensor, U: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The point ``(a, W) = (alpha, u)`` with unit rows on the orbit of the quotient point ``(alpha, U)``.

    Rows of ``U`` are normalised first (zero rows must carry ``alpha_r = 0``), so any
    nonzero ``u_r`` names the same direction.
    """
    alpha, U, vector = _checked(alpha, U)
    norms = _norms(alpha, U, vector)
    return alpha, torch.where(norms[..., None] > 0, U / norms.clamp_min(1e-300)[..., None], torch.zeros_like(U))


def quotient_jacobian(a: torch.Tensor, W: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Quotient gradients ``g_i^Q`` of ``F(x_i)`` (one output), in ambient coordinates: ``(..., n, m (d+1))``.

    For neuron r the block is ``[ReLU(u_r^T x_i), alpha_r 1[u_r^T x_i > 0] (I - u_r u_r^T) x_i]``:
    the derivative in ``alpha_r`` and the Riemannian gradient on the sphere, a tangent
    vector written in R^d. Inner products of rows are those of the quotient metric, so
    ``J^T J / n`` is the Gauss-Newton matrix of the quotient, padded by zero normal
    directions (which :func:`active_jacobian` removes).
    """
    a, W, vector = _checked(a, W)
    if vector:
        raise ValueError("quotient_jacobian needs a one-output network (a of shape (..., m))")
    x = _inputs(x, W.shape[-1])
    alpha, U = quotient_coordinates(a, W)
    z = U @ x.T  # (..., m, n)
    active = (z > 0).to(x.dtype)
    tangent = x[None, :, :] - z[..., None] * U[..., None, :]  # (..., m, n, d)
    block = torch.cat([torch.relu(z)[..., None], (alpha[..., None] * active)[..., None] * tangent], dim=-1)
    return block.transpose(-3, -2).reshape(*W.shape[:-2], x.shape[0], -1)


# ---------------------------------------------------------------------------------------
# Input smoothness and the constants of the bound
# ---------------------------------------------------------------------------------------


def input_smoothness(a: torch.Tensor, W: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``(1/n) sum_i ||grad_x F(x_i)||^2`` with ``grad_x F(x) = sum_r a_r 1[w_r^T x > 0] w_r`` (one output)."""
    a, W, vector = _checked(a, W)
    if vector:
        raise ValueError("input_smoothness needs a one-output network (a of shape (..., m))")
    x = _inputs(x, W.shape[-1])
    active = (W @ x.T > 0).to(x.dtype)  # (..., m, n)
    grads = (active * a[..., None]).transpose(-1, -2) @ W  # (..., n, d)
    return (grads**2).sum(-1).mean(-1)


@dataclass(frozen=True)
class SmoothnessConstants:
    """``kappa = ||U||_op^2``, ``amplitude = A_* = max_r |alpha_r|``, ``rho = min_i ||x_i||`` (per model)."""

    kappa: torch.Tensor
    amplitude: torch.Tensor
    rho: torch.Tensor

    @property
    def factor(self) -> torch.Tensor:
        """``kappa_* max(1, A_*^2) rho^-2``: the constant in front of ``Flat^Q_GN``."""
        return self.kappa * torch.clamp(self.amplitude**2, min=1.0) / self.rho**2


def smoothness_constants(a: torch.Tensor, W: torch.Tensor, x: torch.Tensor) -> SmoothnessConstants:
    """The constants of ``(1/n) sum_i ||grad_x F(x_i)||^2 <= kappa_* max(1, A_*^2) rho^-2 Flat^Q_GN``.

    Derived in the chapter: ``grad_x F(x) = U^T (alpha * s(x))``, so its squared norm is at
    most ``kappa_* sum_r s_r alpha_r^2``, and neuron r's Gauss-Newton term
    ``(u_r^T x)^2 + alpha_r^2 (||x||^2 - (u_r^T x)^2)`` is at least ``min(1, alpha_r^2) ||x||^2``.
    """
    a, W, vector = _checked(a, W)
    if vector:
        raise ValueError("smoothness_constants needs a one-output network (a of shape (..., m))")
    x = _inputs(x, W.shape[-1])
    alpha, U = quotient_coordinates(a, W)
    rho = x.norm(dim=-1).min()
    if rho == 0:
        raise ValueError("rho = min_i ||x_i|| must be > 0 (an input at the origin breaks the bound)")
    kappa = torch.linalg.matrix_norm(U, ord=2) ** 2
    return SmoothnessConstants(kappa, alpha.abs().amax(-1), rho.expand_as(kappa))


# ---------------------------------------------------------------------------------------
# Linear stability of SGD on the active subspace
# ---------------------------------------------------------------------------------------


def active_jacobian(jacobian, rel_threshold: float = 1e-6) -> np.ndarray:
    """The rows of ``jacobian`` (n, p) in an orthonormal basis of its row space: (n, k).

    The basis is the right singular vectors with singular value above
    ``rel_threshold * sigma_1`` (the seed's threshold is ``1e-6 sigma_1``). Every per-batch
    Hessian ``A_I`` acts on this subspace and vanishes on its complement, where the
    linearised dynamics is the identity.
    """
    J = _jacobian(jacobian)
    thr = positive("rel_threshold", rel_threshold)
    _, sigma, Vt = np.linalg.svd(J, full_matrices=False)
    if sigma[0] == 0:
        raise ValueError("jacobian is zero: there is no active subspace")
    return J @ Vt[sigma > thr * sigma[0]].T


def _jacobian(jacobian) -> np.ndarray:
    J = finite_tensor("jacobian", jacobian).detach().numpy()
    if J.ndim != 2 or J.shape[0] == 0:
        raise ValueError(f"jacobian must have shape (n, p) with n >= 1, got {J.shape}")
    return J


def _batch_size(batch_size: int, n: int) -> int:
    b = positive_int("batch_size", batch_size)
    if b > n:
        raise ValueError(f"batch_size must be <= n = {n} (the number of examples), got {b}")
    return b


def batch_moments(jacobian, batch_size: int, replacement: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``(A_bar, E[A_I^2])`` for ``A_I = (1/B) sum_{i in I} g_i g_i^T`` over random batches I.

    With ``S = (1/n) sum_i ||g_i||^2 g_i g_i^T``: drawn with replacement,
    ``E[A_I^2] = S / B + (1 - 1/B) A_bar^2``; without replacement (a uniform B-subset),
    ``E[A_I^2] = (n - B) / (B (n - 1)) S + n (B - 1) / (B (n - 1)) A_bar^2``.
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


def stability_operator(jacobian, learning_rate: float, batch_size: int, replacement: bool = True) -> np.ndarray:
    """``E[M_I^2] = I - 2 eta A_bar + eta^2 E[A_I^2]`` with ``M_I = I - eta A_I`` (one SGD step, linearised)."""
    eta = positive("learning_rate", learning_rate)
    A_bar, second = batch_moments(jacobian, batch_size, replacement)
    return np.eye(A_bar.shape[0]) - 2 * eta * A_bar + eta**2 * second


def stability_lambda_max(jacobian, learning_rate: float, batch_size: int, replacement: bool = True) -> float:
    """``lambda_max(E[M_I^2])``; one-step mean-square stability is ``lambda_max <= 1``."""
    return float(np.linalg.eigvalsh(stability_operator(jacobian, learning_rate, batch_size, replacement))[-1])


def critical_learning_rate(jacobian, batch_size: int, replacement: bool = True) -> float:
    """The largest stable ``eta``: ``2 / mu_max`` with ``E[A_I^2] v = mu A_bar v`` (generalised eigenproblem).

    ``v^T E[M_I^2] v <= v^T v`` for all v is ``eta v^T E[A_I^2] v <= 2 v^T A_bar v``, so the
    stable learning rates form the interval ``(0, 2 / mu_max]``. ``jacobian`` must be an
    active Jacobian (:func:`active_jacobian`), so that ``A_bar`` is positive definite.
    """
    A_bar, second = batch_moments(jacobian, batch_size, replacement)
    eig_A = np.linalg.eigvalsh(A_bar)
    if eig_A[0] <= 1e-12 * eig_A[-1]:
        raise ValueError("A_bar is singular: pass active_jacobian(jacobian) so the subspace is the active one")
    return float(2.0 / scipy.linalg.eigh(second, A_bar, eigvals_only=True)[-1])


def stable_pairs(jacobian, learning_rates: Sequence[float], batch_sizes: Sequence[int],
                 replacement: bool = True) -> np.ndarray:
    """Which ``(B, eta)`` are one-step mean-square stable: ``lambda_max(E[M_I^2]) <= 1``.

    Returns a boolean array of shape ``(len(batch_sizes), len(learning_rates))``; pass an
    active Jacobian (:func:`active_jacobian`) so that the subspace is the seed's.
    """
    return np.array([[stability_lambda_max(jacobian, eta, b, replacement) <= 1.0 for eta in learning_rates]
                     for b in batch_sizes])


def stable_pair_grid(a: torch.Tensor, W: torch.Tensor, x: torch.Tensor, learning_rates: Sequence[float],
                     batch_sizes: Sequence[int], replacement: bool = True) -> np.ndarray:
    """:func:`stable_pairs` of every model in a batch, from its weights: ``(..., len(B), len(eta))``.

    Each model's quotient Jacobian on ``x`` is cut to its active subspace
    (:func:`active_jacobian`, threshold ``1e-6 sigma_1``) before the test.
    """
    a, W, vector = _checked(a, W)
    if vector:
        raise ValueError("stable_pair_grid needs one-output networks (a of shape (..., m))")
    jacobians = quotient_jacobian(a, W, x)
    flat = jacobians.reshape(-1, *jacobians.shape[-2:])
    grids = [stable_pairs(active_jacobian(J), learning_rates, batch_sizes, replacement) for J in flat]
    return np.stack(grids).reshape(*jacobians.shape[:-2], len(batch_sizes), len(learning_rates))


# ---------------------------------------------------------------------------------------
# Teacher-student task, test distribution and the generalisation bound
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TeacherStudentTask:
    """Inputs on the unit sphere, a two-layer ReLU teacher and its noise-free labels."""

    x: torch.Tensor
    y: torch.Tensor
    teacher_a: torch.Tensor
    teacher_W: torch.Tensor
    description: str


def teacher_student(n: int = 25, d: int = 4, m_teacher: int = 4, seed: int = 0) -> TeacherStudentTask:
    """``n`` inputs uniform on ``S^{d-1}``; teacher rows ``w_r`` uniform on ``S^{d-1}``, ``a_r ~ N(0, 1/m_t)``."""
    n, d, m_t = positive_int("n", n), positive_int("d", d), positive_int("m_teacher", m_teacher)
    g = torch.Generator().manual_seed(int(seed))
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    W_t = torch.randn(m_t, d, generator=g, dtype=torch.float64)
    a_t = torch.randn(m_t, generator=g, dtype=torch.float64) / math.sqrt(m_t)
    x, W_t = x / x.norm(dim=1, keepdim=True), W_t / W_t.norm(dim=1, keepdim=True)
    desc = (f"teacher-student: n = {n} inputs uniform on S^{d - 1}, teacher width {m_t} "
            f"(unit w_r, a_r ~ N(0, 1/{m_t})), noise-free labels, seed {seed}")
    return TeacherStudentTask(x, relu_network(a_t, W_t, x), a_t, W_t, desc)


@dataclass(frozen=True)
class BallUnionSample:
    """Draws from the uniform law on ``U_i B(x_i, eps)`` and the overlap factor ``nu``."""

    x: torch.Tensor
    nu: float


def sample_ball_union(centres: torch.Tensor, radius: float, n_samples: int, seed: int = 0) -> BallUnionSample:
    """Exact draws from the uniform distribution on the union of the balls ``B(x_i, radius)``.

    A draw from the equal mixture of the balls is kept with probability ``1 / N(x)``,
    ``N(x)`` the number of balls holding x; the kept draws are uniform on the union. The
    density of that law is at most ``nu`` times the mixture's, with
    ``nu = n vol(B) / vol(union) = 1 / E_mixture[1 / N]`` (1 when no balls overlap),
    estimated from the mixture draws.
    """
    X = finite_tensor("centres", centres)
    r = positive("radius", radius)
    count = positive_int("n_samples", n_samples)
    n, d = X.shape
    g = torch.Generator().manual_seed(int(seed))
    kept, inverse_counts = [], []
    while sum(len(k) for k in kept) < count:
        which = torch.randint(n, (count,), generator=g)
        direction = torch.randn(count, d, generator=g, dtype=torch.float64)
        length = r * torch.rand(count, generator=g, dtype=torch.float64) ** (1.0 / d)
        draws = X[which] + direction / direction.norm(dim=1, keepdim=True) * length[:, None]
        inside = (torch.cdist(draws, X) <= r).sum(1).to(torch.float64)
        keep = torch.rand(count, generator=g, dtype=torch.float64) < 1.0 / inside
        kept.append(draws[keep])
        inverse_counts.append(1.0 / inside)
    return BallUnionSample(torch.cat(kept)[:count], float(1.0 / torch.cat(inverse_counts).mean()))


def kink_remainder(a: torch.Tensor, W: torch.Tensor, centres: torch.Tensor, radius: float) -> torch.Tensor:
    """``K_i = sum_r |alpha_r| (eps - |u_r^T x_i|)_+``: the largest departure of F from its tangent on ``B(x_i, eps)``.

    Only neurons whose kink ``u_r^T x = 0`` passes through the ball contribute. Shape ``(..., n)``.
    """
    r = positive("radius", radius)
    alpha, U = quotient_coordinates(a, W)
    x = _inputs(centres, U.shape[-1])
    return (alpha.abs()[..., None] * torch.clamp(r - (U @ x.T).abs(), min=0.0)).sum(-2)


@dataclass(frozen=True)
class GeneralisationBound:
    """The bound on ``E_gen = E_P[(F - f_*)^2 / 2] - L`` and its terms (each already times ``nu``)."""

    training: torch.Tensor
    flatness: torch.Tensor
    teacher: torch.Tensor
    kinks: torch.Tensor

    @property
    def total(self) -> torch.Tensor:
        return self.training + self.flatness + self.teacher + self.kinks


def generalisation_bound(a, W, task: TeacherStudentTask, radius: float, nu: float = 1.0) -> GeneralisationBound:
    """``E_gen <= nu [3 L + 3 eps^2/(d+2) (C Flat^Q_GN + S_*) + 3/(2n) sum_i K_i^2] - L``.

    Here ``C = kappa_* max(1, A_*^2) rho^-2`` (:func:`smoothness_constants`), ``S_*`` is the
    teacher's input smoothness and ``K_i`` the kink remainders of student plus teacher
    (:func:`kink_remainder`); the law is uniform on the union of ``B(x_i, eps)`` with
    overlap factor ``nu``. The chapter derives it: on each ball the error is the residual
    plus a linear term (mean square ``eps^2 ||grad (F - f_*)||^2 / (d + 2)``) plus at most
    ``K_i``; Minkowski's inequality and ``(p + q + s)^2 <= 3 (p^2 + q^2 + s^2)`` finish it.
    """
    r, nu = positive("radius", radius), positive("nu", nu)
    if nu < 1:
        raise ValueError(f"nu = n vol(B) / vol(union) is >= 1, got {nu}")
    from lossgeom.flatness import quotient_flatness  # flatness builds on this module's coordinates

    x, y, d = task.x, task.y, task.x.shape[1]
    loss = regression_loss(a, W, x, y)
    constant = smoothness_constants(a, W, x).factor
    flat = quotient_flatness(a, W, x, y, part="gauss_newton")
    teacher_smooth = input_smoothness(task.teacher_a, task.teacher_W, x)
    K = kink_remainder(a, W, x, r) + kink_remainder(task.teacher_a, task.teacher_W, x, r)
    scale = 3 * r**2 / (d + 2)
    return GeneralisationBound(training=(3 * nu - 1) * loss, flatness=nu * scale * constant * flat,
                               teacher=nu * scale * teacher_smooth * torch.ones_like(loss),
                               kinks=nu * 1.5 * (K**2).mean(-1))


def generalisation_error(a, W, task: TeacherStudentTask, test_x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Monte Carlo ``E_gen = mean_test (F - f_*)^2 / 2 - L`` and the standard error of the mean."""
    test_x = _inputs(test_x, task.x.shape[1])
    diff2 = 0.5 * (relu_network(a, W, test_x) - relu_network(task.teacher_a, task.teacher_W, test_x)) ** 2
    loss = regression_loss(a, W, task.x, task.y)
    return diff2.mean(-1) - loss, diff2.std(-1) / math.sqrt(test_x.shape[0])


# ---------------------------------------------------------------------------------------
# Two-dimensional slices in raw and quotient coordinates
# ---------------------------------------------------------------------------------------


def slice_directions(a: torch.Tensor, W: torch.Tensor, seed: int, coordinates: str = "raw"
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The centre and two seeded random directions of a 2-D loss slice, as flat vectors ``[a, W]``.

    ``coordinates="raw"``: the centre is ``(a, W)``; each direction is Gaussian, filter-normalised
    (Li et al. 2018): row r of the ``W`` part gets the norm of ``w_r`` and output unit j's weights
    (column j of ``a``) the norm of ``a[:, j]``. ``coordinates="quotient"``: the centre is
    ``(alpha, U)``; the ``alpha_r`` part of a direction gets the norm of ``alpha_r`` and the ``u_r``
    part is projected onto the tangent space at ``u_r`` and given unit norm (the norm of ``u_r``).
    Both directions use the same Gaussian draws for the same seed and shapes.
    """
    if coordinates not in ("raw", "quotient"):
        raise ValueError(f"coordinates must be 'raw' or 'quotient', got {coordinates!r}")
    a, W, vector = _checked(a, W)
    if W.ndim != 2:
        raise ValueError(f"slice_directions takes one network: W must be (m, d), got {tuple(W.shape)}")
    a2 = a if vector else a[:, None]
    if coordinates == "quotient":
        alpha, U = quotient_coordinates(a2, W)
        centre_a, centre_W = alpha, U
    else:
        centre_a, centre_W = a2, W
    g = torch.Generator().manual_seed(int(seed))
    directions = []
    for _ in range(2):
        da = torch.randn(a2.shape, generator=g, dtype=torch.float64)
        dW = torch.randn(W.shape, generator=g, dtype=torch.float64)
        if coordinates == "raw":
            da = da / da.norm(dim=0, keepdim=True) * centre_a.norm(dim=0, keepdim=True)
            dW = dW / dW.norm(dim=1, keepdim=True) * centre_W.norm(dim=1, keepdim=True)
        else:
            da = da / da.norm(dim=1, keepdim=True) * centre_a.norm(dim=1, keepdim=True)
            dW = dW - (dW * centre_W).sum(1, keepdim=True) * centre_W
            dW = dW / dW.norm(dim=1, keepdim=True)
        directions.append(torch.cat([da.reshape(-1), dW.reshape(-1)]).numpy())
    centre = torch.cat([centre_a.reshape(-1), centre_W.reshape(-1)]).numpy()
    return centre, directions[0], directions[1]


def slice_cross_entropy(points, x: torch.Tensor, y: torch.Tensor, m: int, k: int,
                        coordinates: str = "raw") -> np.ndarray:
    """Mean cross-entropy of ``x -> sum_r a_r ReLU(w_r^T x)`` at every flat point ``[a (m, k), W (m, d)]``.

    ``points`` has shape ``(..., m k + m d)`` (e.g. from :func:`lossgeom.landscape.plane_grid`).
    With ``coordinates="quotient"`` a point is ``[alpha, U]`` and each ``u_r`` is normalised
    first, so the loss is that of the quotient point (a retraction onto the spheres).
    """
    if coordinates not in ("raw", "quotient"):
        raise ValueError(f"coordinates must be 'raw' or 'quotient', got {coordinates!r}")
    x = finite_tensor("x", x)
    m, k = positive_int("m", m), positive_int("k", k)
    P = torch.as_tensor(np.asarray(points, dtype=np.float64))
    d = x.shape[1]
    if P.shape[-1] != m * k + m * d:
        raise ValueError(f"points must end in m k + m d = {m * k + m * d} coordinates, got {tuple(P.shape)}")
    flat = P.reshape(-1, P.shape[-1])
    A, Wb = flat[:, : m * k].reshape(-1, m, k), flat[:, m * k:].reshape(-1, m, d)
    if coordinates == "quotient":
        Wb = Wb / Wb.norm(dim=-1, keepdim=True)
    losses = []
    for start in range(0, flat.shape[0], 64):  # blocks of 64 points keep memory small
        logits = torch.relu(x @ Wb[start:start + 64].transpose(1, 2)) @ A[start:start + 64]
        losses.append(torch.nn.functional.cross_entropy(logits.transpose(1, 2), y.expand(logits.shape[0], -1),
                                                        reduction="none").mean(-1))
    return torch.cat(losses).reshape(P.shape[:-1]).numpy()


# ---------------------------------------------------------------------------------------
# Many students at once
# ---------------------------------------------------------------------------------------


def init_students(d: int, widths: Sequence[int], seeds: Sequence[int], init_scales: Sequence[float] = (1.0,)
                  ) -> tuple[torch.Tensor, torch.Tensor, list[tuple[float, int, int]]]:
    """Initial ``(a, W)`` of every (init scale, width, seed), padded with absent neurons to the largest width.

    Each student is :func:`two_layer_relu` ``(d, m, seed=seed, init_scale=scale)``, so one seed
    gives the same directions at every scale. Returns ``a (S, M)``, ``W (S, M, d)`` and the labels.
    """
    width = max(positive_int("width", m) for m in widths)
    rows, labels = [], []
    for scale in init_scales:
        for m in widths:
            for seed in seeds:
                a, W = two_layer_weights(two_layer_relu(d, m, seed=seed, init_scale=scale))
                rows.append((torch.cat([a, a.new_zeros(width - m)]), torch.cat([W, W.new_zeros(width - m, d)])))
                labels.append((float(scale), int(m), int(seed)))
    return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows]), labels


@dataclass(frozen=True)
class StudentFits:
    """Every student's parameters at each check, whether it reached its target, and its history.

    ``a[:, j]`` and ``W[:, j]`` are the parameters after ``steps[j]`` updates (a frozen
    student keeps its last ones); ``history[key][:, j]`` holds the loss, ``Flat^Q``, its
    Gauss-Newton part and the raw Hessian trace there. ``final`` gives the last ``(a, W)``.
    """

    a: torch.Tensor
    W: torch.Tensor
    converged: torch.Tensor
    steps: np.ndarray
    history: dict[str, np.ndarray]

    @property
    def final(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.a[:, -1], self.W[:, -1]


def train_students(a: torch.Tensor, W: torch.Tensor, x: torch.Tensor, y: torch.Tensor, *, learning_rate: float,
                   target_loss, max_steps: int, check_every: int = 100) -> StudentFits:
    """Full-batch gradient descent on every student's ``L`` at once, with :func:`lossgeom.optimisers.train`.

    The students' losses are summed, so each one's gradient is its own. A monitor checks
    every ``check_every`` steps (and after the last): it records the history and freezes
    each student whose loss is below its ``target_loss`` (a number or one per student;
    its loss drops out of the sum, so it stops moving); a stop hook ends the run when all
    are frozen, else it ends after ``max_steps`` updates.
    """
    a, W, vector = _checked(a, W)
    if vector or W.ndim != 3:
        raise ValueError("train_students takes a batch of one-output students: a (S, M), W (S, M, d)")
    x, y = _inputs(x, W.shape[-1]), finite_tensor("y", y)
    if y.shape != (x.shape[0],):
        raise ValueError(f"y must have shape ({x.shape[0]},), got {tuple(y.shape)}")
    targets = torch.as_tensor(target_loss, dtype=torch.float64).expand(W.shape[0]).clone()
    if not (targets > 0).all():
        raise ValueError("target_loss must be > 0")
    max_steps, every = positive_int("max_steps", max_steps), positive_int("check_every", check_every)
    from lossgeom.flatness import quotient_flatness, raw_hessian_trace  # flatness builds on this module

    x_t, running = x.T.contiguous(), torch.ones(W.shape[0], dtype=torch.float64)

    def loss_fn(params, indices=None):  # the summed losses of the running students, without input checks
        F = (params["a"].unsqueeze(-2) @ torch.relu(params["W"] @ x_t)).squeeze(-2)
        return 0.5 * (running * ((F - y) ** 2).mean(-1)).sum()

    def check(step: int, params: dict) -> tuple[dict, tuple]:
        nonlocal running
        record = {"loss": regression_loss(params["a"], params["W"], x, y),
                  "flatness": quotient_flatness(params["a"], params["W"], x, y),
                  "gauss_newton": quotient_flatness(params["a"], params["W"], x, y, part="gauss_newton"),
                  "raw": raw_hessian_trace(params["a"], params["W"], x)}
        running = torch.where(record["loss"] < targets, 0.0, running)
        return {k: v.numpy().copy() for k, v in record.items()}, (params["a"], params["W"])

    run = train(loss_fn, {"a": a, "W": W}, sgd(learning_rate), max_steps,
                hooks=[Monitor("check", check, every=every),
                       StopWhen(lambda step, params: not running.any(), "every student reached its target")])
    checks = run.records["check"]
    history = {k: np.stack([record[k] for _, (record, _) in checks], axis=1) for k in checks[0][1][0]}
    return StudentFits(torch.stack([s[0] for _, (_, s) in checks], 1), torch.stack([s[1] for _, (_, s) in checks], 1),
                       running == 0, np.array([step for step, _ in checks]), history)


# ---------------------------------------------------------------------------------------
# Many students with any update rule, and what to read off their runs
# ---------------------------------------------------------------------------------------


def student_gradients(a: torch.Tensor, W: torch.Tensor, x: torch.Tensor, y: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each student's ``L = (1/2n) sum_i r_i^2`` and its gradient in closed form, ``r_i = F(x_i) - y_i``.

    ``dL/da_r = (1/n) sum_i r_i ReLU(w_r^T x_i)`` and ``dL/dw_r = (1/n) sum_i r_i a_r 1[w_r^T x_i > 0] x_i``
    (the derivative of ReLU at 0 taken as 0, as torch's autograd takes it). Returns
    ``(loss (...,), grad_a (..., m), grad_W (..., m, d))``.
    """
    a, W, vector = _checked(a, W)
    if vector:
        raise ValueError("student_gradients needs one-output networks (a of shape (..., m))")
    x, y = _inputs(x, W.shape[-1]), finite_tensor("y", y)
    if y.shape != (x.shape[0],):
        raise ValueError(f"y must have shape ({x.shape[0]},), got {tuple(y.shape)}")
    return _student_gradients(a, W, x, y)


def _student_gradients(a, W, x, y):
    z = W @ x.T  # (..., m, n)
    hidden = torch.relu(z)
    r = (a.unsqueeze(-1) * hidden).sum(-2) - y  # (..., n)
    n = x.shape[0]
    grad_a = (hidden * r.unsqueeze(-2)).sum(-1) / n
    grad_W = ((z > 0).to(x.dtype) * (a.unsqueeze(-1) * r.unsqueeze(-2))) @ x / n
    return 0.5 * (r**2).mean(-1), grad_a, grad_W


def fit_students(a: torch.Tensor, W: torch.Tensor, x: torch.Tensor, y: torch.Tensor, optimiser, *,
                 target_loss, max_steps: int, check_every: int = 100) -> StudentFits:
    """Full-batch training of every student by ``optimiser``, each frozen at the first check below its target.

    ``optimiser`` is any update rule of :mod:`lossgeom.optimisers` (:func:`~lossgeom.optimisers.sgd`
    with or without momentum, :func:`~lossgeom.optimisers.adam`); its ``update`` is applied
    to the closed-form gradients of :func:`student_gradients`, so the rule is the package's
    own and only the gradient is computed without autograd. Every ``check_every`` steps (and
    after the last) the loss, ``Flat^Q``, its Gauss-Newton part and the raw Hessian trace are
    recorded, as in :func:`train_students`; a student whose loss is below its ``target_loss``
    (a number or one per student) is frozen: its parameters and optimiser buffers stop
    changing. The run ends when all are frozen or after ``max_steps`` updates.
    With ``sgd(eta)`` the result equals :func:`train_students` ``(learning_rate=eta)`` to rounding.
    """
    from lossgeom.flatness import quotient_flatness, raw_hessian_trace  # flatness builds on this module
    from lossgeom.optimisers import Optimiser

    if not isinstance(optimiser, Optimiser):
        raise TypeError(f"optimiser must be an Optimiser (from lossgeom.optimisers.sgd or adam), "
                        f"got {type(optimiser).__name__}")
    if optimiser.sam_radius:
        raise ValueError("fit_students takes plain update rules; SAM needs a loss closure "
                         "(use lossgeom.optimisers.train)")
    a, W, vector = _checked(a, W)
    if vector or W.ndim != 3:
        raise ValueError("fit_students takes a batch of one-output students: a (S, M), W (S, M, d)")
    x, y = _inputs(x, W.shape[-1]), finite_tensor("y", y)
    if y.shape != (x.shape[0],):
        raise ValueError(f"y must have shape ({x.shape[0]},), got {tuple(y.shape)}")
    targets = torch.as_tensor(target_loss, dtype=torch.float64).expand(W.shape[0]).clone()
    if not (targets > 0).all():
        raise ValueError("target_loss must be > 0")
    max_steps, every = positive_int("max_steps", max_steps), positive_int("check_every", check_every)
    # One packed tensor theta = [a_r, w_r] per neuron: the update rules act elementwise, so this is
    # the same arithmetic with half the tensor operations per step.
    params = {"theta": torch.cat([a.unsqueeze(-1), W], -1)}
    state = optimiser.init(params)
    running = torch.ones(W.shape[0], dtype=torch.bool)
    steps, records, snapshots = [], [], []
    with torch.inference_mode():  # no autograd bookkeeping in the loop
        for step in range(max_steps + 1):
            theta = params["theta"]
            if step % every == 0 or step == max_steps:
                if not bool(torch.isfinite(theta).all()):
                    raise FloatingPointError(f"a student's parameters became non-finite by step {step}")
                a_now, W_now = theta[..., 0], theta[..., 1:]
                record = {"loss": regression_loss(a_now, W_now, x, y),
                          "flatness": quotient_flatness(a_now, W_now, x, y),
                          "gauss_newton": quotient_flatness(a_now, W_now, x, y, part="gauss_newton"),
                          "raw": raw_hessian_trace(a_now, W_now, x)}
                running = running & ~(record["loss"] < targets)
                all_running = bool(running.all())
                steps.append(step)
                records.append({k: v.numpy().copy() for k, v in record.items()})
                snapshots.append(theta)
                if not running.any():
                    break
            if step == max_steps:
                break
            _, grad_a, grad_W = _student_gradients(theta[..., 0], theta[..., 1:], x, y)
            new_params, new_state = optimiser.update(params, {"theta": torch.cat([grad_a.unsqueeze(-1), grad_W], -1)},
                                                     state)
            if not all_running:  # frozen students keep their parameters and buffers
                new_params = {"theta": _where_running(running, new_params["theta"], theta)}
                new_state = type(new_state)(new_state.step, {
                    key: {k: (_where_running(running, t, state.buffers[key][k])
                              if key in state.buffers and t.shape == theta.shape else t)
                          for k, t in b.items()} for key, b in new_state.buffers.items()})
            params, state = new_params, new_state
    history = {k: np.stack([r[k] for r in records], axis=1) for k in records[0]}
    stacked = torch.stack(snapshots, 1).clone()  # an ordinary tensor again, outside inference mode
    return StudentFits(stacked[..., 0].clone(), stacked[..., 1:].clone(), ~running, np.array(steps), history)


def _where_running(running: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    return torch.where(running.reshape(-1, *([1] * (new.ndim - 1))), new, old)


def first_check_below(fits: StudentFits, thresholds: Sequence[float]) -> np.ndarray:
    """Index of each student's first check with loss ``< threshold``, for every threshold: ``(S, T)``, -1 if never."""
    levels = [positive("threshold", t) for t in thresholds]
    losses = fits.history["loss"]
    below = losses[:, None, :] < np.array(levels)[None, :, None]  # (S, T, checks)
    return np.where(below.any(-1), below.argmax(-1), -1)


def stable_counts(fits: StudentFits, x: torch.Tensor, learning_rates: Sequence[float], batch_sizes: Sequence[int],
                  checks, replacement: bool = True) -> np.ndarray:
    """Number of stable ``(eta, B)`` pairs (:func:`stable_pair_grid`) of student i at check ``checks[i, t]``.

    ``checks`` is an integer array ``(S, T)`` of check indices (as from :func:`first_check_below`);
    -1 marks a student that never got there and gives ``nan``. Returns a float array ``(S, T)``.
    """
    index = np.asarray(checks)
    if index.ndim != 2 or index.shape[0] != fits.a.shape[0] or not np.issubdtype(index.dtype, np.integer):
        raise ValueError(f"checks must be an integer array of shape ({fits.a.shape[0]}, T), got {index.shape}")
    if (index >= fits.a.shape[1]).any() or (index < -1).any():
        raise ValueError(f"checks must lie in [-1, {fits.a.shape[1] - 1}] (-1: never reached)")
    counts = np.full(index.shape, np.nan)
    for (i, t), j in np.ndenumerate(index):
        if j >= 0:
            counts[i, t] = stable_pair_grid(fits.a[i, j], fits.W[i, j], x, learning_rates, batch_sizes,
                                            replacement).sum()
    return counts


def loss_pace(fits: StudentFits, window: int, end_step: int | None = None) -> np.ndarray:
    """Each student's geometric pace ``log(L(t - window) / L(t)) / window`` per step, ``t = end_step``.

    ``t`` defaults to the last check; both ``t`` and ``t - window`` must be check steps. A
    positive pace means the loss fell; e-folds of the loss per step.
    """
    span = positive_int("window", window)
    end = int(fits.steps[-1]) if end_step is None else int(end_step)
    position = {int(step): j for j, step in enumerate(fits.steps)}
    if end not in position or end - span not in position:
        raise ValueError(f"window must be a multiple of the check interval, with end_step - window and end_step "
                         f"check steps in [0, {int(fits.steps[-1])}], got window {span}, end_step {end}")
    losses = fits.history["loss"]
    return np.log(losses[:, position[end - span]] / losses[:, position[end]]) / span


def steps_at_recent_pace(fits: StudentFits, target: float, window: int) -> np.ndarray:
    """Steps each student still needs to reach ``target`` at the geometric pace of its last ``window`` steps.

    With ``L_end`` the last recorded loss and :func:`loss_pace` ``p`` over the last ``window``
    steps, the answer is ``log(L_end / target) / p``: 0 for a student already below ``target``,
    ``inf`` for one whose loss did not fall. A loss whose pace keeps dropping needs more.
    """
    level = positive("target", target)
    pace = loss_pace(fits, window)
    loss_end = fits.history["loss"][:, -1]
    with np.errstate(divide="ignore"):
        needed = np.where(pace > 0, np.log(loss_end / level) / np.where(pace > 0, pace, 1.0), np.inf)
    return np.where(loss_end < level, 0.0, needed)


@dataclass(frozen=True)
class FittingProfile:
    """How a measure ``M`` (e.g. ``Flat^Q``) moves while the loss ``L`` falls, over one recorded run.

    ``co_moving``: share of the recorded intervals in which ``L`` fell and ``M`` rose.
    ``peak_position``: where ``M`` is largest, as a fraction of the run (0 start, 1 end).
    ``loss_share_before_peak``: ``(L_0 - L_peak) / (L_0 - L_end)``, the share of the loss decrease
    made before the peak; ``decades_before_peak`` the same share of ``log L``.
    ``fall_after_peak``: ``(M_peak - M_end) / |M_peak|``. ``loss_monotone``: ``L`` never rose.
    """

    co_moving: float
    peak_position: float
    loss_share_before_peak: float
    decades_before_peak: float
    fall_after_peak: float
    loss_monotone: bool


def fitting_profile(loss, measure) -> FittingProfile:
    """The :class:`FittingProfile` of one run from its recorded losses and measure values.

    Trailing records after the loss stopped changing (a frozen student) are dropped; the
    co-moving share counts only the intervals in which the loss changed.
    """
    L = np.asarray(loss, dtype=np.float64)
    M = np.asarray(measure, dtype=np.float64)
    if L.ndim != 1 or L.shape != M.shape or L.size < 2:
        raise ValueError(f"loss and measure must be 1-D of one length >= 2, got {L.shape} and {M.shape}")
    if not (np.isfinite(L).all() and np.isfinite(M).all()) or (L <= 0).any():
        raise ValueError("loss must be positive and finite and measure finite")
    moving = np.flatnonzero(np.diff(L) != 0)
    if moving.size == 0 or L[moving[-1] + 1] >= L[0]:
        raise ValueError("the loss must fall over the run")
    end = moving[-1] + 1
    L, M = L[: end + 1], M[: end + 1]
    falls, rises = np.diff(L)[moving] < 0, np.diff(M)[moving] > 0
    peak = int(np.argmax(M))
    return FittingProfile(co_moving=float((falls & rises).mean()), peak_position=peak / end,
                          loss_share_before_peak=float((L[0] - L[peak]) / (L[0] - L[-1])),
                          decades_before_peak=float(np.log(L[0] / L[peak]) / np.log(L[0] / L[-1])),
                          fall_after_peak=float((M[peak] - M[-1]) / abs(M[peak])) if M[peak] != 0 else 0.0,
                          loss_monotone=bool((np.diff(L) <= 0).all()))


@dataclass(frozen=True)
class TangentDeparture:
    """The kink lemma on test draws: ``|D(x) - r_i - grad D(x_i)^T (x - x_i)| <= K_i`` on ``B(x_i, eps)``.

    ``ratio_max[s]``: the largest ``|remainder| / K_i`` over the (draw, ball) pairs with ``K_i > 0``
    (at most 1 by the lemma); ``untouched_max[s]``: the largest ``|remainder|`` where ``K_i = 0``
    (no kink crosses the ball, so the remainder is 0 up to rounding); ``pairs``: how many pairs.
    """

    ratio_max: torch.Tensor
    untouched_max: torch.Tensor
    pairs: int


def tangent_departure(a, W, task: TeacherStudentTask, test_x: torch.Tensor, radius: float) -> TangentDeparture:
    """Check the kink remainder :func:`kink_remainder` of ``D = F - f_*`` at every test draw.

    Every draw ``x`` is paired with each ball ``B(x_i, radius)`` that holds it; the remainder
    is ``D(x) - D(x_i) - grad D(x_i)^T (x - x_i)`` and ``K_i`` sums the student's and the
    teacher's kink terms, as in :func:`generalisation_bound`.
    """
    r = positive("radius", radius)
    a, W, vector = _checked(a, W)
    if vector:
        raise ValueError("tangent_departure needs one-output networks (a of shape (..., m))")
    X = task.x
    test_x = _inputs(test_x, X.shape[1])
    pairs = (torch.cdist(test_x, X) <= r).nonzero()
    if pairs.shape[0] == 0:
        raise ValueError("no test draw lies in any ball B(x_i, radius)")
    draw, ball = pairs[:, 0], pairs[:, 1]

    def gap(x_eval):
        return relu_network(a, W, x_eval) - relu_network(task.teacher_a, task.teacher_W, x_eval)

    def input_gradient(a_, W_):  # grad_x F at the centres, (..., n, d)
        return ((W_ @ X.T > 0).to(X.dtype) * a_[..., None]).transpose(-1, -2) @ W_

    grad_gap = input_gradient(a, W) - input_gradient(task.teacher_a, task.teacher_W)
    remainder = (gap(test_x)[..., draw] - gap(X)[..., ball]
                 - (grad_gap[..., ball, :] * (test_x[draw] - X[ball])).sum(-1))
    K = (kink_remainder(a, W, X, r) + kink_remainder(task.teacher_a, task.teacher_W, X, r))[..., ball]
    crossed = K > 0
    ratio = torch.where(crossed, remainder.abs() / K.clamp_min(1e-300), torch.zeros_like(K))
    untouched = torch.where(crossed, torch.zeros_like(K), remainder.abs())
    return TangentDeparture(ratio.amax(-1), untouched.amax(-1), int(pairs.shape[0]))

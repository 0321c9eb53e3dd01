"""Gradient-noise probes and checkpoint rounding of the chapter "Saddles, plateaus and optimisers".

:func:`projected_noise` measures mini-batch gradient noise in a chosen subspace from the
per-example gradients (:func:`lossgeom.training.closure_per_example_gradients`),
:func:`sampled_batch_noise` samples it, and :func:`heavy_ball_velocity` and
:func:`adam_preconditioner` show how momentum and adaptive scaling reshape it.
:func:`stored_at_precision` rounds a checkpoint to a lower precision and
:func:`natural_gradient_direction` is steepest descent in a declared metric.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.signal import lfilter

from lossgeom.training.rules import OptimiserState
from lossgeom.types import Params
from lossgeom_book.checks import as_real, finite_array, finite_tensor, positive, positive_int


def projected_noise(
    per_example: torch.Tensor, basis: torch.Tensor, batch_size: int, preconditioner: torch.Tensor | None = None
) -> float:
    """Mean variance of the mini-batch mean gradient along the orthonormal columns of ``basis``.

    For batches of ``B`` drawn without replacement from ``n`` examples with per-example
    covariance ``Sigma`` (normalised by ``n``), ``Cov(mean) = (n - B)/(n - 1) Sigma / B``;
    the result is ``tr(U^T Cov U) / k`` for ``basis = U`` of shape ``(p, k)``.
    With a diagonal ``preconditioner`` ``d`` (shape ``(p,)``, e.g. from
    :func:`adam_preconditioner`) it is the same for the preconditioned noise ``D g_B``:
    ``tr(U^T D Cov D U) / k``.
    """
    G, U = _noise_inputs(per_example, basis)
    n, b = G.shape[0], positive_int("batch_size", batch_size)
    if b > n:
        raise ValueError(f"batch_size must be <= n ({n}), got {b}")
    centred = G - G.mean(0)
    if preconditioner is not None:
        d = finite_tensor("preconditioner", preconditioner)
        if d.shape != (G.shape[1],):
            raise ValueError(f"preconditioner must have shape ({G.shape[1]},), got {tuple(d.shape)}")
        centred = centred * d
    P = centred @ U
    sigma = (P * P).sum(0) / n
    factor = (n - b) / (n - 1) / b if n > 1 else 0.0
    return float(sigma.mean() * factor)


def stored_at_precision(params: Params, state: OptimiserState, dtype: torch.dtype) -> tuple[dict, OptimiserState]:
    """A checkpoint written at ``dtype`` and read back as float64: rounded params and state.

    ``float64 -> dtype -> float64`` rounds every entry to the nearest ``dtype`` value (an
    exact, machine-independent operation), as saving weights and optimiser buffers in
    single or half precision does.
    """
    if not isinstance(state, OptimiserState):
        raise TypeError(f"state must be an OptimiserState, got {type(state).__name__}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")

    def trip(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype).to(torch.float64)

    buffers = {k: {n: trip(t) for n, t in b.items()} for k, b in state.buffers.items()}
    return {n: trip(p) for n, p in params.items()}, OptimiserState(state.step, buffers)


def sampled_batch_noise(
    per_example: torch.Tensor, basis: torch.Tensor, batch_size: int, n_batches: int, seed: int = 0
) -> np.ndarray:
    """Projected noise of sampled mini-batches: ``U^T (g_B - g)`` for ``n_batches`` draws.

    Each batch is ``batch_size`` distinct examples (without replacement within a batch,
    batches independent of each other, ``numpy.random.default_rng(seed)``); ``g_B`` is its
    mean gradient and ``g`` the full-data mean. Shape ``(n_batches, k)``. Its variance per
    column is what :func:`projected_noise` predicts exactly.
    """
    G, U = _noise_inputs(per_example, basis)
    n, b = G.shape[0], positive_int("batch_size", batch_size)
    if b > n:
        raise ValueError(f"batch_size must be <= n ({n}), got {b}")
    count = positive_int("n_batches", n_batches)
    projected = ((G - G.mean(0)) @ U).numpy()
    draws = np.random.default_rng(seed).random((count, n)).argsort(axis=1)[:, :b]
    return projected[draws].mean(axis=1)


def heavy_ball_velocity(gradients, momentum: float) -> np.ndarray:
    """The heavy-ball buffer ``v_t = mu v_{t-1} + g_t`` (``v_{-1} = 0``) along axis 0.

    For independent gradient noise of covariance ``C`` the stationary covariance of ``v``
    is ``C / (1 - mu^2)`` and its lag-``k`` autocorrelation ``mu^k``; computed
    with ``scipy.signal.lfilter``.
    """
    mu = as_real("momentum", momentum)
    if not 0.0 <= mu < 1.0:
        raise ValueError(f"momentum must lie in [0, 1), got {mu}")
    return lfilter([1.0], [1.0, -mu], finite_tensor("gradients", gradients).numpy(), axis=0)


def adam_preconditioner(per_example: torch.Tensor, batch_size: int, eps: float = 1e-8) -> torch.Tensor:
    """Adam's per-coordinate scaling ``1 / (sqrt(E[g_B^2]) + eps)`` at a fixed point.

    Adam's second-moment buffer averages squared mini-batch gradients; held at one point
    it tends to ``E[g_B^2] = g^2 + Var(g_B)`` coordinate-wise, with the variance of
    :func:`projected_noise`'s formula ``(n - B)/(n - 1) sigma^2 / B``. Its update noise is
    this diagonal times the mini-batch noise.
    """
    G = finite_tensor("per_example", per_example)
    if G.ndim != 2:
        raise ValueError(f"per_example must have shape (n, p), got {tuple(G.shape)}")
    n, b = G.shape[0], positive_int("batch_size", batch_size)
    if b > n:
        raise ValueError(f"batch_size must be <= n ({n}), got {b}")
    mean = G.mean(0)
    factor = (n - b) / (n - 1) / b if n > 1 else 0.0
    second_moment = mean**2 + ((G - mean) ** 2).mean(0) * factor
    return 1.0 / (second_moment.sqrt() + positive("eps", eps))


def natural_gradient_direction(gradient, metric, damping: float = 0.0) -> np.ndarray:
    """``(F + damping I)^+ g``: the steepest-descent direction in the metric ``F``.

    With ``F`` the Fisher information (for a Gaussian likelihood of unit variance, the
    Gauss-Newton matrix ``J_f^T J_f``) the step ``-eta F^+ g`` changes the model's outputs by
    ``-eta`` times the residual to first order, whatever the coordinates (Amari 1998; the
    worked example of "Saddles, plateaus and optimisers"). A singular ``F`` (a symmetry, as
    for the product model) uses the Moore-Penrose pseudo-inverse, ``numpy.linalg.pinv``.
    """
    g = finite_array("gradient", gradient, ndim=1)
    F = finite_array("metric", metric, ndim=2, shape=(g.size, g.size))
    if not np.allclose(F, F.T, rtol=0, atol=1e-12 * max(1.0, np.abs(F).max())):
        raise ValueError("metric must be a symmetric matrix")
    delta = as_real("damping", damping)
    if delta < 0:
        raise ValueError(f"damping must be >= 0, got {delta}")
    return np.linalg.pinv(F + delta * np.eye(g.size), hermitian=True) @ g


def _noise_inputs(per_example: torch.Tensor, basis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    G = finite_tensor("per_example", per_example)
    U = finite_tensor("basis", basis)
    if G.ndim != 2 or U.ndim != 2 or U.shape[0] != G.shape[1]:
        raise ValueError(f"per_example must be (n, p) and basis (p, k), got {tuple(G.shape)} and {tuple(U.shape)}")
    return G, U

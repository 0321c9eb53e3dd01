"""The rescaling quotient of two-layer ReLU networks: coordinates, quotient flatness, smoothness.

A two-layer ReLU network ``F(x) = sum_r a_r ReLU(w_r^T x)`` (no biases) is unchanged by
the positive rescaling ``(a_r, w_r) -> (a_r / c_r, c_r w_r)``, ``c_r > 0``
(:func:`lossgeom.symmetries.relu_neuron_rescaling` with layers ``"0"`` and ``"2"``). On
the regular part of the quotient (every ``w_r != 0``) the invariants

    alpha_r = a_r ||w_r||,    u_r = w_r / ||w_r||  in the unit sphere S^{d-1},

are coordinates, and ``F(x) = sum_r alpha_r ReLU(u_r^T x)``. The quotient carries the
product metric: Euclidean in each ``alpha_r``, the round metric of the unit sphere in
each ``u_r``. For the square loss ``L = (1/2n) sum_i (F(x_i) - y_i)^2`` the quotient
flatness ``Flat^Q`` is the trace of the Riemannian Hessian of ``L`` in that metric
(``miyagawa2026symmetry``). This module computes:

- the weights ``(a, W)`` of a ``Linear - ReLU - Linear`` module without biases
  (:func:`two_layer_weights`);
- the quotient coordinates (:func:`quotient_coordinates`, :func:`representative`) and
  the quotient gradient ``g_i^Q`` (:func:`quotient_jacobian`);
- the flatness measures built on them: :func:`quotient_flatness`, ``Flat^Q``, the trace
  of the Riemannian Hessian of ``L`` on the quotient (``miyagawa2026symmetry``), in closed
  form, with :func:`quotient_flatness_autograd` its autograd reference; and
  :func:`raw_hessian_trace`, the Euclidean Hessian trace in ``(a, W)``, which moves along
  the orbit as ``sum_r (c_r^2 P_r + Q_r / c_r^2)`` (``dinh2017sharp``);
- input smoothness ``(1/n) sum_i ||grad_x F(x_i)||^2`` (:func:`input_smoothness`) and the
  constants ``kappa_* = ||U||_op^2``, ``A_* = max_r |alpha_r|``, ``rho = min_i ||x_i||``
  of the bound ``smoothness <= kappa_* max(1, A_*^2) rho^-2 Flat^Q_GN``
  (:func:`smoothness_constants`).

The one-step SGD stability of the linearised dynamics on the quotient is in
:mod:`lossgeom.flatness.stability`.

Shapes: ``W`` is ``(..., m, d)`` (row r is ``w_r``); for a scalar output ``a`` is
``(..., m)`` with the same leading dimensions, so many models are handled at once; for a
``k``-output network ``a`` is ``(m, k)`` (row r is the outgoing vector ``a_r``). A neuron
with ``w_r = 0`` and ``a_r = 0`` is absent (it is how narrower students are padded to a
common width): it contributes nothing to any quantity here.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from numpy.typing import ArrayLike
from torch import nn

from lossgeom._validation import finite_tensor

# ---------------------------------------------------------------------------------------
# The network and its weights
# ---------------------------------------------------------------------------------------


def two_layer_weights(network: nn.Module | Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(a, W)`` of a two-layer ReLU network without biases (a module or its parameter dict).

    ``a`` is ``(m,)`` for one output and ``(m, k)`` for ``k`` outputs; ``W`` is ``(m, d)``.

    Args:
        network: the module ``Sequential(Linear(d, m, bias=False), ReLU(), Linear(m, k, bias=False))``
            or its parameter dict (keys ``"0.weight"`` and ``"2.weight"``).

    Returns:
        ``(a, W)``: the output weights ``(m,)`` or ``(m, k)`` and the input weights ``(m, d)``.

    Raises:
        TypeError: if ``network`` is not ``Sequential(Linear(d, m, bias=False), ReLU(),
            Linear(m, k, bias=False))`` or a dict with exactly ``"0.weight"`` and ``"2.weight"``.
        ValueError: if the two weight shapes do not chain.
    """
    if isinstance(network, nn.Module):
        layers = list(network.children()) if isinstance(network, nn.Sequential) else []
        ok = (
            len(layers) == 3
            and isinstance(layers[0], nn.Linear)
            and isinstance(layers[1], nn.ReLU)
            and isinstance(layers[2], nn.Linear)
            and layers[0].bias is None
            and layers[2].bias is None
        )
        if not ok:
            raise TypeError(
                "network must be a two-layer ReLU network: Sequential(Linear(d, m, bias=False), "
                f"ReLU(), Linear(m, k, bias=False)), got {network.__class__.__name__} {network}"
            )
        params = {n: p.detach() for n, p in network.named_parameters()}
    elif isinstance(network, Mapping):
        params = dict(network)
    else:
        raise TypeError(f"network must be an nn.Module or a dict of parameters, got {type(network).__name__}")
    if set(params) != {"0.weight", "2.weight"}:
        raise TypeError(
            f"a two-layer ReLU network without biases has parameters ['0.weight', '2.weight'], got {sorted(params)}"
        )
    W = finite_tensor("params['0.weight']", params["0.weight"])
    out = finite_tensor("params['2.weight']", params["2.weight"])
    if W.ndim != 2 or out.ndim != 2 or out.shape[1] != W.shape[0]:
        raise ValueError(
            f"'0.weight' must be (m, d) and '2.weight' (k, m), got {tuple(W.shape)} and {tuple(out.shape)}"
        )
    return (out[0] if out.shape[0] == 1 else out.T), W


def _checked(a: ArrayLike, W: ArrayLike) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Validate ``(a, W)``; return them as float64 and whether the output is a vector."""
    a, W = finite_tensor("a", a), finite_tensor("W", W)
    if W.ndim < 2:
        raise ValueError(f"W must have shape (..., m, d), got {tuple(W.shape)}")
    if a.shape == W.shape[:-1]:
        return a, W, False
    if W.ndim == 2 and a.ndim == 2 and a.shape[0] == W.shape[0]:
        return a, W, True
    raise ValueError(
        f"a must have shape {tuple(W.shape[:-1])} (one output) or ({W.shape[0]}, k) (k outputs) "
        f"for W of shape {tuple(W.shape)}, got {tuple(a.shape)}"
    )


def _inputs(x: ArrayLike, d: int) -> torch.Tensor:
    x = finite_tensor("x", x)
    if x.ndim != 2 or x.shape[1] != d or x.shape[0] == 0:
        raise ValueError(f"x must have shape (n, {d}) with n >= 1, got {tuple(x.shape)}")
    return x


def _network(a: torch.Tensor, W: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``F(x_i) = sum_r a_r ReLU(w_r^T x_i)`` on checked weights (one output): shape ``(..., n)``."""
    return (a.unsqueeze(-1) * torch.relu(W @ x.T)).sum(-2)


def _square_loss(a: torch.Tensor, W: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``L = (1/2n) sum_i (F(x_i) - y_i)^2`` on checked weights (one output)."""
    return 0.5 * ((_network(a, W, x) - y) ** 2).mean(-1)


# ---------------------------------------------------------------------------------------
# Quotient coordinates
# ---------------------------------------------------------------------------------------


def _norms(a: torch.Tensor, W: torch.Tensor, vector: bool) -> torch.Tensor:
    norms = W.norm(dim=-1)
    absent = norms == 0
    if absent.any():
        a_abs = a.norm(dim=-1) if vector else a.abs()
        if (a_abs[absent] != 0).any():
            raise ValueError(
                "a neuron with w_r = 0 but a_r != 0 is not on the regular quotient "
                "(alpha_r = 0 but u_r is undefined); only absent neurons (w_r = 0, a_r = 0) are allowed"
            )
    return norms


def quotient_coordinates(a: torch.Tensor, W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(alpha, U)`` with ``alpha_r = a_r ||w_r||`` and rows ``u_r = w_r / ||w_r||``.

    Both are invariant under ``(a_r, w_r) -> (a_r / c_r, c_r w_r)`` for every ``c_r > 0``.
    Absent neurons (``w_r = 0``, ``a_r = 0``) get ``alpha_r = 0`` and ``u_r = 0``.

    Args:
        a: output weights ``(..., m)`` (one output; leading dimensions batch models) or ``(m, k)``.
        W: input weights ``(..., m, d)``.

    Returns:
        ``(alpha, U)``: ``alpha`` of the shape of ``a`` and ``U`` of the shape of ``W``.

    Raises:
        ValueError: if the shapes do not match, or a neuron has ``w_r = 0`` but ``a_r != 0``.
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

    Args:
        alpha: the invariants ``alpha_r``, ``(..., m)`` (one output) or ``(m, k)``.
        U: the directions ``u_r`` as rows, ``(..., m, d)`` (any nonzero length).

    Returns:
        ``(a, W)``: ``a = alpha`` and ``W`` the rows of ``U`` normalised to unit length (zero rows kept).

    Raises:
        ValueError: if the shapes do not match, or a zero row of ``U`` has ``alpha_r != 0``.
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

    Args:
        a: output weights ``(..., m)`` (one output; leading dimensions batch models).
        W: input weights ``(..., m, d)``.
        x: inputs ``(n, d)``.

    Returns:
        ``J`` with rows ``g_i^Q``, shape ``(..., n, m (d + 1))`` (neuron r's block of ``d + 1`` columns).

    Raises:
        ValueError: for a k-output network, or if the shapes do not match.
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
# Quotient flatness and the raw Hessian trace
# ---------------------------------------------------------------------------------------


def quotient_flatness(
    a: torch.Tensor, W: torch.Tensor, x: torch.Tensor, y: torch.Tensor, part: str = "full"
) -> torch.Tensor:
    """``Flat^Q``: the trace of the Riemannian Hessian of ``L`` on the quotient, in closed form.

    ``Flat^Q = (1/n) sum_i sum_r 1[u_r^T x_i > 0] ((u_r^T x_i)^2
    + alpha_r^2 (||x_i||^2 - (u_r^T x_i)^2)) - (d - 1) (1/n) sum_i r_i F(x_i)``, valid off
    the kinks ``u_r^T x_i = 0``, in the quotient coordinates ``alpha_r = a_r ||w_r||``,
    ``u_r = w_r / ||w_r||`` (:func:`quotient_coordinates`). The second
    term comes from the curvature of the spheres (the trace of the Riemannian Hessian of
    ``F`` is ``-(d - 1) F``; ``absil2008optimization``). ``part="gauss_newton"`` returns
    the first term alone, which equals the full trace at an interpolant (every
    ``r_i = 0``). The measure of ``miyagawa2026symmetry``; invariant under every
    rescaling ``(a_r / c_r, c_r w_r)``.

    Args:
        a: output weights ``(..., m)`` (one output; leading dimensions batch models).
        W: input weights ``(..., m, d)``.
        x: inputs ``(n, d)``.
        y: targets ``(n,)``.
        part: ``"full"`` or ``"gauss_newton"``.

    Returns:
        ``Flat^Q`` of every model, shape ``(...)``.

    Raises:
        ValueError: on an unknown ``part``, a k-output network, or shapes that do not match.
    """
    if part not in ("full", "gauss_newton"):
        raise ValueError(f"part must be 'full' or 'gauss_newton', got {part!r}")
    a, W, vector = _checked(a, W)
    if vector:
        raise ValueError(
            f"quotient_flatness needs a one-output network (a of shape {tuple(W.shape[:-1])}), got a of shape "
            f"{tuple(a.shape)}: its closed form is derived for one output"
        )
    x = _inputs(x, W.shape[-1])
    alpha, U = quotient_coordinates(a, W)
    z = U @ x.T
    active = (z > 0).to(x.dtype)
    sq = (x * x).sum(-1)
    gauss_newton = (active * (z**2 + alpha[..., None] ** 2 * (sq - z**2))).sum(-2).mean(-1)
    if part == "gauss_newton":
        return gauss_newton
    F = _network(a, W, x)
    y = finite_tensor("y", y)
    if y.shape != F.shape[-1:]:
        raise ValueError(f"y must have shape ({F.shape[-1]},), got {tuple(y.shape)}")
    return gauss_newton - (W.shape[-1] - 1) * ((F - y) * F).mean(-1)


def _tangent_frames(U: torch.Tensor) -> torch.Tensor:
    """Orthonormal bases ``(m, d, d-1)`` of the tangent spaces ``u_r^perp`` (QR of ``[u_r, I]``)."""
    d = U.shape[-1]
    stacked = torch.cat([U[:, :, None], torch.eye(d, dtype=U.dtype).expand(U.shape[0], d, d)], dim=-1)
    Q, _ = torch.linalg.qr(stacked)
    return Q[:, :, 1:d]


def quotient_flatness_autograd(a: torch.Tensor, W: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> float:
    """``Flat^Q`` by autograd: the trace of the dense Hessian of ``L`` in a chart of the quotient.

    The chart is ``(alpha, v) -> (alpha, R(v))`` with the retraction
    ``u_r(v_r) = (u_r + E_r v_r) / ||u_r + E_r v_r||`` (``E_r`` an orthonormal basis of
    ``u_r^perp``). It is an isometry at ``v = 0`` and its second derivative there is normal
    to the sphere (a second-order retraction), so the Euclidean Hessian at ``v = 0`` is the
    Riemannian Hessian and its trace is ``Flat^Q`` (one model; absent neurons dropped;
    ``absil2008optimization`` for the retraction). The dense reference of
    :func:`quotient_flatness`.

    Args:
        a: output weights ``(m,)`` of one one-output network.
        W: input weights ``(m, d)``.
        x: inputs ``(n, d)``.
        y: targets ``(n,)``.

    Returns:
        ``Flat^Q``, the trace of the dense Hessian in the chart at ``v = 0``, a float.

    Raises:
        ValueError: unless ``a`` is ``(m,)`` and ``W`` is ``(m, d)``, or if the shapes do not match.
    """
    a, W, vector = _checked(a, W)
    if vector or W.ndim != 2:
        raise ValueError("quotient_flatness_autograd takes one one-output network: a (m,), W (m, d)")
    x = _inputs(x, W.shape[-1])
    y = finite_tensor("y", y)
    present = W.norm(dim=-1) > 0
    alpha, U = quotient_coordinates(a[present], W[present])
    frames = _tangent_frames(U)
    m, d = U.shape

    def loss(z: torch.Tensor) -> torch.Tensor:
        v = z[m:].reshape(m, d - 1)
        moved = U + (frames @ v[..., None])[..., 0]
        return _square_loss(z[:m], moved / moved.norm(dim=-1, keepdim=True), x, y)

    start = torch.cat([alpha, torch.zeros(m * (d - 1), dtype=alpha.dtype)])
    with warnings.catch_warnings():
        # torch's forward-mode AD registers decompositions with torch.jit.script on first use
        # and warns that jit is deprecated; the warning is about torch itself.
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*", category=DeprecationWarning)
        return float(torch.func.hessian(loss)(start).trace())


def raw_hessian_trace(a: torch.Tensor, W: torch.Tensor, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
    """The Euclidean Hessian trace of ``L`` in the raw parameters ``(a, W)`` (one output), closed form.

    ``tr H = (1/n) sum_i sum_r (ReLU(w_r^T x_i)^2 + a_r^2 1[w_r^T x_i > 0] ||x_i||^2)`` at every
    point off the kinks: the raw Hessian of ``F`` has only the mixed ``a_r``-``w_r`` blocks,
    so the residual term has zero trace (``y`` is accepted for symmetry and not needed).
    Under ``(a_r / c_r, c_r w_r)`` neuron r's two terms scale by ``c_r^2`` and ``c_r^-2``:
    the coordinate-dependent trace that ``dinh2017sharp`` show can be made as large as one
    likes, unlike :func:`quotient_flatness`.

    Args:
        a: output weights ``(..., m)`` (one output; leading dimensions batch models).
        W: input weights ``(..., m, d)``.
        x: inputs ``(n, d)``.
        y: targets ``(n,)``; accepted and ignored (the trace does not depend on them).

    Returns:
        ``tr H`` of every model, shape ``(...)``.

    Raises:
        ValueError: for a k-output network, or if the shapes do not match.
    """
    a, W, vector = _checked(a, W)
    if vector:
        raise ValueError("raw_hessian_trace needs a one-output network (a of shape (..., m))")
    x = _inputs(x, W.shape[-1])
    z = W @ x.T
    sq = (x * x).sum(-1)
    return (torch.relu(z) ** 2 + (a**2)[..., None] * (z > 0).to(x.dtype) * sq).sum(-2).mean(-1)


# ---------------------------------------------------------------------------------------
# Input smoothness and the constants of the bound
# ---------------------------------------------------------------------------------------


def input_smoothness(a: torch.Tensor, W: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``(1/n) sum_i ||grad_x F(x_i)||^2`` with ``grad_x F(x) = sum_r a_r 1[w_r^T x > 0] w_r`` (one output).

    Args:
        a: output weights ``(..., m)`` (one output; leading dimensions batch models).
        W: input weights ``(..., m, d)``.
        x: inputs ``(n, d)``.

    Returns:
        the input smoothness of every model, shape ``(...)``.

    Raises:
        ValueError: for a k-output network, or if the shapes do not match.
    """
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

    Since ``grad_x F(x) = U^T (alpha * s(x))`` (``s_r(x) = 1[u_r^T x > 0]``), its squared norm is at
    most ``kappa_* sum_r s_r alpha_r^2``, and neuron r's Gauss-Newton term
    ``(u_r^T x)^2 + alpha_r^2 (||x||^2 - (u_r^T x)^2)`` is at least ``min(1, alpha_r^2) ||x||^2``.

    Args:
        a: output weights ``(..., m)`` (one output; leading dimensions batch models).
        W: input weights ``(..., m, d)``.
        x: inputs ``(n, d)``, none at the origin.

    Returns:
        :class:`SmoothnessConstants` with ``kappa``, ``amplitude`` and ``rho`` of shape ``(...)``.

    Raises:
        ValueError: for a k-output network, if the shapes do not match, or if some ``x_i = 0``.
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

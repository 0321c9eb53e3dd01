"""The book's small models: a seeded float64 MLP and the two-layer ReLU students.

- :func:`mlp`: the seeded float64 fully connected network of the book's experiments;
- :func:`two_layer_relu`: ``x -> sum_r a_r ReLU(w_r^T x)`` as ``Linear - ReLU - Linear``
  without biases, the student of the quotient-flatness experiments; :func:`as_params`
  writes weights ``(a, W)`` into its parameter dict (the inverse of
  :func:`lossgeom.flatness.relu_quotient.two_layer_weights`);
- :func:`relu_network` and :func:`regression_loss`: the same network and its square loss
  ``(1/2n) sum_i (F(x_i) - y_i)^2`` on weights ``(a, W)`` directly, batched over many
  students (leading dimensions of ``a`` and ``W``);
- :func:`checked_weights` and :func:`checked_inputs`: the shape checks they share.

Shapes follow :mod:`lossgeom.flatness.relu_quotient`: ``W`` is ``(..., m, d)``; ``a`` is
``(..., m)`` for one output or ``(m, k)`` for ``k`` outputs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from lossgeom_book.checks import finite_tensor, positive, positive_int

_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU, "identity": nn.Identity}


def mlp(
    sizes: Sequence[int], activation: str = "relu", seed: int = 0, bias: bool = True, init_scale: float = 1.0
) -> nn.Sequential:
    """A float64 MLP with layer widths ``sizes`` (input first), seeded initialisation.

    Hidden layers use ``activation``; the last layer is linear. PyTorch's default
    (Kaiming-uniform) initialisation is multiplied by ``init_scale``.

    Args:
        sizes: the layer widths, input width first; at least two positive ints.
        activation: the hidden activation, one of ``"relu"``, ``"tanh"``, ``"gelu"``,
            ``"identity"``.
        seed: the torch seed of the initialisation (the global RNG state is restored).
        bias: whether the linear layers have biases.
        init_scale: the factor (> 0) multiplying the default initialisation.

    Returns:
        An ``nn.Sequential`` of float64 ``nn.Linear`` layers with ``activation`` between them.

    Raises:
        ValueError: on fewer than two or non-positive sizes, an unknown activation or
            ``init_scale <= 0``.
    """
    sizes = list(sizes)
    if len(sizes) < 2 or not all(isinstance(s, int) and s >= 1 for s in sizes):
        raise ValueError(f"sizes must list >= 2 positive ints (input width first), got {sizes}")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
    if not init_scale > 0:
        raise ValueError(f"init_scale must be > 0, got {init_scale}")
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        layers: list[nn.Module] = []
        for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(nn.Linear(n_in, n_out, bias=bias, dtype=torch.float64))
            if i < len(sizes) - 2:
                layers.append(_ACTIVATIONS[activation]())
        model = nn.Sequential(*layers)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(init_scale)
    finally:
        torch.random.set_rng_state(gen_state)
    return model


def two_layer_relu(d: int, m: int, k: int = 1, seed: int = 0, init_scale: float = 1.0) -> nn.Sequential:
    """The network ``x -> sum_r a_r ReLU(w_r^T x)`` as ``Linear(d, m) - ReLU - Linear(m, k)``, no biases.

    PyTorch's default initialisation (``w_r`` uniform in ``[-1/sqrt(d), 1/sqrt(d)]^d``,
    ``a_r`` uniform in ``[-1/sqrt(m), 1/sqrt(m)]``) times ``init_scale``, seeded.

    Args:
        d: the input dimension (a positive integer).
        m: the width, the number of hidden ReLU neurons (a positive integer).
        k: the number of outputs (a positive integer).
        seed: the seed of the initialisation.
        init_scale: the factor multiplying the default initialisation (positive).

    Returns:
        ``Sequential(Linear(d, m, bias=False), ReLU(), Linear(m, k, bias=False))``.
    """
    for name, value in (("d", d), ("m", m), ("k", k)):
        positive_int(name, value)
    return mlp([d, m, k], activation="relu", seed=seed, bias=False, init_scale=positive("init_scale", init_scale))


def checked_weights(a, W) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Validate ``(a, W)``; return them as float64 and whether the output is a vector (k outputs).

    Args:
        a: output weights ``(..., m)`` (one output) or ``(m, k)`` (k outputs).
        W: input weights ``(..., m, d)``.

    Returns:
        ``(a, W, vector)``: the checked tensors and whether ``a`` is ``(m, k)``.

    Raises:
        ValueError: if the shapes of ``a`` and ``W`` do not match.
    """
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


def checked_inputs(x, d: int) -> torch.Tensor:
    """Inputs ``x`` checked to be a finite ``(n, d)`` tensor with ``n >= 1``.

    Args:
        x: the inputs.
        d: the input dimension they must have.

    Returns:
        ``x`` as a finite floating tensor.

    Raises:
        ValueError: if ``x`` is not ``(n, d)`` with ``n >= 1``.
    """
    x = finite_tensor("x", x)
    if x.ndim != 2 or x.shape[1] != d or x.shape[0] == 0:
        raise ValueError(f"x must have shape (n, {d}) with n >= 1, got {tuple(x.shape)}")
    return x


def as_params(a: torch.Tensor, W: torch.Tensor) -> dict[str, torch.Tensor]:
    """The parameter dict of :func:`two_layer_relu` holding ``(a, W)`` (inverse of ``two_layer_weights``).

    Args:
        a: output weights ``(m,)`` (one output) or ``(m, k)`` (k outputs).
        W: input weights ``(m, d)`` of one network.

    Returns:
        ``{"0.weight": W, "2.weight": a^T}`` with ``"2.weight"`` of shape ``(k, m)`` (``(1, m)`` for one output).

    Raises:
        ValueError: if ``W`` is not ``(m, d)`` or ``a`` does not match it.
    """
    a, W, vector = checked_weights(a, W)
    if W.ndim != 2:
        raise ValueError(f"as_params takes one network: W must be (m, d), got {tuple(W.shape)}")
    return {"0.weight": W, "2.weight": a.T if vector else a[None, :]}


def relu_network(a: torch.Tensor, W: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``F(x_i) = sum_r a_r ReLU(w_r^T x_i)``: shape ``(..., n)`` for one output, ``(n, k)`` for k.

    Args:
        a: output weights ``(..., m)`` (one output; leading dimensions batch models) or ``(m, k)``.
        W: input weights ``(..., m, d)``.
        x: inputs ``(n, d)``, ``n >= 1``.

    Returns:
        the outputs ``F(x_i)``, shape ``(..., n)`` for one output, ``(n, k)`` for k outputs.

    Raises:
        ValueError: if the shapes of ``a``, ``W`` and ``x`` do not match.
    """
    a, W, vector = checked_weights(a, W)
    x = checked_inputs(x, W.shape[-1])
    hidden = torch.relu(W @ x.T)  # (..., m, n)
    return hidden.T @ a if vector else (a.unsqueeze(-1) * hidden).sum(-2)


def regression_loss(a: torch.Tensor, W: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The square loss ``L = (1/2n) sum_i (F(x_i) - y_i)^2`` of every model in the batch.

    Args:
        a: output weights ``(..., m)`` (one output; leading dimensions batch models).
        W: input weights ``(..., m, d)``.
        x: inputs ``(n, d)``.
        y: targets ``(n,)``.

    Returns:
        ``L`` of every model, shape ``(...)``.

    Raises:
        ValueError: if the shapes of ``a``, ``W``, ``x`` or ``y`` do not match.
    """
    F = relu_network(a, W, x)
    y = finite_tensor("y", y)
    if y.shape != F.shape[-1:]:
        raise ValueError(f"y must have shape ({F.shape[-1]},), got {tuple(y.shape)}")
    return 0.5 * ((F - y) ** 2).mean(-1)

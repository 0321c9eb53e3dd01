"""Small seeded float64 models for the library's tests, built with torch alone.

The library's tests must run without the book's package, so they build their models
here: :func:`mlp` (a seeded ``Linear``/activation stack) and the two-layer ReLU network
without biases (:func:`two_layer_relu`, its forward :func:`relu_network` on weights
``(a, W)`` and :func:`as_params`, the parameter dict holding ``(a, W)``). They match the
book's builders in ``lossgeom_book.models`` seed for seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU, "identity": nn.Identity}


def mlp(
    sizes: Sequence[int], activation: str = "relu", seed: int = 0, bias: bool = True, init_scale: float = 1.0
) -> nn.Sequential:
    """A float64 MLP with widths ``sizes`` (input first), seeded; the global RNG state is restored."""
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
    """``Sequential(Linear(d, m, bias=False), ReLU(), Linear(m, k, bias=False))``, seeded."""
    return mlp([d, m, k], activation="relu", seed=seed, bias=False, init_scale=init_scale)


def relu_network(a: torch.Tensor, W: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``F(x_i) = sum_r a_r ReLU(w_r^T x_i)``: ``(..., n)`` for ``a`` of shape ``W.shape[:-1]``, else ``(n, k)``."""
    hidden = torch.relu(W @ x.T)
    return (a.unsqueeze(-1) * hidden).sum(-2) if a.shape == W.shape[:-1] else hidden.T @ a


def as_params(a: torch.Tensor, W: torch.Tensor) -> dict[str, torch.Tensor]:
    """The parameter dict of :func:`two_layer_relu` holding ``(a, W)``."""
    return {"0.weight": W, "2.weight": a.T if a.ndim == 2 else a[None, :]}

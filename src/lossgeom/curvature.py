"""Dense curvature references by autograd (float64).

Small models only: :func:`dense_hessian` builds the full Hessian of a scalar loss of a
parameter dict with ``torch.func.hessian``. It is the reference the book's analytic
formulas (Chapter 2) and, later, its iterative estimators are checked against.
"""
from __future__ import annotations

from typing import Callable, Mapping

import warnings

import torch

from lossgeom._checks import finite_tensor

Params = Mapping[str, torch.Tensor]


def flatten_params(params: Params) -> tuple[torch.Tensor, Callable[[torch.Tensor], dict[str, torch.Tensor]]]:
    """Concatenate a parameter dict into one vector; return it and the inverse map.

    The order is the dict's insertion order, so Hessian rows follow it too.
    """
    if not isinstance(params, Mapping) or not params:
        raise TypeError("params must be a non-empty dict of name -> tensor")
    names = list(params)
    tensors = []
    for name in names:
        value = params[name]
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"params[{name!r}] must be a torch.Tensor, got {type(value).__name__}")
        tensors.append(finite_tensor(f"params[{name!r}]", value))
    shapes = [t.shape for t in tensors]
    sizes = [t.numel() for t in tensors]
    flat = torch.cat([t.reshape(-1) for t in tensors])

    def unflatten(vector: torch.Tensor) -> dict[str, torch.Tensor]:
        pieces = torch.split(vector, sizes)
        return {n: p.reshape(s) for n, p, s in zip(names, pieces, shapes)}

    return flat, unflatten


def dense_hessian(loss_fn: Callable[[dict[str, torch.Tensor]], torch.Tensor], params: Params) -> torch.Tensor:
    """The full Hessian of ``loss_fn(params)`` w.r.t. all parameters, as an (n, n) tensor.

    ``loss_fn`` maps a parameter dict to a scalar tensor. Rows and columns follow the
    parameter dict's order (see :func:`flatten_params`).
    """
    flat, unflatten = flatten_params(params)

    def scalar(vector: torch.Tensor) -> torch.Tensor:
        value = loss_fn(unflatten(vector))
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise ValueError("loss_fn must return a scalar tensor")
        return value.reshape(())

    value = scalar(flat.detach())
    if not torch.isfinite(value):
        raise ValueError(f"loss_fn returned a non-finite loss ({value.item()}) at params")
    with warnings.catch_warnings():
        # torch's forward-mode AD registers its decompositions with torch.jit.script on
        # first use and warns that jit is deprecated; the warning is about torch itself.
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*", category=DeprecationWarning)
        return torch.func.hessian(scalar)(flat.detach())


def dense_gradient(loss_fn: Callable[[dict[str, torch.Tensor]], torch.Tensor], params: Params) -> torch.Tensor:
    """The gradient of ``loss_fn(params)`` as one flat vector (same order as :func:`dense_hessian`)."""
    flat, unflatten = flatten_params(params)
    return torch.func.grad(lambda v: loss_fn(unflatten(v)).reshape(()))(flat.detach())

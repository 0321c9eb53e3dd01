"""Loss values and gradients of an indexed loss, whole or example by example.

:func:`closure_per_example_gradients` stacks the gradients of the loss on each single example,
the raw material of gradient-noise estimates (the covariance of per-example gradients,
Jastrzebski et al. 2018). The private ``_value_and_grad`` is the one
reverse-mode gradient that :mod:`lossgeom.training.rules` (the SAM gradient) and
:mod:`lossgeom.training.loop` (the training loop) both take.
"""

from __future__ import annotations

import torch

from lossgeom._validation import positive_int
from lossgeom.types import IndexedLoss, Params


def _value_and_grad(loss_fn: IndexedLoss, params: Params, idx: torch.Tensor | None) -> tuple[torch.Tensor, dict | None]:
    """Loss and its gradient by reverse-mode autograd (much cheaper per call than torch.func here).

    The gradient is not taken (``None``) where the loss is not finite.
    """
    leaves = {n: p.detach().requires_grad_(True) for n, p in params.items()}
    value = loss_fn(leaves, idx)
    if not torch.isfinite(value):
        return value.detach(), None
    grads = torch.autograd.grad(value, list(leaves.values()))
    return value.detach(), {n: g for n, g in zip(leaves, grads)}


def closure_per_example_gradients(loss_fn: IndexedLoss, params: Params, n_examples: int) -> torch.Tensor:
    """The gradients of the loss on each single example, flattened: shape ``(n, p)``.

    One reverse-mode pass per example (cheap for the book's small networks, and free of
    ``torch.func.vmap``'s one-off start-up cost); the tests compare it with ``vmap``.

    Args:
        loss_fn: the indexed loss ``loss_fn(params, indices)``, called with ``torch.tensor([i])``.
        params: the parameters where the gradients are taken.
        n_examples: the number of examples ``n``, an int >= 1.

    Returns:
        An ``(n, p)`` tensor whose row ``i`` is the flattened gradient of the loss on example ``i``.

    Raises:
        FloatingPointError: if the loss of an example is not finite.
    """
    n = positive_int("n_examples", n_examples)
    rows = []
    for i in range(n):
        value, grads = _value_and_grad(loss_fn, params, torch.tensor([i]))
        if grads is None:
            raise FloatingPointError(f"the loss of example {i} is not finite")
        rows.append(torch.cat([grads[k].reshape(-1) for k in params]))
    return torch.stack(rows)

"""The types shared across :mod:`lossgeom`, defined once.

- ``Params``: named parameter tensors, ``{name: tensor}``, as ``model.named_parameters()``
  gives them;
- ``LossFn``: a closure ``loss_fn(params) -> scalar tensor``, the low-level form every
  curvature operator also accepts;
- ``Forward``: a functional forward ``forward(params, x) -> outputs``;
- ``Batch`` and ``Data``: one ``(inputs, targets)`` pair, or an iterable of them.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch

Params = Mapping[str, torch.Tensor]
LossFn = Callable[[dict[str, torch.Tensor]], torch.Tensor]
Forward = Callable[[Params, torch.Tensor], torch.Tensor]
Batch = tuple[torch.Tensor, torch.Tensor]
Data = Batch | Iterable[Batch]

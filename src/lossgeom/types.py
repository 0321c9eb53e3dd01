"""The types shared across ``lossgeom``, defined once.

- ``Params``: named parameter tensors, ``{name: tensor}``, as ``model.named_parameters()``
  gives them;
- ``LossFn``: a closure ``loss_fn(params) -> scalar tensor``, the low-level form every
  curvature operator also accepts;
- ``Forward``: a functional forward ``forward(params, x) -> outputs``;
- ``Batch`` and ``Data``: one ``(inputs, targets)`` pair, or an iterable of them;
- ``IndexedLoss``: ``loss_fn(params, indices) -> scalar tensor``, the mean loss on the
  examples ``indices`` (all of them if ``None``), the form :mod:`lossgeom.training` trains;
- ``Group``: a ``torch.distributed`` process group, or ``None`` for one process;
- ``Output``: what ``output=`` takes, ``None`` or a callable selecting the tensor of outputs
  from what a model returns (see :mod:`lossgeom.outputs`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch
from torch.distributed import ProcessGroup

Params = Mapping[str, torch.Tensor]
LossFn = Callable[[dict[str, torch.Tensor]], torch.Tensor]
Forward = Callable[[Params, torch.Tensor], torch.Tensor]
Batch = tuple[torch.Tensor, torch.Tensor]
Data = Batch | Iterable[Batch]
IndexedLoss = Callable[[Params, "torch.Tensor | None"], torch.Tensor]
Group = ProcessGroup | None
Output = Callable[[object], torch.Tensor] | None

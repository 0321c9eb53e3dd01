"""Training: functional optimisers with explicit state, the training loop and its checkpoints.

- :mod:`lossgeom.training.rules`: ``sgd``, ``adam``, ``sam`` (an ``Optimiser`` and its
  ``OptimiserState``) and ``sam_gradient``;
- :mod:`lossgeom.training.loop`: ``train`` with its hooks (``Monitor``, ``Projection``,
  ``DivergenceStop``, ``StopWhen``), its result ``TrainRun``, ``indexed_loss`` and
  ``batch_schedule``;
- :mod:`lossgeom.training.gradients`: ``per_example_gradients``;
- :mod:`lossgeom.training.checkpoints`: ``checkpoint_monitor``, ``first_checkpoint_below``
  and ``parameter_path``.

Training builds only on :mod:`lossgeom.types` and ``lossgeom._validation``, so every
other part of the package can train.
"""

from lossgeom.training.checkpoints import checkpoint_monitor, parameter_path
from lossgeom.training.gradients import per_example_gradients
from lossgeom.training.loop import (
    DivergenceStop,
    Monitor,
    Projection,
    StopWhen,
    batch_schedule,
    indexed_loss,
    train,
)
from lossgeom.training.rules import Optimiser, adam, sam, sgd

__all__ = [
    "DivergenceStop",
    "Monitor",
    "Optimiser",
    "Projection",
    "StopWhen",
    "adam",
    "batch_schedule",
    "checkpoint_monitor",
    "indexed_loss",
    "parameter_path",
    "per_example_gradients",
    "sam",
    "sgd",
    "train",
]

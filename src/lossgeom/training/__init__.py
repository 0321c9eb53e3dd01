"""Training: functional optimisers with explicit state, the training loop and its checkpoints.

- :mod:`lossgeom.training.rules`: ``sgd``, ``adam``, ``sam`` (an ``Optimiser`` and its
  ``OptimiserState``) and ``closure_sam_gradient``;
- :mod:`lossgeom.training.loop`: ``train`` with its hooks (``Monitor``, ``Projection``,
  ``DivergenceStop``, ``StopWhen``), its result ``TrainRun``, ``indexed_loss`` and
  ``batch_schedule``;
- :mod:`lossgeom.training.gradients`: ``closure_per_example_gradients``;
- :mod:`lossgeom.training.checkpoints`: ``closure_checkpoint_monitor``, ``first_checkpoint_below``
  and ``closure_parameter_path``.

Training builds only on :mod:`lossgeom.types` and ``lossgeom._validation``, so every
other part of the package can train.
"""

from lossgeom.training.checkpoints import closure_checkpoint_monitor, closure_parameter_path
from lossgeom.training.gradients import closure_per_example_gradients
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
    "closure_checkpoint_monitor",
    "indexed_loss",
    "closure_parameter_path",
    "closure_per_example_gradients",
    "sam",
    "sgd",
    "train",
]

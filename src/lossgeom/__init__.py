"""lossgeom: loss-landscape geometry under parameter symmetries, for your own models.

The library behind the executable book *Same Function, Different Geometry*. Everything
that acts on a model follows one convention, ``f(model, loss, data, *, params=None, ...)``
(``loss`` the caller's own loss module, called for every value and derivative; ``data``
an ``(x, y)`` pair, a dict batch with ``"labels"``, or an iterable of batches), works in
the model's dtype and device, and never changes the caller's parameters or buffers.

- ``lossgeom.curvature``: Hessian, GGN and Fisher operators (one per module), spectra,
  traces, sharpness, dense references for small models, the null space;
- ``lossgeom.symmetries``: function-preserving transforms, the registry that finds them
  in an ``nn.Module`` and the symmetry audit;
- ``lossgeom.flatness``: flatness and sharpness measures (softmax head, ReLU quotient,
  SGD stability, spectral bounds, Fisher-Riemannian sharpness, the module-first measures);
- ``lossgeom.landscape``: loss slices, their direction schemes and audit, and paths;
- ``lossgeom.training``: functional update rules and the one training loop;
- ``lossgeom.atlas``: every measure under every function-preserving transform;
- ``lossgeom.losses``: what the library reads from a loss module (batch weights, output
  Hessians, likelihoods) and :class:`~lossgeom.losses.CausalLMLoss`;
- ``lossgeom.batches``, ``lossgeom.outputs``: batch forms and streaming, and the rule
  that reads a model's outputs (tensors, ``output=``, ``.logits``);
- ``lossgeom.risk``, ``lossgeom.models``, ``lossgeom.parameters``, ``lossgeom.contract``,
  ``lossgeom.formatting``, ``lossgeom.progress``, ``lossgeom.types``: the risk object, model
  helpers, flattened parameters, the measurement contract, portable number formatting,
  progress bars, shared types.
"""

from lossgeom import atlas, contract, curvature, flatness, landscape, losses, models, symmetries, training
from lossgeom.contract import MeasurementContract
from lossgeom.symmetries import AuditReport, Symmetry, audit_symmetry

__all__ = [
    "AuditReport",
    "MeasurementContract",
    "Symmetry",
    "atlas",
    "audit_symmetry",
    "contract",
    "curvature",
    "flatness",
    "landscape",
    "losses",
    "models",
    "symmetries",
    "training",
]
__version__ = "0.2.0"  # the one version source: pyproject.toml reads it (dynamic version)

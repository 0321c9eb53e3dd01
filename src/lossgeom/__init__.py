"""lossgeom: loss-landscape geometry under parameter symmetries, for your own models.

The library behind the executable book *Same Function, Different Geometry*. Everything
that acts on a model follows one convention, ``f(model, loss, data, *, params=None, ...)``
(``loss`` a torch loss module, ``data`` an ``(x, y)`` pair or an iterable of batches),
works in the model's dtype and device, and never changes the caller's parameters or buffers.
The layout (filled in below by module) is listed in the package appendix of the book.
"""

from lossgeom import atlas, contract, curvature, flatness, landscape, models, symmetries, training
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
    "models",
    "symmetries",
    "training",
]
__version__ = "0.2.0"

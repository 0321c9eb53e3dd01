"""lossgeom: loss-landscape geometry under parameter symmetries.

The package behind the executable book *Same Function, Different Geometry*. Chapters
derive; ``lossgeom`` computes. One module per concept:

- :mod:`lossgeom.ledger`        the results ledger every chapter ends with
- :mod:`lossgeom.contract`      the measurement contract recorded with every geometry number
- :mod:`lossgeom.symmetries`    function-preserving transforms and the symmetry audit
- :mod:`lossgeom.product`       the product model f(a, b; x) = a b x
- :mod:`lossgeom.perturbations` perturbation sets that move with the coordinates
- :mod:`lossgeom.curvature`     dense Hessians by autograd (float64 references)
- :mod:`lossgeom.landscape`     two-dimensional loss slices
- :mod:`lossgeom.display`       number formatting and the book's plot style
- :mod:`lossgeom.data`          sklearn's bundled digits, split and seeded
- :mod:`lossgeom.models`        small float64 MLPs and functional loss closures
"""
from lossgeom import contract, curvature, data, display, landscape, ledger, models, perturbations, product, symmetries
from lossgeom.contract import MeasurementContract
from lossgeom.ledger import Ledger
from lossgeom.symmetries import AuditReport, Symmetry, audit_symmetry

__all__ = [
    "AuditReport",
    "Ledger",
    "MeasurementContract",
    "Symmetry",
    "audit_symmetry",
    "contract",
    "curvature",
    "data",
    "display",
    "landscape",
    "ledger",
    "models",
    "perturbations",
    "product",
    "symmetries",
]
__version__ = "0.1.0"

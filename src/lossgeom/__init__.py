"""lossgeom: loss-landscape geometry under parameter symmetries.

The package behind the executable book *Same Function, Different Geometry*. Chapters
derive; ``lossgeom`` computes. One module per concept:

- :mod:`lossgeom.ledger`        the results ledger every chapter ends with
- :mod:`lossgeom.contract`      the measurement contract recorded with every geometry number
- :mod:`lossgeom.symmetries`    function-preserving transforms and the symmetry audit
- :mod:`lossgeom.margins`       raw and normalised classification margins
- :mod:`lossgeom.product`       the product model f(a, b; x) = a b x
- :mod:`lossgeom.perturbations` perturbation sets that move with the coordinates
- :mod:`lossgeom.curvature`     Hessian/GGN/Fisher operators, Lanczos, trace and density estimators
- :mod:`lossgeom.landscape`     loss slices with their contract, direction schemes and their audit, paths
- :mod:`lossgeom.display`       number formatting and the book's plot style
- :mod:`lossgeom.data`          sklearn's bundled digits, split and seeded
- :mod:`lossgeom.models`        small float64 MLPs and functional loss closures
- :mod:`lossgeom.dynamics`      the optimiser lab, gradient descent on quadratics, perturbed GD
- :mod:`lossgeom.optimisers`    SGD/Adam(W), the training loop with hooks, gradient noise
- :mod:`lossgeom.softmax`       the softmax common-row gauge and small softmax classifiers
- :mod:`lossgeom.certificates`  curvature-only and sound feature-space robustness certificates
- :mod:`lossgeom.regularisers`  functional velocity of a regulariser, paired one-step updates
- :mod:`lossgeom.tasks`         modular-arithmetic tasks and their small models
- :mod:`lossgeom.quotient`      the rescaling quotient of two-layer ReLU networks: Flat^Q, SGD stability, smoothness
- :mod:`lossgeom.flatness`      flatness and sharpness measures: softmax proxies, Flat^Q, spectral bounds,
                                Fisher-Riemannian sharpness
- :mod:`lossgeom.teacher_student` the tree committee machine: students, exact Hessians, spectra
- :mod:`lossgeom.atlas`          the symmetry audit atlas: every measure under every function-preserving transform
"""
from lossgeom import (
    atlas,
    certificates,
    contract,
    curvature,
    data,
    display,
    dynamics,
    flatness,
    landscape,
    ledger,
    margins,
    models,
    optimisers,
    perturbations,
    product,
    quotient,
    regularisers,
    softmax,
    symmetries,
    tasks,
    teacher_student,
)
from lossgeom.contract import MeasurementContract
from lossgeom.ledger import Ledger
from lossgeom.symmetries import AuditReport, Symmetry, audit_symmetry

__all__ = [
    "AuditReport",
    "Ledger",
    "MeasurementContract",
    "Symmetry",
    "atlas",
    "audit_symmetry",
    "certificates",
    "contract",
    "curvature",
    "data",
    "display",
    "dynamics",
    "flatness",
    "landscape",
    "ledger",
    "margins",
    "models",
    "optimisers",
    "perturbations",
    "product",
    "quotient",
    "regularisers",
    "softmax",
    "symmetries",
    "tasks",
    "teacher_student",
]
__version__ = "0.1.0"

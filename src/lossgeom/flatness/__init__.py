"""Flatness measures, organised by measure: what each computes, where it is derived, whom it follows.

Every measure here is a number read off a trained model that claims to say how flat its
minimum is. The package is organised by concept:

- :mod:`lossgeom.flatness.softmax_gauge`: the softmax gauge of a linear classifier ``W``
  (logits, probabilities, the covariance ``P(p) = Diag(p) - p p^T``, centring, mean rows,
  common-row shifts), the operations that move a classifier along its symmetry orbit;
- :mod:`lossgeom.flatness.softmax_head`: last-layer relative flatness of a softmax
  classifier, ``kappa_exact <= B_quot <= B_raw`` (``petzka2021relative``,
  ``opazo2026flatness``);
- :mod:`lossgeom.flatness.relu_quotient`: the rescaling quotient of two-layer ReLU
  networks, its coordinates, the quotient flatness ``Flat^Q`` and the raw Hessian trace,
  input smoothness and its constants (``miyagawa2026symmetry``);
- :mod:`lossgeom.flatness.stability`: one-step mean-square stability of linearised SGD on
  the active subspace of a Jacobian;
- :mod:`lossgeom.flatness.spectral`: spectral moments and the Wolkowicz-Styan bound
  ``lambda_max(A) <= m + s sqrt(n - 1)`` (``wolkowicz1980bounds``);
- :mod:`lossgeom.flatness.riemannian`: the Hessian measured in the Fisher metric
  (Fisher-Riemannian sharpness) and the Euclidean ``lambda_max``;
- :mod:`lossgeom.flatness.reparametrisation`: changes of coordinates and of logit scale
  that test whether a measure depends on them;
- :mod:`lossgeom.flatness.geodesic`: geodesic sharpness on the quotient by the attention
  gauge (``dasilva2025hide``), whose first-order truncation is adaptive sharpness;
- :mod:`lossgeom.flatness.loss_point` and :mod:`lossgeom.flatness.measures`: the
  module-first measures of the symmetry audit atlas, each taking a ``torch.nn.Module``, a
  loss module and data, or one :class:`LossPoint`.

The measures a researcher calls are re-exported here (``from lossgeom.flatness import
kappa_exact``); helpers and references stay in their modules. Citation keys refer to the
book's ``references.bib``.
"""

from lossgeom.flatness.geodesic import (
    geodesic_sharpness,
)
from lossgeom.flatness.loss_point import (
    LossPoint,
)
from lossgeom.flatness.measures import (
    adaptive_sharpness,
    classifier_b_quot,
    classifier_b_raw,
    classifier_kappa_exact,
    fisher_rao_norm,
    hessian_trace,
    keskar_sharpness,
    measure_at,
    model_quotient_flatness,
    model_wolkowicz_styan_bound,
    relative_flatness,
    riemannian_sharpness,
    sam_sharpness,
)
from lossgeom.flatness.relu_quotient import (
    input_smoothness,
    quotient_coordinates,
    quotient_flatness,
    raw_hessian_trace,
)
from lossgeom.flatness.riemannian import (
    diagonal_fisher_sharpness_from_matrices,
    fisher_riemannian_sharpness_from_matrices,
)
from lossgeom.flatness.softmax_gauge import (
    centre,
    common_row_shift,
    covariance,
    logits,
    mean_row,
    probabilities,
)
from lossgeom.flatness.softmax_head import (
    b_quot,
    b_raw,
    kappa_exact,
)
from lossgeom.flatness.spectral import (
    closure_wolkowicz_styan_bound,
    wolkowicz_styan_bound,
)
from lossgeom.flatness.stability import (
    critical_learning_rate,
    stability_lambda_max,
)

__all__ = [
    "LossPoint",
    "adaptive_sharpness",
    "b_quot",
    "b_raw",
    "centre",
    "classifier_b_quot",
    "classifier_b_raw",
    "classifier_kappa_exact",
    "closure_wolkowicz_styan_bound",
    "common_row_shift",
    "covariance",
    "critical_learning_rate",
    "diagonal_fisher_sharpness_from_matrices",
    "fisher_rao_norm",
    "fisher_riemannian_sharpness_from_matrices",
    "geodesic_sharpness",
    "hessian_trace",
    "input_smoothness",
    "kappa_exact",
    "keskar_sharpness",
    "logits",
    "measure_at",
    "mean_row",
    "model_quotient_flatness",
    "model_wolkowicz_styan_bound",
    "probabilities",
    "quotient_coordinates",
    "quotient_flatness",
    "raw_hessian_trace",
    "relative_flatness",
    "riemannian_sharpness",
    "sam_sharpness",
    "stability_lambda_max",
    "wolkowicz_styan_bound",
]

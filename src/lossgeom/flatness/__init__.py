"""Flatness measures, organised by measure: what each computes, where it is derived, whom it follows.

Every measure here is a number read off a trained model that claims to say how flat its
minimum is. The package is organised by concept:

- :mod:`lossgeom.flatness.softmax_gauge`: the softmax gauge of a linear classifier ``W``
  (logits, probabilities, the covariance ``P(p) = Diag(p) - p p^T``, centring, mean rows,
  common-row shifts), the operations that move a classifier along its symmetry orbit;
- :mod:`lossgeom.flatness.softmax_head`: last-layer relative flatness of a softmax
  classifier, ``kappa_exact <= B_quot <= B_raw`` and their ratios (chapter
  *The softmax gauge*);
- :mod:`lossgeom.flatness.relu_quotient`: the rescaling quotient of two-layer ReLU
  networks, its coordinates, the quotient flatness ``Flat^Q`` and the raw Hessian trace,
  input smoothness and its constants (chapter *Quotient flatness*);
- :mod:`lossgeom.flatness.stability`: one-step mean-square stability of linearised SGD on
  the active subspace of a Jacobian (chapter *Quotient flatness*);
- :mod:`lossgeom.flatness.spectral`: spectral moments and the Wolkowicz-Styan bound
  ``lambda_max(A) <= m + s sqrt(n - 1)`` (chapter *Flatness in high dimensions, and other
  measures*);
- :mod:`lossgeom.flatness.riemannian`: the Hessian measured in the Fisher metric
  (Fisher-Riemannian sharpness) and the Euclidean ``lambda_max``;
- :mod:`lossgeom.flatness.reparametrisation`: changes of coordinates and of logit scale
  that test whether a measure depends on them;
- :mod:`lossgeom.flatness.loss_point` and :mod:`lossgeom.flatness.measures`: the
  module-first measures of the symmetry audit atlas, each taking a ``torch.nn.Module``, a
  loss module and data, or one :class:`LossPoint`.

Every public name is re-exported here, so ``from lossgeom.flatness import kappa_exact``
works. Citation keys refer to the book's ``references.bib``.
"""

from lossgeom.flatness.loss_point import (
    LossPoint,
    NotApplicable,
)
from lossgeom.flatness.measures import (
    adaptive_sharpness,
    classifier_b_quot,
    classifier_b_raw,
    classifier_kappa_exact,
    fisher_rao_norm,
    hessian_trace,
    keskar_sharpness,
    lambda_max,
    model_quotient_flatness,
    model_wolkowicz_styan_bound,
    relative_flatness,
    riemannian_sharpness,
    sam_sharpness,
)
from lossgeom.flatness.relu_quotient import (
    SmoothnessConstants,
    as_params,
    input_smoothness,
    quotient_coordinates,
    quotient_flatness,
    quotient_flatness_autograd,
    quotient_jacobian,
    raw_hessian_trace,
    regression_loss,
    relu_network,
    representative,
    smoothness_constants,
    two_layer_relu,
    two_layer_weights,
)
from lossgeom.flatness.reparametrisation import (
    CoordinateChange,
    Reparametrised,
    elementwise_sinh,
    nonlinear_shear,
    scale_to_loss,
)
from lossgeom.flatness.riemannian import (
    RiemannianSharpness,
    diagonal_fisher_sharpness,
    fisher_riemannian_sharpness,
)
from lossgeom.flatness.softmax_gauge import (
    centre,
    common_row_shift,
    covariance,
    logits,
    max_probability_gap,
    mean_row,
    mean_row_share,
    probabilities,
    row_shift_symmetry,
    shift_for_norm_factor,
)
from lossgeom.flatness.softmax_head import (
    b_quot,
    b_raw,
    initial_ratio_quantiles,
    invariance_gaps,
    kappa_exact,
    kappa_exact_by_trace,
    orbit_minimum,
    pair_distance_ratio,
    quotient_looseness,
    raw_quotient_ratio,
    reference_class_ratios,
    reference_ratio,
)
from lossgeom.flatness.spectral import (
    hessian_wolkowicz_styan_bound,
    spectral_moments,
    wolkowicz_styan_bound,
    wolkowicz_styan_bound_from_traces,
    wolkowicz_styan_bound_gradient,
)
from lossgeom.flatness.stability import (
    active_jacobian,
    batch_moments,
    critical_learning_rate,
    stability_lambda_max,
    stability_operator,
    stable_pair_grid,
    stable_pairs,
)

__all__ = [
    "CoordinateChange",
    "LossPoint",
    "NotApplicable",
    "Reparametrised",
    "RiemannianSharpness",
    "SmoothnessConstants",
    "active_jacobian",
    "adaptive_sharpness",
    "as_params",
    "b_quot",
    "b_raw",
    "batch_moments",
    "centre",
    "classifier_b_quot",
    "classifier_b_raw",
    "classifier_kappa_exact",
    "common_row_shift",
    "covariance",
    "critical_learning_rate",
    "diagonal_fisher_sharpness",
    "elementwise_sinh",
    "fisher_rao_norm",
    "fisher_riemannian_sharpness",
    "hessian_trace",
    "hessian_wolkowicz_styan_bound",
    "initial_ratio_quantiles",
    "input_smoothness",
    "invariance_gaps",
    "kappa_exact",
    "kappa_exact_by_trace",
    "keskar_sharpness",
    "lambda_max",
    "logits",
    "max_probability_gap",
    "mean_row",
    "mean_row_share",
    "model_quotient_flatness",
    "model_wolkowicz_styan_bound",
    "nonlinear_shear",
    "orbit_minimum",
    "pair_distance_ratio",
    "probabilities",
    "quotient_coordinates",
    "quotient_flatness",
    "quotient_flatness_autograd",
    "quotient_jacobian",
    "quotient_looseness",
    "raw_hessian_trace",
    "raw_quotient_ratio",
    "reference_class_ratios",
    "reference_ratio",
    "regression_loss",
    "relative_flatness",
    "relu_network",
    "representative",
    "riemannian_sharpness",
    "row_shift_symmetry",
    "sam_sharpness",
    "scale_to_loss",
    "shift_for_norm_factor",
    "smoothness_constants",
    "spectral_moments",
    "stability_lambda_max",
    "stability_operator",
    "stable_pair_grid",
    "stable_pairs",
    "two_layer_relu",
    "two_layer_weights",
    "wolkowicz_styan_bound",
    "wolkowicz_styan_bound_from_traces",
    "wolkowicz_styan_bound_gradient",
]

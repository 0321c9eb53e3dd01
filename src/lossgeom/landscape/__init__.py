"""Loss slices and paths with their geometry stated: the slice toolkit.

- :mod:`lossgeom.landscape.directions`: the direction schemes (``Directions``);
- :mod:`lossgeom.landscape.slices`: ``plane_grid``, ``evaluate_slice`` and its ``Slice``,
  ``projected_hessian``, ``plane_coordinates``, ``audit_slice_scheme`` and
  ``shared_levels``;
- :mod:`lossgeom.landscape.paths`: straight lines and trained Bezier curves between
  solutions.

Used by ``chapters/ch03_perturbation_sets`` and ``chapters/ch07_landscape_pictures``
("What a landscape picture can establish").
"""

from lossgeom.landscape.directions import (
    Directions,
    filter_normalised_directions,
    gaussian_directions,
    hessian_directions,
    neuron_normalised_directions,
    trajectory_directions,
    transported_directions,
)
from lossgeom.landscape.paths import (
    bezier_curve_loss,
    bezier_point,
    fit_bezier_curve,
    interpolate,
    linear_point,
    loss_barrier,
)
from lossgeom.landscape.slices import (
    Slice,
    SliceAudit,
    audit_slice_scheme,
    evaluate_slice,
    plane_coordinates,
    plane_grid,
    projected_hessian,
    shared_levels,
)

__all__ = [
    "Directions",
    "Slice",
    "SliceAudit",
    "audit_slice_scheme",
    "bezier_curve_loss",
    "bezier_point",
    "evaluate_slice",
    "filter_normalised_directions",
    "fit_bezier_curve",
    "gaussian_directions",
    "hessian_directions",
    "interpolate",
    "linear_point",
    "loss_barrier",
    "neuron_normalised_directions",
    "plane_coordinates",
    "plane_grid",
    "projected_hessian",
    "shared_levels",
    "trajectory_directions",
    "transported_directions",
]

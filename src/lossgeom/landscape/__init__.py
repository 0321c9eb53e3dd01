"""Loss slices and paths with their geometry stated: the slice toolkit.

- :mod:`lossgeom.landscape.directions`: the direction schemes (``Directions``);
- :mod:`lossgeom.landscape.slices`: ``plane_grid``, ``closure_evaluate_slice`` and its ``Slice``,
  ``closure_projected_hessian``, ``plane_coordinates``, ``closure_audit_slice_scheme`` and
  ``shared_levels``;
- :mod:`lossgeom.landscape.paths`: straight lines and trained Bezier curves between
  solutions.

A picture of the loss depends on the directions and their normalisation (Li et al.
2018) and changes under reparametrisations that leave the function unchanged (Dinh et
al. 2017); the slice records both.
"""

from lossgeom.landscape.directions import (
    closure_hessian_directions,
    filter_normalised_directions,
    gaussian_directions,
    neuron_normalised_directions,
    trajectory_directions,
    transported_directions,
)
from lossgeom.landscape.paths import (
    bezier_point,
    closure_fit_bezier_curve,
    interpolate,
    loss_barrier,
)
from lossgeom.landscape.slices import (
    closure_audit_slice_scheme,
    closure_evaluate_slice,
    closure_projected_hessian,
    plane_grid,
)

__all__ = [
    "closure_audit_slice_scheme",
    "bezier_point",
    "closure_evaluate_slice",
    "filter_normalised_directions",
    "closure_fit_bezier_curve",
    "gaussian_directions",
    "closure_hessian_directions",
    "interpolate",
    "loss_barrier",
    "neuron_normalised_directions",
    "plane_grid",
    "closure_projected_hessian",
    "trajectory_directions",
    "transported_directions",
]

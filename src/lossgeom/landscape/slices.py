r"""Loss slices with their geometry stated: the slice evaluator and its audit.

A slice is the loss on a plane :math:`\theta_0 + s d_1 + t d_2` through a centre
(Goodfellow, Vinyals and Saxe 2015; Li et al. 2018); what it shows depends on the
directions and their normalisation, which the slice records.

A landscape picture is a restriction of a loss to a chosen plane,
``(s, t) -> L(centre + s d1 + t d2)`` for ``s, t`` in ``[-radius, radius]``. What it shows
depends on the centre, the two directions (:mod:`lossgeom.landscape.directions`), their
normalisation, the radius, the loss and data and the resolution; this module makes each
of these an explicit argument and records them in a
:class:`~lossgeom.contract.MeasurementContract` returned with the values.

- :func:`plane_grid`: the square grid of a plane in a flat coordinate vector.
- :func:`closure_evaluate_slice` evaluates a loss over the grid and returns a :class:`Slice`
  carrying its contract; :func:`closure_projected_hessian` is the slice's curvature at its
  centre; :func:`plane_coordinates` projects points (iterates) onto a plane;
  :func:`closure_audit_slice_scheme` checks whether a scheme's slice is unchanged by a
  function-preserving transform; :func:`shared_levels` puts several slices on one
  colour scale.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from lossgeom._validation import finite_array, positive, positive_int
from lossgeom.contract import MeasurementContract
from lossgeom.curvature import HessianOperator
from lossgeom.formatting import fmt
from lossgeom.landscape.directions import Directions, _check_directions, _check_params
from lossgeom.parameters import flatten_params
from lossgeom.symmetries.core import AuditReport, Symmetry, audit_symmetry
from lossgeom.types import Forward, LossFn, Params


def plane_grid(
    centre: Params, d1: Params, d2: Params, radius: float, resolution: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (S, T, points) with points[i, j] = centre + S[i, j] d1 + T[i, j] d2.

    Args:
        centre: the slice's centre, a vector of length n.
        d1: the first direction, a vector of length n (not normalised here).
        d2: the second direction, a vector of length n, linearly independent of ``d1``.
        radius: half the side of the square in the (s, t) coordinates (> 0).
        resolution: number of grid values per axis (>= 2).

    Returns:
        ``(S, T, points)``: the ``(resolution, resolution)`` coordinate grids (``numpy.meshgrid``,
        ``indexing="xy"``) and the ``(resolution, resolution, n)`` array of grid points.

    Raises:
        ValueError: on non-finite or mismatched vectors, ``radius <= 0``, ``resolution < 2``
            or dependent directions.
    """
    centre = finite_array("centre", centre, ndim=1)
    d1 = finite_array("d1", d1, shape=centre.shape)
    d2 = finite_array("d2", d2, shape=centre.shape)
    radius = positive("radius", radius)
    resolution = positive_int("resolution", resolution)
    if resolution < 2:
        raise ValueError(f"resolution must be >= 2, got {resolution}")
    if np.linalg.matrix_rank(np.stack([d1, d2])) < 2:
        raise ValueError("d1 and d2 must be linearly independent")
    axis = np.linspace(-radius, radius, resolution)
    S, T = np.meshgrid(axis, axis, indexing="xy")
    points = centre + S[..., None] * d1 + T[..., None] * d2
    return S, T, points


@dataclass(frozen=True)
class Slice:
    """Loss values over a square grid of a plane, with the contract that defines them.

    ``values[i, j]`` is the loss at ``centre + axis[j] d1 + axis[i] d2`` (rows follow the
    second direction, as ``numpy.meshgrid(..., indexing="xy")``).
    """

    axis: np.ndarray
    values: np.ndarray
    centre_value: float
    contract: MeasurementContract
    directions: Directions

    @property
    def sharpness(self) -> float:
        """The apparent sharpness, the mean loss increase over the grid, ``mean(L - L(centre))``."""
        return float(np.mean(self.values - self.centre_value))

    @property
    def lowest_increase(self) -> float:
        """The lowest ``L - L(centre)`` on the grid, negative if the picture shows a lower point."""
        return float(np.min(self.values - self.centre_value))

    def rises_along_rays(self) -> bool:
        """Whether the loss never decreases along the 8 grid rays (axes, diagonals) from the centre.

        A ray that falls after rising would show a barrier or a second basin in the
        picture. Needs an odd resolution, so that the centre is a grid point.

        Returns:
            True if the values never decrease outward along any of the 8 rays.

        Raises:
            ValueError: if the resolution is even.
        """
        n = self.values.shape[0]
        if n % 2 == 0:
            raise ValueError(f"rises_along_rays needs an odd resolution (the centre on the grid), got {n}")
        c, steps = n // 2, np.arange(n // 2 + 1)
        for di, dj in ((0, 1), (0, -1), (1, 0), (-1, 0), (1, 1), (1, -1), (-1, 1), (-1, -1)):
            ray = self.values[c + di * steps, c + dj * steps]
            if np.any(np.diff(ray) < 0):
                return False
        return True


def closure_evaluate_slice(
    loss_fn: LossFn,
    centre: Params,
    directions: Directions,
    radius: float,
    resolution: int,
    *,
    centre_name: str,
    loss: str,
    reduction: str,
    data: str,
    model_mode: str,
) -> Slice:
    """Evaluate ``loss_fn`` on the grid ``centre + s d1 + t d2``, ``abs(s), abs(t) <= radius``.

    Returns a :class:`Slice`.

    The returned contract records the centre (``centre_name``), the scheme and its seeds,
    the normalisation, the radius, the loss, its reduction, the data, the model mode, the
    resolution and the precision (the centre's dtype), so a figure glued with it cannot
    lose its provenance (claim P13).

    Args:
        loss_fn: the closure ``loss_fn(params) -> scalar``.
        centre: the slice's centre, a parameter dict of one floating dtype.
        directions: the slice's :class:`~lossgeom.landscape.directions.Directions` d1, d2.
        radius: half the side of the square ``[-radius, radius]^2`` (> 0).
        resolution: number of grid values per axis (>= 2).
        centre_name: the contract's ``centre`` field.
        loss: the contract's ``loss`` field.
        reduction: the contract's ``reduction`` field.
        data: the contract's ``data`` field.
        model_mode: the contract's ``model_mode`` field.

    Returns:
        The :class:`Slice` with the grid axis, the ``(resolution, resolution)`` values, the
        centre's loss, the contract and the directions.

    Raises:
        TypeError: if ``loss_fn`` is not callable, or the centre's tensors do not share one
            floating dtype.
        ValueError: directions of the wrong names or shapes, a zero or non-finite
            direction, dependent directions, ``radius <= 0`` or ``resolution < 2``.
    """
    centre = _check_params(centre, "centre")
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable as loss_fn(params) -> scalar tensor")
    d1, d2 = _check_directions(centre, directions)
    radius = positive("radius", radius)
    resolution = positive_int("resolution", resolution)
    dtypes = {p.dtype for p in centre.values()}
    if len(dtypes) != 1 or not next(iter(dtypes)).is_floating_point:
        raise TypeError(f"centre tensors must share one floating dtype, got {sorted(map(str, dtypes))}")
    dtype = next(iter(dtypes))
    flat, unflatten = flatten_params(centre)
    S, T, points = plane_grid(flat.detach().to(torch.float64).numpy(), d1.numpy(), d2.numpy(), radius, resolution)
    values = np.empty(S.shape)
    with torch.no_grad():
        centre_value = float(loss_fn(centre))
        for i in range(resolution):
            for j in range(resolution):
                values[i, j] = float(loss_fn(unflatten(torch.from_numpy(points[i, j]).to(dtype))))
    dtypes = [str(dtype).replace("torch.", "")]
    contract = MeasurementContract(
        centre=centre_name,
        directions=directions.scheme,
        normalisation=directions.normalisation,
        radius=f"{fmt(radius)} in both slice coordinates (square [-r, r]^2)",
        loss=loss,
        reduction=reduction,
        data=data,
        model_mode=model_mode,
        resolution=f"{resolution} x {resolution} grid",
        precision=f"{', '.join(dtypes)} parameters and loss evaluation",
    )
    return Slice(S[0].copy(), values, centre_value, contract, directions)


def closure_projected_hessian(loss_fn: LossFn, params: Params, directions: Directions) -> np.ndarray:
    """The 2 x 2 curvature of a slice at its centre, [d1 d2]^T H [d1 d2] (two Hessian-vector products).

    The slice's second-order Taylor model is L(centre) + g.(s d1 + t d2) + 1/2 [s t] P [s t]^T
    with this P; the plane shows a saddle where P has a negative eigenvalue
    (:func:`lossgeom_book.hidden_saddles.shows_negative_curvature` tests it).

    Args:
        loss_fn: the closure ``loss_fn(params) -> scalar``.
        params: the slice's centre.
        directions: the slice's directions d1, d2 (names and shapes of ``params``).

    Returns:
        The symmetrised 2 x 2 float64 array ``P = [d1 d2]^T H [d1 d2]``.
    """
    params = _check_params(params)
    d1, d2 = _check_directions(params, directions)
    operator = HessianOperator.from_closure(loss_fn, params, method="reverse-over-reverse")
    D = torch.stack([d1, d2], 1).to(operator.dtype)
    P = (D.T @ operator.matmat(D)).detach().cpu().numpy().astype(np.float64)
    return (P + P.T) / 2


def plane_coordinates(points: Sequence[Params], centre: Params, directions: Directions) -> np.ndarray:
    """Least-squares (s, t) of each point in the plane centre + s d1 + t d2, shape (m, 2).

    For points off the plane (an optimiser's iterates projected onto its PCA plane) this
    is the orthogonal projection in the metric of the flattened parameters.

    Args:
        points: m parameter dicts (names and shapes of ``centre``).
        centre: the plane's centre.
        directions: the plane's directions d1, d2.

    Returns:
        An ``(m, 2)`` array of the coordinates ``(s, t)`` of each point.
    """
    centre = _check_params(centre, "centre")
    d1, d2 = _check_directions(centre, directions)
    flat = flatten_params(centre)[0]
    D = torch.stack([d1, d2], 1).numpy()
    rows = np.stack([(flatten_params(_check_params(p, "points[i]"))[0] - flat).numpy() for p in points])
    return np.linalg.lstsq(D, rows.T, rcond=None)[0].T


@dataclass(frozen=True)
class SliceAudit:
    """Whether a direction scheme's slice survives a function-preserving transform.

    ``function_check`` is the symmetry audit of the transform (outputs on the probe set,
    then apparent sharpness before and after); ``max_slice_discrepancy`` is the largest
    ``abs(L_after - L_before)`` over the grid, relative to the largest
    ``abs(L_before - L(centre))``.
    """

    scheme: str
    function_check: AuditReport
    max_slice_discrepancy: float
    before: Slice
    after: Slice

    @property
    def sharpness_before(self) -> float:
        """The apparent sharpness of the slice at the original parameters."""
        return self.before.sharpness

    @property
    def sharpness_after(self) -> float:
        """The apparent sharpness of the slice at the transformed parameters."""
        return self.after.sharpness


def closure_audit_slice_scheme(
    loss_fn: LossFn,
    forward: Forward,
    params: Params,
    symmetry: Symmetry,
    probe: torch.Tensor,
    scheme: Callable[[Params], Directions],
    *,
    radius: float,
    resolution: int,
    tol: float,
    scheme_after: Callable[[Params], Directions] | None = None,
    **contract: str,
) -> SliceAudit:
    """Audit a direction scheme under ``symmetry``: does the slice move with the reparametrisation?

    The scheme is run at ``params`` and again at ``symmetry(params)`` (``scheme_after`` if
    the scheme needs something transformed with the parameters, e.g. recorded iterates);
    :func:`~lossgeom.symmetries.audit_symmetry` checks the outputs on ``probe`` agree
    within ``tol`` and recomputes the apparent sharpness; then both slices are compared
    point by point. ``contract`` holds the keyword fields of :func:`closure_evaluate_slice`.

    Args:
        loss_fn: the closure ``loss_fn(params) -> scalar``.
        forward: ``forward(params, probe) -> outputs``, the function whose outputs the audit compares.
        params: the original parameters.
        symmetry: the function-preserving transform.
        probe: the probe inputs of the audit.
        scheme: ``scheme(params) -> Directions``, the direction scheme under audit.
        radius: the slices' radius (as :func:`closure_evaluate_slice`).
        resolution: the slices' grid values per axis.
        tol: the audit's tolerance on the outputs.
        scheme_after: the scheme run at ``symmetry(params)``; ``None`` means ``scheme``.
        **contract: the keyword fields of :func:`closure_evaluate_slice`'s measurement contract.

    Returns:
        The :class:`SliceAudit`: the audit report, the largest slice discrepancy relative to the
        largest ``abs(L_before - L(centre))``, and both slices.

    Raises:
        TypeError: if ``scheme`` or ``scheme_after`` is not callable.
        ValueError: if the slice before the symmetry is flat (the relative discrepancy is undefined).
    """
    scheme_after = scheme if scheme_after is None else scheme_after
    if not callable(scheme) or not callable(scheme_after):
        raise TypeError("scheme must be callable as scheme(params) -> Directions")
    params = _check_params(params)
    moved = symmetry(params)
    slices = {}

    def sharpness(p: Params) -> float:
        key = "before" if p is params else "after"
        slices[key] = closure_evaluate_slice(
            loss_fn, p, (scheme if key == "before" else scheme_after)(p), radius, resolution, **contract
        )
        return slices[key].sharpness

    report = audit_symmetry(
        forward,
        params,
        Symmetry(symmetry.name, lambda p: moved),
        probe,
        tol=tol,
        measure=sharpness,
        measure_name="apparent sharpness (mean loss increase on the grid)",
    )
    before, after = slices["before"], slices["after"]
    scale = float(np.max(np.abs(before.values - before.centre_value)))
    if scale == 0:
        raise ValueError(
            "the slice before the symmetry is flat (every grid value equals the centre's), so a relative "
            "slice discrepancy is undefined: choose a larger radius"
        )
    discrepancy = float(np.max(np.abs(after.values - before.values))) / scale
    return SliceAudit(before.directions.scheme, report, discrepancy, before, after)


def shared_levels(slices: Sequence[Slice], n_above: int = 16, n_below: int = 6) -> np.ndarray:
    """Contour levels of L - L(centre) common to several slices, with 0 (the centre value) a boundary.

    ``n_below`` levels span the lowest value up to 0 (at least a sliver below 0, so that
    a diverging colour map stays centred) and ``n_above`` levels span 0 to the highest.

    Args:
        slices: a non-empty sequence of :class:`Slice`.
        n_below: the number of levels below 0, an int >= 1.
        n_above: the number of levels from 0 up to the highest value, an int >= 1.

    Returns:
        The increasing array of ``n_below + n_above + 1`` levels, 0 among them.

    Raises:
        TypeError: if ``slices`` is empty or holds something other than a :class:`Slice`.
    """
    if not slices or not all(isinstance(p, Slice) for p in slices):
        raise TypeError("slices must be a non-empty sequence of Slice")
    n_above, n_below = positive_int("n_above", n_above), positive_int("n_below", n_below)
    high = max(float(np.max(p.values - p.centre_value)) for p in slices)
    low = min(float(np.min(p.values - p.centre_value)) for p in slices)
    high = max(high, 1e-12)
    low = min(low, -1e-3 * high)
    return np.r_[np.linspace(low, 0.0, n_below + 1)[:-1], np.linspace(0.0, high, n_above + 1)]

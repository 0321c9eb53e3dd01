"""Loss slices and paths with their geometry stated: the slice toolkit.

Used by ``chapters/ch03_perturbation_sets`` (:func:`plane_grid`) and derived and
measured in ``chapters/ch07_landscape_pictures`` ("What a landscape picture can
establish").

A landscape picture is a restriction of a loss to a chosen plane,
``(s, t) -> L(centre + s d1 + t d2)`` for ``s, t`` in ``[-radius, radius]``, or to a path
between two parameter points. What it shows depends on the centre, the two directions,
their normalisation, the radius, the loss and data and the resolution; this module makes
each of these an explicit argument and records them in a
:class:`~lossgeom.contract.MeasurementContract` returned with the values.

- :func:`plane_grid`: the square grid of a plane in a flat coordinate vector.
- Direction schemes, each returning :class:`Directions` (two parameter dicts and how they
  were made): :func:`gaussian_directions` (raw), :func:`filter_normalised_directions`
  (Li et al. 2018), :func:`neuron_normalised_directions`, :func:`hessian_directions`
  (extreme eigenvectors by Lanczos), :func:`trajectory_directions` (PCA of iterates) and
  :func:`transported_directions` (the transformed square of a reparametrisation).
- :func:`evaluate_slice` evaluates a loss over the grid and returns a :class:`Slice`
  carrying its contract; :func:`projected_hessian` is the slice's curvature at its
  centre; :func:`plane_coordinates` projects points (iterates) onto a plane;
  :func:`audit_slice_scheme` checks whether a scheme's slice is unchanged by a
  function-preserving transform.
- :func:`saddle_visibility_probability`, :func:`random_plane_hessians` and
  :func:`shows_negative_curvature`: how often a random plane shows a saddle.
- :func:`linear_point`, :func:`interpolate`, :func:`loss_barrier`, :func:`bezier_point`,
  :func:`bezier_curve_loss` and :func:`fit_bezier_curve`: straight lines and trained
  curves between solutions.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from lossgeom._validation import as_real, finite_array, positive, positive_int
from lossgeom.contract import MeasurementContract
from lossgeom.curvature import flatten_params, hessian_operator, top_eigenpairs
from lossgeom.formatting import fmt
from lossgeom.symmetries import AuditReport, Symmetry, audit_symmetry
from lossgeom.types import LossFn, Params


def plane_grid(centre, d1, d2, radius: float, resolution: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (S, T, points) with points[i, j] = centre + S[i, j] d1 + T[i, j] d2.

    Args:
        centre: the slice's centre, a vector of length n.
        d1, d2: the two directions, vectors of length n (not normalised here).
        radius: half the side of the square in the (s, t) coordinates (> 0).
        resolution: number of grid values per axis (>= 2).
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


# ---------------------------------------------------------------------------------------
# Direction schemes
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Directions:
    """Two directions of a slice, as parameter dicts, and how they were made.

    Attributes:
        first, second: the directions d1 and d2 (same names and shapes as the parameters).
        scheme: what was drawn or computed, with seeds (goes into the contract).
        normalisation: how the directions were scaled (goes into the contract).
        details: scheme-specific numbers (eigenvalues, explained variance, ...).
    """

    first: dict[str, torch.Tensor]
    second: dict[str, torch.Tensor]
    scheme: str
    normalisation: str
    details: dict = field(default_factory=dict)


def _check_params(params: Params, name: str = "params") -> dict[str, torch.Tensor]:
    if not isinstance(params, Mapping) or not params:
        raise TypeError(f"{name} must be a non-empty dict of name -> tensor")
    for key, value in params.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name}[{key!r}] must be a torch.Tensor, got {type(value).__name__}")
    return dict(params)


def _check_directions(params: Params, directions: Directions) -> tuple[torch.Tensor, torch.Tensor]:
    """Flatten both directions after checking names, shapes, finiteness and independence."""
    if not isinstance(directions, Directions):
        raise TypeError(f"directions must be a lossgeom.landscape.Directions, got {type(directions).__name__}")
    flats = []
    for label, d in (("first", directions.first), ("second", directions.second)):
        if set(d) != set(params):
            raise ValueError(f"directions.{label} must have the parameter names {sorted(params)}, got {sorted(d)}")
        for key in params:
            if tuple(d[key].shape) != tuple(params[key].shape):
                raise ValueError(f"directions.{label}[{key!r}] must have shape {tuple(params[key].shape)} "
                                 f"(the parameter's), got {tuple(d[key].shape)}")
            if d[key].dtype != params[key].dtype:
                raise TypeError(f"directions.{label}[{key!r}] has dtype {d[key].dtype} but the parameter has "
                                f"{params[key].dtype}; convert one of them explicitly")
        flat = torch.cat([d[key].reshape(-1) for key in params]).to(torch.float64)
        if not torch.isfinite(flat).all():
            raise ValueError(f"directions.{label} must contain only finite values")
        if float(flat.norm()) == 0.0:
            raise ValueError(f"directions.{label} is the zero direction: a slice needs two non-zero directions")
        flats.append(flat)
    if np.linalg.matrix_rank(torch.stack(flats).numpy()) < 2:
        raise ValueError("the two directions must be linearly independent")
    return flats[0], flats[1]


def _gaussian_pair(params: dict[str, torch.Tensor], seed: int) -> tuple[dict, dict]:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    generator = torch.Generator().manual_seed(int(seed))
    pair = []
    for _ in range(2):
        pair.append({k: torch.randn(p.shape, generator=generator, dtype=torch.float64).to(p.dtype)
                     for k, p in params.items()})
    return pair[0], pair[1]


def gaussian_directions(params: Params, seed: int) -> Directions:
    """Raw random directions: i.i.d. N(0, 1) entries, each direction scaled to unit norm.

    No per-layer or per-neuron scaling: the same seed gives the same two vectors at any
    centre, so a reparametrisation of the centre does not move them
    (``chapters/ch07_landscape_pictures`` shows what that does to a picture). Drawn with
    ``torch.Generator().manual_seed(seed)`` in the parameter dict's order, all of d1
    before d2.
    """
    params = _check_params(params)
    pair = _gaussian_pair(params, seed)
    unit = []
    for d in pair:
        norm = torch.cat([v.reshape(-1) for v in d.values()]).norm()
        unit.append({k: v / norm for k, v in d.items()})
    return Directions(unit[0], unit[1], f"raw Gaussian, torch seed {seed}",
                      "none per layer; each direction scaled to unit Euclidean norm over all parameters")


def filter_normalised_directions(params: Params, seed: int, one_dimensional: str = "zero") -> Directions:
    """Filter-normalised random directions in the sense of Li et al. (2018).

    A Gaussian direction is rescaled filter by filter: for every parameter tensor with two
    or more dimensions, each slice along the first dimension (a row of a linear layer's
    weight, one output neuron; an output channel of a convolution) gets the norm of the
    same slice of the parameters, ``d_i <- d_i ||theta_i|| / ||d_i||``. One-dimensional tensors
    (biases and the weights and biases of normalisation layers) are set to zero
    (``one_dimensional="zero"``, Li et al.'s default ``ignore='biasbn'``) or to the
    parameters themselves (``"copy"``, their alternative). Same seed convention as
    :func:`gaussian_directions`.
    """
    params = _check_params(params)
    if one_dimensional not in ("zero", "copy"):
        raise ValueError(f"one_dimensional must be 'zero' or 'copy', got {one_dimensional!r}")
    pair = _gaussian_pair(params, seed)
    out = []
    for d in pair:
        scaled = {}
        for key, p in params.items():
            if p.ndim <= 1:
                scaled[key] = torch.zeros_like(p) if one_dimensional == "zero" else p.detach().clone()
                continue
            rows_d, rows_p = d[key].reshape(p.shape[0], -1), p.detach().reshape(p.shape[0], -1)
            factor = rows_p.norm(dim=1, keepdim=True) / rows_d.norm(dim=1, keepdim=True)
            scaled[key] = (rows_d * factor).reshape(p.shape)
        out.append(scaled)
    rule = ("zero on one-dimensional tensors (biases, normalisation layers)" if one_dimensional == "zero"
            else "one-dimensional tensors set to the parameters themselves")
    return Directions(out[0], out[1], f"filter-normalised Gaussian (Li et al. 2018), torch seed {seed}",
                      f"each filter (row of a weight) scaled to the norm of the same row of the centre; {rule}")


def neuron_normalised_directions(params: Params, seed: int, layer_in: str, layer_out: str) -> Directions:
    """Random directions normalised neuron by neuron across a ReLU layer.

    For hidden neuron j between ``layer_in`` and ``layer_out``: its incoming weights and
    bias (row j of ``layer_in.weight`` with ``layer_in.bias[j]``) are scaled jointly to
    their norm at the centre, and its outgoing weights (column j of ``layer_out.weight``)
    to theirs. Every other tensor is scaled as a whole to the norm of the parameter
    tensor. Under the per-neuron rescaling (c_j theta_in,j, theta_out,j / c_j) the two
    pieces of the direction scale by c_j and 1/c_j, exactly as the parameters do, so the
    slice of the rescaled network is the rescaled slice (``chapters/ch07_landscape_pictures``
    measures it).
    """
    params = _check_params(params)
    w_in, b_in, w_out = f"{layer_in}.weight", f"{layer_in}.bias", f"{layer_out}.weight"
    missing = {w_in, w_out} - set(params)
    if missing:
        raise ValueError(f"neuron_normalised_directions needs params {sorted(missing)} (layer_in={layer_in!r}, "
                         f"layer_out={layer_out!r})")
    width = params[w_in].shape[0]
    if params[w_in].ndim != 2 or params[w_out].ndim != 2 or params[w_out].shape[1] != width:
        raise ValueError(f"{w_in} must be (h, d) and {w_out} must be (k, h) with the same h; got "
                         f"{tuple(params[w_in].shape)} and {tuple(params[w_out].shape)}")
    pair = _gaussian_pair(params, seed)
    out = []
    for d in pair:
        scaled = {}
        incoming_d = [d[w_in]] + ([d[b_in][:, None]] if b_in in params else [])
        incoming_p = [params[w_in].detach()] + ([params[b_in].detach()[:, None]] if b_in in params else [])
        factor_in = torch.cat(incoming_p, 1).norm(dim=1) / torch.cat(incoming_d, 1).norm(dim=1)
        scaled[w_in] = d[w_in] * factor_in[:, None]
        if b_in in params:
            scaled[b_in] = d[b_in] * factor_in
        factor_out = params[w_out].detach().norm(dim=0) / d[w_out].norm(dim=0)
        scaled[w_out] = d[w_out] * factor_out[None, :]
        for key, p in params.items():
            if key not in scaled:
                scaled[key] = d[key] * (p.detach().norm() / d[key].norm())
        out.append({key: scaled[key] for key in params})
    return Directions(out[0], out[1], f"neuron-normalised Gaussian across layers {layer_in} -> {layer_out}, "
                      f"torch seed {seed}",
                      "each hidden neuron's incoming weights+bias and outgoing weights scaled to their norms at the "
                      "centre; other tensors scaled to their tensor's norm")


def _fixed_sign(vector: np.ndarray) -> np.ndarray:
    """Eigen- and singular vectors are defined up to sign: make the largest entry positive."""
    return vector if vector[np.argmax(np.abs(vector))] >= 0 else -vector


def hessian_directions(loss_fn: LossFn, params: Params, which: tuple[str, str] = ("largest", "smallest"),
                       tol: float = 1e-10, seed: int = 0, normalisation: str = "unit") -> Directions:
    """Unit Hessian eigenvectors at ``params``: by default the most positive and most negative.

    The Hessian is the curvature toolkit's :func:`~lossgeom.curvature.hessian_operator`
    (reverse-over-reverse Hessian-vector products) and the eigenpairs come from
    :func:`~lossgeom.curvature.top_eigenpairs` (Lanczos, ``scipy.sparse.linalg.eigsh``).
    ``which`` names the eigenvalue of each direction: ``"largest"`` or ``"smallest"``;
    ``("largest", "largest")`` takes the top two. Signs are fixed so the largest entry is
    positive. ``normalisation="unit"`` keeps unit eigenvectors; ``"curvature"`` divides
    each by ``sqrt(abs(lambda))``, so that the quadratic model along either axis of the slice is
    ``+-s^2/2`` and one radius shows both curvatures. ``details`` holds the eigenvalues,
    residuals and products used.
    """
    params = _check_params(params)
    if (not isinstance(which, (tuple, list)) or len(which) != 2
            or any(w not in ("largest", "smallest") for w in which)):
        raise ValueError(f"which must be a pair of 'largest'/'smallest', got {which!r}")
    if normalisation not in ("unit", "curvature"):
        raise ValueError(f"normalisation must be 'unit' or 'curvature', got {normalisation!r}")
    _, unflatten = flatten_params(params)
    operator = hessian_operator(loss_fn, params, method="reverse-over-reverse")
    vectors, values, residuals, used = [], [], [], 0
    if which[0] == which[1]:
        result = top_eigenpairs(operator, k=2, which=which[0], tol=tol, seed=seed)
        vectors = [result.vectors[:, 0], result.vectors[:, 1]]
        values, residuals, used = list(result.values), list(result.residuals), result.n_hvp
    else:
        for w in which:
            result = top_eigenpairs(operator, k=1, which=w, tol=tol, seed=seed)
            vectors.append(result.vectors[:, 0])
            values.append(result.values[0])
            residuals.append(result.residuals[0])
            used += result.n_hvp
    scales = [1.0, 1.0]
    if normalisation == "curvature":
        if min(abs(v) for v in values) == 0.0:
            raise ValueError("normalisation='curvature' needs non-zero eigenvalues")
        scales = [1.0 / math.sqrt(abs(v)) for v in values]
    dirs = [unflatten(torch.from_numpy(_fixed_sign(v) * c)) for v, c in zip(vectors, scales)]
    rule = ("unit Euclidean norm (eigenvectors)" if normalisation == "unit"
            else "each eigenvector divided by sqrt(|eigenvalue|) (quadratic model +-s^2/2 on each axis)")
    return Directions(dirs[0], dirs[1], f"Hessian eigenvectors ({which[0]}, {which[1]} eigenvalue) by Lanczos, "
                      f"start seed {seed}", f"{rule}; sign: largest entry positive",
                      {"eigenvalues": [float(v) for v in values], "residuals": [float(r) for r in residuals],
                       "n_hvp": int(used)})


def trajectory_directions(iterates: Sequence[Params], centre: Params | None = None) -> Directions:
    """The trajectory plane: the top two principal directions of recorded iterates.

    The rows of the matrix are ``iterate - centre`` (the centre defaults to the last
    iterate, as in Li et al. 2018); its two leading right singular vectors are the
    directions (unit norm, sign fixed). ``details["explained_variance"]`` holds the
    fraction of the rows' squared norm each captures, s_k^2 / sum_i s_i^2.
    """
    if isinstance(iterates, Mapping) or len(iterates) < 3:
        raise ValueError("iterates must be a sequence of at least 3 parameter dicts")
    first = _check_params(iterates[0], "iterates[0]")

    def same_layout(name: str, p: Params) -> dict:
        p = _check_params(p, name)
        if set(p) != set(first) or any(p[k].shape != first[k].shape for k in first):
            raise ValueError(f"{name} must have the same names and shapes as iterates[0]")
        return {k: p[k] for k in first}

    checked = [same_layout(f"iterates[{i}]", it) for i, it in enumerate(iterates)]
    centre = checked[-1] if centre is None else same_layout("centre", centre)
    centre_flat, unflatten = flatten_params(centre)
    rows = [(flatten_params(it)[0] - centre_flat).numpy() for it in checked]
    _, singular, vt = np.linalg.svd(np.stack(rows), full_matrices=False)
    if singular.size < 2 or singular[1] <= 0:
        raise ValueError("the iterates span fewer than two directions around the centre")
    explained = singular**2 / np.sum(singular**2)
    dirs = [unflatten(torch.from_numpy(_fixed_sign(vt[k]).copy())) for k in range(2)]
    return Directions(dirs[0], dirs[1], f"trajectory PCA of {len(iterates)} recorded iterates",
                      "unit Euclidean norm (principal directions of iterate - centre); sign: largest entry positive",
                      {"explained_variance": [float(explained[0]), float(explained[1])]})


def transported_directions(directions: Directions, symmetry: Symmetry, at: Params) -> Directions:
    """The transformed square: push both directions through the Jacobian of ``symmetry`` at ``at``.

    d -> J d with J = d symmetry / d theta at ``at`` (``torch.autograd.functional.jvp``). For a linear
    transform such as the per-neuron ReLU rescaling, ``symmetry(at + s d1 + t d2) =
    symmetry(at) + s J d1 + t J d2`` exactly, so the slice at ``symmetry(at)`` along the
    transported directions repeats every value of the original slice (the
    transformed square of ``chapters/ch03_perturbation_sets``, claim P10).
    """
    if not isinstance(symmetry, Symmetry):
        raise TypeError(f"symmetry must be a lossgeom Symmetry, got {type(symmetry).__name__}")
    at = _check_params(at, "at")
    _check_directions(at, directions)
    names = list(at)

    def transform(*tensors):
        moved = symmetry(dict(zip(names, tensors)))
        return tuple(moved[n] for n in names)

    pushed = []
    for d in (directions.first, directions.second):
        # reverse-mode double-vjp (torch.autograd.functional.jvp): no forward-mode start-up cost
        _, tangent = torch.autograd.functional.jvp(transform, tuple(at[n].detach() for n in names),
                                                   tuple(d[n] for n in names))
        pushed.append({n: t.detach() for n, t in zip(names, tangent)})
    return Directions(pushed[0], pushed[1], f"{directions.scheme}, transported by the Jacobian of {symmetry.name}",
                      f"{directions.normalisation}, then multiplied by the transform's Jacobian",
                      dict(directions.details))


# ---------------------------------------------------------------------------------------
# The slice evaluator
# ---------------------------------------------------------------------------------------


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


def evaluate_slice(loss_fn: LossFn, centre: Params, directions: Directions, radius: float, resolution: int, *,
                   centre_name: str, loss: str, reduction: str, data: str, model_mode: str) -> Slice:
    """Evaluate ``loss_fn`` on the grid ``centre + s d1 + t d2``, ``abs(s), abs(t) <= radius``.

    Returns a :class:`Slice`.

    The returned contract records the centre (``centre_name``), the scheme and its seeds,
    the normalisation, the radius, the loss, its reduction, the data, the model mode, the
    resolution and the precision (the centre's dtype), so a figure glued with it cannot
    lose its provenance (claim P13).

    Raises:
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
        centre=centre_name, directions=directions.scheme, normalisation=directions.normalisation,
        radius=f"{fmt(radius)} in both slice coordinates (square [-r, r]^2)", loss=loss, reduction=reduction,
        data=data, model_mode=model_mode, resolution=f"{resolution} x {resolution} grid",
        precision=f"{', '.join(dtypes)} parameters and loss evaluation")
    return Slice(S[0].copy(), values, centre_value, contract, directions)


def projected_hessian(loss_fn: LossFn, params: Params, directions: Directions) -> np.ndarray:
    """The 2 x 2 curvature of a slice at its centre, [d1 d2]^T H [d1 d2] (two Hessian-vector products).

    The slice's second-order Taylor model is L(centre) + g.(s d1 + t d2) + 1/2 [s t] P [s t]^T
    with this P; :func:`shows_negative_curvature` tells whether P has a negative eigenvalue.
    """
    params = _check_params(params)
    d1, d2 = _check_directions(params, directions)
    operator = hessian_operator(loss_fn, params, method="reverse-over-reverse")
    D = torch.stack([d1, d2], 1).to(operator.dtype)
    P = (D.T @ operator.matmat(D)).detach().cpu().numpy().astype(np.float64)
    return (P + P.T) / 2


def plane_coordinates(points: Sequence[Params], centre: Params, directions: Directions) -> np.ndarray:
    """Least-squares (s, t) of each point in the plane centre + s d1 + t d2, shape (m, 2).

    For points off the plane (an optimiser's iterates projected onto its PCA plane) this
    is the orthogonal projection in the metric of the flattened parameters.
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


def audit_slice_scheme(loss_fn: LossFn, forward, params: Params, symmetry: Symmetry, probe: torch.Tensor,
                       scheme: Callable[[Params], Directions], *, radius: float, resolution: int, tol: float,
                       scheme_after: Callable[[Params], Directions] | None = None, **contract: str) -> SliceAudit:
    """Audit a direction scheme under ``symmetry`` (``chapters/ch07_landscape_pictures``).

    The scheme is run at ``params`` and again at ``symmetry(params)`` (``scheme_after`` if
    the scheme needs something transformed with the parameters, e.g. recorded iterates);
    :func:`~lossgeom.symmetries.audit_symmetry` checks the outputs on ``probe`` agree
    within ``tol`` and recomputes the apparent sharpness; then both slices are compared
    point by point. ``contract`` holds the keyword fields of :func:`evaluate_slice`.
    """
    scheme_after = scheme if scheme_after is None else scheme_after
    if not callable(scheme) or not callable(scheme_after):
        raise TypeError("scheme must be callable as scheme(params) -> Directions")
    params = _check_params(params)
    moved = symmetry(params)
    slices = {}

    def sharpness(p: Params) -> float:
        key = "before" if p is params else "after"
        slices[key] = evaluate_slice(loss_fn, p, (scheme if key == "before" else scheme_after)(p), radius,
                                     resolution, **contract)
        return slices[key].sharpness

    report = audit_symmetry(forward, params, Symmetry(symmetry.name, lambda p: moved), probe, tol=tol,
                            measure=sharpness, measure_name="apparent sharpness (mean loss increase on the grid)")
    before, after = slices["before"], slices["after"]
    scale = float(np.max(np.abs(before.values - before.centre_value)))
    discrepancy = float(np.max(np.abs(after.values - before.values))) / scale
    return SliceAudit(before.directions.scheme, report, discrepancy, before, after)


def shared_levels(slices: Sequence[Slice], n_above: int = 16, n_below: int = 6) -> np.ndarray:
    """Contour levels of L - L(centre) common to several slices, with 0 (the centre value) a boundary.

    ``n_below`` levels span the lowest value up to 0 (at least a sliver below 0, so that
    a diverging colour map stays centred) and ``n_above`` levels span 0 to the highest.
    """
    if not slices or not all(isinstance(p, Slice) for p in slices):
        raise TypeError("slices must be a non-empty sequence of Slice")
    n_above, n_below = positive_int("n_above", n_above), positive_int("n_below", n_below)
    high = max(float(np.max(p.values - p.centre_value)) for p in slices)
    low = min(float(np.min(p.values - p.centre_value)) for p in slices)
    high = max(high, 1e-12)
    low = min(low, -1e-3 * high)
    return np.r_[np.linspace(low, 0.0, n_below + 1)[:-1], np.linspace(0.0, high, n_above + 1)]


def draw_slice(ax, piece: Slice, levels=None, labels: tuple[str, str] = ("s", "t")):
    """Filled contours of L - L(centre) on matplotlib axes ``ax``; returns the contour set.

    Colours are diverging around the centre value (white): red above it, blue below, so
    a region lower than the centre, the visual sign of a saddle or of a slope, stands
    out. ``levels`` defaults to :func:`shared_levels` of this slice alone; pass shared
    levels to put several slices on one colour scale. The centre is marked with a cross.
    """
    from matplotlib.colors import TwoSlopeNorm

    if not isinstance(piece, Slice):
        raise TypeError(f"piece must be a Slice, got {type(piece).__name__}")
    levels = shared_levels([piece]) if levels is None else np.asarray(levels, dtype=float)
    norm = TwoSlopeNorm(vcenter=0.0, vmin=float(levels[0]), vmax=float(levels[-1]))
    image = ax.contourf(piece.axis, piece.axis, piece.values - piece.centre_value, levels=levels, cmap="RdBu_r",
                        norm=norm)
    ax.plot(0, 0, "k+")
    ax.set(xlabel=labels[0], ylabel=labels[1], aspect="equal")
    return image


# ---------------------------------------------------------------------------------------
# What a random plane shows
# ---------------------------------------------------------------------------------------


def saddle_visibility_probability(n: int, positive_eigenvalue: float, negative_eigenvalue: float) -> float:
    """P(a uniformly random 2-D plane contains a direction of negative curvature).

    For a Hessian on R^n with n - 1 eigenvalues ``lambda = positive_eigenvalue > 0`` and
    one eigenvalue ``-mu = negative_eigenvalue < 0``, a plane contains a unit u with
    u^T H u < 0 iff the squared cosine between the negative eigenvector and the plane
    exceeds lambda / (lambda + mu); that squared cosine is Beta(1, (n - 2)/2), so

        P = (mu / (lambda + mu)) ** ((n - 2) / 2)

    (``chapters/ch07_landscape_pictures`` derives it with sympy). Raw Gaussian and
    orthonormalised planes give the same answer (Sylvester's law of inertia).
    """
    n = positive_int("n", n)
    if n < 2:
        raise ValueError(f"n must be >= 2 (a plane needs two dimensions), got {n}")
    lam = positive("positive_eigenvalue", positive_eigenvalue)
    mu = as_real("negative_eigenvalue", negative_eigenvalue)
    if mu >= 0:
        raise ValueError(f"negative_eigenvalue must be < 0, got {mu}")
    mu = -mu
    return math.exp((n - 2) / 2 * math.log(mu / (lam + mu)))


def random_plane_hessians(hessian, n_planes: int, seed: int) -> np.ndarray:
    """Projected Hessians G^T H G of ``n_planes`` raw Gaussian planes, shape (n_planes, 2, 2).

    Each plane is spanned by two i.i.d. N(0, I) vectors (the columns of G) drawn with
    ``numpy.random.default_rng(seed)``; the 2 x 2 matrix is the curvature of the slice
    at its centre, (s, t) -> 1/2 [s t] G^T H G [s t]^T. ``hessian`` is either a
    symmetric (n, n) matrix or its n eigenvalues (a 1-D array): since V^T G is again a
    matrix of i.i.d. N(0, 1) entries for orthogonal V, sampling G in the eigenbasis
    gives the same distribution of G^T H G at O(n) rather than O(n^2) cost per plane.
    """
    H = finite_array("hessian", hessian)
    n_planes = positive_int("n_planes", n_planes)
    if H.ndim == 1:
        if H.shape[0] < 2:
            raise ValueError(f"hessian eigenvalues must number n >= 2, got {H.shape[0]}")
        G = np.random.default_rng(seed).standard_normal((n_planes, H.shape[0], 2))
        return np.einsum("pia,i,pib->pab", G, H, G, optimize=True)
    if H.ndim != 2 or H.shape[0] != H.shape[1] or H.shape[0] < 2:
        raise ValueError(f"hessian must be a square (n, n) matrix or n eigenvalues with n >= 2, got shape {H.shape}")
    if not np.allclose(H, H.T, rtol=1e-12, atol=1e-12 * max(1.0, float(np.abs(H).max()))):
        raise ValueError("hessian must be symmetric")
    G = np.random.default_rng(seed).standard_normal((n_planes, H.shape[0], 2))
    return np.einsum("pia,ij,pjb->pab", G, H, G, optimize=True)


def shows_negative_curvature(projected) -> np.ndarray:
    """Whether each 2 x 2 projected Hessian has a negative eigenvalue (the plane shows a saddle).

    For a symmetric 2 x 2 matrix: det < 0 (one negative eigenvalue) or det >= 0 with
    trace < 0 (two). ``projected`` has shape (2, 2) or (m, 2, 2).
    """
    M = finite_array("projected", projected)
    if M.shape[-2:] != (2, 2):
        raise ValueError(f"projected must have shape (2, 2) or (m, 2, 2), got {M.shape}")
    det = M[..., 0, 0] * M[..., 1, 1] - M[..., 0, 1] * M[..., 1, 0]
    return (det < 0) | ((det >= 0) & (M[..., 0, 0] + M[..., 1, 1] < 0))


# ---------------------------------------------------------------------------------------
# Paths between parameter points
# ---------------------------------------------------------------------------------------


def _check_pair(start: Params, end: Params) -> tuple[dict, dict]:
    start, end = _check_params(start, "start"), _check_params(end, "end")
    if set(start) != set(end) or any(start[k].shape != end[k].shape for k in start):
        raise ValueError("start and end must have the same parameter names and shapes")
    return start, end


def linear_point(start: Params, end: Params, alpha: float) -> dict[str, torch.Tensor]:
    """(1 - alpha) start + alpha end, name by name."""
    alpha = as_real("alpha", alpha)
    return {k: (1 - alpha) * start[k] + alpha * end[k] for k in start}


def interpolate(metrics: Mapping[str, LossFn], start: Params, end: Params, alphas) -> dict[str, np.ndarray]:
    """Evaluate each metric along the straight line (1 - alpha) start + alpha end.

    Args:
        metrics: name -> ``metric(params)`` returning a scalar (loss, accuracy, ...).
        start, end: the two parameter dicts (same names and shapes).
        alphas: the line coordinates (alpha = 0 is ``start``, 1 is ``end``).

    Returns:
        ``{"alpha": alphas, name: values, ...}``.
    """
    start, end = _check_pair(start, end)
    alphas = finite_array("alphas", alphas, ndim=1)
    if not metrics:
        raise ValueError("metrics must name at least one function of the parameters")
    out = {"alpha": alphas}
    with torch.no_grad():
        for name, fn in metrics.items():
            out[name] = np.array([float(fn(linear_point(start, end, a))) for a in alphas])
    return out


def loss_barrier(alphas, values) -> float:
    """The barrier of a path: max over alpha of L(alpha) - ((1 - alpha) L(0) + alpha L(1)).

    The height above the straight line between the endpoint values (Frankle et al. 2020);
    ``alphas`` must run from 0 to 1. Zero when the path never rises above that chord.
    """
    alphas = finite_array("alphas", alphas, ndim=1)
    values = finite_array("values", values, shape=alphas.shape)
    if alphas[0] != 0.0 or alphas[-1] != 1.0 or np.any(np.diff(alphas) <= 0):
        raise ValueError("alphas must increase from 0 to 1")
    chord = (1 - alphas) * values[0] + alphas * values[-1]
    return float(max(0.0, np.max(values - chord)))


def bezier_point(start: Params, control: Params, end: Params, t: float) -> dict[str, torch.Tensor]:
    """The quadratic Bezier curve (1 - t)^2 start + 2 t (1 - t) control + t^2 end (Garipov et al. 2018)."""
    t = as_real("t", t)
    return {k: (1 - t) ** 2 * start[k] + 2 * t * (1 - t) * control[k] + t**2 * end[k] for k in start}


def bezier_curve_loss(loss_fn: LossFn, start: Params, end: Params):
    """``curve_loss(control, ts)``: the mean of ``loss_fn`` at the curve points t in ``ts``.

    The endpoints are fixed; only the control point is a free parameter dict. The shape
    ``curve_loss(params, batch)`` is that of :func:`lossgeom.optimisers.train`, whose
    ``batches`` rows then hold the curve positions t sampled for each step, so the curve
    is trained by the package's ordinary training loop. ``loss_fn`` is evaluated through
    ``torch.func.functional_call`` when it comes from :func:`lossgeom.models.loss_closure`.
    """
    start, end = _check_pair(start, end)

    def curve_loss(control: Params, ts: torch.Tensor | None = None) -> torch.Tensor:
        if ts is None:
            raise ValueError("curve_loss needs the curve positions t of the step (a 1-D tensor)")
        return torch.stack([loss_fn(bezier_point(start, control, end, float(t))) for t in ts]).mean()

    return curve_loss


def fit_bezier_curve(loss_fn: LossFn, start: Params, end: Params, optimiser, steps: int, points_per_step: int = 4,
                     seed: int = 0, control: Params | None = None):
    """Train the control point of a quadratic Bezier curve between two solutions.

    Minimises E_{t ~ U(0, 1)} L(bezier_point(start, control, end, t)) (Garipov et al.
    2018) with :func:`lossgeom.optimisers.train`: each step averages the loss at
    ``points_per_step`` positions t drawn by ``numpy.random.default_rng(seed)``. The
    control point starts at the midpoint of the endpoints unless ``control`` is given.

    Returns:
        The :class:`~lossgeom.optimisers.TrainRun`; its ``params`` is the trained control
        point.
    """
    from lossgeom.optimisers import train

    start, end = _check_pair(start, end)
    steps, points_per_step = positive_int("steps", steps), positive_int("points_per_step", points_per_step)
    ts = torch.from_numpy(np.random.default_rng(seed).uniform(0.0, 1.0, size=(steps, points_per_step)))
    init = linear_point(start, end, 0.5) if control is None else _check_pair(start, control)[1]
    return train(bezier_curve_loss(loss_fn, start, end), init, optimiser, steps, batches=ts)

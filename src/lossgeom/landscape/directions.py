"""Direction schemes of a loss slice: how the two directions of a landscape picture are made.

Each scheme returns :class:`Directions` (two parameter dicts and how they were made, for
the slice's contract): :func:`gaussian_directions` (raw), :func:`filter_normalised_directions`
(Li et al. 2018), :func:`neuron_normalised_directions`, :func:`closure_hessian_directions`
(extreme eigenvectors by Lanczos), :func:`trajectory_directions` (PCA of iterates) and
:func:`transported_directions` (the transformed square of a reparametrisation). Each scheme
states what it normalises, so a picture's dependence on the coordinates can be read
off (Li et al. 2018; Dinh et al. 2017).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from lossgeom.curvature import HessianOperator, top_eigenpairs
from lossgeom.parameters import flatten_params
from lossgeom.symmetries.core import Symmetry
from lossgeom.types import LossFn, Params


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
                raise ValueError(
                    f"directions.{label}[{key!r}] must have shape {tuple(params[key].shape)} "
                    f"(the parameter's), got {tuple(d[key].shape)}"
                )
            if d[key].dtype != params[key].dtype:
                raise TypeError(
                    f"directions.{label}[{key!r}] has dtype {d[key].dtype} but the parameter has "
                    f"{params[key].dtype}; convert one of them explicitly"
                )
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
        pair.append(
            {k: torch.randn(p.shape, generator=generator, dtype=torch.float64).to(p.dtype) for k, p in params.items()}
        )
    return pair[0], pair[1]


def gaussian_directions(params: Params, seed: int) -> Directions:
    """Raw random directions: i.i.d. N(0, 1) entries, each direction scaled to unit norm.

    No per-layer or per-neuron scaling: the same seed gives the same two vectors at any
    centre, so a reparametrisation of the centre does not move them
    (Dinh et al. 2017: a sharp minimum can be made to look flat). Drawn with
    ``torch.Generator().manual_seed(seed)`` in the parameter dict's order, all of d1
    before d2.

    Args:
        params: the centre, a non-empty dict of name -> tensor (gives names, shapes, dtypes).
        seed: the int seed of the torch generator.

    Returns:
        :class:`Directions` d1, d2, each of unit Euclidean norm over all parameters.

    Raises:
        TypeError: if ``params`` is not a non-empty dict of tensors or ``seed`` is not an int.
    """
    params = _check_params(params)
    pair = _gaussian_pair(params, seed)
    unit = []
    for d in pair:
        norm = torch.cat([v.reshape(-1) for v in d.values()]).norm()
        unit.append({k: v / norm for k, v in d.items()})
    return Directions(
        unit[0],
        unit[1],
        f"raw Gaussian, torch seed {seed}",
        "none per layer; each direction scaled to unit Euclidean norm over all parameters",
    )


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

    Args:
        params: the centre ``theta``, a non-empty dict of name -> tensor.
        seed: the int seed of the torch generator.
        one_dimensional: ``"zero"`` or ``"copy"``, the rule for one-dimensional tensors.

    Returns:
        :class:`Directions` d1, d2, filter-normalised to the centre.

    Raises:
        TypeError: if ``params`` is not a non-empty dict of tensors or ``seed`` is not an int.
        ValueError: if ``one_dimensional`` is not ``"zero"`` or ``"copy"``.
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
    rule = (
        "zero on one-dimensional tensors (biases, normalisation layers)"
        if one_dimensional == "zero"
        else "one-dimensional tensors set to the parameters themselves"
    )
    return Directions(
        out[0],
        out[1],
        f"filter-normalised Gaussian (Li et al. 2018), torch seed {seed}",
        f"each filter (row of a weight) scaled to the norm of the same row of the centre; {rule}",
    )


def neuron_normalised_directions(params: Params, seed: int, layer_in: str, layer_out: str) -> Directions:
    """Random directions normalised neuron by neuron across a ReLU layer.

    For hidden neuron j between ``layer_in`` and ``layer_out``: its incoming weights and
    bias (row j of ``layer_in.weight`` with ``layer_in.bias[j]``) are scaled jointly to
    their norm at the centre, and its outgoing weights (column j of ``layer_out.weight``)
    to theirs. Every other tensor is scaled as a whole to the norm of the parameter
    tensor. Under the per-neuron rescaling (c_j theta_in,j, theta_out,j / c_j) the two
    pieces of the direction scale by c_j and 1/c_j, exactly as the parameters do, so the
    slice of the rescaled network is the rescaled slice (as filter normalisation intends,
    Li et al. 2018, at the granularity of the symmetry).

    Args:
        params: the centre, a non-empty dict of name -> tensor holding ``{layer_in}.weight``
            (shape ``(h, d)``), optionally ``{layer_in}.bias``, and ``{layer_out}.weight`` (``(k, h)``).
        seed: the int seed of the torch generator.
        layer_in: the name of the layer into the hidden neurons.
        layer_out: the name of the layer out of them.

    Returns:
        :class:`Directions` d1, d2, neuron-normalised to the centre.

    Raises:
        TypeError: if ``params`` is not a non-empty dict of tensors or ``seed`` is not an int.
        ValueError: if a weight is missing or the two weights' shapes do not match ``(h, d)``, ``(k, h)``.
    """
    params = _check_params(params)
    w_in, b_in, w_out = f"{layer_in}.weight", f"{layer_in}.bias", f"{layer_out}.weight"
    missing = {w_in, w_out} - set(params)
    if missing:
        raise ValueError(
            f"neuron_normalised_directions needs params {sorted(missing)} (layer_in={layer_in!r}, "
            f"layer_out={layer_out!r})"
        )
    width = params[w_in].shape[0]
    if params[w_in].ndim != 2 or params[w_out].ndim != 2 or params[w_out].shape[1] != width:
        raise ValueError(
            f"{w_in} must be (h, d) and {w_out} must be (k, h) with the same h; got "
            f"{tuple(params[w_in].shape)} and {tuple(params[w_out].shape)}"
        )
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
    return Directions(
        out[0],
        out[1],
        f"neuron-normalised Gaussian across layers {layer_in} -> {layer_out}, torch seed {seed}",
        "each hidden neuron's incoming weights+bias and outgoing weights scaled to their norms at the "
        "centre; other tensors scaled to their tensor's norm",
    )


def _fixed_sign(vector: np.ndarray) -> np.ndarray:
    """Eigen- and singular vectors are defined up to sign: make the largest entry positive."""
    return vector if vector[np.argmax(np.abs(vector))] >= 0 else -vector


def closure_hessian_directions(
    loss_fn: LossFn,
    params: Params,
    which: tuple[str, str] = ("largest", "smallest"),
    tol: float = 1e-10,
    seed: int = 0,
    normalisation: str = "unit",
) -> Directions:
    """Unit Hessian eigenvectors at ``params``: by default the most positive and most negative.

    The Hessian is the curvature toolkit's :class:`~lossgeom.curvature.HessianOperator`
    (reverse-over-reverse Hessian-vector products) and the eigenpairs come from
    :func:`~lossgeom.curvature.top_eigenpairs` (Lanczos stopped on the residual, since the
    directions are the eigenvectors: ``stop="residual"``).
    ``which`` names the eigenvalue of each direction: ``"largest"`` or ``"smallest"``;
    ``("largest", "largest")`` takes the top two. Signs are fixed so the largest entry is
    positive. ``normalisation="unit"`` keeps unit eigenvectors; ``"curvature"`` divides
    each by ``sqrt(abs(lambda))``, so that the quadratic model along either axis of the slice is
    ``+-s^2/2`` and one radius shows both curvatures. ``details`` holds the eigenvalues,
    residuals and products used.

    Args:
        loss_fn: the closure ``loss_fn(params) -> scalar``.
        params: the centre, a non-empty dict of name -> tensor.
        which: the eigenvalue of each direction, a pair of ``"largest"``/``"smallest"``.
        tol: the Lanczos tolerance on the relative residual ``||H v - lambda v|| / |lambda|``.
        seed: the seed of the Lanczos start vector.
        normalisation: ``"unit"`` or ``"curvature"``.

    Returns:
        :class:`Directions` with ``details`` ``{"eigenvalues", "residuals", "n_hvp"}``.

    Raises:
        TypeError: if ``params`` is not a non-empty dict of tensors.
        ValueError: on an invalid ``which`` or ``normalisation``, or a zero eigenvalue with
            ``normalisation="curvature"``.
    """
    params = _check_params(params)
    if not isinstance(which, (tuple, list)) or len(which) != 2 or any(w not in ("largest", "smallest") for w in which):
        raise ValueError(f"which must be a pair of 'largest'/'smallest', got {which!r}")
    if normalisation not in ("unit", "curvature"):
        raise ValueError(f"normalisation must be 'unit' or 'curvature', got {normalisation!r}")
    _, unflatten = flatten_params(params)
    operator = HessianOperator.from_closure(loss_fn, params, method="reverse-over-reverse")
    vectors, values, residuals, used = [], [], [], 0
    if which[0] == which[1]:
        result = top_eigenpairs(operator, k=2, which=which[0], tol=tol, seed=seed, stop="residual")
        vectors = [result.vectors[:, 0], result.vectors[:, 1]]
        values, residuals, used = list(result.values), list(result.residuals), result.n_hvp
    else:
        for w in which:
            result = top_eigenpairs(operator, k=1, which=w, tol=tol, seed=seed, stop="residual")
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
    rule = (
        "unit Euclidean norm (eigenvectors)"
        if normalisation == "unit"
        else "each eigenvector divided by sqrt(|eigenvalue|) (quadratic model +-s^2/2 on each axis)"
    )
    return Directions(
        dirs[0],
        dirs[1],
        f"Hessian eigenvectors ({which[0]}, {which[1]} eigenvalue) by Lanczos, start seed {seed}",
        f"{rule}; sign: largest entry positive",
        {"eigenvalues": [float(v) for v in values], "residuals": [float(r) for r in residuals], "n_hvp": int(used)},
    )


def trajectory_directions(iterates: Sequence[Params], centre: Params | None = None) -> Directions:
    """The trajectory plane: the top two principal directions of recorded iterates.

    The rows of the matrix are ``iterate - centre`` (the centre defaults to the last
    iterate, as in Li et al. 2018); its two leading right singular vectors are the
    directions (unit norm, sign fixed). ``details["explained_variance"]`` holds the
    fraction of the rows' squared norm each captures, s_k^2 / sum_i s_i^2.

    Args:
        iterates: at least 3 parameter dicts with the same names and shapes.
        centre: the centre of the rows; ``None`` means the last iterate.

    Returns:
        :class:`Directions` with ``details["explained_variance"]`` of both directions.

    Raises:
        TypeError: if an iterate or the centre is not a non-empty dict of tensors.
        ValueError: on fewer than 3 iterates, mismatched names or shapes, or iterates that span
            fewer than two directions around the centre.
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
    return Directions(
        dirs[0],
        dirs[1],
        f"trajectory PCA of {len(iterates)} recorded iterates",
        "unit Euclidean norm (principal directions of iterate - centre); sign: largest entry positive",
        {"explained_variance": [float(explained[0]), float(explained[1])]},
    )


def transported_directions(directions: Directions, symmetry: Symmetry, at: Params) -> Directions:
    """The transformed square: push both directions through the Jacobian of ``symmetry`` at ``at``.

    d -> J d with J = d symmetry / d theta at ``at`` (``torch.autograd.functional.jvp``). For a linear
    transform such as the per-neuron ReLU rescaling, ``symmetry(at + s d1 + t d2) =
    symmetry(at) + s J d1 + t J d2`` exactly, so the slice at ``symmetry(at)`` along the
    transported directions repeats every value of the original slice: the pushforward of
    the square by the reparametrisation.

    Args:
        directions: the :class:`Directions` to transport (names and shapes of ``at``).
        symmetry: the transformation ``theta -> symmetry(theta)``.
        at: the parameters where the Jacobian is taken (the slice's centre).

    Returns:
        :class:`Directions` ``J d1``, ``J d2``, with the original scheme, normalisation and details.

    Raises:
        TypeError: if ``symmetry`` is not a lossgeom Symmetry, ``at`` not a dict of tensors, or
            ``directions`` not :class:`Directions` (or of another dtype).
        ValueError: if the directions do not match ``at``'s names and shapes, are non-finite,
            zero or linearly dependent.
    """
    if not isinstance(symmetry, Symmetry):
        raise TypeError(f"symmetry must be a lossgeom Symmetry, got {type(symmetry).__name__}")
    at = _check_params(at, "at")
    _check_directions(at, directions)
    names = list(at)

    def transform(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        moved = symmetry(dict(zip(names, tensors)))
        return tuple(moved[n] for n in names)

    pushed = []
    for d in (directions.first, directions.second):
        # reverse-mode double-vjp (torch.autograd.functional.jvp): no forward-mode start-up cost
        _, tangent = torch.autograd.functional.jvp(
            transform, tuple(at[n].detach() for n in names), tuple(d[n] for n in names)
        )
        pushed.append({n: t.detach() for n, t in zip(names, tangent)})
    return Directions(
        pushed[0],
        pushed[1],
        f"{directions.scheme}, transported by the Jacobian of {symmetry.name}",
        f"{directions.normalisation}, then multiplied by the transform's Jacobian",
        dict(directions.details),
    )

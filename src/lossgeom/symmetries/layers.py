"""Symmetries of named layers: rescalings, permutations, mixings and the softmax gauge.

Each function builds a :class:`~lossgeom.symmetries.core.Symmetry` acting on the
parameter dict of a model whose layers are named (``"0.weight"``, ``"2.bias"``, ...):

- the per-unit rescaling through a positively homogeneous activation
  (:func:`relu_neuron_rescaling`, :func:`homogeneous_neuron_rescaling`) and its one-factor
  version (:func:`layer_rescaling`);
- the invertible mixing of two linear layers with nothing between them
  (:func:`linear_layer_mixing`);
- the permutation of hidden units or channels (:func:`unit_permutation`);
- the rescaling of a layer read by a scale-invariant normalisation
  (:func:`normalisation_rescaling`);
- the softmax gauge of a classifier: the common-row shift (:func:`softmax_row_shift`,
  compared through :func:`centred_over_classes`) and the reference-class representative
  (:func:`reference_class`, :func:`reference_class_shift`).
"""

from __future__ import annotations

import math

import torch
from numpy.typing import ArrayLike

from lossgeom._validation import finite_tensor, positive
from lossgeom.formatting import fmt
from lossgeom.symmetries.core import Symmetry
from lossgeom.types import Params


def _along(vector: torch.Tensor, ndim: int, axis: int) -> torch.Tensor:
    shape = [1] * ndim
    shape[axis] = -1
    return vector.reshape(shape)


def _output_columns(weight: torch.Tensor, width: int, units_last: bool) -> torch.Tensor:
    """View the reading layer's weight so the hidden units are axis 1 (3-D for Linear readers).

    A Conv reader (``weight`` of shape (out, width, k...)) is returned as is. A Linear
    reader of ``width * s`` columns (a Flatten in between) is viewed as (out, width, s)
    when the units came from a Conv (channel-major), and as (out, s, width) transposed to
    (out, width, s) when they came from a Linear layer (units last).
    """
    if weight.ndim != 2:
        return weight
    rows, cols = weight.shape
    if units_last:
        return weight.reshape(rows, cols // width, width).transpose(1, 2)
    return weight.reshape(rows, width, cols // width)


def _restore_columns(view: torch.Tensor, like: torch.Tensor, units_last: bool) -> torch.Tensor:
    if like.ndim != 2:
        return view
    return (view.transpose(1, 2) if units_last else view).reshape(like.shape)


def _check_unit_layers(kind: str, w_in: str, w_out: str, width: int, params: Params, units_last: bool) -> None:
    missing = {w_in, w_out} - set(params)
    if missing:
        raise ValueError(f"{kind} needs params {sorted(missing)}")
    rows = params[w_in].shape[0]
    cols = params[w_out].shape[1] if params[w_out].ndim >= 2 else -1
    flattened = params[w_out].ndim == 2 and width > 0 and cols % width == 0 and cols > width
    if rows != width or not (cols == width or flattened):
        raise ValueError(
            f"{kind} has {width} entries but {w_in} has {rows} rows and {w_out} has {cols} columns; they must agree"
        )


def relu_neuron_rescaling(
    layer_in: str, layer_out: str, scales: ArrayLike, *, units_last: bool = True, activation: str = "ReLU"
) -> Symmetry:
    """Per-neuron rescaling of a ReLU layer: incoming weights and bias times c_j, outgoing / c_j.

    Row j of ``f"{layer_in}.weight"`` and entry j of ``f"{layer_in}.bias"`` (if present)
    are multiplied by c_j > 0 and column j of ``f"{layer_out}.weight"`` is divided by it.
    Since relu(c z) = c relu(z) for c > 0 (and the same for LeakyReLU), every output is
    unchanged (the symmetry predicts one Hessian null direction per hidden neuron at a
    critical point). Conv layers work the same way with channels for neurons; when a
    Flatten sits between the layers, each unit owns a block of the reading Linear
    layer's columns.

    Args:
        layer_in: name prefix of the layer feeding the ReLU (e.g. ``"0"`` in an
            ``nn.Sequential``).
        layer_out: name prefix of the layer reading the ReLU's output (e.g. ``"2"``).
        scales: one positive scale per hidden neuron (sequence, array or 1-D tensor).
        units_last: with a Flatten between the layers: True if the units are the last
            axis before flattening (a Linear ``layer_in``), False if they are channels
            (axis 1, a Conv ``layer_in``).
        activation: the activation's name, for the symmetry's name.

    Returns:
        A :class:`Symmetry` on the model's parameter dict.
    """
    scales = torch.as_tensor(scales, dtype=torch.float64)
    if scales.ndim != 1 or scales.numel() == 0:
        raise ValueError(
            f"scales must be a non-empty 1-D sequence (one per hidden neuron), got shape {tuple(scales.shape)}"
        )
    if not torch.isfinite(scales).all() or not (scales > 0).all():
        raise ValueError("scales must be finite and > 0 (ReLU is positively homogeneous only for c > 0)")
    w_in, b_in, w_out = f"{layer_in}.weight", f"{layer_in}.bias", f"{layer_out}.weight"
    width = scales.numel()

    def transform(params: Params) -> dict[str, torch.Tensor]:
        _check_unit_layers("scales", w_in, w_out, width, params, units_last)
        c = scales.to(dtype=params[w_in].dtype, device=params[w_in].device)
        out = dict(params)
        out[w_in] = params[w_in] * _along(c, params[w_in].ndim, 0)
        if b_in in params:
            out[b_in] = params[b_in] * c
        view = _output_columns(params[w_out], width, units_last)
        out[w_out] = _restore_columns(view / _along(c, view.ndim, 1), params[w_out], units_last)
        return out

    return Symmetry(
        f"{activation} neuron rescaling of layer {layer_in} -> {layer_out}, "
        f"{width} scales in [{fmt(float(scales.min()), 4)}, {fmt(float(scales.max()), 4)}]",
        transform,
    )


def linear_layer_mixing(layer_in: str, layer_out: str, matrix: ArrayLike) -> Symmetry:
    """An invertible mixing of two consecutive linear layers: ``W_in -> A W_in``, ``W_out -> W_out A^-1``.

    When ``layer_out`` reads ``layer_in``'s output directly (no activation between them),
    ``W_out A^-1 (A W_in x + A b_in) = W_out (W_in x + b_in)``, so every output is kept for
    any invertible ``r x r`` matrix ``A`` (``r`` the width between the layers); the bias of
    ``layer_in``, if present, becomes ``A b_in``. Factorised and low-rank layers and the
    query-key product of attention carry this ``GL(r)`` symmetry; unlike the ReLU
    rescaling its Jacobian is not diagonal.

    Args:
        layer_in: name prefix of the first linear layer (e.g. ``"0"``).
        layer_out: name prefix of the linear layer that reads it (e.g. ``"1"``).
        matrix: the invertible ``r x r`` mixing matrix ``A``.

    Returns:
        A :class:`Symmetry` on the model's parameter dict.
    """
    A = finite_tensor("matrix", matrix).to(torch.float64)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"matrix must be square (r x r), got shape {tuple(A.shape)}")
    singular = torch.linalg.svdvals(A)
    if float(singular[-1]) <= 1e-12 * float(singular[0]):
        raise ValueError("matrix must be invertible (its smallest singular value is ~0)")
    inverse = torch.linalg.inv(A)
    w_in, b_in, w_out = f"{layer_in}.weight", f"{layer_in}.bias", f"{layer_out}.weight"

    def transform(params: Params) -> dict[str, torch.Tensor]:
        missing = {w_in, w_out} - set(params)
        if missing:
            raise ValueError(f"linear_layer_mixing needs params {sorted(missing)}")
        r = params[w_in].shape[0]
        if A.shape[0] != r or params[w_out].shape[1] != r:
            raise ValueError(
                f"matrix is {A.shape[0]} x {A.shape[0]} but {w_in} has {r} rows and "
                f"{w_out} has {params[w_out].shape[1]} columns; they must agree"
            )
        out = dict(params)
        out[w_in] = A @ params[w_in]
        if b_in in params:
            out[b_in] = A @ params[b_in]
        out[w_out] = params[w_out] @ inverse
        return out

    return Symmetry(
        f"linear mixing of layers {layer_in} -> {layer_out} by a {A.shape[0]} x {A.shape[0]} matrix, "
        f"condition number {fmt(float(singular[0] / singular[-1]), 3)}",
        transform,
    )


def homogeneous_neuron_rescaling(layer_in: str, layer_out: str, scales: ArrayLike, degree: int) -> Symmetry:
    """Per-neuron rescaling for an activation with ``sigma(c z) = c^degree sigma(z)`` (``c > 0``).

    Row ``j`` of ``f"{layer_in}.weight"`` and entry ``j`` of its bias (if present) are
    multiplied by ``c_j``, column ``j`` of ``f"{layer_out}.weight"`` is divided by
    ``c_j^degree``. ``degree=1`` is :func:`relu_neuron_rescaling` (ReLU, leaky ReLU);
    ``degree=2`` is the rescaling of a square activation ``sigma(z) = z^2``, which is smooth,
    so its networks have genuine critical points.
    Either way the Jacobian of the map is diagonal.

    Args:
        layer_in: name prefix of the layer feeding the activation.
        layer_out: name prefix of the layer reading it.
        scales: one positive scale ``c_j`` per hidden unit.
        degree: the homogeneity degree, an int >= 1.

    Returns:
        A :class:`Symmetry` on the model's parameter dict.

    Raises:
        ValueError: if ``degree`` is not an int >= 1.
    """
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
        raise ValueError(f"degree must be an int >= 1, got {degree!r}")
    scales = torch.as_tensor(scales, dtype=torch.float64)
    base = relu_neuron_rescaling(layer_in, layer_out, scales)
    if degree == 1:
        return base
    w_out = f"{layer_out}.weight"

    def transform(params: Params) -> dict[str, torch.Tensor]:
        out = base(params)
        out[w_out] = params[w_out] / scales[None, :] ** degree
        return out

    return Symmetry(base.name.replace("ReLU neuron rescaling", f"degree-{degree} neuron rescaling"), transform)


def unit_permutation(layer_in: str, layer_out: str, permutation: ArrayLike, *, units_last: bool = True) -> Symmetry:
    """Permute the hidden units (or channels) between two layers: rows of one, columns of the next.

    Hidden unit ``permutation[j]`` becomes unit ``j``: row ``permutation[j]`` of
    ``f"{layer_in}.weight"`` (and its bias entry) moves to row ``j`` and so does column
    ``permutation[j]`` of ``f"{layer_out}.weight"``. Any element-wise activation between
    the layers commutes with this relabelling, so every output is unchanged.

    Args:
        layer_in: name prefix of the layer whose rows (output units) are permuted.
        layer_out: name prefix of the layer whose columns (input units) are permuted.
        permutation: a permutation of ``0..width-1`` (sequence or 1-D integer tensor).
        units_last: as in :func:`relu_neuron_rescaling` (only matters with a Flatten).

    Returns:
        A :class:`Symmetry` on the model's parameter dict.

    Raises:
        ValueError: if ``permutation`` is not a non-empty 1-D integer sequence holding each of
            ``0..width-1`` exactly once.
    """
    perm = torch.as_tensor(permutation)
    if perm.ndim != 1 or perm.numel() == 0 or perm.dtype.is_floating_point or perm.dtype == torch.bool:
        raise ValueError(f"permutation must be a non-empty 1-D sequence of integers, got {permutation!r}")
    perm = perm.to(torch.long)
    if not torch.equal(torch.sort(perm).values, torch.arange(perm.numel())):
        raise ValueError(f"permutation must hold each of 0..{perm.numel() - 1} exactly once")
    w_in, b_in, w_out = f"{layer_in}.weight", f"{layer_in}.bias", f"{layer_out}.weight"
    width = perm.numel()

    def transform(params: Params) -> dict[str, torch.Tensor]:
        _check_unit_layers("permutation", w_in, w_out, width, params, units_last)
        index = perm.to(params[w_in].device)
        out = dict(params)
        out[w_in] = params[w_in][index]
        if b_in in params:
            out[b_in] = params[b_in][index]
        view = _output_columns(params[w_out], width, units_last)
        out[w_out] = _restore_columns(view[:, index], params[w_out], units_last)
        return out

    moved = int((perm != torch.arange(width)).sum())
    return Symmetry(f"permutation of the {width} units of layer {layer_in} -> {layer_out} ({moved} moved)", transform)


def centred_over_classes(outputs: torch.Tensor) -> torch.Tensor:
    """Logits minus their mean over the class axis (the last): what a softmax cannot see shifted.

    Args:
        outputs: the logits, classes on the last axis.

    Returns:
        ``outputs - outputs.mean(dim=-1, keepdim=True)``, of the shape of ``outputs``.

    >>> centred_over_classes(torch.tensor([[1.0, 2.0, 6.0]]))
    tensor([[-2., -1.,  3.]])
    """
    return outputs - outputs.mean(dim=-1, keepdim=True)


def softmax_row_shift(
    weight: str, v: torch.Tensor, *, bias: str | None = None, beta: float = 0.0, invariant: bool = True
) -> Symmetry:
    """The softmax common-row shift ``W -> W + 1 v^T`` (and ``b -> b + beta 1``) of a classifier.

    Every logit of an example gains the same ``v^T h + beta``, so softmax probabilities
    and the cross-entropy are unchanged while the logits are not (the softmax gauge). The
    symmetry's ``invariant`` is therefore the logits centred over classes
    (:func:`centred_over_classes`); pass ``invariant=False`` when the audited outputs are
    already probabilities or log-probabilities.
    :func:`lossgeom.flatness.softmax_gauge.row_shift_symmetry` is the same transform on ``weight`` alone.

    Args:
        weight: the parameter name of the (K, d) classifier ``W``, e.g. ``"2.weight"``.
        v: the shift, shape (d,).
        bias: the name of the classifier's (K,) bias, shifted by ``beta`` (optional).
        beta: the common shift of the bias.
        invariant: compare centred logits (True) or the outputs themselves (False).

    Returns:
        A :class:`Symmetry` whose ``invariant`` is :func:`centred_over_classes` (or None).
    """
    if not isinstance(weight, str) or not weight:
        raise TypeError("weight must be a non-empty parameter name")
    if not isinstance(v, torch.Tensor) or v.ndim != 1 or v.numel() == 0:
        raise ValueError(
            f"v must be a non-empty 1-D torch.Tensor of shape (d,), got "
            f"{tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__}"
        )
    v = finite_tensor("v", v)
    beta = float(beta)
    if not math.isfinite(beta):
        raise ValueError(f"beta must be finite, got {beta}")
    if bias is None and beta != 0.0:
        raise ValueError("beta shifts the bias: give the bias's parameter name as bias=")

    def transform(params: Params) -> dict[str, torch.Tensor]:
        needed = {weight} | ({bias} if bias is not None else set())
        missing = needed - set(params)
        if missing:
            raise ValueError(f"softmax_row_shift needs params {sorted(missing)} (the classifier); got {sorted(params)}")
        W = params[weight]
        if W.ndim != 2 or W.shape[1] != v.numel() or W.shape[0] < 2:
            raise ValueError(
                f"params[{weight!r}] must be a (K, {v.numel()}) classifier with K >= 2 to match v, "
                f"got shape {tuple(W.shape)}"
            )
        out = dict(params)
        out[weight] = W + v.to(dtype=W.dtype, device=W.device)[None, :]
        if bias is not None:
            out[bias] = params[bias] + beta
        return out

    size = float(torch.cat([v, torch.tensor([beta], dtype=v.dtype)]).norm()) if bias is not None else float(v.norm())
    return Symmetry(
        f"softmax common-row shift of {weight}"
        + (f" and {bias}" if bias is not None else "")
        + f", |shift| = {fmt(size, 4)}",
        transform,
        invariant=centred_over_classes if invariant else None,
        invariant_name="logits centred over classes" if invariant else "outputs",
    )


def layer_rescaling(layer_in: str, layer_out: str, c: float, *, activation: str = "ReLU") -> Symmetry:
    """Layer-wise rescaling: ``layer_in``'s weight and bias times ``c > 0``, ``layer_out``'s weight divided by it.

    The rescaling of :func:`relu_neuron_rescaling` with one scale for every unit (the
    transformation of Dinh et al. 2017): a positively homogeneous activation (ReLU,
    LeakyReLU, max or average pooling, none) passes the common factor ``c`` through, so
    every output is unchanged. Because the factor is common, the reading layer's weight is
    divided as a whole, whatever lies between (a Flatten included).

    Args:
        layer_in: name prefix of the layer whose weight and bias are multiplied by ``c``.
        layer_out: name prefix of the layer whose weight is divided by ``c``.
        c: the common factor, > 0.
        activation: the activation's name, for the symmetry's name.

    Returns:
        A :class:`Symmetry` on the model's parameter dict.
    """
    c = positive("c", c)
    w_in, b_in, w_out = f"{layer_in}.weight", f"{layer_in}.bias", f"{layer_out}.weight"

    def transform(params: Params) -> dict[str, torch.Tensor]:
        missing = {w_in, w_out} - set(params)
        if missing:
            raise ValueError(f"layer_rescaling needs params {sorted(missing)}")
        out = dict(params)
        out[w_in] = params[w_in] * c
        if b_in in params:
            out[b_in] = params[b_in] * c
        out[w_out] = params[w_out] / c
        return out

    return Symmetry(f"{activation} layer rescaling of {layer_in} -> {layer_out}, c = {fmt(c, 4)}", transform)


def normalisation_rescaling(layer: str, c: float, *, norm: str = "a normalisation layer") -> Symmetry:
    """The weight and bias of ``layer`` times ``c > 0``, where ``layer`` feeds a scale-invariant normalisation.

    LayerNorm, GroupNorm and RMSNorm divide their input by its own spread, so multiplying
    everything they read by a common ``c > 0`` leaves their output unchanged up to their
    ``eps`` (``LN(c z) = LN(z)`` exactly when ``eps = 0``); the layer's own weights become
    free in scale, and any curvature of the loss in them scales like ``1 / c^2``. The
    symmetry is therefore marked ``approximate``: the audit measures how far the ``eps`` of
    the model at hand moves the outputs and reports it, instead of refusing the transform.

    Args:
        layer: name prefix of the layer read by the normalisation.
        c: the factor, > 0.
        norm: the normalisation, for the symmetry's name.

    Returns:
        A :class:`Symmetry` on the model's parameter dict.
    """
    c = positive("c", c)
    weight, bias = f"{layer}.weight", f"{layer}.bias"

    def transform(params: Params) -> dict[str, torch.Tensor]:
        if weight not in params:
            raise ValueError(f"normalisation_rescaling needs params[{weight!r}]")
        out = dict(params)
        out[weight] = params[weight] * c
        if bias in params:
            out[bias] = params[bias] * c
        return out

    return Symmetry(
        f"rescaling of layer {layer} before {norm}, c = {fmt(c, 4)}",
        transform,
        approximate="the normalisation's eps makes it exact only as eps -> 0" if c != 1 else "",
    )


def _float64(name: str, value: ArrayLike) -> torch.Tensor:
    value = finite_tensor(name, value)
    return value if value.dtype == torch.float64 else value.to(torch.float64)


def _classifier(W: torch.Tensor) -> torch.Tensor:
    if not isinstance(W, torch.Tensor):
        raise TypeError(f"W must be a torch.Tensor of shape (K, d), got {type(W).__name__}")
    if W.ndim != 2:
        raise ValueError(f"W must be 2-D of shape (K, d), got shape {tuple(W.shape)}")
    if W.shape[0] < 2:
        raise ValueError(f"W must have K >= 2 class rows, got K = {W.shape[0]}")
    if W.shape[1] < 1:
        raise ValueError(f"W must have at least one feature column, got shape {tuple(W.shape)}")
    return _float64("W", W)


def reference_class(W: torch.Tensor, r: int) -> torch.Tensor:
    """The reference-class representative ``W - 1 w_r^T``, whose row ``r`` is zero.

    Equal to ``W_c - 1 w_{c,r}^T``: same function, different ``||W||_F``.

    Args:
        W: the (K, d) classifier, K >= 2; computed in float64.
        r: the reference class, an int in ``0..K-1``.

    Returns:
        The (K, d) float64 matrix ``W - 1 w_r^T``.

    Raises:
        TypeError: if ``W`` is not a tensor or ``r`` is not an int.
        ValueError: if ``W`` is not a finite (K, d) matrix with K >= 2, or ``r`` is out of range.
    """
    W = _classifier(W)
    if isinstance(r, bool) or not isinstance(r, int):
        raise TypeError(f"r must be an int class index, got {type(r).__name__}")
    K = W.shape[0]
    if not 0 <= r < K:
        raise ValueError(f"r must be a class index in 0..{K - 1}, got {r}")
    return W - W[r].unsqueeze(0)


def reference_class_shift(weight: str, r: int, *, bias: str | None = None) -> Symmetry:
    """The reference-class representative of a softmax classifier: ``W -> W - 1 w_r^T``, ``b -> b - b_r 1``.

    Row ``r`` (and bias entry ``r``) becomes zero, the convention of a multinomial logit
    with reference class ``r``; it is the common-row shift by ``v = -w_r``
    (:func:`reference_class`), so the softmax probabilities are unchanged
    while ``||W||_F`` is not. Unlike a fixed shift, the
    amount depends on the parameters it is applied to.

    Args:
        weight: the parameter name of the (K, d) classifier.
        r: the reference class.
        bias: the name of its (K,) bias (optional).

    Returns:
        A :class:`Symmetry` compared through :func:`centred_over_classes`.
    """
    if not isinstance(weight, str) or not weight:
        raise TypeError("weight must be a non-empty parameter name")
    if isinstance(r, bool) or not isinstance(r, int):
        raise TypeError(f"r must be an int class index, got {type(r).__name__}")

    def transform(params: Params) -> dict[str, torch.Tensor]:
        needed = {weight} | ({bias} if bias is not None else set())
        missing = needed - set(params)
        if missing:
            raise ValueError(f"reference_class_shift needs params {sorted(missing)} (the classifier)")
        W = params[weight]
        out = dict(params)
        out[weight] = reference_class(W, r).to(dtype=W.dtype, device=W.device)
        if bias is not None:
            out[bias] = params[bias] - params[bias][r]
        return out

    return Symmetry(
        f"reference class {r} of {weight}" + (f" and {bias}" if bias is not None else ""),
        transform,
        invariant=centred_over_classes,
        invariant_name="logits centred over classes",
    )

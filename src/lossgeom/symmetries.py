"""Function-preserving transforms, the symmetry registry and the symmetry audit (claim P12).

A :class:`Symmetry` maps a parameter dict to another parameter dict that should
implement the same function. :func:`audit_symmetry` is the audit protocol of Chapter 1:

1. evaluate the model's real-valued outputs (or logits, never labels) on a declared
   probe set, before and after the transform;
2. report the largest discrepancy and compare it with a stated tolerance: if it is
   larger, the transform is not a same-predictor control and the audit says so;
3. only then recompute the geometry measure before and after.

Two guards make a wrong certificate impossible to produce silently: a transform never
sees the caller's tensors (it gets private copies, and one that edits its input in place
is refused), and a ``forward`` whose outputs do not depend on the parameters it is given
is refused (its outputs could not reveal a non-symmetry).

:func:`audit` is the same protocol for a plain ``torch.nn.Module``: the registry
(:func:`find_symmetries`) reads the model's computation graph (``torch.fx``) and finds the
symmetries it can identify safely, so no transform has to be written by hand:

- the per-unit positive rescaling of ReLU and LeakyReLU hidden units (or channels)
  between two Linear or two Conv layers (``relu(c z) = c relu(z)`` for ``c > 0``);
- the permutation of hidden units or channels between two such layers (through any
  element-wise activation);
- the softmax common-row shift of a final Linear layer that feeds a softmax cross-entropy
  (or a final softmax / log-softmax).

Hand-written symmetries for other models plug in by returning a :class:`Symmetry`: the
product model's rescaling (:func:`product_rescaling`), a ReLU rescaling and a unit
permutation of named layers (:func:`relu_neuron_rescaling`, :func:`unit_permutation`)
and the common-row shift of a classifier (:func:`softmax_row_shift`).
"""
from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lossgeom._validation import finite_tensor, positive
from lossgeom.formatting import SIGNIFICANT_DIGITS, fmt, rounding_level
from lossgeom.types import Forward, Params


def _private_copy(params: Params) -> dict[str, torch.Tensor]:
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a dict of name -> tensor, got {type(params).__name__}")
    for key, value in params.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"params[{key!r}] must be a torch.Tensor, got {type(value).__name__}")
    return {key: value.clone() for key, value in params.items()}


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise-equal values (NaN equal to NaN); True when the comparison cannot run."""
    try:
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if not (torch.is_floating_point(a) or torch.is_complex(a)):
            return bool(torch.equal(a, b))
        return bool(torch.equal(a, b) or torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True))
    except RuntimeError:  # inside a torch.func transform the values are not inspectable
        return True


@dataclass(frozen=True)
class Symmetry:
    """A named parameter transform claimed to preserve the model's function.

    Calling a symmetry gives the transform a private copy of the parameters, so the
    caller's tensors are never touched, and refuses a transform that edits its input in
    place (it would have silently moved the caller's model before this guard). The result
    must have the same names, shapes, dtypes and devices as the input.

    Attributes:
        name: what the transform is and how it was drawn, e.g.
            ``"rescaling (a, b) -> (c a, b / c), c = 10"``.
        transform: maps a parameter dict to a new parameter dict; it must not modify
            the dict or tensors it is given.
        invariant: the function of the outputs the symmetry preserves, when that is not
            the outputs themselves. The softmax common-row shift adds one number per
            example to every logit, so its invariant is the logits centred over classes;
            ``None`` (default) compares the outputs themselves.
        invariant_name: what ``invariant`` returns, for the audit's receipt.
    """

    name: str
    transform: Callable[[Params], dict[str, torch.Tensor]]
    invariant: Callable[[torch.Tensor], torch.Tensor] | None = None
    invariant_name: str = "outputs"

    def __call__(self, params: Params) -> dict[str, torch.Tensor]:
        private = _private_copy(params)
        handed = dict(private)
        versions = {key: value._version for key, value in private.items()}
        out = self.transform(private)
        if set(private) != set(handed) or any(private[key] is not handed[key] for key in handed):
            raise ValueError(f"symmetry {self.name!r} modified the parameter dict it was given in place; "
                             "a transform must build and return a new dict")
        edited = sorted(key for key, value in handed.items()
                        if value._version != versions[key] or not _same_values(value, params[key]))
        if edited:
            raise ValueError(f"symmetry {self.name!r} edited the tensors {edited} in place; a transform must "
                             "return new tensors and leave its input unchanged (use p * c, not p.mul_(c))")
        if not isinstance(out, Mapping) or set(out) != set(params):
            raise ValueError(f"symmetry {self.name!r} must return the same parameter names it was given")
        for key, value in out.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"symmetry {self.name!r} returned a {type(value).__name__} for {key!r}, not a tensor")
            given = params[key]
            if value.shape != given.shape or value.dtype != given.dtype or value.device != given.device:
                raise ValueError(
                    f"symmetry {self.name!r} changed {key!r} from {tuple(given.shape)} {given.dtype} on "
                    f"{given.device} to {tuple(value.shape)} {value.dtype} on {value.device}; a transform must keep "
                    "each tensor's shape, dtype and device")
        return dict(out)

    def compared(self, outputs: torch.Tensor) -> torch.Tensor:
        """What the audit compares: ``invariant(outputs)``, or the outputs themselves."""
        return outputs if self.invariant is None else self.invariant(outputs)


def product_rescaling(c: float) -> Symmetry:
    """The product model's rescaling (a, b) -> (c a, b / c) for c > 0 (Chapter 2).

    ``ab`` is unchanged, so the function x -> abx is unchanged on every input.
    """
    c = positive("c", c)

    def transform(params: Params) -> dict[str, torch.Tensor]:
        missing = {"a", "b"} - set(params)
        if missing:
            raise ValueError(f"product_rescaling needs params 'a' and 'b'; missing {sorted(missing)}")
        return {"a": params["a"] * c, "b": params["b"] / c}

    return Symmetry(f"rescaling (a, b) -> (c a, b / c), c = {fmt(c)}", transform)


#: Discrepancies below this are reported by their order only, since their digits are the machine's.
ROUNDING_FLOOR = 1e-13


def discrepancy_text(value: float, floor: float = ROUNDING_FLOOR) -> str:
    """A discrepancy as portable text: its order below ``floor``, else 2 significant digits.

    >>> discrepancy_text(2.2e-16), discrepancy_text(0.0123)
    ('below 1e-13 (rounding level)', '0.012')
    >>> discrepancy_text(3e-7, floor=1e-4)
    'below 0.0001 (rounding level)'
    """
    return str(rounding_level(value, floor)) if abs(value) < floor else fmt(value, 2)


def rounding_floor(dtype: torch.dtype) -> float:
    """The reporting floor of a relative discrepancy in ``dtype``: 1e-13 (float64), 1e-4 (float32).

    It is the power of ten just above 450 units of round-off (``450 eps``, the scale of
    :data:`ROUNDING_FLOOR` in float64): a relative discrepancy below it has no digits that
    survive a change of CPU.

    >>> rounding_floor(torch.float64), rounding_floor(torch.float32)
    (1e-13, 0.0001)
    """
    if dtype not in _AUDIT_DTYPES:
        raise ValueError(f"the audit works in float32 or float64, got {dtype}")
    return 10.0 ** math.ceil(math.log10(450 * torch.finfo(dtype).eps))


_AUDIT_DTYPES = (torch.float32, torch.float64)
#: The default relative output tolerance of the module audit, by dtype.
DEFAULT_RTOL = {torch.float64: 1e-10, torch.float32: 1e-4}


@dataclass(frozen=True)
class AuditReport:
    """The receipt of one symmetry audit: functional check first, then the measure.

    ``max_output_discrepancy`` and ``tolerance`` are absolute. A module audit
    (:func:`audit`) also records ``output_scale`` (the largest ``|value|`` it compared)
    and ``relative_tolerance``; its receipt then states the discrepancy relative to that
    scale, by order when it is below ``rounding_floor``. Measures print with ``sig``
    significant digits, so the text carries only digits that survive a change of CPU.
    """

    symmetry: str
    probe_size: int
    tolerance: float
    max_output_discrepancy: float
    is_symmetry: bool
    measure_name: str | None = None
    measure_before: float | None = None
    measure_after: float | None = None
    details: dict = field(default_factory=dict)
    sig: int = SIGNIFICANT_DIGITS
    output_scale: float | None = None
    relative_tolerance: float | None = None
    rounding_floor: float = ROUNDING_FLOOR
    compared: str = "outputs"

    @property
    def measure_ratio(self) -> float | None:
        if self.measure_before is None or self.measure_after is None or self.measure_before == 0:
            return None
        return self.measure_after / self.measure_before

    @property
    def relative_discrepancy(self) -> float | None:
        """``max_output_discrepancy / output_scale`` (module audits only)."""
        if self.output_scale is None:
            return None
        return self.max_output_discrepancy / self.output_scale

    def discrepancy_text(self) -> str:
        """The largest discrepancy as portable text (relative to the output scale if recorded)."""
        if self.output_scale is None:
            return discrepancy_text(self.max_output_discrepancy, self.rounding_floor)
        return discrepancy_text(self.relative_discrepancy, self.rounding_floor) + " of the scale"

    def measure_text(self) -> str | None:
        """``"<measure>: before x, after y, ratio r"`` at ``sig`` digits, or None without a measure."""
        if self.measure_name is None:
            return None
        ratio = self.measure_ratio
        return (f"{self.measure_name}: before {fmt(self.measure_before, self.sig)}, after "
                f"{fmt(self.measure_after, self.sig)}"
                + (f", ratio {fmt(ratio, self.sig)}" if ratio is not None else ""))

    def __str__(self) -> str:
        verdict = "same function on the probe set" if self.is_symmetry else "NOT the same function: not a valid control"
        if self.output_scale is None:
            lines = [
                f"transform: {self.symmetry}",
                f"probe set: {self.probe_size} inputs; tolerance {fmt(self.tolerance, 3)}",
                f"largest output discrepancy: {self.discrepancy_text()} ({verdict})",
            ]
        else:
            lines = [
                f"transform: {self.symmetry}",
                (f"probe set: {self.probe_size} inputs; {self.compared} compared with tolerance "
                 f"{fmt(self.relative_tolerance, 3)} x their scale (largest |value| {fmt(self.output_scale, 3)})"),
                f"largest discrepancy: {self.discrepancy_text()} ({verdict})",
            ]
        if self.measure_name is not None:
            lines.append(self.measure_text())
        return "\n".join(lines)


def _perturbed(params: Params, keys, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """``params`` with every floating tensor in ``keys`` moved by ``(rms + 1) N(0, 1)`` noise."""
    out = dict(params)
    for key in keys:
        value = params[key]
        if not torch.is_floating_point(value):
            continue
        noise = torch.randn(value.shape, generator=generator, dtype=torch.float64).to(value.dtype).to(value.device)
        rms = float(value.detach().double().pow(2).mean().sqrt()) if value.numel() else 0.0
        scale = rms + 1.0 if math.isfinite(rms) else 1.0
        out[key] = value.detach() + scale * noise
    return out


def _outputs_or_none(forward: Forward, params: Params, probe: torch.Tensor) -> torch.Tensor | None:
    try:
        out = forward(params, probe)
    except Exception:  # noqa: BLE001 - a forward that fails on other parameters does read them
        return None
    return out if isinstance(out, torch.Tensor) else None


def _same_outputs(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return a is not None and b is not None and a.shape == b.shape and _same_values(a, b)


def check_forward_reads(forward: Forward, params: Params, probe: torch.Tensor, keys=None, *,
                        before: torch.Tensor | None = None, seed: int = 0) -> None:
    """Refuse a ``forward`` whose outputs do not depend on the parameters it is given.

    A forward that computes with a model's own weights instead of its ``params``
    argument (``lambda p, x: model(x)``) returns the same outputs for every transform,
    so any audit would certify any transform. Every floating parameter is moved at
    random by ``(rms + 1)`` times standard normal noise (seeded): if the outputs on the
    probe stay bitwise the same, this raises. Then, from that random point (where no
    parameter sits at a special value such as zero), each parameter in ``keys`` (those a
    symmetry changes) is moved again alone: one the outputs do not read cannot be
    certified.

    Raises:
        ValueError: naming the parameter the forward does not read.
    """
    generator = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        if before is None:
            before = forward(params, probe)
        moved = _perturbed(params, list(params), generator)
        anywhere = _outputs_or_none(forward, moved, probe)
        if _same_outputs(anywhere, before):
            raise ValueError("forward does not depend on its params argument: its outputs on the probe are "
                             "unchanged when every parameter is perturbed at random, so no transform can be "
                             "audited; compute with the params it is given, e.g. "
                             "torch.func.functional_call(model, params, (x,))")
        if anywhere is None:
            return
        for key in sorted(keys or ()):
            if _same_outputs(_outputs_or_none(forward, _perturbed(moved, [key], generator), probe), anywhere):
                raise ValueError(f"forward does not read params[{key!r}]: its outputs on the probe are unchanged "
                                 f"when that parameter is perturbed at random, so a transform of it cannot be "
                                 "audited (a misspelt name, or a forward that uses its own copy of the weight?)")


def audit_symmetry(
    forward: Forward,
    params: Params,
    symmetry: Symmetry,
    probe: torch.Tensor,
    *,
    tol: float,
    measure: Callable[[Params], float] | None = None,
    measure_name: str = "measure",
    input_shape: tuple[int, ...] | None = None,
    require_symmetry: bool = True,
) -> AuditReport:
    """Apply ``symmetry``, check outputs agree on ``probe``, then recompute ``measure``.

    The transform works on a private copy of ``params`` (the caller's tensors are never
    touched) and is refused if it edits its input in place; ``forward`` is refused if
    its outputs do not depend on ``params`` or on a parameter the transform changes
    (:func:`check_forward_reads`). :func:`audit` does the same for a ``torch.nn.Module``
    with symmetries found automatically.

    Args:
        forward: ``forward(params, probe) -> outputs``; real-valued outputs or logits.
        params: the model's parameters as a dict of tensors.
        symmetry: the transform to audit.
        probe: the declared probe inputs, first dimension indexing examples.
        tol: largest allowed absolute output discrepancy (> 0).
        measure: optional geometry measure ``measure(params) -> float`` to recompute.
        measure_name: the measure's name in the receipt.
        input_shape: the shape of one input; when given, ``probe.shape[1:]`` must match.
        require_symmetry: if True (default), raise ``ValueError`` when outputs differ by
            more than ``tol``; if False, return a report with ``is_symmetry=False``
            (for negative controls).

    Returns:
        An :class:`AuditReport`. When the transform fails the functional check the
        measure is not recomputed: a change in geometry then means nothing.
    """
    tol = positive("tol", tol)
    if not callable(forward):
        raise TypeError("forward must be callable as forward(params, probe)")
    if not isinstance(symmetry, Symmetry):
        raise TypeError(f"symmetry must be a lossgeom Symmetry, got {type(symmetry).__name__}")
    probe = finite_tensor("probe", probe)
    if probe.ndim == 0 or probe.shape[0] == 0:
        raise ValueError("probe must hold at least one input along its first dimension, "
                         f"got shape {tuple(probe.shape)}")
    if input_shape is not None and tuple(probe.shape[1:]) != tuple(input_shape):
        raise ValueError(
            f"probe must have shape (n, {', '.join(map(str, input_shape))}) for this model "
            f"(one input has shape {tuple(input_shape)}), got {tuple(probe.shape)}"
        )
    with torch.no_grad():
        try:
            before = forward(params, probe)
            moved = symmetry(params)
            after = forward(moved, probe)
        except RuntimeError as err:
            raise ValueError(f"forward failed on the probe set of shape {tuple(probe.shape)}: {err}") from err
    before = finite_tensor("forward(params, probe)", before)
    after = finite_tensor("forward(transformed params, probe)", after)
    if before.shape != after.shape:
        raise ValueError(f"outputs changed shape under the transform: {tuple(before.shape)} -> {tuple(after.shape)}")
    changed = [key for key in params if not _same_values(moved[key], params[key])]
    check_forward_reads(forward, params, probe, changed, before=before)
    before, after = symmetry.compared(before), symmetry.compared(after)
    discrepancy = float((after - before).abs().max())
    ok = discrepancy <= tol
    if not ok and require_symmetry:
        raise ValueError(
            f"{symmetry.name} is not a symmetry of the model on the probe set: largest output "
            f"discrepancy {fmt(discrepancy, 3)} exceeds tol {fmt(tol, 3)}"
        )
    report = dict(symmetry=symmetry.name, probe_size=int(probe.shape[0]), tolerance=tol,
                  max_output_discrepancy=discrepancy, is_symmetry=ok, compared=symmetry.invariant_name)
    if measure is not None and ok:
        report.update(measure_name=measure_name, measure_before=float(measure(params)),
                      measure_after=float(measure(moved)))
    return AuditReport(**report)


# --- symmetries of named layers ------------------------------------------------------------


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
        raise ValueError(f"{kind} has {width} entries but {w_in} has {rows} rows and {w_out} has {cols} columns; "
                         "they must agree")


def relu_neuron_rescaling(layer_in: str, layer_out: str, scales, *, units_last: bool = True,
                          activation: str = "ReLU") -> Symmetry:
    """Per-neuron rescaling of a ReLU layer: incoming weights and bias times c_j, outgoing / c_j.

    Row j of ``f"{layer_in}.weight"`` and entry j of ``f"{layer_in}.bias"`` (if present)
    are multiplied by c_j > 0 and column j of ``f"{layer_out}.weight"`` is divided by it.
    Since relu(c z) = c relu(z) for c > 0 (and the same for LeakyReLU), every output is
    unchanged (Chapter 4 derives the one Hessian null direction per hidden neuron this
    symmetry predicts). Conv layers work the same way with channels for neurons; when a
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
    """
    scales = torch.as_tensor(scales, dtype=torch.float64)
    if scales.ndim != 1 or scales.numel() == 0:
        raise ValueError("scales must be a non-empty 1-D sequence (one per hidden neuron), "
                         f"got shape {tuple(scales.shape)}")
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

    return Symmetry(f"{activation} neuron rescaling of layer {layer_in} -> {layer_out}, "
                    f"{width} scales in [{fmt(float(scales.min()), 4)}, {fmt(float(scales.max()), 4)}]",
                    transform)


def linear_layer_mixing(layer_in: str, layer_out: str, matrix) -> Symmetry:
    """An invertible mixing of two consecutive linear layers: ``W_in -> A W_in``, ``W_out -> W_out A^-1``.

    When ``layer_out`` reads ``layer_in``'s output directly (no activation between them),
    ``W_out A^-1 (A W_in x + A b_in) = W_out (W_in x + b_in)``, so every output is kept for
    any invertible ``r x r`` matrix ``A`` (``r`` the width between the layers); the bias of
    ``layer_in``, if present, becomes ``A b_in``. Factorised and low-rank layers and the
    query-key product of attention carry this ``GL(r)`` symmetry; unlike the ReLU
    rescaling its Jacobian is not diagonal (chapter ``ch12_high_dimensions``).

    Args:
        layer_in: name prefix of the first linear layer (e.g. ``"0"``).
        layer_out: name prefix of the linear layer that reads it (e.g. ``"1"``).
        matrix: the invertible ``r x r`` mixing matrix ``A``.
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
            raise ValueError(f"matrix is {A.shape[0]} x {A.shape[0]} but {w_in} has {r} rows and "
                             f"{w_out} has {params[w_out].shape[1]} columns; they must agree")
        out = dict(params)
        out[w_in] = A @ params[w_in]
        if b_in in params:
            out[b_in] = A @ params[b_in]
        out[w_out] = params[w_out] @ inverse
        return out

    return Symmetry(f"linear mixing of layers {layer_in} -> {layer_out} by a {A.shape[0]} x {A.shape[0]} matrix, "
                    f"condition number {fmt(float(singular[0] / singular[-1]), 3)}", transform)


def homogeneous_neuron_rescaling(layer_in: str, layer_out: str, scales, degree: int) -> Symmetry:
    """Per-neuron rescaling for an activation with ``sigma(c z) = c^degree sigma(z)`` (``c > 0``).

    Row ``j`` of ``f"{layer_in}.weight"`` and entry ``j`` of its bias (if present) are
    multiplied by ``c_j``, column ``j`` of ``f"{layer_out}.weight"`` is divided by
    ``c_j^degree``. ``degree=1`` is :func:`relu_neuron_rescaling` (ReLU, leaky ReLU);
    ``degree=2`` is the rescaling of a square activation ``sigma(z) = z^2``, which is smooth,
    so its networks have genuine critical points (chapter ``ch12_high_dimensions``).
    Either way the Jacobian of the map is diagonal.
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
def unit_permutation(layer_in: str, layer_out: str, permutation, *, units_last: bool = True) -> Symmetry:
    """Permute the hidden units (or channels) between two layers: rows of one, columns of the next.

    Hidden unit ``permutation[j]`` becomes unit ``j``: row ``permutation[j]`` of
    ``f"{layer_in}.weight"`` (and its bias entry) moves to row ``j`` and so does column
    ``permutation[j]`` of ``f"{layer_out}.weight"``. Any element-wise activation between
    the layers commutes with this relabelling, so every output is unchanged.

    Args:
        layer_in, layer_out: name prefixes of the two layers.
        permutation: a permutation of ``0..width-1`` (sequence or 1-D integer tensor).
        units_last: as in :func:`relu_neuron_rescaling` (only matters with a Flatten).
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

    >>> centred_over_classes(torch.tensor([[1.0, 2.0, 6.0]]))
    tensor([[-2., -1.,  3.]])
    """
    return outputs - outputs.mean(dim=-1, keepdim=True)


def softmax_row_shift(weight: str, v, *, bias: str | None = None, beta: float = 0.0,
                      invariant: bool = True) -> Symmetry:
    """The softmax common-row shift ``W -> W + 1 v^T`` (and ``b -> b + beta 1``) of a classifier.

    Every logit of an example gains the same ``v^T h + beta``, so softmax probabilities
    and the cross-entropy are unchanged while the logits are not (Chapter 7 derives the
    gauge). The symmetry's ``invariant`` is therefore the logits centred
    over classes (:func:`centred_over_classes`); pass ``invariant=False`` when the audited
    outputs are already probabilities or log-probabilities.
    :func:`lossgeom.softmax.row_shift_symmetry` is the same transform on ``weight`` alone.

    Args:
        weight: the parameter name of the (K, d) classifier ``W``, e.g. ``"2.weight"``.
        v: the shift, shape (d,).
        bias: the name of the classifier's (K,) bias, shifted by ``beta`` (optional).
        beta: the common shift of the bias.
        invariant: compare centred logits (True) or the outputs themselves (False).
    """
    if not isinstance(weight, str) or not weight:
        raise TypeError("weight must be a non-empty parameter name")
    if not isinstance(v, torch.Tensor) or v.ndim != 1 or v.numel() == 0:
        raise ValueError(f"v must be a non-empty 1-D torch.Tensor of shape (d,), got "
                         f"{tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__}")
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
            raise ValueError(f"params[{weight!r}] must be a (K, {v.numel()}) classifier with K >= 2 to match v, "
                             f"got shape {tuple(W.shape)}")
        out = dict(params)
        out[weight] = W + v.to(dtype=W.dtype, device=W.device)[None, :]
        if bias is not None:
            out[bias] = params[bias] + beta
        return out

    size = float(torch.cat([v, torch.tensor([beta], dtype=v.dtype)]).norm()) if bias is not None else float(v.norm())
    return Symmetry(f"softmax common-row shift of {weight}" + (f" and {bias}" if bias is not None else "")
                    + f", |shift| = {fmt(size, 4)}", transform,
                    invariant=centred_over_classes if invariant else None,
                    invariant_name="logits centred over classes" if invariant else "outputs")


# --- the registry: symmetries found in a module's graph -----------------------------------

_HOMOGENEOUS = (nn.ReLU, nn.LeakyReLU)
_ELEMENTWISE = (nn.Tanh, nn.Sigmoid, nn.GELU, nn.SiLU, nn.ELU, nn.SELU, nn.CELU, nn.Softplus, nn.Mish, nn.Hardtanh,
                nn.ReLU6, nn.Softsign, nn.Tanhshrink, nn.Hardswish, nn.Hardsigmoid, nn.LogSigmoid, nn.Hardshrink,
                nn.Softshrink)
_POOLS = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
          nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
          nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d)
_DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
_NORMS = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm, nn.RMSNorm)
_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_F = nn.functional
_HOMOGENEOUS_FUNCTIONS = {torch.relu: "relu", _F.relu: "relu", _F.leaky_relu: "leaky_relu"}
_ELEMENTWISE_FUNCTIONS = {torch.tanh: "tanh", _F.tanh: "tanh", torch.sigmoid: "sigmoid", _F.sigmoid: "sigmoid",
                          _F.gelu: "gelu", _F.silu: "silu", _F.elu: "elu", _F.softplus: "softplus"}
_HOMOGENEOUS_METHODS = ("relu",)
_ELEMENTWISE_METHODS = ("tanh", "sigmoid")
_SOFTMAX_MODULES = (nn.Softmax, nn.LogSoftmax)
_SOFTMAX_FUNCTIONS = (torch.softmax, torch.log_softmax, _F.softmax, _F.log_softmax)
_SHAPE_READS = ("size", "dim")
_OUTPUT = "its output is the model's output"


@dataclass(frozen=True)
class FoundSymmetries:
    """What :func:`find_symmetries` found in a model, and what it refused and why.

    Attributes:
        symmetries: one :class:`Symmetry` per safely identified symmetry, each acting on
            the dict of ``model.named_parameters()``.
        skipped: one sentence per place where a symmetry might live but cannot be
            identified safely (and is therefore not reported).
        sampling: how the sizes were drawn (range, shift size, seed).
    """

    symmetries: tuple[Symmetry, ...]
    skipped: tuple[str, ...]
    sampling: str

    def __iter__(self) -> Iterator[Symmetry]:
        return iter(self.symmetries)

    def __len__(self) -> int:
        return len(self.symmetries)


def _consumers(node) -> list:
    """Users of a graph node that consume its values (shape reads such as ``x.size(0)`` do not)."""
    users = []
    for user in node.users:
        if user.op == "call_method" and user.target in _SHAPE_READS:
            continue
        if user.op == "call_function" and user.target is getattr and len(user.args) > 1 and user.args[1] == "shape":
            continue
        users.append(user)
    return users


def _module(model: nn.Module, node):
    return model.get_submodule(node.target) if node.op == "call_module" else None


def _flatten_start(node, module) -> int | None:
    """The start dim of a flatten-like node (Flatten, torch.flatten, x.flatten, x.view(n, -1)), else None."""
    if isinstance(module, nn.Flatten):
        return module.start_dim if module.end_dim == -1 else None
    if node.op == "call_function" and node.target is torch.flatten:
        start = node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)
        end = node.args[2] if len(node.args) > 2 else node.kwargs.get("end_dim", -1)
        return start if end == -1 else None
    if node.op == "call_method" and node.target == "flatten":
        start = node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)
        end = node.args[2] if len(node.args) > 2 else node.kwargs.get("end_dim", -1)
        return start if end == -1 else None
    if node.op == "call_method" and node.target in ("view", "reshape") and len(node.args) == 3 and node.args[2] == -1:
        batch = node.args[1]
        reads_batch = (getattr(batch, "op", None) == "call_method" and batch.target == "size"
                       and batch.args[0] is node.args[0] and len(batch.args) > 1 and batch.args[1] == 0)
        return 1 if reads_batch else None
    return None


def _describe(node, module) -> str:
    if module is not None:
        return f"{type(module).__name__} {node.target!r}"
    target = getattr(node.target, "__name__", node.target)
    return f"{node.op} {target!r}" if node.op != "output" else "the model's output"


def _unit_path(model: nn.Module, node):
    """Follow a layer's output to the next Linear/Conv layer through unit-wise operations.

    Returns ``(reader_node, homogeneous, activation, units_last_flatten, reason)``;
    ``reader_node`` is None and ``reason`` says why when the path is not recognised.
    """
    layer = _module(model, node)
    conv = isinstance(layer, _CONVS)
    homogeneous, activations, flattened = True, [], False
    current = node
    while True:
        users = _consumers(current)
        if not users:
            return None, False, "", False, "its output is not used"
        if len(users) > 1:
            return None, False, "", False, (f"its output feeds {len(users)} operations (a residual connection or "
                                            "a second branch), so its units are not identified")
        user = users[0]
        module = _module(model, user)
        if user.op == "output":
            return None, False, "", False, _OUTPUT
        if _softmax_dim(user, module) is not None:
            finals = _consumers(user)
            if len(finals) == 1 and finals[0].op == "output":
                return None, False, "", False, _OUTPUT
            return None, False, "", False, f"{_describe(user, module)} mixes the units"
        if isinstance(module, (nn.Linear, *_CONVS)):
            return user, homogeneous, ", ".join(activations) or "identity", flattened, ""
        if isinstance(module, _NORMS):
            return None, False, "", False, (
                f"the units pass through {_describe(user, module)}: a normalisation layer mixes units (or undoes "
                "their scale), so neither their rescaling nor their permutation is reported (the registry does "
                "not find normalisation-layer symmetries)")
        if isinstance(module, _DROPOUTS):
            if module.training and module.p > 0:
                return None, False, "", False, (f"{_describe(user, module)} is in training mode (random); call "
                                                "model.eval() before the audit")
        elif isinstance(module, nn.Identity):
            pass
        elif isinstance(module, _HOMOGENEOUS):
            activations.append(type(module).__name__)
        elif isinstance(module, _ELEMENTWISE):
            activations.append(type(module).__name__)
            homogeneous = False
        elif isinstance(module, _POOLS):
            if not conv or flattened:
                return None, False, "", False, f"{_describe(user, module)} pools across units"
        elif user.op == "call_function" and user.target in _HOMOGENEOUS_FUNCTIONS:
            activations.append(_HOMOGENEOUS_FUNCTIONS[user.target])
        elif user.op == "call_function" and user.target in _ELEMENTWISE_FUNCTIONS:
            activations.append(_ELEMENTWISE_FUNCTIONS[user.target])
            homogeneous = False
        elif user.op == "call_method" and user.target in _HOMOGENEOUS_METHODS + _ELEMENTWISE_METHODS:
            activations.append(user.target)
            homogeneous = homogeneous and user.target in _HOMOGENEOUS_METHODS
        elif _flatten_start(user, module) is not None:
            if _flatten_start(user, module) != 1 or flattened:
                return None, False, "", False, f"{_describe(user, module)} flattens more than the feature axes"
            flattened = True
        else:
            return None, False, "", False, (f"the units pass through {_describe(user, module)}, which the registry "
                                            "does not know to act unit by unit")
        current = user


def _log_uniform(width: int, rescale: float, generator: torch.Generator) -> torch.Tensor:
    u = torch.rand(width, generator=generator, dtype=torch.float64)
    return torch.exp((2 * u - 1) * math.log(rescale))


def _loss_is_softmax_cross_entropy(loss) -> bool:
    if loss is None:
        return False
    if isinstance(loss, str):
        if loss not in ("cross_entropy", "mse", "none"):
            raise ValueError(f"loss must be 'cross_entropy', 'mse', 'none', None or a torch loss module, got {loss!r}")
        return loss == "cross_entropy"
    if isinstance(loss, nn.Module):
        return isinstance(loss, nn.CrossEntropyLoss)
    raise TypeError(f"loss must be a string, None or a torch.nn loss module, got {type(loss).__name__}")


def _softmax_dim(node, module) -> int | None:
    if isinstance(module, _SOFTMAX_MODULES):
        return module.dim
    if node.op == "call_function" and node.target in _SOFTMAX_FUNCTIONS:
        return node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if node.op == "call_method" and node.target in ("softmax", "log_softmax"):
        return node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    return None


def find_symmetries(model: nn.Module, *, loss=None, rescale: float = 2.0, shift: float = 1.0,
                    seed: int | None = None, generator: torch.Generator | None = None) -> FoundSymmetries:
    """The symmetry registry: the symmetries of ``model`` it can identify safely, drawn at stated sizes.

    The model's forward is traced with ``torch.fx`` (an ``nn.Sequential`` or any module
    whose layers are named submodules and whose forward has no data-dependent control
    flow). For each Linear or Conv layer ``A`` whose output reaches exactly one other
    Linear/Conv layer ``B`` through unit-wise operations only (element-wise activations,
    Dropout in eval mode, Identity, pooling after a Conv, one Flatten before a Linear),
    it reports:

    - **ReLU/LeakyReLU rescaling**: if every activation on the way is ReLU or LeakyReLU
      (or there is none), rows of ``A`` (weight and bias) times ``c_j`` and the matching
      columns of ``B`` divided by ``c_j``; ``log c_j`` uniform in ``[-log r, log r]``
      with ``r = rescale``;
    - **unit permutation**: a uniformly random permutation of the units (if ``A`` is not
      a grouped convolution and has more than one unit);

    and, for the layer that produces the model's output:

    - **softmax common-row shift**: if it is a Linear layer and ``loss`` is a softmax
      cross-entropy, or it feeds a final softmax / log-softmax over the last axis:
      ``[W b] -> [W b] + 1 u^T`` with ``u`` a random direction of norm ``shift`` times
      the root-mean-square row norm of ``[W b]``.

    Not found (and said so in ``skipped`` where the graph shows them): symmetries across a
    normalisation layer (BatchNorm, LayerNorm, GroupNorm, RMSNorm: the registry neither
    rescales through them nor permutes their parameters, and their own scale
    symmetries are not reported), attention heads and other symmetries of
    ``nn.MultiheadAttention`` / Transformer layers, recurrent layers, residual branches
    (a unit read twice), weights shared between layers, grouped-convolution permutations,
    PReLU, ConvTranspose layers, continuous symmetries beyond these (e.g. the general
    linear group between two layers without activation), and sign flips of odd
    activations such as tanh.

    Args:
        model: the model; its parameters are not read or changed, only its structure.
        loss: ``"cross_entropy"`` or ``nn.CrossEntropyLoss()`` if the outputs are
            logits of a softmax cross-entropy (enables the shift of a final Linear);
            ``None``, ``"mse"``, ``"none"`` or another loss module otherwise.
        rescale: ``r > 1``; the rescaling factors lie in ``[1 / r, r]``.
        shift: the shift's size relative to the classifier's RMS row norm (> 0).
        seed: seed of the generator that draws every size (default 0).
        generator: a ``torch.Generator`` to draw from instead of ``seed``.

    Returns:
        A :class:`FoundSymmetries`.

    Raises:
        TypeError: if ``model`` is not an ``nn.Module``.
        ValueError: if the model cannot be traced, or on a bad size or seed.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    rescale = positive("rescale", rescale)
    if rescale <= 1:
        raise ValueError(f"rescale must be > 1 (the scales lie in [1/rescale, rescale]), got {rescale}")
    shift = positive("shift", shift)
    if generator is not None and seed is not None:
        raise ValueError("give seed or generator, not both")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if generator is None:
        if seed is None:
            seed = 0
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        generator = torch.Generator().manual_seed(seed)
        drawn = f"seed {seed}"
    else:
        drawn = "the given generator"
    cross_entropy = _loss_is_softmax_cross_entropy(loss)
    try:
        graph = torch.fx.symbolic_trace(model).graph
    except Exception as err:  # torch.fx raises many kinds of errors on untraceable code
        raise ValueError(f"cannot trace {type(model).__name__} with torch.fx ({type(err).__name__}: {err}); the "
                         "registry needs a forward without data-dependent control flow: audit hand-written "
                         "symmetries with audit(..., symmetries=[...]) or audit_symmetry") from err
    names = dict(model.named_parameters())
    nodes = list(graph.nodes)
    counts: dict[str, int] = {}
    for node in nodes:
        if node.op == "call_module":
            counts[node.target] = counts.get(node.target, 0) + 1
    found: list[Symmetry] = []
    skipped: list[str] = []
    for node in nodes:
        layer = _module(model, node)
        if not isinstance(layer, (nn.Linear, *_CONVS)):
            if isinstance(layer, (nn.MultiheadAttention, nn.RNNBase, nn.TransformerEncoderLayer,
                                  nn.TransformerDecoderLayer, nn.PReLU)):
                skipped.append(f"{_describe(node, layer)}: the registry does not find its symmetries")
            continue
        name = node.target
        if counts[name] > 1:
            skipped.append(f"layer {name!r} is called more than once: its units are not identified")
            continue
        reader, homogeneous, activation, flattened, reason = _unit_path(model, node)
        if reader is None:
            if reason != _OUTPUT:
                skipped.append(f"hidden units of {name!r}: {reason}")
            continue
        target = _module(model, reader)
        width = layer.out_features if isinstance(layer, nn.Linear) else layer.out_channels
        conv = isinstance(layer, _CONVS)
        pair = f"{name} -> {reader.target}"
        problem = ""
        if isinstance(target, _CONVS):
            if not conv or flattened or type(target) is not type(layer):
                problem = (f"{type(layer).__name__} {name!r} feeds {type(target).__name__} {reader.target!r} "
                           "without a matching layout")
            elif target.groups != 1:
                problem = f"{reader.target!r} is a grouped convolution"
            elif target.in_channels != width:
                problem = f"{reader.target!r} reads {target.in_channels} channels, not {width}"
        else:
            if conv and not flattened:
                problem = f"Linear {reader.target!r} reads a Conv output without a Flatten"
            elif not (target.in_features == width or (flattened and target.in_features % width == 0)):
                problem = f"{reader.target!r} reads {target.in_features} features, not a multiple of {width}"
        keys = (f"{name}.weight", f"{reader.target}.weight") + ((f"{name}.bias",) if layer.bias is not None else ())
        for key in keys:
            if not problem and key not in names:
                problem = f"{key!r} is not a plain parameter of the model (shared or parametrised?)"
        if counts.get(reader.target, 0) > 1:
            problem = f"layer {reader.target!r} is called more than once"
        if problem:
            skipped.append(f"hidden units {pair}: {problem}")
            continue
        units_last = not conv
        if homogeneous:
            kind = "LeakyReLU" if "LeakyReLU" in activation or "leaky_relu" in activation else (
                "ReLU" if activation != "identity" else "identity")
            scales = _log_uniform(width, rescale, generator)
            symmetry = relu_neuron_rescaling(name, reader.target, scales, units_last=units_last, activation=kind)
            found.append(Symmetry(f"{kind} rescaling {pair} ({width} units, c in [1/{fmt(rescale)}, "
                                  f"{fmt(rescale)}])", symmetry.transform))
        else:
            skipped.append(f"rescaling {pair}: the activation ({activation}) is not positively homogeneous")
        if width < 2:
            skipped.append(f"permutation {pair}: a single unit has no permutation")
        elif conv and layer.groups != 1:
            skipped.append(f"permutation {pair}: {name!r} is a grouped convolution")
        else:
            perm = torch.randperm(width, generator=generator)
            symmetry = unit_permutation(name, reader.target, perm, units_last=units_last)
            found.append(Symmetry(f"permutation {pair} ({width} units)", symmetry.transform))
    found.extend(_final_shift(model, nodes, names, counts, cross_entropy, loss, shift, generator, skipped))
    sampling = (f"rescalings log-uniform in [1/{fmt(rescale)}, {fmt(rescale)}], shifts of {fmt(shift)} x the RMS "
                f"row norm, drawn with {drawn}")
    return FoundSymmetries(tuple(found), tuple(skipped), sampling)


def _final_shift(model, nodes, names, counts, cross_entropy, loss, shift, generator, skipped) -> list[Symmetry]:
    output = next(node for node in nodes if node.op == "output")
    last = output.args[0]
    if not isinstance(last, torch.fx.Node):
        skipped.append("softmax shift: the model does not return one tensor")
        return []
    last_module = _module(model, last)
    dim = _softmax_dim(last, last_module)
    probabilities = dim is not None
    if probabilities:
        if dim not in (-1, 1):
            skipped.append(f"softmax shift: the final softmax is over dim {dim}, not the class axis of a Linear layer")
            return []
        inputs = [arg for arg in last.args if isinstance(arg, torch.fx.Node)]
        if len(inputs) != 1 or len(_consumers(inputs[0])) != 1:
            skipped.append("softmax shift: the final softmax does not read one Linear layer alone")
            return []
        last = inputs[0]
        last_module = _module(model, last)
    if not isinstance(last_module, nn.Linear):
        if cross_entropy or probabilities:
            skipped.append(f"softmax shift: the logits come from {_describe(last, last_module)}, not a Linear layer")
        return []
    if not (cross_entropy or probabilities):
        skipped.append(f"softmax shift of {last.target!r}: not looked for, since loss={loss!r} is not a softmax "
                       "cross-entropy (pass loss='cross_entropy' if the outputs are its logits)")
        return []
    weight, bias = f"{last.target}.weight", f"{last.target}.bias" if last_module.bias is not None else None
    if counts[last.target] > 1 or weight not in names or (bias is not None and bias not in names):
        skipped.append(f"softmax shift of {last.target!r}: its parameters are shared or parametrised")
        return []
    if last_module.out_features < 2:
        skipped.append(f"softmax shift of {last.target!r}: one class has no softmax gauge")
        return []
    W = names[weight].detach().double().cpu()
    rows = torch.cat([W, names[bias].detach().double().cpu()[:, None]], dim=1) if bias is not None else W
    direction = torch.randn(rows.shape[1], generator=generator, dtype=torch.float64)
    size = shift * float(rows.norm()) / rows.shape[0] ** 0.5
    u = direction / direction.norm() * (size if size > 0 else shift)
    beta = float(u[-1]) if bias is not None else 0.0
    v = u[:-1] if bias is not None else u
    symmetry = softmax_row_shift(weight, v, bias=bias, beta=beta, invariant=not probabilities)
    label = f"softmax row shift of {last.target} (|shift| = {fmt(shift)} RMS row)"
    return [Symmetry(label, symmetry.transform, symmetry.invariant, symmetry.invariant_name)]


# --- the module-first audit --------------------------------------------------------------


@dataclass(frozen=True)
class AuditTable:
    """The result of :func:`audit`: one :class:`AuditReport` per symmetry, printable as a table.

    Iterating, ``len`` and indexing act on ``reports``; :meth:`rows` gives one dict
    per symmetry (for a data frame). ``str`` prints a portable table: discrepancies
    relative to the output scale (by order at rounding level) and measures at the
    reports' significant digits; symmetries the registry refused are listed below it.
    """

    model: str
    dtype: str
    probe_size: int
    relative_tolerance: float
    reports: tuple[AuditReport, ...]
    skipped: tuple[str, ...] = ()
    sampling: str = ""

    def __iter__(self) -> Iterator[AuditReport]:
        return iter(self.reports)

    def __len__(self) -> int:
        return len(self.reports)

    def __getitem__(self, index: int) -> AuditReport:
        return self.reports[index]

    def rows(self) -> list[dict[str, Any]]:
        """One dict per symmetry: name, discrepancy, verdict, measure before/after/ratio."""
        return [dict(symmetry=r.symmetry, compared=r.compared, max_output_discrepancy=r.max_output_discrepancy,
                     relative_discrepancy=r.relative_discrepancy, is_symmetry=r.is_symmetry,
                     measure=r.measure_name, before=r.measure_before, after=r.measure_after, ratio=r.measure_ratio)
                for r in self.reports]

    def __str__(self) -> str:
        measured = next((r.measure_name for r in self.reports if r.measure_name is not None), None)
        header = ["symmetry", "discrepancy / scale"] + (["before", "after", "ratio"] if measured else [])
        body = []
        for r in self.reports:
            row = [r.symmetry, r.discrepancy_text().removesuffix(" of the scale")
                   + ("" if r.is_symmetry else " FAILED")]
            if measured:
                ratio = r.measure_ratio
                row += ([fmt(r.measure_before, r.sig), fmt(r.measure_after, r.sig),
                         fmt(ratio, r.sig) if ratio is not None else "-"]
                        if r.measure_name is not None else ["-", "-", "-"])
            body.append(row)
        widths = [max(len(line[i]) for line in [header] + body) for i in range(len(header))]
        lines = [f"symmetry audit of {self.model} ({self.dtype}) on {self.probe_size} probe inputs",
                 f"outputs first (tolerance {fmt(self.relative_tolerance, 3)} x their scale), then "
                 + (f"the measure: {measured}" if measured else "no measure")]
        lines += ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip()
                  for line in [header] + body]
        if self.sampling:
            lines.append(f"sizes: {self.sampling}")
        lines += [f"not audited: {reason}" for reason in self.skipped]
        return "\n".join(lines)


def _model_dtype_device(model: nn.Module) -> tuple[torch.dtype, torch.device]:
    floating = [p for p in model.parameters() if torch.is_floating_point(p)]
    if not floating:
        raise ValueError(f"model {type(model).__name__} has no floating-point parameters to audit")
    dtypes, devices = {p.dtype for p in floating}, {p.device for p in floating}
    if len(dtypes) > 1 or len(devices) > 1:
        raise ValueError(f"model parameters must share one dtype and device, got {sorted(map(str, dtypes))} on "
                         f"{sorted(map(str, devices))}")
    dtype = dtypes.pop()
    if dtype not in _AUDIT_DTYPES:
        raise ValueError(f"model dtype is {dtype}: the audit works in float32 or float64 (in half precision "
                         "rounding is too coarse to tell a symmetry from a small change)")
    return dtype, devices.pop()


def _loaded(model: nn.Module, params: Params) -> nn.Module:
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for key, value in twin.named_parameters():
            value.copy_(params[key])
    return twin


def _measured(measure, value) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"measure must return one real number, got a tensor of shape {tuple(value.shape)}")
        value = value.detach().item()
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"measure must return a real number, got {type(value).__name__}") from None
    if not math.isfinite(value):
        raise ValueError(f"measure returned {value}; it must be finite")
    return value


def audit(model: nn.Module, measure: Callable | None, probe: torch.Tensor, *, loss=None,
          symmetries: Sequence[Symmetry] | None = None, measure_name: str | None = None, measure_on: str = "model",
          rtol: float | None = None, rescale: float = 2.0, shift: float = 1.0, seed: int | None = None,
          generator: torch.Generator | None = None, sig: int = SIGNIFICANT_DIGITS,
          require_symmetry: bool = True) -> AuditTable:
    """Audit a ``torch.nn.Module``: find its symmetries, check each on the probe, then recompute the measure.

    The protocol of :func:`audit_symmetry` for a plain module, without hand-written
    transforms: the registry (:func:`find_symmetries`) finds the per-unit ReLU/LeakyReLU
    rescalings, the unit and channel permutations and the softmax common-row shift it can
    identify safely (read its docstring for what it does not find). For each symmetry the
    audit

    1. transforms a private copy of the parameters (the dict of
       ``model.named_parameters()``; the caller's model is never called or changed: all
       work happens on a deep copy);
    2. compares the model's outputs on ``probe`` (logits, never labels; for the softmax
       shift, logits centred over classes) before and after, against ``rtol`` times the
       output scale (the largest ``|value|`` compared);
    3. only if they agree, recomputes ``measure`` on a copy of the model carrying the
       transformed parameters.

    Everything runs in the model's dtype (float32 or float64) and on its device; a
    floating ``probe`` is converted to them. A model whose outputs on the probe differ
    between two evaluations (dropout in training mode) is refused.

    Example (the same one as the README's "Audit your own model")::

        >>> import torch
        >>> from torch import nn
        >>> from lossgeom.symmetries import audit
        >>> _ = torch.manual_seed(0)
        >>> model = nn.Sequential(nn.Linear(4, 6, dtype=torch.float64), nn.ReLU(),
        ...                       nn.Linear(6, 3, dtype=torch.float64))
        >>> probe = torch.randn(20, 4, dtype=torch.float64)
        >>> def squared_weight_norm(m):
        ...     return sum(float(p.detach().pow(2).sum()) for p in m.parameters())
        >>> print(audit(model, squared_weight_norm, probe, loss="cross_entropy"))
        symmetry audit of Sequential (float64) on 20 probe inputs
        outputs first (tolerance 1e-10 x their scale), then the measure: squared weight norm
        symmetry                                        discrepancy / scale           before   after    ratio
        ReLU rescaling 0 -> 2 (6 units, c in [1/2, 2])  below 1e-13 (rounding level)  2.77485  4.64347  1.67342
        permutation 0 -> 2 (6 units)                    below 1e-13 (rounding level)  2.77485  2.77485  1
        softmax row shift of 2 (|shift| = 1 RMS row)    below 1e-13 (rounding level)  2.77485  3.67995  1.32618
        sizes: rescalings log-uniform in [1/2, 2], shifts of 1 x the RMS row norm, drawn with seed 0

    Args:
        model: the model; ``model(probe)`` returns one tensor of outputs (logits for a
            classifier).
        measure: ``measure(model_copy) -> float`` (``measure_on="model"``) or
            ``measure(params) -> float`` (``measure_on="params"``, a dict of name ->
            tensor); ``None`` runs the functional check only.
        probe: the declared probe inputs (first dimension indexes examples).
        loss: as in :func:`find_symmetries` (``"cross_entropy"`` enables the softmax
            shift of a final Linear layer).
        symmetries: audit these (each acting on the dict of ``model.named_parameters()``)
            instead of the registry's.
        measure_name: the measure's name in the table (default: the function's name).
        measure_on: ``"model"`` or ``"params"``: what ``measure`` is called with.
        rtol: relative output tolerance (> 0; default 1e-10 in float64, 1e-4 in float32).
        rescale, shift, seed, generator: the sizes and the randomness of the registry's
            draws (see :func:`find_symmetries`); ignored with ``symmetries``.
        sig: significant digits of the printed measures.
        require_symmetry: if True (default), raise when a symmetry fails the functional
            check; if False, report it as failed, without a measure.

    Returns:
        An :class:`AuditTable` (one :class:`AuditReport` per symmetry).

    Raises:
        ValueError: if the registry finds no symmetry it can identify safely (with its
            reasons), if a symmetry changes the outputs (naming it and the discrepancy),
            or on bad input (probe, tolerance, dtype, nondeterministic outputs).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if measure is not None and not callable(measure):
        raise TypeError("measure must be callable (of the model or of its parameter dict), "
                        f"got {type(measure).__name__}")
    if measure_on not in ("model", "params"):
        raise ValueError(f"measure_on must be 'model' or 'params', got {measure_on!r}")
    if isinstance(sig, bool) or not isinstance(sig, int) or sig < 1:
        raise ValueError(f"sig must be an int >= 1 (significant digits), got {sig!r}")
    dtype, device = _model_dtype_device(model)
    rtol = DEFAULT_RTOL[dtype] if rtol is None else positive("rtol", rtol)
    if isinstance(probe, (tuple, list)):
        raise TypeError("probe must be a tensor of inputs only (outputs are compared, never labels)")
    if not isinstance(probe, torch.Tensor):
        raise TypeError(f"probe must be a torch.Tensor of inputs, got {type(probe).__name__}")
    if probe.ndim == 0 or probe.shape[0] == 0:
        raise ValueError("probe must hold at least one input along its first dimension, "
                         f"got shape {tuple(probe.shape)}")
    probe = probe.to(device=device, dtype=dtype) if torch.is_floating_point(probe) else probe.to(device)
    if torch.is_floating_point(probe) and not torch.isfinite(probe).all():
        raise ValueError("probe must contain only finite values")
    work = copy.deepcopy(model)
    params = {key: value.detach().clone() for key, value in work.named_parameters()}

    def forward(p: Params, x: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(work, dict(p), (x,))

    with torch.no_grad():
        try:
            before = forward(params, probe)
            again = forward(params, probe)
        except RuntimeError as err:
            raise ValueError(f"model failed on the probe set of shape {tuple(probe.shape)}: {err}") from err
    if not isinstance(before, torch.Tensor):
        raise TypeError(f"model must return one tensor of outputs, got {type(before).__name__}")
    if not torch.isfinite(before).all():
        raise ValueError("model outputs on the probe must be finite")
    if not _same_values(before, again):
        raise ValueError("model outputs differ between two evaluations on the same probe (dropout or another random "
                         "layer in training mode?): call model.eval() before the audit")
    if symmetries is None:
        search = find_symmetries(work, loss=loss, rescale=rescale, shift=shift, seed=seed, generator=generator)
        chosen, skipped, sampling = list(search.symmetries), search.skipped, search.sampling
        if not chosen:
            raise ValueError(f"found no symmetry of {type(model).__name__} that it can identify safely: "
                             + ("; ".join(skipped) if skipped else "no Linear or Conv layers feed one another")
                             + "; pass symmetries=[...] to audit hand-written ones")
    else:
        chosen = list(symmetries) if not isinstance(symmetries, Symmetry) else [symmetries]
        if not chosen or not all(isinstance(s, Symmetry) for s in chosen):
            raise TypeError("symmetries must be a non-empty list of lossgeom Symmetry objects")
        skipped, sampling = (), ""
    name = measure_name or getattr(measure, "__name__", "measure")
    name = "measure" if name == "<lambda>" else name.replace("_", " ")

    def evaluate(p: Params) -> float:
        target = _loaded(work, p) if measure_on == "model" else {k: v.clone() for k, v in p.items()}
        return _measured(measure, measure(target))

    measure_before = evaluate(params) if measure is not None else None
    floor = rounding_floor(dtype)
    reports = []
    for symmetry in chosen:
        moved = symmetry(params)
        with torch.no_grad():
            after = forward(moved, probe)
        if not isinstance(after, torch.Tensor) or after.shape != before.shape:
            raise ValueError(f"outputs changed shape under {symmetry.name}")
        reference, compared = symmetry.compared(before), symmetry.compared(after)
        scale = float(reference.abs().max())
        if scale == 0:
            raise ValueError(f"the {symmetry.invariant_name} are all zero on the probe: the check of "
                             f"{symmetry.name} would be vacuous; choose another probe")
        discrepancy = float((compared - reference).abs().max()) if torch.isfinite(compared).all() else math.inf
        ok = discrepancy <= rtol * scale
        if not ok and require_symmetry:
            raise ValueError(f"{symmetry.name} is not a symmetry of {type(model).__name__} on the probe set: largest "
                             f"discrepancy {fmt(discrepancy / scale, 3)} x the output scale "
                             f"exceeds rtol {fmt(rtol, 3)}")
        entry = dict(symmetry=symmetry.name, probe_size=int(probe.shape[0]), tolerance=rtol * scale,
                     max_output_discrepancy=discrepancy, is_symmetry=ok, sig=sig, output_scale=scale,
                     relative_tolerance=rtol, rounding_floor=floor, compared=symmetry.invariant_name,
                     details={"dtype": str(dtype).removeprefix("torch.")})
        if measure is not None and ok:
            entry.update(measure_name=name, measure_before=measure_before, measure_after=evaluate(moved))
        reports.append(AuditReport(**entry))
    return AuditTable(type(model).__name__, str(dtype).removeprefix("torch."), int(probe.shape[0]), rtol,
                      tuple(reports), tuple(skipped), sampling)


# --- layer-wise and normalisation rescalings, the reference class (the symmetry audit atlas) ---


def layer_rescaling(layer_in: str, layer_out: str, c: float, *, activation: str = "ReLU") -> Symmetry:
    """Layer-wise rescaling: ``layer_in``'s weight and bias times ``c > 0``, ``layer_out``'s weight divided by it.

    The rescaling of :func:`relu_neuron_rescaling` with one scale for every unit (the
    transformation of Dinh et al. 2017): a positively homogeneous activation (ReLU,
    LeakyReLU, max or average pooling, none) passes the common factor ``c`` through, so
    every output is unchanged. Because the factor is common, the reading layer's weight is
    divided as a whole, whatever lies between (a Flatten included).
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
    free in scale, and any curvature of the loss in them scales like ``1 / c^2``. The audit
    decides whether the ``eps`` of the model at hand keeps the outputs within tolerance.
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

    return Symmetry(f"rescaling of layer {layer} before {norm}, c = {fmt(c, 4)}", transform)


def reference_class_shift(weight: str, r: int, *, bias: str | None = None) -> Symmetry:
    """The reference-class representative of a softmax classifier: ``W -> W - 1 w_r^T``, ``b -> b - b_r 1``.

    Row ``r`` (and bias entry ``r``) becomes zero, the convention of a multinomial logit
    with reference class ``r``; it is the common-row shift by ``v = -w_r``
    (:func:`lossgeom.softmax.reference_class`), so the softmax probabilities are unchanged
    while ``||W||_F`` is not (chapter *The softmax gauge*). Unlike a fixed shift, the
    amount depends on the parameters it is applied to.
    """
    if not isinstance(weight, str) or not weight:
        raise TypeError("weight must be a non-empty parameter name")
    if isinstance(r, bool) or not isinstance(r, int):
        raise TypeError(f"r must be an int class index, got {type(r).__name__}")

    def transform(params: Params) -> dict[str, torch.Tensor]:
        from lossgeom.softmax import reference_class

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

    return Symmetry(f"reference class {r} of {weight}" + (f" and {bias}" if bias is not None else ""), transform,
                    invariant=centred_over_classes, invariant_name="logits centred over classes")


def compose(symmetries: Sequence[Symmetry], name: str | None = None) -> Symmetry:
    """The symmetries applied one after another, as one :class:`Symmetry`.

    A composition of function-preserving maps preserves the function; the composite
    compares what its parts compare (they must agree on it).

    Raises:
        TypeError: if ``symmetries`` is not a non-empty sequence of :class:`Symmetry`.
        ValueError: if the parts compare different invariants of the outputs.
    """
    parts = list(symmetries) if not isinstance(symmetries, Symmetry) else [symmetries]
    if not parts or not all(isinstance(s, Symmetry) for s in parts):
        raise TypeError("symmetries must be a non-empty sequence of lossgeom Symmetry objects")
    compared = {s.invariant_name for s in parts}
    if len(compared) > 1:
        raise ValueError(f"the symmetries compare different invariants of the outputs ({sorted(compared)}); "
                         "compose only symmetries of one kind")
    if len(parts) == 1 and name is None:
        return parts[0]

    def transform(params: Params) -> dict[str, torch.Tensor]:
        out = dict(params)
        for part in parts:
            out = part(out)
        return out

    return Symmetry(name or " then ".join(s.name for s in parts), transform, parts[0].invariant,
                    parts[0].invariant_name)


_SCALE_INVARIANT_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)


def _traced(model: nn.Module):
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    try:
        graph = torch.fx.symbolic_trace(model).graph
    except Exception as err:  # torch.fx raises many kinds of errors on untraceable code
        raise ValueError(f"cannot trace {type(model).__name__} with torch.fx ({type(err).__name__}: {err}); pass "
                         "hand-written symmetries instead") from err
    nodes = list(graph.nodes)
    counts: dict[str, int] = {}
    for node in nodes:
        if node.op == "call_module":
            counts[node.target] = counts.get(node.target, 0) + 1
    return nodes, counts, dict(model.named_parameters())


def find_layer_rescalings(model: nn.Module, c: float) -> FoundSymmetries:
    """Every layer-wise rescaling (:func:`layer_rescaling`, factor ``c``) the graph of ``model`` allows.

    For each Linear or Conv layer whose output reaches exactly one other Linear/Conv
    layer through positively homogeneous operations only (ReLU, LeakyReLU, pooling after
    a Conv, Flatten, Dropout in eval mode, Identity), the same walk as
    :func:`find_symmetries`; refusals are listed in ``skipped``.
    """
    c = positive("c", c)
    nodes, counts, names = _traced(model)
    found, skipped = [], []
    for node in nodes:
        layer = _module(model, node)
        if not isinstance(layer, (nn.Linear, *_CONVS)) or counts[node.target] > 1:
            continue
        reader, homogeneous, activation, _, reason = _unit_path(model, node)
        if reader is None:
            if reason != _OUTPUT:
                skipped.append(f"layer rescaling of {node.target!r}: {reason}")
            continue
        pair = f"{node.target} -> {reader.target}"
        keys = [f"{node.target}.weight", f"{reader.target}.weight"]
        if not homogeneous:
            skipped.append(f"layer rescaling {pair}: the activation ({activation}) is not positively homogeneous")
        elif counts.get(reader.target, 0) > 1 or any(key not in names for key in keys):
            skipped.append(f"layer rescaling {pair}: a layer is called twice or its weight is shared")
        else:
            kind = activation.split(",")[0] if activation != "identity" else "identity"
            found.append(layer_rescaling(node.target, reader.target, c, activation=kind))
    return FoundSymmetries(tuple(found), tuple(skipped), f"layer rescalings by c = {fmt(c)}")


def find_normalisation_rescalings(model: nn.Module, c: float) -> FoundSymmetries:
    """Every rescaling of a layer whose output goes straight into a scale-invariant normalisation.

    A Linear or Conv layer whose only consumer is a LayerNorm, GroupNorm or RMSNorm module
    (:func:`normalisation_rescaling`, factor ``c``). BatchNorm is refused: in eval mode it
    normalises with stored statistics, which do not undo a rescaling.
    """
    c = positive("c", c)
    nodes, counts, names = _traced(model)
    found, skipped = [], []
    for node in nodes:
        layer = _module(model, node)
        if not isinstance(layer, (nn.Linear, *_CONVS)) or counts[node.target] > 1:
            continue
        users = _consumers(node)
        norm = _module(model, users[0]) if len(users) == 1 else None
        if isinstance(norm, _SCALE_INVARIANT_NORMS):
            if f"{node.target}.weight" not in names:
                skipped.append(f"rescaling of {node.target!r}: its weight is shared or parametrised")
                continue
            found.append(normalisation_rescaling(node.target, c, norm=f"{type(norm).__name__} {users[0].target} "
                                                 f"(eps {fmt(norm.eps, 3)})"))
        elif isinstance(norm, nn.modules.batchnorm._NormBase):
            skipped.append(f"rescaling of {node.target!r} before {_describe(users[0], norm)}: batch norm in eval "
                           "mode normalises with stored statistics, which do not undo a rescaling")
    return FoundSymmetries(tuple(found), tuple(skipped), f"normalisation rescalings by c = {fmt(c)}")


def classifier_layer(model: nn.Module) -> tuple[str, str | None] | None:
    """``(weight, bias)`` names of the Linear layer whose output is the model's output (or its softmax).

    ``bias`` is None for a bias-free classifier; the result is None when the model's
    output is not (a softmax of) one Linear layer's output.
    """
    nodes, counts, names = _traced(model)
    last = next(node for node in nodes if node.op == "output").args[0]
    if not isinstance(last, torch.fx.Node):
        return None
    if _softmax_dim(last, _module(model, last)) is not None:
        inputs = [arg for arg in last.args if isinstance(arg, torch.fx.Node)]
        if len(inputs) != 1:
            return None
        last = inputs[0]
    module = _module(model, last)
    if not isinstance(module, nn.Linear) or counts[last.target] > 1 or f"{last.target}.weight" not in names:
        return None
    return f"{last.target}.weight", (f"{last.target}.bias" if module.bias is not None else None)

"""Function-preserving transforms and the symmetry audit (claim P12).

A :class:`Symmetry` maps a parameter dict to another parameter dict that should
implement the same function. :func:`audit_symmetry` is the audit protocol of Chapter 1:

1. evaluate the model's real-valued outputs (or logits, never labels) on a declared
   probe set, before and after the transform;
2. report the largest discrepancy and compare it with a stated tolerance: if it is
   larger, the transform is not a same-predictor control and the audit says so;
3. only then recompute the geometry measure before and after.

Transforms for other models plug in by returning a :class:`Symmetry` (the product
rescaling is here; the ReLU rescaling and the softmax common-row shift join later).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch

from lossgeom._checks import finite_tensor, positive
from lossgeom.display import fmt, rounding_level

Params = Mapping[str, torch.Tensor]
Forward = Callable[[Params, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Symmetry:
    """A named parameter transform claimed to preserve the model's function.

    Attributes:
        name: what the transform is, e.g. ``"rescaling (a, b) -> (c a, b / c), c = 10"``.
        transform: maps a parameter dict to a new parameter dict (inputs are not modified).
    """

    name: str
    transform: Callable[[Params], dict[str, torch.Tensor]]

    def __call__(self, params: Params) -> dict[str, torch.Tensor]:
        if not isinstance(params, Mapping):
            raise TypeError(f"params must be a dict of name -> tensor, got {type(params).__name__}")
        out = self.transform(params)
        if not isinstance(out, Mapping) or set(out) != set(params):
            raise ValueError(f"symmetry {self.name!r} must return the same parameter names it was given")
        return dict(out)


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


@dataclass(frozen=True)
class AuditReport:
    """The receipt of one symmetry audit: functional check first, then the measure."""

    symmetry: str
    probe_size: int
    tolerance: float
    max_output_discrepancy: float
    is_symmetry: bool
    measure_name: str | None = None
    measure_before: float | None = None
    measure_after: float | None = None
    details: dict = field(default_factory=dict)

    @property
    def measure_ratio(self) -> float | None:
        if self.measure_before is None or self.measure_after is None or self.measure_before == 0:
            return None
        return self.measure_after / self.measure_before

    def __str__(self) -> str:
        verdict = "same function on the probe set" if self.is_symmetry else "NOT the same function: not a valid control"
        lines = [
            f"transform: {self.symmetry}",
            f"probe set: {self.probe_size} inputs; tolerance {fmt(self.tolerance, 3)}",
            f"largest output discrepancy: {discrepancy_text(self.max_output_discrepancy)} ({verdict})",
        ]
        if self.measure_name is not None:
            lines.append(
                f"{self.measure_name}: before {fmt(self.measure_before)}, after {fmt(self.measure_after)}"
                + (f", ratio {fmt(self.measure_ratio)}" if self.measure_ratio is not None else "")
            )
        return "\n".join(lines)


#: Discrepancies below this are reported by order only: their digits are the machine's.
ROUNDING_FLOOR = 1e-13


def discrepancy_text(value: float) -> str:
    """A discrepancy as portable text: its order below :data:`ROUNDING_FLOOR`, else 2 digits."""
    return str(rounding_level(value, ROUNDING_FLOOR)) if abs(value) < ROUNDING_FLOOR else fmt(value, 2)


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

    Args:
        forward: ``forward(params, probe) -> outputs``; real-valued outputs or logits.
        params: the model's parameters as a dict of tensors.
        symmetry: the transform to audit.
        probe: the declared probe inputs, first dimension indexing examples.
        tol: largest allowed absolute output discrepancy (> 0).
        measure: optional geometry measure ``measure(params) -> float`` to recompute.
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
        raise ValueError(f"probe must hold at least one input along its first dimension, got shape {tuple(probe.shape)}")
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
    discrepancy = float((after - before).abs().max())
    ok = discrepancy <= tol
    if not ok and require_symmetry:
        raise ValueError(
            f"{symmetry.name} is not a symmetry of the model on the probe set: largest output "
            f"discrepancy {fmt(discrepancy, 3)} exceeds tol {fmt(tol, 3)}"
        )
    report = dict(symmetry=symmetry.name, probe_size=int(probe.shape[0]), tolerance=tol,
                  max_output_discrepancy=discrepancy, is_symmetry=ok)
    if measure is not None and ok:
        report.update(measure_name=measure_name, measure_before=float(measure(params)),
                      measure_after=float(measure(moved)))
    return AuditReport(**report)


def relu_neuron_rescaling(layer_in: str, layer_out: str, scales) -> Symmetry:
    """Per-neuron rescaling of a ReLU layer: incoming weights and bias times c_j, outgoing / c_j.

    Row j of ``f"{layer_in}.weight"`` and entry j of ``f"{layer_in}.bias"`` (if present)
    are multiplied by c_j > 0 and column j of ``f"{layer_out}.weight"`` is divided by it.
    Since relu(c z) = c relu(z) for c > 0, every output is unchanged (Chapter 4 derives
    the one Hessian null direction per hidden neuron this symmetry predicts).

    Args:
        layer_in: name prefix of the layer feeding the ReLU (e.g. ``"0"`` in an
            ``nn.Sequential``).
        layer_out: name prefix of the layer reading the ReLU's output (e.g. ``"2"``).
        scales: one positive scale per hidden neuron (sequence, array or 1-D tensor).
    """
    scales = torch.as_tensor(scales, dtype=torch.float64)
    if scales.ndim != 1 or scales.numel() == 0:
        raise ValueError(f"scales must be a non-empty 1-D sequence (one per hidden neuron), got shape {tuple(scales.shape)}")
    if not torch.isfinite(scales).all() or not (scales > 0).all():
        raise ValueError("scales must be finite and > 0 (ReLU is positively homogeneous only for c > 0)")
    w_in, b_in, w_out = f"{layer_in}.weight", f"{layer_in}.bias", f"{layer_out}.weight"

    def transform(params: Params) -> dict[str, torch.Tensor]:
        missing = {w_in, w_out} - set(params)
        if missing:
            raise ValueError(f"relu_neuron_rescaling needs params {sorted(missing)}")
        width = params[w_in].shape[0]
        if scales.numel() != width or params[w_out].shape[1] != width:
            raise ValueError(f"scales has {scales.numel()} entries but {w_in} has {width} rows and "
                             f"{w_out} has {params[w_out].shape[1]} columns; they must agree")
        out = dict(params)
        out[w_in] = params[w_in] * scales[:, None]
        if b_in in params:
            out[b_in] = params[b_in] * scales
        out[w_out] = params[w_out] / scales[None, :]
        return out

    return Symmetry(f"ReLU neuron rescaling of layer {layer_in} -> {layer_out}, "
                    f"{scales.numel()} scales in [{fmt(float(scales.min()), 4)}, {fmt(float(scales.max()), 4)}]",
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

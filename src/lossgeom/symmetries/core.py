"""The symmetry object and the audit protocol: is a transform a same-predictor control?

A :class:`Symmetry` maps a parameter dict to another parameter dict that should
implement the same function. :func:`audit_symmetry` is the audit protocol:

1. evaluate the model's real-valued outputs (or logits, never labels) on a declared
   probe set, before and after the transform;
2. report the largest discrepancy and compare it with a stated tolerance: if it is
   larger, the transform is not a same-predictor control and the audit says so;
3. only then recompute the geometry measure before and after.

Two guards make a wrong certificate impossible to produce silently: a transform never
sees the caller's tensors (it gets private copies, and one that edits its input in place
is refused), and a ``forward`` whose outputs do not depend on the parameters it is given
is refused (its outputs could not reveal a non-symmetry) (:func:`check_forward_reads`).
The receipt is an :class:`AuditReport`; :func:`compose` chains symmetries.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from lossgeom._validation import finite_inputs, finite_tensor, positive
from lossgeom.formatting import SIGNIFICANT_DIGITS, fmt, rounding_level
from lossgeom.parameters import params_of
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
        approximate: why the transform preserves the function only approximately (for
            example a normalisation's ``eps``); empty (default) for an exact symmetry. The
            module audit measures an approximate symmetry's discrepancy and reports it
            instead of refusing the transform.
        buffers: the names of the buffers the transform reads and writes besides
            parameters (a batch norm's ``running_mean`` and ``running_var``); empty
            (default) for a transform of parameters only. Such a symmetry is called on the
            dict of parameters and buffers (``params_of(model, buffers=True)``); :meth:`applied` gives a
            copy of a model carrying the transformed parameters and buffers.
    """

    name: str
    transform: Callable[[Params], dict[str, torch.Tensor]]
    invariant: Callable[[torch.Tensor], torch.Tensor] | None = None
    invariant_name: str = "outputs"
    approximate: str = ""
    buffers: tuple[str, ...] = ()

    def __call__(self, params: Params) -> dict[str, torch.Tensor]:
        """The transformed parameters, computed on a private copy of ``params`` and checked.

        Args:
            params: the parameter dict (and the buffers named in ``buffers``, if any).

        Returns:
            A new dict with the same names, shapes, dtypes and devices.

        Raises:
            ValueError: if a buffer the transform needs is missing, the transform edits its
                input in place, or its result changes the names, shapes, dtypes or devices.
            TypeError: if the transform returns something other than a tensor for a name.
        """
        missing = [key for key in self.buffers if isinstance(params, Mapping) and key not in params]
        if missing:
            raise ValueError(
                f"symmetry {self.name!r} transforms the buffers {missing} too: call it on the dict of parameters "
                "and buffers (params_of(model, buffers=True)), or use symmetry.applied(model)"
            )
        private = _private_copy(params)
        handed = dict(private)
        versions = {key: value._version for key, value in private.items()}
        out = self.transform(private)
        if set(private) != set(handed) or any(private[key] is not handed[key] for key in handed):
            raise ValueError(
                f"symmetry {self.name!r} modified the parameter dict it was given in place; "
                "a transform must build and return a new dict"
            )
        edited = sorted(
            key
            for key, value in handed.items()
            if value._version != versions[key] or not _same_values(value, params[key])
        )
        if edited:
            raise ValueError(
                f"symmetry {self.name!r} edited the tensors {edited} in place; a transform must "
                "return new tensors and leave its input unchanged (use p * c, not p.mul_(c))"
            )
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
                    "each tensor's shape, dtype and device"
                )
        return dict(out)

    def compared(self, outputs: torch.Tensor) -> torch.Tensor:
        """What the audit compares: ``invariant(outputs)``, or the outputs themselves.

        Args:
            outputs: the model's outputs on the probe set.

        Returns:
            ``invariant(outputs)``, or ``outputs`` when ``invariant`` is None.
        """
        return outputs if self.invariant is None else self.invariant(outputs)

    def applied(self, model: nn.Module) -> nn.Module:
        """A deep copy of ``model`` carrying the transformed parameters and buffers.

        The caller's model is neither called nor changed. The copy is what a measure that
        reads a model (rather than a parameter dict) sees at the transformed point; it is
        the only faithful image of a symmetry that acts on buffers.

        Args:
            model: the model whose parameters (and buffers) the symmetry names.

        Returns:
            The transformed copy.

        Raises:
            TypeError: if ``model`` is not an ``nn.Module``.
        """
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        twin = copy.deepcopy(model)
        moved = self(params_of(twin, buffers=True))
        load_state(twin, moved)
        return twin


def load_state(model: nn.Module, state: Params) -> None:
    """Copy the tensors of ``state`` into the parameters and buffers of ``model`` of the same names (in place).

    Use it on a copy: :meth:`Symmetry.applied` does.

    Args:
        model: the model to load into (changed in place).
        state: ``{name: tensor}``; names the model does not have are refused.

    Raises:
        ValueError: on a name that is neither a parameter nor a buffer of ``model``.
    """
    targets = dict(model.named_parameters())
    targets.update(dict(model.named_buffers()))
    unknown = sorted(set(state) - set(targets))
    if unknown:
        raise ValueError(f"state names {unknown}, which are neither parameters nor buffers of the model")
    with torch.no_grad():
        for key, value in state.items():
            targets[key].copy_(value)


#: Discrepancies below this are reported by their order only, since their digits are the machine's.
ROUNDING_FLOOR = 1e-13


def discrepancy_text(value: float, floor: float = ROUNDING_FLOOR) -> str:
    """A discrepancy as portable text: its order below ``floor``, else 2 significant digits.

    >>> discrepancy_text(2.2e-16), discrepancy_text(0.0123)
    ('below 1e-13 (rounding level)', '0.012')
    >>> discrepancy_text(3e-7, floor=1e-4)
    'below 0.0001 (rounding level)'

    Args:
        value: the discrepancy.
        floor: the reporting floor (default :data:`ROUNDING_FLOOR`).

    Returns:
        ``"below <floor> (rounding level)"`` or the value at 2 significant digits.
    """
    return str(rounding_level(value, floor)) if abs(value) < floor else fmt(value, 2)


def rounding_floor(dtype: torch.dtype) -> float:
    """The reporting floor of a relative discrepancy in ``dtype``: 1e-13 (float64), 1e-4 (float32).

    It is the power of ten just above 450 units of round-off (``450 eps``, the scale of
    :data:`ROUNDING_FLOOR` in float64): a relative discrepancy below it has no digits that
    survive a change of CPU.

    >>> rounding_floor(torch.float64), rounding_floor(torch.float32)
    (1e-13, 0.0001)

    Args:
        dtype: ``torch.float32`` or ``torch.float64``.

    Returns:
        ``10 ** ceil(log10(450 eps))`` of ``dtype``.

    Raises:
        ValueError: for another dtype.
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
    (:func:`~lossgeom.symmetries.module_audit.audit`) also records ``output_scale`` (the
    largest ``|value|`` it compared) and ``relative_tolerance``; its receipt then states the
    discrepancy relative to that scale, by order when it is below ``rounding_floor``. Measures print with ``sig``
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
    approximate: str = ""

    @property
    def measure_ratio(self) -> float | None:
        """``measure_after / measure_before``; None without both measures or when ``measure_before`` is 0."""
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
        """The largest discrepancy as portable text (relative to the output scale if recorded).

        Returns:
            :func:`discrepancy_text` of ``max_output_discrepancy``, or of ``relative_discrepancy``
            followed by ``" of the scale"`` when the output scale is recorded.
        """
        if self.output_scale is None:
            return discrepancy_text(self.max_output_discrepancy, self.rounding_floor)
        return discrepancy_text(self.relative_discrepancy, self.rounding_floor) + " of the scale"

    def measure_text(self) -> str | None:
        """``"<measure>: before x, after y, ratio r"`` at ``sig`` digits, or None without a measure.

        Returns:
            The sentence (without the ratio when it is None), or None when no measure was recorded.
        """
        if self.measure_name is None:
            return None
        ratio = self.measure_ratio
        return (
            f"{self.measure_name}: before {fmt(self.measure_before, self.sig)}, after "
            f"{fmt(self.measure_after, self.sig)}" + (f", ratio {fmt(ratio, self.sig)}" if ratio is not None else "")
        )

    def __str__(self) -> str:
        verdict = "same function on the probe set" if self.is_symmetry else "NOT the same function: not a valid control"
        if self.approximate:
            verdict = ("within tolerance" if self.is_symmetry else "beyond tolerance") + (
                f": an approximate symmetry ({self.approximate})"
            )
        if self.output_scale is None:
            lines = [
                f"transform: {self.symmetry}",
                f"probe set: {self.probe_size} inputs; tolerance {fmt(self.tolerance, 3)}",
                f"largest output discrepancy: {self.discrepancy_text()} ({verdict})",
            ]
        else:
            lines = [
                f"transform: {self.symmetry}",
                (
                    f"probe set: {self.probe_size} inputs; {self.compared} compared with tolerance "
                    f"{fmt(self.relative_tolerance, 3)} x their scale (largest |value| {fmt(self.output_scale, 3)})"
                ),
                f"largest discrepancy: {self.discrepancy_text()} ({verdict})",
            ]
        if self.measure_name is not None:
            lines.append(self.measure_text())
        return "\n".join(lines)


def _perturbed(params: Params, keys: Iterable[str], generator: torch.Generator) -> dict[str, torch.Tensor]:
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


def check_forward_reads(
    forward: Forward,
    params: Params,
    probe: torch.Tensor,
    keys: Iterable[str] | None = None,
    *,
    before: torch.Tensor | None = None,
    seed: int = 0,
) -> None:
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

    Args:
        forward: ``forward(params, probe) -> outputs``.
        params: the parameter dict.
        probe: the probe inputs.
        keys: the names of the parameters a symmetry changes (checked one by one).
        before: ``forward(params, probe)`` if already computed.
        seed: seed of the random perturbations.

    Returns:
        None; it only raises.
    """
    generator = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        if before is None:
            before = forward(params, probe)
        moved = _perturbed(params, list(params), generator)
        anywhere = _outputs_or_none(forward, moved, probe)
        if _same_outputs(anywhere, before):
            raise ValueError(
                "forward does not depend on its params argument: its outputs on the probe are "
                "unchanged when every parameter is perturbed at random, so no transform can be "
                "audited; compute with the params it is given, e.g. "
                "torch.func.functional_call(model, params, (x,))"
            )
        if anywhere is None:
            return
        for key in sorted(keys or ()):
            if _same_outputs(_outputs_or_none(forward, _perturbed(moved, [key], generator), probe), anywhere):
                raise ValueError(
                    f"forward does not read params[{key!r}]: its outputs on the probe are unchanged "
                    f"when that parameter is perturbed at random, so a transform of it cannot be "
                    "audited (a misspelt name, or a forward that uses its own copy of the weight?)"
                )


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
    (:func:`check_forward_reads`). :func:`~lossgeom.symmetries.module_audit.audit` does the
    same for a ``torch.nn.Module`` with symmetries found automatically.

    Args:
        forward: ``forward(params, probe) -> outputs``; real-valued outputs or logits.
        params: the model's parameters as a dict of tensors.
        symmetry: the transform to audit.
        probe: the declared probe inputs, first dimension indexing examples (integer
            inputs such as token ids keep their dtype).
        tol: largest allowed absolute output discrepancy (> 0).
        measure: optional geometry measure ``measure(params) -> float`` to recompute.
        measure_name: the measure's name in the receipt.
        input_shape: the shape of one input; when given, ``probe.shape[1:]`` must match.
        require_symmetry: if True (default), raise ``ValueError`` when outputs differ by
            more than ``tol``; if False, return a report with ``is_symmetry=False``
            (for negative controls). An ``approximate`` symmetry is never refused: its
            report records the measured discrepancy.

    Returns:
        An :class:`AuditReport`. When an exact transform fails the functional check the
        measure is not recomputed: a change in geometry then means nothing.
    """
    tol = positive("tol", tol)
    if not callable(forward):
        raise TypeError("forward must be callable as forward(params, probe)")
    if not isinstance(symmetry, Symmetry):
        raise TypeError(f"symmetry must be a lossgeom Symmetry, got {type(symmetry).__name__}")
    probe = finite_inputs("probe", probe)
    if probe.ndim == 0 or probe.shape[0] == 0:
        raise ValueError(
            f"probe must hold at least one input along its first dimension, got shape {tuple(probe.shape)}"
        )
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
    if not ok and require_symmetry and not symmetry.approximate:
        raise ValueError(
            f"{symmetry.name} is not a symmetry of the model on the probe set: largest output "
            f"discrepancy {fmt(discrepancy, 3)} exceeds tol {fmt(tol, 3)}"
        )
    report = dict(
        symmetry=symmetry.name,
        probe_size=int(probe.shape[0]),
        tolerance=tol,
        max_output_discrepancy=discrepancy,
        is_symmetry=ok,
        compared=symmetry.invariant_name,
        approximate=symmetry.approximate,
    )
    if measure is not None and (ok or symmetry.approximate):
        report.update(
            measure_name=measure_name, measure_before=float(measure(params)), measure_after=float(measure(moved))
        )
    return AuditReport(**report)


def compose(symmetries: Sequence[Symmetry], name: str | None = None) -> Symmetry:
    """The symmetries applied one after another, as one :class:`Symmetry`.

    A composition of function-preserving maps preserves the function; the composite
    compares what its parts compare (they must agree on it).

    Args:
        symmetries: the parts, applied first to last (or one :class:`Symmetry`).
        name: the composite's name (default: the parts' names joined by "then").

    Returns:
        One :class:`Symmetry` (the part itself when there is one and no ``name``).

    Raises:
        TypeError: if ``symmetries`` is not a non-empty sequence of :class:`Symmetry`.
        ValueError: if the parts compare different invariants of the outputs.
    """
    parts = list(symmetries) if not isinstance(symmetries, Symmetry) else [symmetries]
    if not parts or not all(isinstance(s, Symmetry) for s in parts):
        raise TypeError("symmetries must be a non-empty sequence of lossgeom Symmetry objects")
    compared = {s.invariant_name for s in parts}
    if len(compared) > 1:
        raise ValueError(
            f"the symmetries compare different invariants of the outputs ({sorted(compared)}); "
            "compose only symmetries of one kind"
        )
    if len(parts) == 1 and name is None:
        return parts[0]

    def transform(params: Params) -> dict[str, torch.Tensor]:
        out = dict(params)
        for part in parts:
            out = part(out)
        return out

    approximate = "; ".join(dict.fromkeys(s.approximate for s in parts if s.approximate))
    buffers = tuple(dict.fromkeys(key for s in parts for key in s.buffers))
    return Symmetry(
        name or " then ".join(s.name for s in parts),
        transform,
        parts[0].invariant,
        parts[0].invariant_name,
        approximate,
        buffers,
    )

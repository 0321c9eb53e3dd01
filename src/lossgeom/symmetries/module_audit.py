"""The module-first symmetry audit: :func:`audit` of a plain ``torch.nn.Module``.

The protocol of :func:`lossgeom.symmetries.core.audit_symmetry` without hand-written
transforms: the registry (:func:`lossgeom.symmetries.registry.find_symmetries`) finds the
symmetries, each is checked on the probe against a tolerance relative to the output
scale, and only then is the measure recomputed. The result is an :class:`AuditTable`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lossgeom._validation import positive
from lossgeom.formatting import SIGNIFICANT_DIGITS, fmt
from lossgeom.outputs import _output_model
from lossgeom.parameters import params_of
from lossgeom.progress import progress_bar, show_progress
from lossgeom.risk import math_attention
from lossgeom.symmetries.core import (
    _AUDIT_DTYPES,
    DEFAULT_RTOL,
    AuditReport,
    Symmetry,
    _same_values,
    load_state,
    rounding_floor,
)
from lossgeom.symmetries.registry import find_symmetries
from lossgeom.types import Forward, Params


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
        """One dict per symmetry: name, discrepancy, verdict, measure before/after/ratio.

        Returns:
            One dict per report, with keys ``symmetry``, ``compared``, ``max_output_discrepancy``,
            ``relative_discrepancy``, ``is_symmetry``, ``measure``, ``before``, ``after``, ``ratio``.
        """
        return [
            dict(
                symmetry=r.symmetry,
                compared=r.compared,
                max_output_discrepancy=r.max_output_discrepancy,
                relative_discrepancy=r.relative_discrepancy,
                is_symmetry=r.is_symmetry,
                measure=r.measure_name,
                before=r.measure_before,
                after=r.measure_after,
                ratio=r.measure_ratio,
            )
            for r in self.reports
        ]

    def __str__(self) -> str:
        measured = next((r.measure_name for r in self.reports if r.measure_name is not None), None)
        header = ["symmetry", "discrepancy / scale"] + (["before", "after", "ratio"] if measured else [])
        body = []
        for r in self.reports:
            row = [
                r.symmetry,
                r.discrepancy_text().removesuffix(" of the scale")
                + ("" if r.is_symmetry else " approximate" if r.approximate else " FAILED"),
            ]
            if measured:
                ratio = r.measure_ratio
                row += (
                    [
                        fmt(r.measure_before, r.sig),
                        fmt(r.measure_after, r.sig),
                        fmt(ratio, r.sig) if ratio is not None else "-",
                    ]
                    if r.measure_name is not None
                    else ["-", "-", "-"]
                )
            body.append(row)
        widths = [max(len(line[i]) for line in [header] + body) for i in range(len(header))]
        lines = [
            f"symmetry audit of {self.model} ({self.dtype}) on {self.probe_size} probe inputs",
            f"outputs first (tolerance {fmt(self.relative_tolerance, 3)} x their scale), then "
            + (f"the measure: {measured}" if measured else "no measure"),
        ]
        lines += [
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in [header] + body
        ]
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
        raise ValueError(
            f"model parameters must share one dtype and device, got {sorted(map(str, dtypes))} on "
            f"{sorted(map(str, devices))}"
        )
    dtype = dtypes.pop()
    if dtype not in _AUDIT_DTYPES:
        raise ValueError(
            f"model dtype is {dtype}: the audit works in float32 or float64 (in half precision "
            "rounding is too coarse to tell a symmetry from a small change)"
        )
    return dtype, devices.pop()


def _loaded(model: nn.Module, params: Params) -> nn.Module:
    twin = copy.deepcopy(model)
    load_state(twin, params)
    return twin


def _measured(measure: Callable, value: object) -> float:
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


def _checked_options(model: nn.Module, measure: Callable | None, measure_on: str, sig: int) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if measure is not None and not callable(measure):
        raise TypeError(
            f"measure must be callable (of the model or of its parameter dict), got {type(measure).__name__}"
        )
    if measure_on not in ("model", "params"):
        raise ValueError(f"measure_on must be 'model' or 'params', got {measure_on!r}")
    if isinstance(sig, bool) or not isinstance(sig, int) or sig < 1:
        raise ValueError(f"sig must be an int >= 1 (significant digits), got {sig!r}")


def _checked_probe(probe: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The probe in the model's dtype (if floating) and on its device, checked non-empty and finite."""
    if isinstance(probe, (tuple, list)):
        raise TypeError("probe must be a tensor of inputs only (outputs are compared, never labels)")
    if not isinstance(probe, torch.Tensor):
        raise TypeError(f"probe must be a torch.Tensor of inputs, got {type(probe).__name__}")
    if probe.ndim == 0 or probe.shape[0] == 0:
        raise ValueError(
            f"probe must hold at least one input along its first dimension, got shape {tuple(probe.shape)}"
        )
    probe = probe.to(device=device, dtype=dtype) if torch.is_floating_point(probe) else probe.to(device)
    if torch.is_floating_point(probe) and not torch.isfinite(probe).all():
        raise ValueError("probe must contain only finite values")
    return probe


def _first_outputs(forward: Forward, params: Params, probe: torch.Tensor) -> object:
    """What the model returns on the probe (before an output is selected), its errors named."""
    with torch.no_grad():
        try:
            return forward(params, probe)
        except RuntimeError as err:
            raise ValueError(f"model failed on the probe set of shape {tuple(probe.shape)}: {err}") from err


def _reference_outputs(forward: Forward, params: Params, probe: torch.Tensor) -> torch.Tensor:
    """The outputs on the probe, checked one finite tensor and the same on a second evaluation."""
    with torch.no_grad():
        try:
            before = forward(params, probe)
            again = forward(params, probe)
        except RuntimeError as err:
            raise ValueError(f"model failed on the probe set of shape {tuple(probe.shape)}: {err}") from err
    if not torch.isfinite(before).all():
        raise ValueError("model outputs on the probe must be finite")
    if not _same_values(before, again):
        raise ValueError(
            "model outputs differ between two evaluations on the same probe (dropout or another random "
            "layer in training mode?): call model.eval() before the audit"
        )
    return before


def _chosen(
    model: nn.Module,
    work: nn.Module,
    symmetries: Symmetry | Sequence[Symmetry] | None,
    loss: nn.Module | None,
    rescale: float,
    shift: float,
    seed: int | None,
    generator: torch.Generator | None,
) -> tuple[list[Symmetry], tuple[str, ...], str]:
    """The symmetries to audit (given, or the registry's on ``work``), the refusals and the sampling text."""
    if symmetries is None:
        search = find_symmetries(work, loss=loss, rescale=rescale, shift=shift, seed=seed, generator=generator)
        chosen, skipped, sampling = list(search.symmetries), search.skipped, search.sampling
        if not chosen:
            raise ValueError(
                f"found no symmetry of {type(model).__name__} that it can identify safely: "
                + ("; ".join(skipped) if skipped else "no Linear or Conv layers feed one another")
                + "; pass symmetries=[...] to audit hand-written ones"
            )
        return chosen, skipped, sampling
    chosen = list(symmetries) if not isinstance(symmetries, Symmetry) else [symmetries]
    if not chosen or not all(isinstance(s, Symmetry) for s in chosen):
        raise TypeError("symmetries must be a non-empty list of lossgeom Symmetry objects")
    return chosen, (), ""


def _measure_label(measure: Callable | None, measure_name: str | None) -> str:
    name = measure_name or getattr(measure, "__name__", "measure")
    return "measure" if name == "<lambda>" else name.replace("_", " ")


def _audited(
    symmetry: Symmetry,
    model: nn.Module,
    forward: Forward,
    params: Params,
    probe: torch.Tensor,
    before: torch.Tensor,
    rtol: float,
    require_symmetry: bool,
) -> tuple[dict, dict[str, torch.Tensor]]:
    """The functional check of one symmetry: the report's fields (no measure yet) and the moved parameters."""
    moved = symmetry(params)
    with torch.no_grad():
        after = forward(moved, probe)
    if not isinstance(after, torch.Tensor) or after.shape != before.shape:
        raise ValueError(f"outputs changed shape under {symmetry.name}")
    reference, compared = symmetry.compared(before), symmetry.compared(after)
    scale = float(reference.abs().max())
    if scale == 0:
        raise ValueError(
            f"the {symmetry.invariant_name} are all zero on the probe: the check of "
            f"{symmetry.name} would be vacuous; choose another probe"
        )
    discrepancy = float((compared - reference).abs().max()) if torch.isfinite(compared).all() else math.inf
    ok = discrepancy <= rtol * scale
    if not ok and require_symmetry and not symmetry.approximate:
        raise ValueError(
            f"{symmetry.name} is not a symmetry of {type(model).__name__} on the probe set: largest "
            f"discrepancy {fmt(discrepancy / scale, 3)} x the output scale "
            f"exceeds rtol {fmt(rtol, 3)}"
        )
    entry = dict(
        symmetry=symmetry.name,
        probe_size=int(probe.shape[0]),
        tolerance=rtol * scale,
        max_output_discrepancy=discrepancy,
        is_symmetry=ok,
        output_scale=scale,
        relative_tolerance=rtol,
        compared=symmetry.invariant_name,
        approximate=symmetry.approximate,
    )
    return entry, moved


def audit(
    model: nn.Module,
    measure: Callable | None,
    probe: torch.Tensor,
    *,
    loss: nn.Module | None = None,
    symmetries: Sequence[Symmetry] | None = None,
    measure_name: str | None = None,
    measure_on: str = "model",
    rtol: float | None = None,
    rescale: float = 2.0,
    shift: float = 1.0,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    sig: int = SIGNIFICANT_DIGITS,
    require_symmetry: bool = True,
    output: Callable[[object], torch.Tensor] | None = None,
    progress: bool | None = None,
) -> AuditTable:
    r"""Audit a ``torch.nn.Module``: find its symmetries, check each on the probe, then recompute the measure.

    The protocol of :func:`~lossgeom.symmetries.core.audit_symmetry` for a plain module, without hand-written
    transforms: the registry (:func:`find_symmetries`) finds the per-unit ReLU/LeakyReLU
    rescalings, the unit and channel permutations and the softmax common-row shift it can
    identify safely (read its docstring for what it does not find). For each symmetry the
    audit

    1. transforms a private copy of the parameters and buffers (the dict of
       ``model.named_parameters()`` and ``model.named_buffers()``, ``params_of(model, buffers=True)``: a
       batch norm's symmetry moves its running statistics; the caller's model is never
       called or changed: all work happens on a deep copy);
    2. compares the model's outputs on ``probe`` (logits, never labels; for the softmax
       shift, logits centred over classes) before and after, against ``rtol`` times the
       output scale (the largest ``|value|`` compared);
    3. only if they agree, recomputes ``measure`` on a copy of the model carrying the
       transformed parameters and buffers (``measure_on="params"``: on the parameters).

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
        >>> print(audit(model, squared_weight_norm, probe, loss=nn.CrossEntropyLoss()))
        symmetry audit of Sequential (float64) on 20 probe inputs
        outputs first (tolerance 1e-10 x their scale), then the measure: squared weight norm
        symmetry                                        discrepancy / scale           before   after    ratio
        ReLU rescaling 0 -> 2 (6 units, c in [1/2, 2])  below 1e-13 (rounding level)  2.77485  4.64347  1.67342
        permutation 0 -> 2 (6 units)                    below 1e-13 (rounding level)  2.77485  2.77485  1
        softmax row shift of 2 (|shift| = 1 RMS row)    below 1e-13 (rounding level)  2.77485  3.67995  1.32618
        sizes: rescalings log-uniform in [1/2, 2], shifts of 1 x the RMS row norm, drawn with seed 0

    A hand-written symmetry checked against a closed form: the layer rescaling by :math:`c`
    multiplies the first layer's weight by :math:`c` (and divides the next one's by it), so
    :math:`\lVert W_0 \rVert_F^2` moves by exactly :math:`c^2 = 4` while the outputs are kept:

        >>> from lossgeom.symmetries import layer_rescaling
        >>> def first_layer_norm(m):
        ...     return float(m[0].weight.detach().pow(2).sum())
        >>> (report,) = audit(model, first_layer_norm, probe, symmetries=[layer_rescaling("0", "2", 2.0)])
        >>> report.is_symmetry, report.measure_after / report.measure_before
        (True, 4.0)

    Args:
        model: the model; ``model(probe)`` returns the outputs (logits for a classifier),
            or a tuple, dict or ``ModelOutput`` holding them (see ``output``).
        measure: ``measure(model_copy) -> float`` (``measure_on="model"``) or
            ``measure(params) -> float`` (``measure_on="params"``, a dict of name ->
            tensor); ``None`` runs the functional check only.
        probe: the declared probe inputs (first dimension indexes examples).
        loss: as in :func:`find_symmetries` (``nn.CrossEntropyLoss()`` enables the softmax
            shift of a final Linear layer).
        symmetries: audit these (each acting on the dict of ``model.named_parameters()``)
            instead of the registry's.
        measure_name: the measure's name in the table (default: the function's name).
        measure_on: ``"model"`` or ``"params"``: what ``measure`` is called with.
        rtol: relative output tolerance (> 0; default 1e-10 in float64, 1e-4 in float32).
        rescale: ``r > 1``, the registry's rescaling factors lie in ``[1 / r, r]`` (see
            :func:`find_symmetries`); ignored with ``symmetries``.
        shift: the registry's shift size relative to the classifier's RMS row norm (> 0);
            ignored with ``symmetries``.
        seed: seed of the generator that draws the registry's sizes (default 0); ignored
            with ``symmetries``.
        generator: a ``torch.Generator`` to draw the registry's sizes from instead of ``seed``;
            ignored with ``symmetries``.
        sig: significant digits of the printed measures.
        require_symmetry: if True (default), raise when a symmetry fails the functional
            check; if False, report it as failed, without a measure. A symmetry marked
            ``approximate`` (such as a rescaling before a LayerNorm, exact only as its
            ``eps`` goes to 0) is never refused: its report records the measured
            discrepancy and its reason, and the measure is recomputed.
        output: a callable selecting the tensor of outputs from what ``model`` returns
            (``None``: the output itself, or its tensor ``logits``), by the rule of
            :mod:`lossgeom.models`; the outputs compared are the selected ones, and the copy
            ``measure`` receives returns them.
        progress: a bar of the audited symmetries on stderr: ``None`` in interactive use
            only, ``True`` always, ``False`` never (see ``lossgeom.progress``).

    Returns:
        An :class:`AuditTable` (one :class:`AuditReport` per symmetry).

    Raises:
        ValueError: if the registry finds no symmetry it can identify safely (with its
            reasons), if a symmetry changes the outputs (naming it and the discrepancy),
            or on bad input (probe, tolerance, dtype, nondeterministic outputs).
        TypeError: on inputs of the wrong kind (``progress`` not a bool or None included).
    """
    _checked_options(model, measure, measure_on, sig)
    show_progress(progress)  # refuses a bad value before any work
    dtype, device = _model_dtype_device(model)
    rtol = DEFAULT_RTOL[dtype] if rtol is None else positive("rtol", rtol)
    probe = _checked_probe(probe, dtype, device)
    work = copy.deepcopy(model)
    # parameters and buffers: a batch norm's symmetry moves its running statistics
    params = params_of(work, buffers=True)
    parameter_names = dict(work.named_parameters()).keys()
    buffer_names = set(params) - set(parameter_names)

    def forward(p: Params, x: torch.Tensor) -> torch.Tensor:
        state = {key: (value.clone() if key in buffer_names else value) for key, value in p.items()}
        with math_attention():  # the eval-mode fast path of attention off: the composite computation
            return torch.func.functional_call(work, state, (x,))

    work = _output_model(work, output, _first_outputs(forward, params, probe))
    before = _reference_outputs(forward, params, probe)
    chosen, skipped, sampling = _chosen(model, work, symmetries, loss, rescale, shift, seed, generator)
    name = _measure_label(measure, measure_name)

    def evaluate(p: Params) -> float:
        target = _loaded(work, p) if measure_on == "model" else {k: p[k].clone() for k in parameter_names}
        return _measured(measure, measure(target))

    measure_before = evaluate(params) if measure is not None else None
    floor = rounding_floor(dtype)
    reports = []
    with progress_bar(progress, total=len(chosen), desc="symmetry audit", unit="symmetry") as bar:
        for symmetry in chosen:
            entry, moved = _audited(symmetry, model, forward, params, probe, before, rtol, require_symmetry)
            entry.update(sig=sig, rounding_floor=floor, details={"dtype": str(dtype).removeprefix("torch.")})
            if measure is not None and (entry["is_symmetry"] or symmetry.approximate):
                entry.update(measure_name=name, measure_before=measure_before, measure_after=evaluate(moved))
            reports.append(AuditReport(**entry))
            bar.update(1)
    return AuditTable(
        type(model).__name__,
        str(dtype).removeprefix("torch."),
        int(probe.shape[0]),
        rtol,
        tuple(reports),
        tuple(skipped),
        sampling,
    )

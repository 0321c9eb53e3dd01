"""The measurement contract (claim P13): what a geometry number or figure measured.

A sharpness number means nothing without its centre, its directions and their
normalisation, its radius, the loss and its reduction, the data split, the model's
mode, the resolution and the precision. :class:`MeasurementContract` records them and
renders them into a figure caption, so the caption cannot forget a field (a picture
depends on every one of them: Li et al. 2018).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

_LABELS = {
    "centre": "centre",
    "directions": "directions",
    "normalisation": "normalisation",
    "radius": "radius",
    "loss": "loss",
    "reduction": "reduction",
    "data": "data",
    "model_mode": "model mode",
    "resolution": "resolution",
    "precision": "precision",
}


@dataclass(frozen=True)
class MeasurementContract:
    """Everything needed to repeat one geometry measurement.

    Every field is a non-empty string; write ``"n/a"`` (with a reason if useful) for a
    field that does not apply, so that omission is a visible decision.

    Example:
        >>> c = MeasurementContract(centre="(1, 1)", directions="unit circle",
        ...     normalisation="Euclidean, balanced coordinates", radius="0.1",
        ...     loss="1/2 (ab x - y)^2", reduction="single example", data="(x, y) = (1, 1)",
        ...     model_mode="n/a (no layers with state)", resolution="64 angles",
        ...     precision="float64")
        >>> c.caption("Loss on a circle.").startswith("Loss on a circle. Contract:")
        True
    """

    centre: str
    directions: str
    normalisation: str
    radius: str
    loss: str
    reduction: str
    data: str
    model_mode: str
    resolution: str
    precision: str

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, str):
                raise TypeError(f"{f.name} must be a string, got {type(value).__name__}")
            if not value.strip():
                raise ValueError(f"{f.name} must be stated (use 'n/a' and say why if it does not apply)")

    def as_dict(self) -> dict[str, str]:
        """The contract's fields as a dict.

        Returns:
            ``{field name: value}`` for every field, in declaration order.
        """
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def with_(self, **changes: str) -> MeasurementContract:
        """A copy with some fields changed (for a figure that differs in one setting).

        Returns:
            A new :class:`MeasurementContract` with the fields named in ``changes`` replaced.

        Raises:
            TypeError: on a keyword that is not a contract field.
        """
        unknown = set(changes) - set(_LABELS)
        if unknown:
            raise TypeError(f"unknown contract field(s) {sorted(unknown)}; fields are {list(_LABELS)}")
        return replace(self, **changes)

    def caption(self, summary: str) -> str:
        """``summary`` followed by every field of the contract, for a figure caption.

        Args:
            summary: a non-empty sentence describing the figure (a full stop is added if it
                does not end in ``.``, ``!`` or ``?``).

        Returns:
            ``"{summary} Contract: label: value; ...."``.

        Raises:
            ValueError: if ``summary`` is not a non-empty string.
        """
        if not isinstance(summary, str) or not summary.strip():
            raise ValueError("summary must be a non-empty sentence describing the figure")
        parts = "; ".join(f"{_LABELS[k]}: {v}" for k, v in self.as_dict().items())
        summary = summary.strip()
        if summary[-1] not in ".!?":
            summary += "."
        return f"{summary} Contract: {parts}."

    def __str__(self) -> str:
        width = max(len(v) for v in _LABELS.values())
        return "\n".join(f"{_LABELS[k]:>{width}}: {v}" for k, v in self.as_dict().items())

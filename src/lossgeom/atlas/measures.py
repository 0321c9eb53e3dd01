"""The rows of the symmetry audit atlas: the flatness and sharpness measures it recomputes.

:class:`Measure` wraps a measure of :mod:`lossgeom.flatness` with its definition, source
and numerical tolerance; :data:`MEASURES` lists the book's measures in the atlas's row
order, and :data:`LAYER_MEASURES` the rows asked for by name (``measures=["geodesic"]``).
:data:`FISHER_RANK_THRESHOLD` is the rank cut of the Fisher-Riemannian row and
:data:`FISHER_CUTS` the other cuts :class:`~lossgeom.atlas.records.FisherRecord` evaluates.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from lossgeom import curvature, flatness
from lossgeom._validation import positive
from lossgeom.flatness.loss_point import NotApplicable

#: The rank cut of the Fisher-Riemannian row. A Fisher eigenvalue at most this times the
#: largest counts as zero. It is the default ``rel_threshold`` of
#: :func:`lossgeom.flatness.riemannian.fisher_riemannian_sharpness_from_matrices`, which
#: :func:`lossgeom.flatness.measures.riemannian_sharpness` (the row's measure) uses; it is read from
#: that signature, so the row and :class:`~lossgeom.atlas.records.FisherRecord` cannot disagree.
FISHER_RANK_THRESHOLD: float = float(
    inspect.signature(flatness.fisher_riemannian_sharpness_from_matrices).parameters["rel_threshold"].default
)

#: The cuts at which :class:`~lossgeom.atlas.records.FisherRecord` also evaluates the Fisher-Riemannian sharpness
#: (largest first; the row's own cut is among them), to show how far the row depends on it.
#: The smallest stays two decades above the float64 rounding of a Fisher eigendecomposition
#: (about 1e-13 of the largest eigenvalue), so the values there keep their digits.
FISHER_CUTS: tuple[float, ...] = tuple(sorted({1e-6, FISHER_RANK_THRESHOLD, 1e-11}, reverse=True))


@dataclass(frozen=True)
class Measure:
    """A flatness or sharpness measure as a row of the atlas.

    Attributes:
        key: short name used to select it (``"lambda_max"``) and in labels.
        title: the row's title in plain text (it is also a link text and an axis label).
        definition: the definition in one line.
        citation: the ``references.bib`` key(s) of its source, comma separated.
        function: a model-first measure ``function(model, loss, data, **options)``
            (evaluated at the atlas's shared :class:`~lossgeom.flatness.loss_point.LossPoint`
            by :func:`lossgeom.flatness.measure_at`), or ``function(point, **options)`` of a
            ``LossPoint`` when ``takes_point`` is True.
        tolerance: the relative change (float64) below which the measure is called
            invariant: its numerical accuracy, not a claim about the model.
        options: keyword arguments passed to ``function``.
        takes_point: whether ``function`` takes a ``LossPoint`` (see ``function``).
        rounding_floor: the relative change below which a cell reads ``< rounding_floor``
            rather than the change's decade, where it exceeds the dtype's rounding floor: for
            a measure whose own computation amplifies rounding (an ascent, an inverse), so
            that an invariant cell reads the same on every CPU.
    """

    key: str
    title: str
    definition: str
    citation: str
    function: Callable[..., float]
    tolerance: float = 1e-9
    options: Mapping[str, Any] = field(default_factory=dict)
    takes_point: bool = False
    rounding_floor: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key.strip():
            raise ValueError("a measure needs a non-empty key")
        if not callable(self.function):
            raise TypeError(f"measure {self.key!r}: function must be callable")
        positive("tolerance", self.tolerance)
        if not 0.0 <= self.rounding_floor < self.tolerance:
            raise ValueError(
                f"measure {self.key!r}: rounding_floor must be >= 0 and below the tolerance {self.tolerance}, "
                f"got {self.rounding_floor}"
            )

    def tolerance_for(self, dtype: torch.dtype) -> float:
        """The invariance tolerance in ``dtype``: ``tolerance`` in float64, at least 1e-3 in float32.

        Args:
            dtype: the dtype the measure is computed in.

        Returns:
            ``tolerance`` for float64, ``max(tolerance, 1e-3)`` for any other dtype.
        """
        return self.tolerance if dtype == torch.float64 else max(self.tolerance, 1e-3)

    def __call__(self, point: flatness.LossPoint) -> float:
        """The measure at ``point``, a finite float.

        Args:
            point: the loss point (model, loss, data and parameters) to measure at.

        Returns:
            The value, checked finite.

        Raises:
            ValueError: if the measure returns a value that is not finite.
        """
        if self.takes_point:
            value = self.function(point, **self.options)
        else:
            value = flatness.measure_at(point, self.function, **self.options)
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"measure {self.key!r} returned {value}; it must be finite")
        return value


#: The book's measures, in the atlas's row order.
MEASURES: dict[str, Measure] = {
    m.key: m
    for m in [
        Measure(
            "lambda_max",
            "λ_max(H)",
            "largest eigenvalue of the loss Hessian H (Lanczos)",
            "cohen2021gradient",
            curvature.lambda_max,
            1e-6,
            {"tol": 1e-9},
        ),
        Measure(
            "trace",
            "tr H",
            "trace of the loss Hessian",
            "yao2020pyhessian",
            flatness.hessian_trace,
            options={"method": "exact"},
        ),
        Measure(
            "keskar",
            "Keskar ε-sharpness",
            "100 (max over |z_i| <= eps (|theta_i| + 1) of L(theta + z) - L) / (1 + L), by L-BFGS-B",
            "keskar2017large",
            flatness.keskar_sharpness,
            1e-6,
            {"epsilon": 1e-3, "max_iter": 20},
        ),
        Measure(
            "sam",
            "SAM sharpness",
            "L(theta + rho g / |g|) - L(theta), g the gradient",
            "foret2021sharpness",
            flatness.sam_sharpness,
            1e-9,
            {"rho": 0.05},
        ),
        Measure(
            "asam",
            "ASAM adaptive sharpness",
            "L(theta + rho T^2 g / |T g|) - L(theta), T = |w| + eta on weights, 1 on biases",
            "kwon2021asam",
            flatness.adaptive_sharpness,
            1e-9,
            {"rho": 0.5, "eta": 0.01},
        ),
        Measure(
            "fisher_rao",
            "Fisher-Rao norm",
            "sqrt(<theta, I theta>), I the empirical Fisher",
            "liang2019fisher",
            flatness.fisher_rao_norm,
        ),
        Measure(
            "relative_flatness",
            "relative flatness (first layer)",
            "sum over rows s, s' of <w_s, w_s'> tr H_{s,s'} for the first weight layer",
            "petzka2021relative",
            flatness.relative_flatness,
        ),
        Measure(
            "kappa_exact",
            "κ_exact",
            "mean |h|^2 tr(W^T P(p) W) of the last layer",
            "petzka2021relative, opazo2026flatness",
            flatness.classifier_kappa_exact,
        ),
        Measure(
            "b_raw",
            "B_raw",
            "|W|_F^2 mean |h|^2 (1 - |p|^2) of the last layer",
            "opazo2026flatness",
            flatness.classifier_b_raw,
        ),
        Measure(
            "b_quot",
            "B_quot",
            "B_raw at the centred classifier W - 1 wbar^T",
            "opazo2026flatness",
            flatness.classifier_b_quot,
        ),
        Measure(
            "flat_q",
            "Flat^Q",
            "trace of the Riemannian Hessian on the ReLU rescaling quotient",
            "miyagawa2026symmetry",
            flatness.model_quotient_flatness,
        ),
        Measure(
            "fisher_riemannian",
            "Fisher-Riemannian sharpness",
            "largest eigenvalue of H in the metric of the true Fisher F (on its range)",
            "ahmed2026fisher",
            flatness.riemannian_sharpness,
            1e-6,
            {"fisher": "true"},
        ),
        Measure(
            "diagonal_fisher",
            "diagonal-Fisher sharpness",
            "largest eigenvalue of D^-1/2 H D^-1/2, D the diagonal of the true Fisher",
            "ahmed2026fisher",
            flatness.riemannian_sharpness,
            1e-6,
            {"fisher": "diagonal"},
        ),
        Measure(
            "wolkowicz_styan",
            "Wolkowicz-Styan bound",
            "m + s sqrt(n - 1) >= lambda_max(H), from tr H and tr H^2",
            "wolkowicz1980bounds",
            flatness.model_wolkowicz_styan_bound,
        ),
    ]
}


def attention_geodesic_sharpness(point: flatness.LossPoint, **options: Any) -> float:
    """Geodesic sharpness on the quotient by the attention gauge, where the model has that gauge.

    :func:`lossgeom.flatness.geodesic_sharpness` takes the quotient by the :math:`GL(d)` gauge
    of every ``nn.MultiheadAttention`` head (da Silva, Dangel & Oore 2025) and ASAM's
    element-wise metric elsewhere; on a model without such a layer it would be an
    element-wise-metric sharpness, not the quotient one, so the row does not apply there.

    Args:
        point: the loss point (model, loss, data and parameters).
        **options: keyword arguments of :func:`lossgeom.flatness.geodesic_sharpness`.

    Returns:
        The geodesic sharpness at ``point``.

    Raises:
        NotApplicable: if the model holds no ``nn.MultiheadAttention`` (or its gauge does
            not act as the measure states, as :func:`~lossgeom.flatness.geodesic_sharpness` says).
    """
    if not any(isinstance(module, torch.nn.MultiheadAttention) for module in point.model.modules()):
        raise NotApplicable(
            "geodesic sharpness takes the quotient by the attention gauge of nn.MultiheadAttention heads, and "
            f"{type(point.model).__name__} has none (attention written as separate q/k/v/o projections, "
            "rotary or grouped, is outside that quotient)"
        )
    return flatness.measure_at(point, flatness.geodesic_sharpness, **options)


#: Rows asked for by name (``measures=[..., "geodesic"]``); the default rows stay :data:`MEASURES`.
LAYER_MEASURES: dict[str, Measure] = {
    m.key: m
    for m in [
        Measure(
            "geodesic",
            "geodesic sharpness",
            "max over horizontal xi, |xi| <= rho in the quotient metric 'inv' of L(gamma_xi(1)) - L, "
            "gamma to second order (5 ascent steps)",
            "dasilva2025hide",
            attention_geodesic_sharpness,
            1e-9,
            {"rho": 0.5, "steps": 5, "order": 2, "metric": "inv"},
            takes_point=True,
            rounding_floor=1e-10,  # the ascent's normalised steps and the Gram inverses: up to 2e-11 seen
        ),
    ]
}

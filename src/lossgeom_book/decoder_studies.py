"""The sharpness studies of da Silva, Dangel & Oore (2025) at CPU scale: gauge sweeps and correlation families.

Used by the chapter "Transformers as they are trained" (``chapters/ch14_decoder_transformers``).

- :func:`gauge_sweep`: geodesic and adaptive sharpness of a trained transformer
  (``nn.MultiheadAttention``) before and after the attention gauge ``A = s M`` on every head's
  query/key pair and ``B = M' / s`` on its value/output pair, over scales ``s``;
- :class:`DiagonalNet`: the diagonal linear network ``f(x) = <u * v, x>`` on synthetic sparse
  regression (more parameters than examples), :func:`sparse_regression`, :func:`train_diagonal`;
- :func:`correlation_study`: Kendall tau of each measure with the generalisation gap over a family.

The diagonal network's symmetry is ``(u_i, v_i) -> (c_i u_i, v_i / c_i)``: one ``GL(1)`` per
coordinate, an attention pair with ``d = 1``. The quotient metric ``inv`` on such a pair is
``eta_u^2 / u^2 + eta_v^2 / v^2``, which is ASAM's element-wise metric with ``eta = 0``, and its
gradient is horizontal, so :func:`lossgeom.flatness.geodesic_sharpness` with ``eta=0`` on a
model whose parameters are named ``weight`` computes the paper's geodesic sharpness of this network.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy.stats import kendalltau
from torch import nn

from lossgeom import symmetries
from lossgeom.symmetries.attention import conditioned_matrix
from lossgeom_book.checks import positive, positive_int
from lossgeom_book.data import Split

_KW = dict(dtype=torch.float64)


def head_gauge(attention: str, n_heads: int, head_dim: int, scale: float, seed: int = 0) -> symmetries.Symmetry:
    """The attention gauge on every head: ``A = scale M``, ``B = M' / scale``, ``M, M'`` of condition number 4."""
    g = torch.Generator().manual_seed(seed)
    moves = [
        symmetries.attention_head_gauge(
            attention,
            i,
            n_heads,
            scale * conditioned_matrix(head_dim, 4.0, g),
            conditioned_matrix(head_dim, 4.0, g) / scale,
        )
        for i in range(positive_int("n_heads", n_heads))
    ]
    return symmetries.compose(moves, f"attention gauge, scale {scale:g}")


@dataclass(frozen=True)
class GaugeSweep:
    """Each measure's value at the trained point and its ratio after the gauge at each scale."""

    scales: tuple[float, ...]
    base: dict[str, float]
    ratios: dict[str, np.ndarray]
    output_change: float


def gauge_sweep(
    model: nn.Module,
    attention: str,
    n_heads: int,
    head_dim: int,
    scales: Sequence[float],
    measures: Mapping[str, Callable],
    probe: torch.Tensor,
) -> GaugeSweep:
    """Every measure (``measure(model) -> float``) at ``model`` and at the gauge-moved model, per scale.

    ``output_change`` is the largest relative output change over the sweep on ``probe``
    (:func:`lossgeom.symmetries.audit`).
    """
    moves = [head_gauge(attention, n_heads, head_dim, positive("scale", s), seed=i) for i, s in enumerate(scales)]
    table = symmetries.audit(model, None, probe, symmetries=moves)
    base = {k: float(f(model)) for k, f in measures.items()}
    ratios = {k: [] for k in measures}
    for move in moves:
        moved = move.applied(model)
        for k, f in measures.items():
            ratios[k].append(float(f(moved)) / base[k])
    return GaugeSweep(
        tuple(scales), base, {k: np.array(v) for k, v in ratios.items()}, max(r.relative_discrepancy for r in table)
    )


class _Vector(nn.Module):
    def __init__(self, values: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(values.clone())


class DiagonalNet(nn.Module):
    """``f(x) = x (u * v)``: a diagonal linear network (``u.weight``, ``v.weight``), initialised at ``alpha``."""

    def __init__(self, d: int, alpha: float) -> None:
        super().__init__()
        start = torch.full((positive_int("d", d),), positive("alpha", alpha), **_KW)
        self.u, self.v = _Vector(start), _Vector(start)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ (self.u.weight * self.v.weight)


def sparse_regression(n_train: int, n_test: int, d: int, k: int, noise: float = 0.0, seed: int = 0) -> Split:
    """Gaussian inputs in ``R^d``, targets ``<beta*, x>`` (+ noise) with ``beta*`` ``k``-sparse, entries 1."""
    g = torch.Generator().manual_seed(seed)
    beta = torch.zeros(positive_int("d", d), **_KW)
    beta[torch.randperm(d, generator=g)[: positive_int("k", k)]] = 1.0
    x = torch.randn(n_train + n_test, d, generator=g, **_KW)
    y = x @ beta + noise * torch.randn(n_train + n_test, generator=g, **_KW)
    desc = f"{k}-sparse regression in R^{d}, {n_train} train / {n_test} test examples, noise {noise:g}, seed {seed}"
    return Split(x[:n_train], y[:n_train], x[n_train:], y[n_train:], desc)


@dataclass(frozen=True)
class Fitted:
    """A trained model with its train and test losses; ``gap`` is test minus train."""

    model: nn.Module
    train_loss: float
    test_loss: float

    @property
    def gap(self) -> float:
        """The generalisation gap, test loss minus training loss."""
        return self.test_loss - self.train_loss


def train_diagonal(split: Split, alpha: float, lr: float, steps: int, target: float = 0.0) -> Fitted:
    """Full-batch gradient descent on the mean squared error of a :class:`DiagonalNet` from ``alpha``.

    Stops after ``steps`` steps or at the first step whose training loss is at most
    ``target``: trained on to rounding level, an interpolating network's gradient is
    rounding noise, and a sharpness whose ascent starts along the gradient then measures
    that noise (its value changes with the floating-point kernels).
    """
    model, mse = DiagonalNet(split.x_train.shape[1], alpha), nn.MSELoss()
    for _ in range(positive_int("steps", steps)):
        model.zero_grad()
        loss = mse(model(split.x_train), split.y_train)
        if float(loss.detach()) <= target:
            break
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
    with torch.no_grad():
        train, test = mse(model(split.x_train), split.y_train), mse(model(split.x_test), split.y_test)
    return Fitted(model, float(train), float(test))


@dataclass(frozen=True)
class Correlation:
    """A family's gaps, each measure's values, and each measure's ``(tau, p)`` against the gaps."""

    gaps: np.ndarray
    values: dict[str, np.ndarray]
    tau: dict[str, tuple[float, float]]


def correlation_study(fits: Sequence, measures: Mapping[str, Callable]) -> Correlation:
    """Kendall tau (``scipy.stats.kendalltau``) of each ``measure(model)`` with the fits' gaps."""
    gaps = np.array([f.gap for f in fits])
    values = {k: np.array([float(m(f.model)) for f in fits]) for k, m in measures.items()}
    return Correlation(gaps, values, {k: tuple(float(t) for t in kendalltau(v, gaps)) for k, v in values.items()})

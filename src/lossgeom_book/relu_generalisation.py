"""Chapter 11's generalisation bound (*Quotient flatness*): a union of balls, kinks and ``Flat^Q_GN``.

The test distribution is uniform on a union of balls ``B(x_i, eps)`` around the training
inputs (:func:`sample_ball_union`); on each ball a student departs from its tangent by at
most the kink remainder :func:`kink_remainder`, and the bound :func:`generalisation_bound`
combines it with the training loss and the smoothness constants of
:func:`lossgeom.flatness.relu_quotient.smoothness_constants`.
:func:`generalisation_error` is the Monte Carlo value it bounds and
:func:`tangent_departure` checks the kink lemma on test draws.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lossgeom.flatness.relu_quotient import (
    input_smoothness,
    quotient_coordinates,
    quotient_flatness,
    smoothness_constants,
)
from lossgeom_book.checks import finite_tensor, positive, positive_int
from lossgeom_book.models import checked_inputs, checked_weights, regression_loss, relu_network
from lossgeom_book.relu_students import TeacherStudentTask


@dataclass(frozen=True)
class BallUnionSample:
    """Draws from the uniform law on ``U_i B(x_i, eps)`` and the overlap factor ``nu``."""

    x: torch.Tensor
    nu: float


def sample_ball_union(centres: torch.Tensor, radius: float, n_samples: int, seed: int = 0) -> BallUnionSample:
    """Exact draws from the uniform distribution on the union of the balls ``B(x_i, radius)``.

    A draw from the equal mixture of the balls is kept with probability ``1 / N(x)``,
    ``N(x)`` the number of balls holding x; the kept draws are uniform on the union. The
    density of that law is at most ``nu`` times the mixture's, with
    ``nu = n vol(B) / vol(union) = 1 / E_mixture[1 / N]`` (1 when no balls overlap),
    estimated from the mixture draws.
    """
    X = finite_tensor("centres", centres)
    r = positive("radius", radius)
    count = positive_int("n_samples", n_samples)
    n, d = X.shape
    g = torch.Generator().manual_seed(int(seed))
    kept, inverse_counts = [], []
    while sum(len(k) for k in kept) < count:
        which = torch.randint(n, (count,), generator=g)
        direction = torch.randn(count, d, generator=g, dtype=torch.float64)
        length = r * torch.rand(count, generator=g, dtype=torch.float64) ** (1.0 / d)
        draws = X[which] + direction / direction.norm(dim=1, keepdim=True) * length[:, None]
        inside = (torch.cdist(draws, X) <= r).sum(1).to(torch.float64)
        keep = torch.rand(count, generator=g, dtype=torch.float64) < 1.0 / inside
        kept.append(draws[keep])
        inverse_counts.append(1.0 / inside)
    return BallUnionSample(torch.cat(kept)[:count], float(1.0 / torch.cat(inverse_counts).mean()))


def kink_remainder(a: torch.Tensor, W: torch.Tensor, centres: torch.Tensor, radius: float) -> torch.Tensor:
    """``K_i = sum_r |alpha_r| (eps - |u_r^T x_i|)_+``: the largest departure of F from its tangent on ``B(x_i, eps)``.

    Only neurons whose kink ``u_r^T x = 0`` passes through the ball contribute. Shape ``(..., n)``.
    """
    r = positive("radius", radius)
    alpha, U = quotient_coordinates(a, W)
    x = checked_inputs(centres, U.shape[-1])
    return (alpha.abs()[..., None] * torch.clamp(r - (U @ x.T).abs(), min=0.0)).sum(-2)


@dataclass(frozen=True)
class GeneralisationBound:
    """The bound on ``E_gen = E_P[(F - f_*)^2 / 2] - L`` and its terms (each already times ``nu``)."""

    training: torch.Tensor
    flatness: torch.Tensor
    teacher: torch.Tensor
    kinks: torch.Tensor

    @property
    def total(self) -> torch.Tensor:
        return self.training + self.flatness + self.teacher + self.kinks


def generalisation_bound(a, W, task: TeacherStudentTask, radius: float, nu: float = 1.0) -> GeneralisationBound:
    """``E_gen <= nu [3 L + 3 eps^2/(d+2) (C Flat^Q_GN + S_*) + 3/(2n) sum_i K_i^2] - L``.

    Here ``C = kappa_* max(1, A_*^2) rho^-2`` (:func:`smoothness_constants`), ``S_*`` is the
    teacher's input smoothness and ``K_i`` the kink remainders of student plus teacher
    (:func:`kink_remainder`); the law is uniform on the union of ``B(x_i, eps)`` with
    overlap factor ``nu``. The chapter derives it: on each ball the error is the residual
    plus a linear term (mean square ``eps^2 ||grad (F - f_*)||^2 / (d + 2)``) plus at most
    ``K_i``; Minkowski's inequality and ``(p + q + s)^2 <= 3 (p^2 + q^2 + s^2)`` finish it.
    """
    r, nu = positive("radius", radius), positive("nu", nu)
    if nu < 1:
        raise ValueError(f"nu = n vol(B) / vol(union) is >= 1, got {nu}")

    x, y, d = task.x, task.y, task.x.shape[1]
    loss = regression_loss(a, W, x, y)
    constant = smoothness_constants(a, W, x).factor
    flat = quotient_flatness(a, W, x, y, part="gauss_newton")
    teacher_smooth = input_smoothness(task.teacher_a, task.teacher_W, x)
    K = kink_remainder(a, W, x, r) + kink_remainder(task.teacher_a, task.teacher_W, x, r)
    scale = 3 * r**2 / (d + 2)
    return GeneralisationBound(
        training=(3 * nu - 1) * loss,
        flatness=nu * scale * constant * flat,
        teacher=nu * scale * teacher_smooth * torch.ones_like(loss),
        kinks=nu * 1.5 * (K**2).mean(-1),
    )


def generalisation_error(a, W, task: TeacherStudentTask, test_x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Monte Carlo ``E_gen = mean_test (F - f_*)^2 / 2 - L`` and the standard error of the mean."""
    test_x = checked_inputs(test_x, task.x.shape[1])
    diff2 = 0.5 * (relu_network(a, W, test_x) - relu_network(task.teacher_a, task.teacher_W, test_x)) ** 2
    loss = regression_loss(a, W, task.x, task.y)
    return diff2.mean(-1) - loss, diff2.std(-1) / math.sqrt(test_x.shape[0])


@dataclass(frozen=True)
class TangentDeparture:
    """The kink lemma on test draws: ``|D(x) - r_i - grad D(x_i)^T (x - x_i)| <= K_i`` on ``B(x_i, eps)``.

    ``ratio_max[s]``: the largest ``|remainder| / K_i`` over the (draw, ball) pairs with ``K_i > 0``
    (at most 1 by the lemma); ``untouched_max[s]``: the largest ``|remainder|`` where ``K_i = 0``
    (no kink crosses the ball, so the remainder is 0 up to rounding); ``pairs``: how many pairs.
    """

    ratio_max: torch.Tensor
    untouched_max: torch.Tensor
    pairs: int


def tangent_departure(a, W, task: TeacherStudentTask, test_x: torch.Tensor, radius: float) -> TangentDeparture:
    """Check the kink remainder :func:`kink_remainder` of ``D = F - f_*`` at every test draw.

    Every draw ``x`` is paired with each ball ``B(x_i, radius)`` that holds it; the remainder
    is ``D(x) - D(x_i) - grad D(x_i)^T (x - x_i)`` and ``K_i`` sums the student's and the
    teacher's kink terms, as in :func:`generalisation_bound`.
    """
    r = positive("radius", radius)
    a, W, vector = checked_weights(a, W)
    if vector:
        raise ValueError("tangent_departure needs one-output networks (a of shape (..., m))")
    X = task.x
    test_x = checked_inputs(test_x, X.shape[1])
    pairs = (torch.cdist(test_x, X) <= r).nonzero()
    if pairs.shape[0] == 0:
        raise ValueError("no test draw lies in any ball B(x_i, radius)")
    draw, ball = pairs[:, 0], pairs[:, 1]

    def gap(x_eval):
        return relu_network(a, W, x_eval) - relu_network(task.teacher_a, task.teacher_W, x_eval)

    def input_gradient(a_, W_):  # grad_x F at the centres, (..., n, d)
        return ((W_ @ X.T > 0).to(X.dtype) * a_[..., None]).transpose(-1, -2) @ W_

    grad_gap = input_gradient(a, W) - input_gradient(task.teacher_a, task.teacher_W)
    remainder = gap(test_x)[..., draw] - gap(X)[..., ball] - (grad_gap[..., ball, :] * (test_x[draw] - X[ball])).sum(-1)
    K = (kink_remainder(a, W, X, r) + kink_remainder(task.teacher_a, task.teacher_W, X, r))[..., ball]
    crossed = K > 0
    ratio = torch.where(crossed, remainder.abs() / K.clamp_min(1e-300), torch.zeros_like(K))
    untouched = torch.where(crossed, torch.zeros_like(K), remainder.abs())
    return TangentDeparture(ratio.amax(-1), untouched.amax(-1), int(pairs.shape[0]))

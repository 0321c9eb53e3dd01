"""Tests of lossgeom_book.dynamics: quadratic GD, the optimiser lab, perturbed GD."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from lossgeom_book import dynamics
from lossgeom_book.dynamics import LAB_OBJECTIVES, LAB_OPTIMISERS, LabConfig, run_lab


# ----------------------------------------------------------------------------------
# Outside reference: a minimal transcription of seed 001's optimiser lab (`run` and its
# objectives), kept ONLY here to verify lossgeom_book.dynamics.run_lab against the source.
# It is a transcription of the seed's lab for verification, not package code.
# ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _SeedConfig:
    optimiser: str = "gd"
    objective: str = "ravine"
    learning_rate: float = 0.04
    steps: int = 120
    momentum: float = 0.9
    kappa: float = 20.0
    perturbation: float = 1e-3


def _seed_objective(name, x, y, kappa):
    if name == "ravine":
        return 0.5 * (x * x + kappa * y * y), (x, kappa * y)
    if name == "saddle":
        return 0.5 * x * x - 0.5 * y * y + 0.25 * y**4, (x, -y + y**3)
    if name == "plateau":
        return 0.5 * x * x + 0.25 * y**4, (x, y**3)
    raise ValueError(name)


def _seed_run(cfg):
    x, y = (0.0, cfg.perturbation) if cfg.objective != "ravine" else (4.0, 4.0)
    vx = vy = mx = my = sx = sy = 0.0
    rows = []
    for t in range(cfg.steps + 1):
        loss, (gx, gy) = _seed_objective(cfg.objective, x, y, cfg.kappa)
        rows.append((t, x, y, loss, math.hypot(gx, gy)))
        if t == cfg.steps:
            break
        if cfg.optimiser == "gd":
            dx, dy = gx, gy
        elif cfg.optimiser == "momentum":
            vx, vy = cfg.momentum * vx + gx, cfg.momentum * vy + gy
            dx, dy = vx, vy
        elif cfg.optimiser == "adam":
            b1, b2, n = cfg.momentum, 0.999, t + 1
            mx, my = b1 * mx + (1 - b1) * gx, b1 * my + (1 - b1) * gy
            sx, sy = b2 * sx + (1 - b2) * gx * gx, b2 * sy + (1 - b2) * gy * gy
            dx = (mx / (1 - b1**n)) / (math.sqrt(sx / (1 - b2**n)) + 1e-8)
            dy = (my / (1 - b1**n)) / (math.sqrt(sy / (1 - b2**n)) + 1e-8)
        else:
            raise ValueError(cfg.optimiser)
        x -= cfg.learning_rate * dx
        y -= cfg.learning_rate * dy
    return rows


LAB_CASES = [(o, ob, lr) for o in LAB_OPTIMISERS for ob in LAB_OBJECTIVES for lr in (0.04, 0.1)]


def _agree_to_10_digits(a, b):
    """Relative agreement to 10 significant digits (absolute 1e-300 floor for exact zeros)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    return np.all(np.abs(a - b) <= 5e-11 * np.maximum(np.abs(a), np.abs(b)) + 1e-300)


@pytest.mark.parametrize("optimiser,objective,lr", LAB_CASES, ids=[f"{o}-{ob}-{lr}" for o, ob, lr in LAB_CASES])
def test_run_lab_reproduces_the_seed_lab_to_10_digits(optimiser, objective, lr):
    ref = np.array(_seed_run(_SeedConfig(optimiser, objective, lr, 120)))
    ours = run_lab(LabConfig(optimiser, objective, lr, 120))
    for column, values in zip((1, 2, 3, 4), (ours.x, ours.y, ours.loss, ours.grad_norm)):
        assert _agree_to_10_digits(values, ref[:, column])
    assert np.array_equal(ours.t, ref[:, 0])


def test_seed_self_check_facts():
    exact = run_lab(LabConfig(objective="saddle", learning_rate=0.1, steps=80, perturbation=0.0))
    escaped = run_lab(LabConfig(objective="saddle", learning_rate=0.1, steps=80, perturbation=1e-3))
    plateau = run_lab(LabConfig(objective="plateau", learning_rate=0.1, steps=80, perturbation=1e-3))
    assert exact.loss[-1] == 0.0 and np.all(exact.x == 0.0) and np.all(exact.y == 0.0)
    assert escaped.loss[-1] < -0.20
    assert np.all(plateau.loss >= 0.0)


def test_ravine_at_eta_kappa_two_oscillates_forever():
    # eta * kappa = 0.1 * 20 = 2: the steep coordinate is multiplied by exactly -1 per step
    run = run_lab(LabConfig("gd", "ravine", 0.1, 40))
    assert np.all(np.abs(run.y) == 4.0) and np.all(np.sign(run.y[1:]) == -np.sign(run.y[:-1]))
    assert np.allclose(run.x, 4.0 * 0.9 ** np.arange(41), rtol=1e-14)


@pytest.mark.parametrize("name,point", [("ravine", (0.3, -1.2)), ("saddle", (0.7, 0.4)), ("plateau", (-0.2, 1.5))])
def test_lab_gradients_match_central_differences(name, point):
    x, y = point
    _, grad = dynamics.lab_objective(name, x, y)
    h = 1e-6
    fd = [
        (dynamics.lab_objective(name, x + h, y)[0] - dynamics.lab_objective(name, x - h, y)[0]) / (2 * h),
        (dynamics.lab_objective(name, x, y + h)[0] - dynamics.lab_objective(name, x, y - h)[0]) / (2 * h),
    ]
    np.testing.assert_allclose(grad, fd, rtol=1e-8, atol=1e-8)


# ---------------------------------------------------------------------------- quadratic


def test_gd_quadratic_multiplies_each_eigencomponent_by_one_minus_eta_lambda():
    rng = np.random.default_rng(3)
    Q, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    lam = np.array([0.1, 1.0, 3.0, 7.0])
    H = Q @ np.diag(lam) @ Q.T
    start, w_star, eta, steps = rng.standard_normal(4), rng.standard_normal(4), 0.25, 30
    path = dynamics.gd_quadratic(H, start, eta, steps, minimiser=w_star)
    coords = (path - w_star) @ Q
    powers = dynamics.contraction_factors(lam, eta)[None, :] ** np.arange(steps + 1)[:, None]
    predicted = ((start - w_star) @ Q)[None, :] * powers
    np.testing.assert_allclose(coords, predicted, rtol=1e-9, atol=1e-12)
    # eta * lambda = 1.75 for lambda = 7: oscillating (sign flips) yet shrinking
    assert np.all(np.diff(np.sign(coords[:10, 3])) != 0)


def test_gd_quadratic_diverges_beyond_two_over_lambda():
    path = dynamics.gd_quadratic(np.diag([1.0, 10.0]), [1.0, 1.0], 0.21, 50)
    # eta * lambda = 2.1 > 2: the factor is -1.1, so |error| grows like 1.1^t
    assert abs(path[-1, 1]) > 100 and np.isclose(abs(path[-1, 1]), 1.1**50, rtol=1e-10)
    assert abs(path[-1, 0]) < 1e-4


def test_quadratic_errors():
    with pytest.raises(ValueError, match="symmetric"):
        dynamics.gd_quadratic(np.array([[1.0, 2.0], [0.0, 1.0]]), [1.0, 1.0], 0.1, 3)
    with pytest.raises(ValueError, match="learning_rate must be > 0"):
        dynamics.gd_quadratic(np.eye(2), [1.0, 1.0], 0.0, 3)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        dynamics.gd_quadratic(np.eye(2), [1.0, 1.0], 0.1, 0)
    with pytest.raises(ValueError, match="start must have shape"):
        dynamics.gd_quadratic(np.eye(2), [1.0, 1.0, 1.0], 0.1, 3)
    with pytest.raises(ValueError, match="learning_rate must be > 0"):
        dynamics.contraction_factors([1.0], -0.1)


# ---------------------------------------------------------------------------- lab errors


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"optimiser": "rmsprop"}, "optimiser must be one of"),
        ({"objective": "bowl"}, "objective must be one of"),
        ({"learning_rate": 0.0}, "learning_rate must be > 0"),
        ({"learning_rate": -0.1}, "learning_rate must be > 0"),
        ({"steps": 0}, "steps must be >= 1"),
        ({"momentum": 1.0}, r"momentum must lie in \[0, 1\)"),
        ({"kappa": -1.0}, "kappa must be > 0"),
        ({"epsilon": -1e-8}, "epsilon must be >= 0"),
    ],
)
def test_lab_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LabConfig(**kwargs)


def test_lab_type_errors():
    with pytest.raises(TypeError, match="steps must be an int"):
        LabConfig(steps=1.5)
    with pytest.raises(TypeError, match="config must be a LabConfig"):
        run_lab({"optimiser": "gd"})
    with pytest.raises(ValueError, match="objective must be one of"):
        dynamics.lab_objective("bowl", 0.0, 0.0)


# ---------------------------------------------------------------------------- saddles


def test_plain_gd_on_the_stable_manifold_converges_to_the_saddle():
    run = dynamics.perturbed_gradient_descent(dynamics.saddle_loss_and_grad, [1.0, 0.0], 0.1, 300, radius=0.0)
    assert run.perturbed_at == () and np.all(run.path[:, 1] == 0.0)
    assert np.linalg.norm(run.path[-1]) < 1e-12 and abs(run.loss[-1]) < 1e-24


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_perturbed_gd_escapes_the_strict_saddle(seed):
    run = dynamics.perturbed_gradient_descent(
        dynamics.saddle_loss_and_grad, [1.0, 0.0], 0.1, 300, radius=1e-3, gradient_threshold=1e-3, wait=20, seed=seed
    )
    assert len(run.perturbed_at) >= 1
    assert run.loss[-1] < -0.2499 and abs(abs(run.path[-1, 1]) - 1.0) < 1e-3
    assert np.linalg.norm(run.path[run.perturbed_at[0] + 1] - run.path[run.perturbed_at[0]]) < 2e-3


def test_perturbation_stays_in_the_ball():
    run = dynamics.perturbed_gradient_descent(
        lambda w: (0.0, np.zeros_like(w)), np.zeros(5), 0.1, 50, radius=0.01, wait=1, seed=7
    )
    jumps = np.linalg.norm(np.diff(run.path, axis=0), axis=1)
    assert len(run.perturbed_at) >= 20 and np.all(jumps <= 0.01) and np.any(jumps > 0)


def test_perturbed_gd_errors():
    f = dynamics.saddle_loss_and_grad
    with pytest.raises(ValueError, match="radius must be >= 0"):
        dynamics.perturbed_gradient_descent(f, [1.0, 0.0], 0.1, 10, radius=-1.0)
    with pytest.raises(ValueError, match="learning_rate must be > 0"):
        dynamics.perturbed_gradient_descent(f, [1.0, 0.0], 0.0, 10)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        dynamics.perturbed_gradient_descent(f, [1.0, 0.0], 0.1, 0)
    with pytest.raises(ValueError, match="start must have 1 dimension"):
        dynamics.perturbed_gradient_descent(f, [[1.0, 0.0]], 0.1, 10)


# ---------------------------------------------------------------------------- lab reference


@pytest.mark.parametrize("optimiser,objective,lr", LAB_CASES, ids=[f"{o}-{ob}-{lr}" for o, ob, lr in LAB_CASES])
def test_torch_optim_reference_agrees_with_the_seed_transcription(optimiser, objective, lr):
    # the reference the chapter compares with is itself checked against the seed's lab
    ref = np.array(_seed_run(_SeedConfig(optimiser, objective, lr, 120)))
    torch_run = dynamics.run_lab_torch_optim(LabConfig(optimiser, objective, lr, 120))
    for column, values in zip((1, 2, 3, 4), (torch_run.x, torch_run.y, torch_run.loss, torch_run.grad_norm)):
        assert _agree_to_10_digits(values, ref[:, column])


def test_run_lab_grid_and_discrepancy():
    ours = dynamics.run_lab_grid((0.04, 0.1), 60)
    reference = dynamics.run_lab_grid((0.04, 0.1), 60, runner=dynamics.run_lab_torch_optim)
    assert len(ours) == 18 and set(ours) == set(reference)
    assert all(run.t.size == 61 for run in ours.values())
    gaps = [dynamics.trajectory_discrepancy(ours[k], reference[k]) for k in ours]
    assert max(gaps) < 1e-10
    # a run compared with itself has no discrepancy; a different run has a large one
    run = ours[("gd", "ravine", 0.04)]
    assert dynamics.trajectory_discrepancy(run, run) == 0.0
    assert dynamics.trajectory_discrepancy(run, ours[("gd", "ravine", 0.1)]) > 0.5


def test_trajectory_discrepancy_is_the_largest_pointwise_relative_difference():
    base = run_lab(LabConfig("gd", "ravine", 0.04, 5))
    shifted = dataclasses.replace(base, x=base.x * (1 + 1e-6))
    assert dynamics.trajectory_discrepancy(base, shifted) == pytest.approx(1e-6 / (1 + 1e-6), rel=1e-6)


def test_lab_reference_errors():
    run = run_lab(LabConfig(steps=3))
    with pytest.raises(TypeError, match="config must be a LabConfig"):
        dynamics.run_lab_torch_optim("gd")
    with pytest.raises(TypeError, match="second must be a LabTrajectory"):
        dynamics.trajectory_discrepancy(run, run.x)
    with pytest.raises(ValueError, match="same number of points"):
        dynamics.trajectory_discrepancy(run, run_lab(LabConfig(steps=4)))
    with pytest.raises(ValueError, match="learning_rates must be > 0"):
        dynamics.run_lab_grid((0.1, -0.1), 3)


def test_first_step_below():
    assert dynamics.first_step_below([3.0, 2.0, 1.0, 0.0], 1.5) == 2
    assert dynamics.first_step_below([3.0, 2.0], 1.0) is None
    with pytest.raises(ValueError, match="values must have 1 dimension"):
        dynamics.first_step_below([[1.0]], 0.0)


# ---------------------------------------------------------------------------- stationarity


def _quadratic_loss(hessian, gradient):
    H, g = torch.tensor(hessian), torch.tensor(gradient)

    def loss(params):
        w = params["w"]
        return 0.5 * w @ H @ w + g @ w

    return loss


def test_second_order_stationarity_matches_a_dense_quadratic():
    rng = np.random.default_rng(0)
    Q, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    eigenvalues = np.array([-0.7, 0.0, 0.3, 1.0, 2.0, 5.0])
    H = Q @ np.diag(eigenvalues) @ Q.T
    g = rng.standard_normal(6)
    w = rng.standard_normal(6)
    report = dynamics.second_order_stationarity(_quadratic_loss(H, g), {"w": torch.tensor(w)})
    assert report.gradient_norm == pytest.approx(np.linalg.norm(H @ w + g), rel=1e-12)
    assert report.smallest_eigenvalue == pytest.approx(-0.7, rel=1e-8)
    assert report.largest_eigenvalue == pytest.approx(5.0, rel=1e-8)
    assert report.loss == pytest.approx(0.5 * w @ H @ w + g @ w, rel=1e-12)
    assert not report.is_second_order_stationary(1e3, 0.5)  # negative curvature below -0.5
    assert report.is_second_order_stationary(1e3, 0.8)
    assert not report.is_second_order_stationary(1e-3, 0.8)  # gradient too large


def test_a_strict_saddle_is_first_but_not_second_order_stationary():
    report = dynamics.second_order_stationarity(
        _quadratic_loss(np.diag([1.0, 2.0, -1.0]), np.zeros(3)), {"w": torch.zeros(3)}
    )
    assert report.gradient_norm == 0.0
    assert report.smallest_eigenvalue == pytest.approx(-1.0, rel=1e-10)
    assert not report.is_second_order_stationary(1e-8, 0.5)
    with pytest.raises(ValueError, match="gradient_tol must be > 0"):
        report.is_second_order_stationary(0.0, 0.5)
    with pytest.raises(ValueError, match="curvature_tol must be > 0"):
        report.is_second_order_stationary(1e-3, -1.0)

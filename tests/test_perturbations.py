"""Perturbation sets (Chapter 3): transformed circles, exact maxima, Gaussian noise."""
import math

import numpy as np
import pytest

from conftest import assert_close
from lossgeom import perturbations as pt
from lossgeom.landscape import plane_grid
from lossgeom.product import loss_at


@pytest.mark.parametrize("c", [0.1, 2.0, 10.0])
def test_transformed_circle_agrees_pointwise_and_control_differs(c):
    r = pt.transformed_circle_receipt(c, 0.1, 64)
    assert r.max_pointwise_discrepancy <= 1e-15
    assert r.sampled_max_transformed == pytest.approx(r.sampled_max_balanced, rel=1e-12)
    assert abs(r.sampled_max_control - r.sampled_max_balanced) > 1e-3 * r.sampled_max_balanced


@pytest.mark.parametrize("radius", [0.01, 0.1, 0.5, 0.8, 2.0])
def test_exact_circle_max_bounds_a_dense_grid_and_is_attained(radius):
    angles = pt.angular_grid(200_000)
    dense = loss_at(pt.circle(np.ones(2), radius, angles)).max()
    exact = pt.product_circle_max(radius)
    assert dense <= exact * (1 + 1e-12)
    assert dense == pytest.approx(exact, rel=1e-8)


def test_grid_missing_the_maximiser_is_a_strict_lower_bound():
    exact = pt.product_circle_max(0.1)
    hit = loss_at(pt.circle(np.ones(2), 0.1, pt.angular_grid(8))).max()
    miss = loss_at(pt.circle(np.ones(2), 0.1, pt.angular_grid(6))).max()
    assert hit == pytest.approx(exact, rel=1e-13)
    assert miss < exact * (1 - 1e-3)


@pytest.mark.parametrize("a,b", [(1.0, 1.0), (10.0, 0.1), (0.3, -2.0)])
def test_gaussian_expected_loss_matches_monte_carlo(a, b):
    exact = pt.gaussian_expected_loss(a, b, 0.05)
    mean, se = pt.monte_carlo_expected_loss(a, b, 0.05, 400_000, seed=3)
    assert abs(mean - exact) < 5 * se


def test_gaussian_expected_loss_values_at_the_two_points():
    assert pt.gaussian_expected_loss(1, 1, 0.01) == pytest.approx(0.5 * (2e-4 + 1e-8), rel=1e-13)
    assert pt.gaussian_expected_loss(10, 0.1, 0.01) == pytest.approx(0.5 * (100.01e-4 + 1e-8), rel=1e-12)


def test_plane_grid_geometry_and_errors():
    S, T, pts = plane_grid([1.0, 2.0], [1.0, 0.0], [0.0, 2.0], 0.5, 3)
    assert pts.shape == (3, 3, 2)
    assert_close(pts[0, 0], [0.5, 1.0])
    assert_close(pts[2, 2], [1.5, 3.0])
    with pytest.raises(ValueError, match="linearly independent"):
        plane_grid([0.0, 0.0], [1.0, 1.0], [2.0, 2.0], 1.0, 5)
    with pytest.raises(ValueError, match=r"d1 must have shape \(2,\)"):
        plane_grid([0.0, 0.0], [1.0, 1.0, 0.0], [2.0, 2.0], 1.0, 5)
    with pytest.raises(ValueError, match="resolution must be >= 2"):
        plane_grid([0.0, 0.0], [1.0, 0.0], [0.0, 1.0], 1.0, 1)


def test_perturbation_errors_are_named():
    with pytest.raises(ValueError, match="radius must be > 0"):
        pt.circle(np.ones(2), -0.1, pt.angular_grid(4))
    with pytest.raises(ValueError, match=r"centre must have shape \(2,\)"):
        pt.circle(np.ones(3), 0.1, pt.angular_grid(4))
    with pytest.raises(ValueError, match="n must be >= 1"):
        pt.angular_grid(0)
    with pytest.raises(ValueError, match="sd must be > 0"):
        pt.gaussian_expected_loss(1, 1, 0.0)
    with pytest.raises(ValueError, match="n_samples must be >= 2"):
        pt.monte_carlo_expected_loss(1, 1, 0.1, 1, seed=0)


def _product_gradient(p):
    from lossgeom.product import gradient
    return gradient(p[0], p[1])


def test_euclidean_sam_matches_the_definition():
    p = np.array([1.2, 1.1])
    g = _product_gradient(p)
    eps = 0.05 * g / np.linalg.norm(g)
    expected = p - 0.1 * _product_gradient(p + eps)
    assert_close(pt.sam_step(_product_gradient, p, 0.05, 0.1), expected, rtol=1e-15, atol=0)


@pytest.mark.parametrize("c", [0.2, 3.0, 10.0])
def test_transformed_sam_commutes_with_the_rescaling_and_euclidean_sam_does_not(c):
    from lossgeom.product import rescale
    u = np.array([1.2, 1.1])
    J = np.diag([c, 1 / c])
    balanced_step = pt.sam_step(_product_gradient, u, 0.05, 0.1)
    transformed_step = pt.sam_step(_product_gradient, rescale(u, c), 0.05, 0.1, preconditioner=J @ J.T)
    assert_close(transformed_step, rescale(balanced_step, c), rtol=1e-13, atol=1e-15)
    euclidean_step = pt.sam_step(_product_gradient, rescale(u, c), 0.05, 0.1)
    assert abs(np.prod(euclidean_step) - np.prod(balanced_step)) > 1e-3


def test_sam_errors_are_named():
    with pytest.raises(ValueError, match="gradient is zero"):
        pt.sam_step(_product_gradient, np.array([1.0, 1.0]), 0.05, 0.1)
    with pytest.raises(ValueError, match="symmetric positive definite"):
        pt.sam_step(_product_gradient, np.array([1.2, 1.0]), 0.05, 0.1, preconditioner=-np.eye(2))
    with pytest.raises(ValueError, match="lr must be > 0"):
        pt.sam_step(_product_gradient, np.array([1.2, 1.0]), 0.05, 0.0)

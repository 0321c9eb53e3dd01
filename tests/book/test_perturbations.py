"""Perturbation sets (``ch03_perturbation_sets``): transformed circles, exact maxima, Gaussian noise."""

import numpy as np
import pytest

from lossgeom.landscape import plane_grid
from lossgeom_book import perturbations as pt
from lossgeom_book.product import loss_at

from conftest import assert_close


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
    from lossgeom_book.product import gradient

    return gradient(p[0], p[1])


def test_euclidean_sam_matches_the_definition():
    p = np.array([1.2, 1.1])
    g = _product_gradient(p)
    eps = 0.05 * g / np.linalg.norm(g)
    expected = p - 0.1 * _product_gradient(p + eps)
    assert_close(pt.sam_step(_product_gradient, p, 0.05, 0.1), expected, rtol=1e-15, atol=0)


def test_sam_ascent_maximises_the_linearised_loss_over_the_ellipse():
    """eps = rho A g / sqrt(g^T A g) lies on e^T A^-1 e = rho^2 and maximises <g, e> there."""
    p, A, rho = np.array([1.3, 0.9]), np.diag([9.0, 1 / 9.0]), 0.05
    g = _product_gradient(p)
    calls = []

    def recording_gradient(q):
        calls.append(np.array(q))
        return g

    after = pt.sam_step(recording_gradient, p, rho, 1.0, ascent_metric=A)
    assert_close(after, p - g, rtol=1e-15, atol=0)  # the descent is Euclidean by default
    eps = calls[1] - calls[0]
    assert eps @ np.linalg.solve(A, eps) == pytest.approx(rho**2, rel=1e-12)
    t = pt.angular_grid(100_000)
    boundary = rho * np.stack([np.cos(t), np.sin(t)], axis=-1) * np.sqrt(np.diag(A))
    assert g @ eps == pytest.approx((boundary @ g).max(), rel=1e-8)
    assert g @ eps >= (boundary @ g).max() * (1 - 1e-12)


def test_gradient_step_with_metric_is_the_balanced_step_mapped_back():
    u, c = np.array([1.2, 1.1]), 3.0
    from lossgeom_book.product import rescale

    balanced = pt.gradient_step(_product_gradient, u, 0.05)
    mapped = pt.gradient_step(_product_gradient, rescale(u, c), 0.05, metric=pt.rescaling_metric(c))
    assert_close(mapped, rescale(balanced, c), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("c", [0.3, 3.0, 10.0])
def test_only_fully_transformed_rules_commute_with_the_rescaling(c):
    from lossgeom_book.product import rescale

    u = np.array([1.2, 1.1])
    for name in pt.UPDATE_RULES:
        balanced = pt.update_rule(name, 1.0, 0.05, 0.005)(u)
        moved = pt.update_rule(name, c, 0.05, 0.005)(rescale(u, c))
        gap = abs(np.prod(moved) - np.prod(balanced))
        if name in ("transformed GD", "transformed SAM"):
            assert_close(moved, rescale(balanced, c), rtol=1e-13, atol=1e-15)
        else:
            assert gap > 1e-3, name


def test_rules_reduce_to_their_euclidean_forms_at_c_equal_one():
    u = np.array([1.2, 1.1])
    step = {name: pt.update_rule(name, 1.0, 0.05, 0.01)(u) for name in pt.UPDATE_RULES}
    assert np.array_equal(step["plain GD"], step["transformed GD"])
    assert_close(step["Euclidean SAM"], step["transformed SAM"], rtol=1e-15, atol=0)
    assert_close(step["Euclidean SAM"], step["transformed ascent, Euclidean descent"], rtol=1e-15, atol=0)
    assert_close(step["Euclidean SAM"], step["Euclidean ascent, transformed descent"], rtol=1e-15, atol=0)


def test_the_four_sam_rules_are_the_two_by_two_of_ascent_and_descent_metrics():
    """Each SAM rule is sam_step with exactly its named ingredients drawn in J J^T."""
    u, c, rho, lr = np.array([3.6, 0.4]), 3.0, 0.05, 0.005
    M = pt.rescaling_metric(c)
    expected = {
        "Euclidean SAM": pt.sam_step(_product_gradient, u, rho, lr),
        "transformed ascent, Euclidean descent": pt.sam_step(_product_gradient, u, rho, lr, ascent_metric=M),
        "Euclidean ascent, transformed descent": pt.sam_step(_product_gradient, u, rho, lr, descent_metric=M),
        "transformed SAM": pt.sam_step(_product_gradient, u, rho, lr, ascent_metric=M, descent_metric=M),
    }
    for name, value in expected.items():
        assert np.array_equal(pt.update_rule(name, c, rho, lr)(u), value), name
    assert len({tuple(v) for v in expected.values()}) == 4  # four different steps at c != 1


def test_euclidean_ascent_with_transformed_descent_is_the_balanced_step_with_a_moved_ball():
    """With the descent transformed, the only non-invariant part left is the ball: the step
    from (c u, v / c) equals the balanced step whose ascent uses the metric J^-1 J^-T."""
    from lossgeom_book.product import rescale

    u, c, rho, lr = np.array([1.2, 1.1]), 3.0, 0.05, 0.005
    moved = pt.update_rule("Euclidean ascent, transformed descent", c, rho, lr)(rescale(u, c))
    pulled_back_ball = np.diag([1 / c**2, c**2])  # the Euclidean ball at (c u, v / c) in balanced coordinates
    balanced = pt.sam_step(_product_gradient, u, rho, lr, ascent_metric=pulled_back_ball)
    assert_close(moved, rescale(balanced, c), rtol=1e-13, atol=1e-15)
    euclidean_balanced = pt.sam_step(_product_gradient, u, rho, lr)
    assert abs(np.prod(moved) - np.prod(euclidean_balanced)) > 1e-3


def test_trajectory_iterates_and_checks():
    path = pt.trajectory(lambda q: q / 2, np.array([1.0, 4.0]), 3)
    assert_close(path, [[1, 4], [0.5, 2], [0.25, 1], [0.125, 0.5]], rtol=0, atol=0)
    with pytest.raises(TypeError, match="step must be callable"):
        pt.trajectory(None, np.ones(2), 3)
    with pytest.raises(ValueError, match=r"step\(point\) must have shape"):
        pt.trajectory(lambda q: np.ones(3), np.ones(2), 1)


def test_sampled_circle_max_and_square_losses():
    assert pt.sampled_circle_max(0.1, 8) == pytest.approx(pt.product_circle_max(0.1), rel=1e-13)
    sq = pt.square_losses(3.0, 0.5, 5)
    assert sq.fixed.shape == sq.transformed.shape == (5, 5)
    assert_close(sq.transformed, sq.balanced, rtol=1e-13, atol=1e-15)
    assert sq.fixed[2, 2] == pytest.approx(0.0, abs=1e-15)  # the centre (3, 1/3) is on the orbit
    assert loss_at(np.array([3.5, 1 / 3 + 0.5])) == pytest.approx(sq.fixed[4, 4], rel=1e-14)


def test_sam_errors_are_named():
    with pytest.raises(ValueError, match="gradient is zero"):
        pt.sam_step(_product_gradient, np.array([1.0, 1.0]), 0.05, 0.1)
    with pytest.raises(ValueError, match="ascent_metric must be symmetric positive definite"):
        pt.sam_step(_product_gradient, np.array([1.2, 1.0]), 0.05, 0.1, ascent_metric=-np.eye(2))
    with pytest.raises(ValueError, match="descent_metric must be symmetric positive definite"):
        pt.sam_step(_product_gradient, np.array([1.2, 1.0]), 0.05, 0.1, descent_metric=np.diag([1.0, 0.0]))
    with pytest.raises(ValueError, match="lr must be > 0"):
        pt.sam_step(_product_gradient, np.array([1.2, 1.0]), 0.05, 0.0)
    with pytest.raises(ValueError, match="name must be one of"):
        pt.update_rule("Adam", 1.0, 0.05, 0.1)
    with pytest.raises(ValueError, match="c must be > 0"):
        pt.rescaling_metric(-1.0)
    with pytest.raises(TypeError, match="gradient must be callable"):
        pt.gradient_step(None, np.ones(2), 0.1)

"""The product model: analytic gradient and Hessian against autograd, eigenvalues, errors."""

import numpy as np
import pytest
import torch

from lossgeom.curvature import closure_gradient, closure_hessian
from lossgeom_book import product

from cases import PRODUCT_POINTS, SCALES, ids
from conftest import assert_close


@pytest.mark.parametrize("case", PRODUCT_POINTS, ids=ids(PRODUCT_POINTS))
def test_hessian_matches_autograd(case):
    a, b, x, y = case["a"], case["b"], case["x"], case["y"]
    assert_close(product.hessian(a, b, x, y), product.hessian_autograd(a, b, x, y), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("case", PRODUCT_POINTS, ids=ids(PRODUCT_POINTS))
def test_gradient_matches_autograd(case):
    a, b, x, y = case["a"], case["b"], case["x"], case["y"]
    xt, yt = torch.tensor(x), torch.tensor(y)
    auto = closure_gradient(lambda p: product.loss(p, xt, yt), product.params(a, b))
    assert_close(product.gradient(a, b, x, y), auto, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("c", SCALES)
def test_orbit_eigenvalues_are_zero_and_c2_plus_inverse(c):
    a, b = product.orbit_point(c)
    eig = np.linalg.eigvalsh(product.hessian_autograd(a, b))
    assert_close(eig[1], c**2 + c**-2, rtol=1e-12)
    assert abs(eig[0]) <= 1e-12 * eig[1]
    assert_close(product.nonzero_eigenvalue(c), eig[1], rtol=1e-12)


def test_nonzero_eigenvalue_is_minimal_at_balance():
    cs = np.geomspace(0.1, 10, 401)
    lam = product.nonzero_eigenvalue(cs)
    assert lam.min() >= 2.0 and np.isclose(lam[200], 2.0)


def test_taylor_slope_of_gradient():
    """Loss(p + h v) - Loss(p) - h g.v shrinks like h^2 (slope 2 on a log-log plot)."""
    rng = np.random.default_rng(0)
    p, v = np.array([0.7, -1.3]), rng.normal(size=2)
    f = lambda q: product.loss_at(q, x=2.0, y=0.5)
    g = product.gradient(*p, x=2.0, y=0.5)
    hs = np.array([1e-2, 1e-3])
    err = [abs(f(p + h * v) - f(p) - h * g @ v) for h in hs]
    slope = np.log(err[0] / err[1]) / np.log(hs[0] / hs[1])
    assert abs(slope - 2) < 0.05


def test_rescale_preserves_products_and_loss():
    rng = np.random.default_rng(1)
    pts = rng.normal(size=(50, 2))
    moved = product.rescale(pts, 7.5)
    assert_close(moved[:, 0] * moved[:, 1], pts[:, 0] * pts[:, 1], rtol=1e-14, atol=1e-14)
    assert_close(product.loss_at(moved), product.loss_at(pts), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_non_positive_or_non_finite_scale_is_rejected(bad):
    with pytest.raises(ValueError, match="c must be"):
        product.orbit_point(bad)
    with pytest.raises(ValueError, match="c must be"):
        product.rescale(np.ones(2), bad)


def test_bad_inputs_name_the_argument():
    with pytest.raises(TypeError, match="c must be a real number"):
        product.orbit_point("ten")
    with pytest.raises(ValueError, match=r"points must have shape \(\.\.\., 2\)"):
        product.loss_at(np.ones((4, 3)))
    with pytest.raises(ValueError, match="points must contain only finite values"):
        product.loss_at(np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="x and y must have the same shape"):
        product.loss(product.params(1, 1), torch.ones(3), torch.ones(2))
    with pytest.raises(ValueError, match="exactly the keys 'a' and 'b'"):
        product.forward({"a": torch.tensor(1.0)}, torch.ones(2))
    with pytest.raises(ValueError, match="a must be finite"):
        product.hessian(float("inf"), 1.0)


def test_largest_hessian_eigenvalue_follows_the_closed_form():
    for c in (0.3, 3.0, 10.0):
        value = product.largest_hessian_eigenvalue(product.params(*product.orbit_point(c)))
        assert_close(value, product.nonzero_eigenvalue(c), rtol=1e-12)


def test_tangent_line_loss_is_the_quartic_and_the_orbit_stays_at_zero():
    steps = np.linspace(-0.5, 0.5, 11)
    for c in (1.0, 3.0, 10.0):
        line = product.tangent_line(c, steps)
        assert_close(line[5], product.orbit_point(c), rtol=0, atol=0)
        expected = steps**4 / (2 * product.nonzero_eigenvalue(c) ** 2)
        assert_close(product.loss_at(line), expected, rtol=1e-9, atol=1e-17)
        assert product.loss_at(product.orbit_curve(c, steps)).max() <= 1e-28
    # the direction is the Hessian's null vector
    t_hat = product.tangent_line(3.0, np.array([1.0]))[0] - np.array(product.orbit_point(3.0))
    assert_close(product.hessian(*product.orbit_point(3.0)) @ t_hat, np.zeros(2), atol=1e-14)


def test_negative_curvature_rule_matches_the_eigenvalues():
    rng = np.random.default_rng(2)
    pts = rng.uniform(-2, 2, size=(300, 2))
    smallest = np.array([np.linalg.eigvalsh(product.hessian(p, q))[0] for p, q in pts])
    assert np.array_equal(product.negative_curvature_predicted(pts[:, 0], pts[:, 1]), smallest < 0)


@pytest.mark.parametrize("a,b", [(2.0, 1.0), (2.0, 0.5), (0.3, 1.7)])
def test_log_coordinate_hessian_is_the_chain_rule(a, b):
    J = np.diag([a, b])
    expected = J @ product.hessian(a, b) @ J + (a * b - 1) * a * b * np.eye(2)
    assert_close(product.log_coordinate_hessian(a, b), expected, rtol=1e-12, atol=1e-13)
    with pytest.raises(ValueError, match="a must be > 0"):
        product.log_coordinate_hessian(-a, b)


def test_dataset_loss_and_hessian_agree_with_autograd():
    x, y = product.regression_sample(7, noise=0.5, seed=4)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    for a, b in [(0.7, -1.3), (1.0, 1.0), (2.0, 0.05)]:
        auto = closure_hessian(lambda p: product.loss(p, xt, yt), product.params(a, b)).numpy()
        assert_close(product.dataset_hessian(a, b, x, y), auto, rtol=1e-12, atol=1e-13)
        assert_close(product.dataset_loss(a, b, x, y), product.loss(product.params(a, b), xt, yt).item())


def test_gradient_descent_decreases_the_loss_and_keeps_the_balance_nearly():
    x, y = product.regression_sample(20, noise=0.5, seed=1)
    a, b = product.gradient_descent(2.0, 0.01, x, y, lr=0.01, steps=200)
    assert product.dataset_loss(a, b, x, y) < product.dataset_loss(2.0, 0.01, x, y)
    # gradient flow conserves a^2 - b^2; small steps nearly do
    assert abs((a * a - b * b) - (4.0 - 1e-4)) < 0.05


def test_balanced_representative_keeps_the_function():
    for a, b in [(3.0, 0.5), (-2.0, 0.5), (0.0, 4.0)]:
        ra, rb = product.balanced_representative(a, b)
        assert ra * rb == pytest.approx(a * b, abs=1e-15)
        assert abs(ra) == pytest.approx(abs(rb))


def test_regression_sample_is_seeded_and_checked():
    x1, y1 = product.regression_sample(5, noise=0.5, seed=0)
    x2, y2 = product.regression_sample(5, noise=0.5, seed=0)
    assert np.array_equal(x1, x2) and np.array_equal(y1, y2)
    with pytest.raises(ValueError, match="noise must be > 0"):
        product.regression_sample(5, noise=0.0, seed=0)
    with pytest.raises(ValueError, match="x and y must be non-empty and of one shape"):
        product.dataset_loss(1.0, 1.0, np.ones(3), np.ones(2))

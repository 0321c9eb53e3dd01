"""The product model: analytic gradient and Hessian against autograd, eigenvalues, errors."""
import numpy as np
import pytest
import torch

from cases import PRODUCT_POINTS, SCALES, ids
from conftest import assert_close
from lossgeom import product
from lossgeom.curvature import dense_gradient


@pytest.mark.parametrize("case", PRODUCT_POINTS, ids=ids(PRODUCT_POINTS))
def test_hessian_matches_autograd(case):
    a, b, x, y = case["a"], case["b"], case["x"], case["y"]
    assert_close(product.hessian(a, b, x, y), product.hessian_autograd(a, b, x, y), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("case", PRODUCT_POINTS, ids=ids(PRODUCT_POINTS))
def test_gradient_matches_autograd(case):
    a, b, x, y = case["a"], case["b"], case["x"], case["y"]
    xt, yt = torch.tensor(x), torch.tensor(y)
    auto = dense_gradient(lambda p: product.loss(p, xt, yt), product.params(a, b))
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

"""Certificates: the counterexample, the sound bound against autograd and on random instances, errors."""

import math

import numpy as np
import pytest
import torch

from lossgeom import flatness
from lossgeom.flatness import softmax_gauge as sm
from lossgeom_book import certificates as cert

from conftest import assert_close

W_STAR = torch.tensor([[0.0], [math.log(2.0)]])
H_ONE = torch.tensor([1.0])


def random_instance(seed, K=5, d=4, scale=2.0):
    gen = torch.Generator().manual_seed(seed)
    W = scale * torch.randn(K, d, generator=gen, dtype=torch.float64)
    h = torch.randn(6, d, generator=gen, dtype=torch.float64)
    y = torch.randint(0, K, (6,), generator=gen)
    return W, h, y, gen


def test_counterexample_numbers():
    increase = float(cert.loss_increase(W_STAR, H_ONE, 1, torch.tensor([-0.01])))
    assert increase == pytest.approx(math.log(1 + 2**-0.99) - math.log(1.5), rel=1e-12)
    b = float(flatness.b_raw(W_STAR, H_ONE))
    assert b == pytest.approx(math.log(2) ** 2 * 4 / 9, rel=1e-14)
    pub = cert.published_expression(0.01, b, r=0.99, K=2, m=1)
    assert pub == pytest.approx(1.0e-4 / (2 * 0.99**2) * b + 1e-6 / (24 * 0.99**3) * 2, rel=1e-14)
    assert increase / pub > 210
    radius = cert.published_radius(1e-4, b, r=0.99, K=2, m=1)
    assert cert.published_expression(radius, b, 0.99, 2, 1) == pytest.approx(1e-4, rel=1e-12)
    assert 0.01 < radius and f"{radius:.3g}" == "0.0299"
    # the sound bound covers the same perturbation
    assert float(cert.sound_bound(W_STAR, H_ONE, 1, 0.01)) >= increase


def test_feature_gradient_and_loss_match_autograd():
    W, h, y, _ = random_instance(0)
    loss = lambda x: torch.nn.functional.cross_entropy(x @ W.T, y, reduction="sum")
    assert_close(cert.feature_gradient(W, h, y), torch.func.grad(loss)(h), rtol=1e-12, atol=1e-14)
    reference = torch.nn.functional.cross_entropy(h @ W.T, y, reduction="none")
    assert_close(cert.cross_entropy(W, h, y), reference, rtol=1e-13)
    d = 0.1 * torch.randn(h.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    naive = cert.cross_entropy(W, h + d, y) - cert.cross_entropy(W, h, y)
    assert_close(cert.loss_increase(W, h, y, d), naive, rtol=1e-10, atol=1e-14)


def test_loss_increase_is_accurate_for_tiny_steps_and_confident_examples():
    W = torch.tensor([[40.0, 0.0], [0.0, 0.0], [-3.0, 1.0]])
    h, y = torch.tensor([1.0, 0.5]), 0
    g = cert.feature_gradient(W, h, y)
    assert g.norm() > 0  # p_y = 1 - 4e-18 does not round the gradient away
    u = g / g.norm()
    for rho in (1e-12, 1e-9):
        ratio = float(cert.loss_increase(W, h, y, rho * u)) / (rho * float(g.norm()))
        assert ratio == pytest.approx(1.0, rel=1e-6)


def test_row_diameter_and_shift_invariance():
    W, h, y, gen = random_instance(2)
    dense = max(float((W[i] - W[j]).norm()) for i in range(5) for j in range(5))
    assert float(cert.row_diameter(W)) == pytest.approx(dense, rel=1e-14)
    v = 30 * torch.randn(W.shape[1], generator=gen, dtype=torch.float64)
    Wv = sm.common_row_shift(W, v)
    assert float(cert.row_diameter(Wv)) == pytest.approx(dense, rel=1e-12)
    assert_close(cert.feature_gradient(Wv, h, y), cert.feature_gradient(W, h, y), rtol=1e-9, atol=1e-10)
    assert_close(cert.sound_radius(Wv, h, y, 0.1), cert.sound_radius(W, h, y, 0.1), rtol=1e-9)
    assert not torch.allclose(cert.raw_quadratic(Wv, h, 0.1), cert.raw_quadratic(W, h, 0.1))


def test_feature_hessian_is_bounded_by_quarter_diameter_squared():
    W, h, y, _ = random_instance(3)
    D2 = float(cert.row_diameter(W)) ** 2
    for x, label in zip(h, y):
        hess = torch.autograd.functional.hessian(lambda t, label=label: cert.cross_entropy(W, t, label), x)
        assert_close(hess, W.T @ sm.covariance(sm.probabilities(W, x)) @ W, rtol=1e-11, atol=1e-13)
        assert float(torch.linalg.eigvalsh(hess)[-1]) <= D2 / 4 * (1 + 1e-12)
    # attained: balanced binary softmax with rows D u apart
    u = torch.tensor([0.6, 0.8])
    W2 = torch.stack([-1.5 * u, 1.5 * u])
    hess = torch.autograd.functional.hessian(lambda t: cert.cross_entropy(W2, t, 0), torch.tensor([0.8, -0.6]))
    assert float(torch.linalg.eigvalsh(hess)[-1]) == pytest.approx(3.0**2 / 4, rel=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_sound_bound_holds_on_random_instances(seed):
    W, h, y, gen = random_instance(seed, K=2 + seed, d=1 + seed % 3, scale=0.5 + seed)
    for scale in (1e-4, 1e-2, 1.0, 10.0):
        d = scale * torch.randn(h.shape, generator=gen, dtype=torch.float64)
        actual = cert.loss_increase(W, h, y, d)
        bound = cert.sound_bound(W, h, y, d.norm(dim=-1))
        assert torch.all(actual <= bound * (1 + 1e-10) + 1e-15)


def test_sound_radius_solves_the_bound():
    W, h, y, _ = random_instance(4)
    rho = cert.sound_radius(W, h, y, 0.05)
    assert_close(cert.sound_bound(W, h, y, rho), torch.full_like(rho, 0.05), rtol=1e-12)
    W0 = torch.ones(3, 4)  # all rows equal: D_W = 0 and the loss is constant in h
    assert torch.isinf(cert.sound_radius(W0, h[0], 0, 0.1))


def test_curvature_only_radius_solves_the_raw_quadratic():
    W, h, _, _ = random_instance(5)
    rho = cert.curvature_only_radius(W, h, 0.1)
    assert_close(cert.raw_quadratic(W, h, rho), torch.full_like(rho, 0.1), rtol=1e-12)
    delta = 1e-3
    expected = delta**2 / 2 * flatness.b_raw(W, h, reduction="none")
    assert_close(cert.raw_quadratic(W, h, delta * h.norm(dim=-1)), expected, rtol=1e-12)


def test_errors_are_named():
    W, h, y, _ = random_instance(0)
    with pytest.raises(ValueError, match="epsilon must be > 0"):
        cert.sound_radius(W, h, y, 0.0)
    with pytest.raises(ValueError, match="epsilon must be > 0"):
        cert.curvature_only_radius(W, h, -1.0)
    with pytest.raises(ValueError, match="epsilon must be > 0"):
        cert.published_radius(0.0, 0.2, 0.99, 2, 1)
    with pytest.raises(ValueError, match="r must be > 0"):
        cert.published_expression(0.01, 0.2, 0.0, 2, 1)
    with pytest.raises(ValueError, match="K must be >= 2"):
        cert.published_expression(0.01, 0.2, 0.9, 1, 1)
    with pytest.raises(ValueError, match="delta and b_raw_value must be >= 0"):
        cert.published_expression(-0.01, 0.2, 0.9, 2, 1)
    with pytest.raises(ValueError, match=r"y must have shape \(6,\)"):
        cert.feature_gradient(W, h, y[:3])
    with pytest.raises(ValueError, match=r"y must hold class labels in 0..4"):
        cert.feature_gradient(W, h, torch.full((6,), 5))
    with pytest.raises(TypeError, match="y must hold integer class labels"):
        cert.cross_entropy(W, h, torch.zeros(6))
    with pytest.raises(ValueError, match="d must have the shape of h"):
        cert.loss_increase(W, h, y, h[0])
    with pytest.raises(ValueError, match="d_norm must be finite and >= 0"):
        cert.sound_bound(W, h, y, -1.0)
    with pytest.raises(ValueError, match="d_norm must be finite and >= 0"):
        cert.raw_quadratic(W, h, float("nan"))
    with pytest.raises(ValueError, match="W must be 2-D"):
        cert.row_diameter(torch.ones(3))
    with pytest.raises(ValueError, match="h must contain only finite"):
        cert.feature_gradient(W, torch.full((4,), float("inf")), 0)


def test_responses_along_gradient_recompute_each_column():
    W, h, y, _ = random_instance(7, K=4, d=3)
    deltas = (1e-4, 1e-2)
    out = cert.responses_along_gradient(W, h, y, deltas)
    g = torch.func.grad(lambda x: torch.nn.functional.cross_entropy(x @ W.T, y, reduction="sum"))(h)
    for dlt in deltas:
        size = dlt * h.norm(dim=-1)
        step = size[:, None] * g / g.norm(dim=-1, keepdim=True)
        naive = cert.cross_entropy(W, h + step, y) - cert.cross_entropy(W, h, y)
        assert_close(out[dlt]["actual"], naive, rtol=1e-8, atol=1e-15)
        assert_close(out[dlt]["raw"], dlt**2 / 2 * flatness.b_raw(W, h, reduction="none"), rtol=1e-12)
        assert_close(out[dlt]["linear"], size * g.norm(dim=-1), rtol=1e-12)
        assert torch.all(out[dlt]["actual"] <= out[dlt]["bound"])
    # linear / raw times Delta does not depend on Delta (an identity)
    scaled = [out[dlt]["linear"] / out[dlt]["raw"] * dlt for dlt in deltas]
    assert_close(scaled[0], scaled[1], rtol=1e-12)


def test_summary_and_table_of_pooled_responses():
    W, h, y, _ = random_instance(8, K=3, d=2)
    per_model = [
        cert.responses_along_gradient(W, h[:3], y[:3], (1e-3,)),
        cert.responses_along_gradient(W, h[3:], y[3:], (1e-3,)),
    ]
    pooled = cert.pool_responses(per_model)
    whole = cert.responses_along_gradient(W, h, y, (1e-3,))
    assert_close(pooled[1e-3]["actual"], whole[1e-3]["actual"], rtol=1e-14)
    row = cert.summarise_responses(pooled)[1e-3]
    r = {k: v.numpy() for k, v in whole[1e-3].items()}
    assert row["covered"] == 1.0 and row["exceed"] == float(np.mean(r["actual"] > r["raw"]))
    assert row["lin_raw"] == pytest.approx(float(np.median(r["linear"] / r["raw"])), rel=1e-14)
    assert row["tight_p90"] >= row["tight_median"] >= 1.0
    table = cert.response_table({1e-3: row}, {1e-3: {"covered": 1.0}})
    assert table.splitlines()[1].split("|")[3].split() == ["100%", "100%"]
    reported_cells = [cell.split()[1] for cell in table.splitlines()[1].split("|")[1:]]
    assert reported_cells == ["-", "-", "100%", "-", "-"]  # every unstated reported cell is '-'
    with pytest.raises(ValueError, match="per_model must be a non-empty list"):
        cert.pool_responses([])


def test_curvature_only_failures_and_random_instances():
    W, h, y, _ = random_instance(9)
    fails = cert.curvature_only_radius_fails(W, h, y, 0.1)
    g = cert.feature_gradient(W, h, y)
    rho = cert.curvature_only_radius(W, h, 0.1)
    direct = cert.cross_entropy(W, h + rho[:, None] * g / g.norm(dim=-1, keepdim=True), y) - cert.cross_entropy(W, h, y)
    assert torch.equal(fails, direct > 0.1)
    worst, count = cert.sound_bound_on_random_instances(n_classifiers=8, seed=3)
    assert count > 100 and worst >= 1.0
    with pytest.raises(ValueError, match="deltas must be a non-empty sequence"):
        cert.responses_along_gradient(W, h, y, ())
    with pytest.raises(ValueError, match="h must be a batch of features"):
        cert.responses_along_gradient(W, h[0], y[0], (1e-3,))
    with pytest.raises(ValueError, match="n_classifiers must be"):
        cert.sound_bound_on_random_instances(n_classifiers=0)

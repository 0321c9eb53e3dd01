"""Geodesic sharpness (da Silva, Dangel & Oore 2025) on ``nn.MultiheadAttention`` models.

Invariance under the attention gauge where adaptive sharpness moves, its first-order truncation
equal to adaptive sharpness, the Christoffel terms and the horizontal projection against
independent computations, bad arguments, and the caller's model left untouched.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lossgeom.flatness import LossPoint, adaptive_sharpness, geodesic_sharpness
from lossgeom.flatness.geodesic import _Geometry
from lossgeom.flatness.loss_point import NotApplicable
from lossgeom.symmetries.attention import attention_head_gauge, conditioned_matrix

E, HEADS, CLASSES = 8, 2, 3
D = E // HEADS


class Attend(nn.Module):
    """Self-attention over a few tokens, mean-pooled, then a linear classifier (float64)."""

    def __init__(self, bias: bool = True) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(E, HEADS, batch_first=True, bias=bias, dtype=torch.float64)
        self.head = nn.Linear(E, CLASSES, dtype=torch.float64)
        self.register_buffer("calls", torch.zeros((), dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.attn(x, x, x, need_weights=False)
        return self.head(h.mean(1))


def _data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(32, 5, E, generator=g, dtype=torch.float64), torch.randint(0, CLASSES, (32,), generator=g)


@pytest.fixture(scope="module")
def trained() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    model, data = Attend(), _data()
    optimiser = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(40):
        optimiser.zero_grad()
        nn.functional.cross_entropy(model(data[0]), data[1]).backward()
        optimiser.step()
    return model.eval(), data


def _gauged(model: nn.Module, scale: float, condition: float, seed: int) -> dict[str, torch.Tensor]:
    """Every head's query/key and value/output gauge, ``A = scale * M`` with ``M`` of the given condition number."""
    g = torch.Generator().manual_seed(seed)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    for head in range(HEADS):
        qk = scale * conditioned_matrix(D, condition, g)
        vo = conditioned_matrix(D, condition, g) / scale
        params = attention_head_gauge("attn", head, HEADS, qk, vo)(params)
    return params


#: (scale, condition number) of the gauge matrices: scales 1e-2..1e2, condition numbers up to 1e2
SWEEP = [(1e-2, 1.0), (1e-1, 10.0), (1.0, 100.0), (1e1, 10.0), (1e2, 100.0)]


@pytest.mark.parametrize(("metric", "order"), [("inv", 2), ("mix", 2), ("inv", 1)])
def test_geodesic_sharpness_is_gauge_invariant_where_adaptive_sharpness_is_not(trained, metric, order):
    model, data = trained
    loss = nn.CrossEntropyLoss()
    rho = 0.05
    before = geodesic_sharpness(model, loss, data, rho=rho, steps=3, metric=metric, order=order)
    adaptive = adaptive_sharpness(model, loss, data, rho=rho)
    assert before > 0 and adaptive > 0
    geodesic_ratios, adaptive_factors = [], []
    for i, (scale, condition) in enumerate(SWEEP):
        params = _gauged(model, scale, condition, seed=i)
        with torch.no_grad():  # the transform keeps the function (so the comparison is of the measures)
            same = torch.func.functional_call(model, params, (data[0],))
            assert torch.allclose(same, model(data[0]), rtol=1e-9, atol=1e-10)
        after = geodesic_sharpness(model, loss, data, params=params, rho=rho, steps=3, metric=metric, order=order)
        moved = adaptive_sharpness(model, loss, data, params=params, rho=rho)
        geodesic_ratios.append(after / before)
        adaptive_factors.append(max(moved / adaptive, adaptive / moved))
    # measured: |ratio - 1| <= 2e-12 (the gauge is an isometry of the metric that maps the truncated
    # geodesics onto themselves, so only rounding is left); adaptive sharpness moves by factors 6e2..9e5
    assert max(abs(r - 1.0) for r in geodesic_ratios) < 1e-9, geodesic_ratios
    assert max(adaptive_factors) > 100.0, adaptive_factors


def test_geodesic_sharpness_is_invariant_on_a_transformer_encoder_layer():
    torch.manual_seed(1)
    layer = nn.TransformerEncoderLayer(E, HEADS, dim_feedforward=16, dropout=0.0, batch_first=True)
    model = nn.Sequential(layer.to(torch.float64)).eval()
    x = torch.randn(16, 4, E, dtype=torch.float64)
    data = (x, torch.randn(16, 4, E, dtype=torch.float64))
    loss = nn.MSELoss()
    before = geodesic_sharpness(model, loss, data, rho=0.05)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    g = torch.Generator().manual_seed(3)
    for head in range(HEADS):
        gauge = attention_head_gauge(
            "0.self_attn", head, HEADS, 30.0 * conditioned_matrix(D, 50.0, g), conditioned_matrix(D, 50.0, g) / 30.0
        )
        params = gauge(params)
    after = geodesic_sharpness(model, loss, data, params=params, rho=0.05)
    assert before > 0 and abs(after / before - 1.0) < 1e-9
    # the residual stream and feed-forward dominate this loss, so adaptive sharpness moves less here
    # than on the attention classifier above (measured: by 12 %), but it moves
    moved = adaptive_sharpness(model, loss, data, params=params, rho=0.05) / adaptive_sharpness(
        model, loss, data, rho=0.05
    )
    assert abs(moved - 1.0) > 0.05, moved


@pytest.mark.parametrize("rho", [0.5, 0.05])
def test_first_order_truncation_in_the_adaptive_metric_is_adaptive_sharpness(trained, rho):
    model, data = trained
    loss = nn.CrossEntropyLoss()
    first = geodesic_sharpness(model, loss, data, rho=rho, metric="adaptive", order=1, steps=1)
    asam = adaptive_sharpness(model, loss, data, rho=rho)
    assert asam > 0 and abs(first - asam) < 1e-12
    params = _gauged(model, 10.0, 10.0, seed=5)  # at another point too, and with another eta
    first = geodesic_sharpness(model, loss, data, params=params, rho=rho, metric="adaptive", order=1, steps=1, eta=0.1)
    assert abs(first - adaptive_sharpness(model, loss, data, params=params, rho=rho, eta=0.1)) < 1e-12
    # the second-order term and more ascent steps are not ASAM: the test above can tell them apart
    second = geodesic_sharpness(model, loss, data, rho=rho, metric="adaptive", order=2, steps=1)
    assert abs(second - asam) > 1e-12


def test_more_steps_never_lower_the_value(trained):
    model, data = trained
    loss = nn.CrossEntropyLoss()
    values = [geodesic_sharpness(model, loss, data, rho=0.05, steps=s) for s in (1, 3, 8)]
    assert values[0] <= values[1] <= values[2]


def _metric_form(geometry: _Geometry, metric: str, eta: float, weight: torch.Tensor):
    """An independent ``q(theta, xi) = <xi, xi>_theta`` from the point's coordinates (for autograd)."""

    def form(theta: torch.Tensor, xi: torch.Tensor) -> torch.Tensor:
        T = torch.where(weight, theta.abs() + eta, torch.ones_like(theta))[geometry.free]
        total = (xi[geometry.free] / T).square().sum()
        for pair in geometry.pairs:
            G, H = theta[pair.g_index], theta[pair.h_index]
            xg, xh = xi[pair.g_index], xi[pair.h_index]
            P, Q = G.T @ G, H.T @ H
            if metric == "inv":
                total = (
                    total
                    + torch.trace(torch.linalg.solve(P, xg.T @ xg))
                    + torch.trace(torch.linalg.solve(Q, xh.T @ xh))
                )
            else:
                total = total + torch.trace(Q @ xg.T @ xg) + torch.trace(P @ xh.T @ xh)
        return total

    return form


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_christoffel_terms_and_horizontal_projection_match_the_metric(trained, metric):
    model, data = trained
    point = LossPoint(model, nn.CrossEntropyLoss(), data)
    eta = 0.01
    geometry = _Geometry(point, model, metric, eta, 0.0)
    assert len(geometry.pairs) == 2 * HEADS
    weight = torch.cat([torch.full((p.numel(),), "weight" in n, dtype=torch.bool) for n, p in point.params.items()])
    form = _metric_form(geometry, metric, eta, weight)
    theta = geometry.theta
    xi = torch.randn(theta.numel(), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    # Gamma(xi, xi) = g^-1 [ (D_xi g) xi - 1/2 grad_theta <xi, xi>_theta ], g = Hessian of q/2 in xi
    g = torch.func.hessian(lambda v: 0.5 * form(theta, v))(xi)
    assert (
        torch.allclose(torch.dot(xi, g @ xi), form(theta, xi))
        and abs(geometry.norm(xi) ** 2 / float(form(theta, xi)) - 1) < 1e-12
    )
    lowered = lambda t: torch.func.grad(lambda v: 0.5 * form(t, v))(xi)  # noqa: E731
    _, along = torch.func.jvp(lowered, (theta,), (xi,))
    spread = torch.func.grad(lambda t: form(t, xi))(theta)
    expected = torch.linalg.solve(g, along - 0.5 * spread)
    assert torch.allclose(geometry.christoffel(xi), expected, rtol=1e-9, atol=1e-9 * float(expected.abs().max()))
    # the raised gradient is g^-1 d
    assert torch.allclose(geometry.raised(xi), torch.linalg.solve(g, xi), rtol=1e-9, atol=1e-12)
    # the projection is g-orthogonal to every gauge direction (G X, -H X^T), idempotent, and moves xi only vertically
    flat = geometry.horizontal(xi)
    assert torch.allclose(geometry.horizontal(flat), flat, rtol=1e-9, atol=1e-12)
    gen = torch.Generator().manual_seed(1)
    for pair in geometry.pairs:
        X = torch.randn(D, D, generator=gen, dtype=torch.float64)
        vertical = torch.zeros_like(xi)
        vertical[pair.g_index], vertical[pair.h_index] = pair.G @ X, -pair.H @ X.T
        assert (
            abs(float(flat @ g @ vertical)) < 1e-9 * float(xi @ g @ xi) ** 0.5 * float(vertical @ g @ vertical) ** 0.5
        )
        assert abs(float((xi - flat) @ g @ vertical)) > 0  # xi itself had a vertical part
    assert abs(float((xi - flat) @ g @ flat)) < 1e-9 * float(xi @ g @ xi)


def test_bad_arguments_are_refused_by_name(trained):
    model, data = trained
    loss = nn.CrossEntropyLoss()
    for kwargs, kind, name in [
        ({"rho": 0.0}, ValueError, "rho"),
        ({"rho": -1.0}, ValueError, "rho"),
        ({"group": object()}, ValueError, "group"),
        ({"steps": 0}, ValueError, "steps"),
        ({"steps": 1.5}, TypeError, "steps"),
        ({"order": 3}, ValueError, "order"),
        ({"metric": "euclidean"}, ValueError, "metric"),
        ({"eta": -0.1}, ValueError, "eta"),
        ({"damping": -1e-3}, ValueError, "damping"),
        ({"damping": float("nan")}, ValueError, "damping"),
    ]:
        with pytest.raises(kind, match=name):
            geodesic_sharpness(model, loss, data, **kwargs)


def test_attention_the_gauge_does_not_act_on_is_refused():
    x, y = _data()
    model = Attend()
    model.attn = nn.MultiheadAttention(E, HEADS, batch_first=True, add_bias_kv=True, dtype=torch.float64)
    with pytest.raises(NotApplicable, match="bias_k"):
        geodesic_sharpness(model, nn.CrossEntropyLoss(), (x, y))
    model = Attend()
    model.attn.in_proj_bias.requires_grad_(False)
    with pytest.raises(NotApplicable, match="in_proj_bias"):
        geodesic_sharpness(model, nn.CrossEntropyLoss(), (x, y))
    assert geodesic_sharpness(model, nn.CrossEntropyLoss(), (x, y), metric="adaptive") > 0  # no quotient asked for


def test_a_rank_deficient_head_needs_damping():
    x, y = _data()
    model = Attend(bias=False).eval()
    with torch.no_grad():
        model.attn.in_proj_weight[E : E + D, 1:] = 0.0  # head 0's key weight has rank 1 < d
        model.attn.in_proj_weight[E : E + D, 0] = 1.0
    with pytest.raises(NotApplicable, match="damping"):
        geodesic_sharpness(model, nn.CrossEntropyLoss(), (x, y))
    assert geodesic_sharpness(model, nn.CrossEntropyLoss(), (x, y), damping=1e-3) > 0


def test_the_callers_model_is_left_bit_identical(trained):
    model, data = trained
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    grads = [p.grad for p in model.parameters()]
    for metric in ("inv", "mix", "adaptive"):
        for order in (1, 2):
            geodesic_sharpness(model, nn.CrossEntropyLoss(), data, rho=0.1, steps=3, metric=metric, order=order)
    geodesic_sharpness(model, nn.CrossEntropyLoss(), data, params=_gauged(model, 10.0, 10.0, seed=0))
    after = model.state_dict()
    assert state.keys() == after.keys()
    assert all(torch.equal(state[k], after[k]) and state[k].dtype == after[k].dtype for k in state)
    assert all(a is b for a, b in zip(grads, [p.grad for p in model.parameters()]))
    assert not model.training

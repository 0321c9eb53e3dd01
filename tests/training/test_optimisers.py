"""Tests of lossgeom.training against torch.optim, closed forms and sampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from small_models import mlp

from lossgeom import training
from lossgeom.parameters import params_of
from lossgeom.training import adam, sgd

from book_extra import from_book
from conftest import assert_close

probes = from_book("lossgeom_book.noise")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny networks run faster, and do not fight other processes, on one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


OPTIMISER_CASES = [
    {"id": "sgd", "ours": lambda: sgd(0.1), "torch": lambda p: torch.optim.SGD(p, lr=0.1)},
    {
        "id": "sgd-momentum-l2",
        "ours": lambda: sgd(0.05, momentum=0.9, weight_decay=0.01),
        "torch": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01),
    },
    {
        "id": "adam-l2",
        "ours": lambda: adam(0.01, weight_decay=0.1, decoupled=False),
        "torch": lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1),
    },
    {
        "id": "adamw",
        "ours": lambda: adam(0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
        "torch": lambda p: torch.optim.AdamW(p, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    },
]


def _problem(seed=0, n=40):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=gen)
    y = torch.randint(0, 3, (n,), generator=gen)
    model = mlp([5, 6, 3], "tanh", seed=seed)
    return model, x, y


@pytest.mark.parametrize("case", OPTIMISER_CASES, ids=[c["id"] for c in OPTIMISER_CASES])
def test_updates_match_torch_optim(case):
    model, x, y = _problem()
    loss_fn = training.indexed_loss(model, torch.nn.CrossEntropyLoss(), (x, y))
    batches = training.batch_schedule(40, 8, 12, seed=1)
    ours = training.train(loss_fn, params_of(model), case["ours"](), 12, batches=batches)
    ref_params = {n: p.detach().clone().requires_grad_(True) for n, p in params_of(model).items()}
    opt = case["torch"](list(ref_params.values()))
    for t in range(12):
        opt.zero_grad()
        loss = loss_fn(ref_params, batches[t])
        assert abs(loss.item() - ours.losses[t]) <= 1e-12 * max(1.0, abs(loss.item()))
        loss.backward()
        opt.step()
    for name in ref_params:
        assert_close(ours.params[name], ref_params[name].detach(), rtol=1e-11, atol=1e-13)
    assert ours.state.step == 12


def test_decoupled_decay_equals_l2_for_plain_sgd_and_not_for_adam():
    model, x, y = _problem(seed=2)
    loss_fn = training.indexed_loss(model, torch.nn.CrossEntropyLoss(), (x, y))
    p0 = params_of(model)
    l2 = training.train(loss_fn, p0, sgd(0.2, weight_decay=0.05), 20)
    dec = training.train(loss_fn, p0, sgd(0.2, weight_decay=0.05, decoupled=True), 20)
    for n in p0:
        assert_close(l2.params[n], dec.params[n], rtol=1e-12, atol=1e-14)
    a_l2 = training.train(loss_fn, p0, adam(0.01, weight_decay=0.05, decoupled=False), 20)
    a_dec = training.train(loss_fn, p0, adam(0.01, weight_decay=0.05, decoupled=True), 20)
    gap = max((a_l2.params[n] - a_dec.params[n]).abs().max().item() for n in p0)
    assert gap > 1e-4
    # heavy-ball momentum: the decay inside the velocity differs from decay outside it
    m_l2 = training.train(loss_fn, p0, sgd(0.2, momentum=0.9, weight_decay=0.05), 20)
    m_dec = training.train(loss_fn, p0, sgd(0.2, momentum=0.9, weight_decay=0.05, decoupled=True), 20)
    assert max((m_l2.params[n] - m_dec.params[n]).abs().max().item() for n in p0) > 1e-4


def test_resume_with_state_continues_the_run_and_reset_does_not():
    model, x, y = _problem(seed=3)
    loss_fn = training.indexed_loss(model, torch.nn.CrossEntropyLoss(), (x, y))
    batches = training.batch_schedule(40, 8, 30, seed=0)
    full = training.train(loss_fn, params_of(model), adam(0.01), 30, batches=batches)
    first = training.train(loss_fn, params_of(model), adam(0.01), 20, batches=batches)
    resumed = training.train(loss_fn, first.params, adam(0.01), 10, batches=batches[20:], state=first.state)
    reset = training.train(loss_fn, first.params, adam(0.01), 10, batches=batches[20:])
    for n in full.params:
        assert_close(resumed.params[n], full.params[n], rtol=0, atol=0)
    assert max((reset.params[n] - full.params[n]).abs().max().item() for n in full.params) > 1e-3
    # the stored state was not mutated by continuing from it
    assert first.state.step == 20


def test_train_monitor_and_full_batch():
    model, x, y = _problem()
    loss_fn = training.indexed_loss(model, torch.nn.CrossEntropyLoss(), (x, y))
    run = training.train(loss_fn, params_of(model), sgd(0.5), 10, monitor=lambda p: float(loss_fn(p)), monitor_every=4)
    assert [t for t, _ in run.monitored] == [0, 4, 8, 10]
    assert run.monitored[0][1] == pytest.approx(run.losses[0], rel=1e-14)
    assert run.monitored[2][1] == pytest.approx(run.losses[8], rel=1e-14)


def test_batch_schedule_covers_each_epoch_once():
    b = training.batch_schedule(10, 3, 7, seed=0).numpy()
    assert b.shape == (7, 3)
    for epoch in range(2):
        assert len(set(b[3 * epoch : 3 * epoch + 3].ravel())) == 9
    assert np.array_equal(b, training.batch_schedule(10, 3, 7, seed=0).numpy())


def test_per_example_gradients_match_vmap():
    model, x, y = _problem(n=7)
    loss_fn = training.indexed_loss(model, torch.nn.CrossEntropyLoss(), (x, y))
    p = params_of(model)
    G = training.closure_per_example_gradients(loss_fn, p, 7)

    def one(q, i):
        g = torch.func.grad(lambda r: loss_fn(r, i.reshape(1)))(q)
        return torch.cat([g[n].reshape(-1) for n in p])

    assert_close(G, torch.func.vmap(one, in_dims=(None, 0))(p, torch.arange(7)), rtol=1e-12, atol=1e-14)
    full = torch.func.grad(lambda q: loss_fn(q))(p)
    assert_close(G.mean(0), torch.cat([full[n].reshape(-1) for n in p]))


def test_projected_noise_matches_sampling_without_replacement():
    rng = np.random.default_rng(0)
    G = torch.from_numpy(rng.standard_normal((30, 6)) * np.array([3.0, 1.0, 1.0, 0.5, 0.2, 0.1]))
    U = torch.eye(6)[:, :2]
    exact = probes.projected_noise(G, U, 5)
    draws = rng.random((40000, 30)).argsort(axis=1)[:, :5]  # 40000 batches without replacement
    means = G.numpy()[draws].mean(axis=1)
    sampled = means[:, :2].var(0).mean()
    assert abs(sampled - exact) / exact < 0.03
    assert probes.projected_noise(G, U, 30) == 0.0  # the full batch has no sampling noise


def test_optimiser_errors():
    with pytest.raises(ValueError, match="lr must be > 0"):
        sgd(0.0)
    with pytest.raises(ValueError, match=r"momentum must lie in \[0, 1\)"):
        sgd(0.1, momentum=1.0)
    with pytest.raises(ValueError, match="weight_decay must be >= 0"):
        adam(0.1, weight_decay=-1.0)
    with pytest.raises(ValueError, match="betas must lie"):
        adam(0.1, betas=(0.9, 1.0))
    model, x, y = _problem()
    loss_fn = training.indexed_loss(model, torch.nn.CrossEntropyLoss(), (x, y))
    with pytest.raises(TypeError, match="optimiser must be an Optimiser"):
        training.train(loss_fn, params_of(model), torch.optim.SGD, 3)
    with pytest.raises(ValueError, match="steps must be >= 0"):
        training.train(loss_fn, params_of(model), sgd(0.1), -1)
    with pytest.raises(ValueError, match="batches must hold at least"):
        training.train(loss_fn, params_of(model), sgd(0.1), 5, batches=training.batch_schedule(40, 8, 2))
    with pytest.raises(FloatingPointError, match="non-finite"):
        training.train(lambda q, i: loss_fn(q, i) * float("nan"), params_of(model), sgd(0.1), 3)
    with pytest.raises(ValueError, match="state must be an OptimiserState of this optimiser"):
        sgd_state = training.sgd(0.1).init(params_of(model))
        training.train(loss_fn, params_of(model), adam(0.1), 2, state=sgd_state)
    with pytest.raises(ValueError, match="kind must be 'sgd' or 'adam'"):
        training.Optimiser("lion", 0.1)
    with pytest.raises(ValueError, match="batch_size must be <="):
        training.batch_schedule(5, 6, 2)
    with pytest.raises(TypeError, match="loss must be a loss module, got the string 'mse'"):
        training.indexed_loss(model, "mse", (x, y))
    with pytest.raises(ValueError, match="basis"):
        probes.projected_noise(torch.zeros(4, 3), torch.zeros(2, 1), 2)


# ---------------------------------------------------------------------------- checkpoints


def test_checkpoint_monitor_and_the_endpoint_rule():
    model, x, y = _problem()
    loss_fn = training.indexed_loss(model, torch.nn.CrossEntropyLoss(), (x, y))
    run = training.train(
        loss_fn, params_of(model), sgd(0.5), 12, monitor=training.closure_checkpoint_monitor(loss_fn), monitor_every=4
    )
    losses = [value for _, (value, _) in run.monitored]
    assert losses[0] == pytest.approx(run.losses[0], rel=1e-14)  # full batch: same loss
    target = losses[2]
    step, value, params = training.checkpoints.first_checkpoint_below(run, target)
    first = next(i for i, v in enumerate(losses) if v <= target)
    assert (step, value) == (run.monitored[first][0], losses[first])
    assert value == pytest.approx(loss_fn(params, None).item(), rel=1e-14)
    with pytest.raises(ValueError, match="no checkpoint reaches the target loss"):
        training.checkpoints.first_checkpoint_below(run, min(losses) / 2)
    with pytest.raises(TypeError, match="loss_fn must be callable"):
        training.closure_checkpoint_monitor(3)


def test_parameter_path_matches_train():
    model, x, y = _problem()
    loss_fn = training.indexed_loss(model, torch.nn.CrossEntropyLoss(), (x, y))
    p0 = params_of(model)
    batches = training.batch_schedule(40, 8, 6, seed=2)
    path = training.closure_parameter_path(loss_fn, p0, adam(0.01), batches)
    final = training.train(loss_fn, p0, adam(0.01), 6, batches=batches).params
    n_params = sum(v.numel() for v in p0.values())
    assert path.shape == (7, n_params)
    assert torch.equal(path[0], torch.cat([v.reshape(-1) for v in p0.values()]))
    assert torch.equal(path[-1], torch.cat([v.reshape(-1) for v in final.values()]))


def test_stored_at_precision_rounds_params_and_buffers():
    model, x, y = _problem()
    loss_fn = training.indexed_loss(model, torch.nn.CrossEntropyLoss(), (x, y))
    run = training.train(loss_fn, params_of(model), adam(0.01), 5)
    params, state = probes.stored_at_precision(run.params, run.state, torch.float32)
    for n, p in run.params.items():
        assert params[n].dtype == torch.float64
        assert torch.equal(params[n], p.float().double())
        assert 0 < (params[n] - p).abs().max() <= 2.0**-24 * p.abs().max()
    assert torch.equal(state.buffers["v"]["0.weight"], run.state.buffers["v"]["0.weight"].float().double())
    assert state.step == run.state.step
    with pytest.raises(TypeError, match="state must be an OptimiserState"):
        probes.stored_at_precision(run.params, {}, torch.float32)
    with pytest.raises(TypeError, match="dtype must be a floating torch.dtype"):
        probes.stored_at_precision(run.params, run.state, torch.int32)


# ---------------------------------------------------------------------------- noise and metrics


def _gradients(n=60, p=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    G = torch.randn(n, p, generator=gen) * torch.linspace(0.2, 3.0, p) + 0.5
    basis, _ = torch.linalg.qr(torch.randn(p, 3, generator=gen))
    return G, basis


@pytest.mark.parametrize("batch_size", [1, 5, 30])
def test_sampled_batch_noise_has_the_predicted_variance(batch_size):
    G, U = _gradients()
    draws = probes.sampled_batch_noise(G, U, batch_size, 20000, seed=3)
    assert draws.shape == (20000, 3)
    predicted = probes.projected_noise(G, U, batch_size)
    per_draw = (draws**2).mean(axis=1)
    standard_error = per_draw.std(ddof=1) / np.sqrt(len(per_draw))
    assert abs(per_draw.mean() - predicted) < 4 * standard_error
    assert np.abs(draws.mean(axis=0)).max() < 4 * np.sqrt(predicted * 3 / 20000)


def test_sampled_batch_noise_of_the_full_set_is_zero():
    G, U = _gradients()
    assert np.abs(probes.sampled_batch_noise(G, U, 60, 10, seed=0)).max() < 1e-12
    assert probes.projected_noise(G, U, 60) == 0.0


def test_projected_noise_with_a_preconditioner_equals_the_noise_of_scaled_gradients():
    G, U = _gradients()
    d = torch.linspace(0.5, 2.0, G.shape[1])
    assert probes.projected_noise(G, U, 7, d) == pytest.approx(probes.projected_noise(G * d, U, 7), rel=1e-13)
    with pytest.raises(ValueError, match="preconditioner must have shape"):
        probes.projected_noise(G, U, 7, torch.ones(3))


def test_heavy_ball_velocity_matches_the_recursion_and_its_stationary_law():
    rng = np.random.default_rng(0)
    noise = rng.standard_normal((20000, 2))
    v = probes.heavy_ball_velocity(noise, 0.8)
    manual, velocity = [], np.zeros(2)
    for g in noise[:50]:
        velocity = 0.8 * velocity + g
        manual.append(velocity)
    np.testing.assert_allclose(v[:50], manual, rtol=1e-13, atol=1e-13)
    tail = v[100:]
    assert (tail**2).mean() == pytest.approx(1 / (1 - 0.64), rel=0.05)
    assert np.mean(tail[1:] * tail[:-1]) / np.mean(tail**2) == pytest.approx(0.8, abs=0.02)
    with pytest.raises(ValueError, match=r"momentum must lie in \[0, 1\)"):
        probes.heavy_ball_velocity(noise, 1.0)


def test_adam_preconditioner_is_the_root_mean_square_of_minibatch_gradients():
    G, _ = _gradients(n=40)
    batch = 4
    scaling = probes.adam_preconditioner(G, batch, eps=1e-8)
    # the exact second moment of the batch mean, by enumerating many sampled batches
    rng = np.random.default_rng(1)
    draws = rng.random((40000, 40)).argsort(axis=1)[:, :batch]
    second_moment = (G.numpy()[draws].mean(axis=1) ** 2).mean(axis=0)
    np.testing.assert_allclose(1.0 / scaling.numpy() - 1e-8, np.sqrt(second_moment), rtol=0.02)
    with pytest.raises(ValueError, match="batch_size must be <="):
        probes.adam_preconditioner(G, 41)
    with pytest.raises(ValueError, match="per_example must have shape"):
        probes.adam_preconditioner(torch.zeros(3), 1)


def test_natural_gradient_direction_is_covariant_for_a_full_rank_metric():
    rng = np.random.default_rng(4)
    A = rng.standard_normal((3, 3))
    F = A @ A.T + np.eye(3)
    g = rng.standard_normal(3)
    J = rng.standard_normal((3, 3)) + 3 * np.eye(3)  # an invertible change of coordinates
    direction = probes.natural_gradient_direction(g, F)
    np.testing.assert_allclose(direction, np.linalg.solve(F, g), rtol=1e-12)
    in_new_coordinates = probes.natural_gradient_direction(J.T @ g, J.T @ F @ J)
    np.testing.assert_allclose(J @ in_new_coordinates, direction, rtol=1e-10, atol=1e-12)
    damped = probes.natural_gradient_direction(g, F, damping=0.5)
    np.testing.assert_allclose(damped, np.linalg.solve(F + 0.5 * np.eye(3), g), rtol=1e-12)


@pytest.mark.parametrize("c", [0.3, 1.0, 3.0, 10.0])
def test_natural_gradient_on_the_product_model_changes_the_prediction_by_minus_the_residual(c):
    a, b = 2.0 * c, 1.0 / c  # ab = 2, residual 1
    gradient = np.array([b, a]) * (a * b - 1)
    direction = probes.natural_gradient_direction(gradient, np.outer([b, a], [b, a]))
    assert np.array([b, a]) @ direction == pytest.approx(a * b - 1, rel=1e-12)


def test_natural_gradient_errors():
    with pytest.raises(ValueError, match="metric must be a symmetric matrix"):
        probes.natural_gradient_direction([1.0, 0.0], [[1.0, 2.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match="metric must have shape"):
        probes.natural_gradient_direction([1.0, 0.0], np.eye(3))
    with pytest.raises(ValueError, match="damping must be >= 0"):
        probes.natural_gradient_direction([1.0, 0.0], np.eye(2), damping=-1.0)


# --------------------------------------------------------------------------- the loop and its hooks

TORCH_ARITHMETIC_CASES = [
    {
        "id": "sgd-momentum-l2",
        "ours": lambda: sgd(0.05, momentum=0.9, weight_decay=0.01, arithmetic="torch"),
        "torch": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01),
    },
    {
        "id": "adam-l2",
        "ours": lambda: adam(0.01, weight_decay=0.1, decoupled=False, arithmetic="torch"),
        "torch": lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1),
    },
    {
        "id": "adamw",
        "ours": lambda: adam(0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1, arithmetic="torch"),
        "torch": lambda p: torch.optim.AdamW(p, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    },
]


@pytest.mark.parametrize("case", TORCH_ARITHMETIC_CASES, ids=[c["id"] for c in TORCH_ARITHMETIC_CASES])
def test_torch_arithmetic_is_torch_optim_bit_for_bit_and_book_arithmetic_within_rounding(case):
    model, x, y = _problem(seed=4)
    loss_fn = training.indexed_loss(model, torch.nn.CrossEntropyLoss(), (x, y))
    batches = training.batch_schedule(40, 8, 15, seed=2)
    ours = training.train(loss_fn, params_of(model), case["ours"](), 15, batches=batches)
    leaves = {n: p.detach().clone().requires_grad_(True) for n, p in params_of(model).items()}
    opt = case["torch"](list(leaves.values()))
    for t in range(15):
        opt.zero_grad()
        loss_fn(leaves, batches[t]).backward()
        opt.step()
    for name in leaves:
        assert torch.equal(ours.params[name], leaves[name].detach())
    book_rule = training.Optimiser(**{**case["ours"]().__dict__, "arithmetic": "book"})
    book = training.train(loss_fn, params_of(model), book_rule, 15, batches=batches)
    for name in leaves:
        assert_close(book.params[name], ours.params[name], rtol=1e-11, atol=1e-13)


def test_torch_arithmetic_state_is_explicit_and_resumes_exactly():
    model, x, y = _problem(seed=5)
    loss_fn = training.indexed_loss(model, torch.nn.CrossEntropyLoss(), (x, y))
    rule = adam(0.01, weight_decay=0.1, arithmetic="torch")
    batches = training.batch_schedule(40, 8, 20, seed=0)
    whole = training.train(loss_fn, params_of(model), rule, 20, batches=batches)
    first = training.train(loss_fn, params_of(model), rule, 12, batches=batches)
    rest = training.train(loss_fn, first.params, rule, 8, batches=batches[12:], state=first.state)
    assert set(first.state.buffers) == {"step", "exp_avg", "exp_avg_sq"} and rest.state.step == 20
    for name in whole.params:
        assert torch.equal(rest.params[name], whole.params[name])
    assert float(first.state.buffers["step"]["0.weight"]) == 12.0  # continuing did not mutate the stored state
    with pytest.raises(ValueError, match="state must be an OptimiserState of this optimiser"):
        training.train(loss_fn, first.params, sgd(0.1, momentum=0.5, arithmetic="torch"), 2, state=first.state)


def test_monitor_records_at_chosen_steps_and_at_the_end():
    model, x, y = _problem()
    loss_fn = training.indexed_loss(model, torch.nn.CrossEntropyLoss(), (x, y))
    norm = lambda step, p: float(p["0.weight"].norm())
    run = training.train(
        loss_fn,
        params_of(model),
        sgd(0.3),
        10,
        hooks=[
            training.Monitor("every3", norm, every=3),
            training.Monitor("chosen", lambda step, p: step, at=(7, 2, 2)),
        ],
    )
    assert [t for t, _ in run.records["every3"]] == [0, 3, 6, 9, 10]
    assert run.records["chosen"] == [(2, 2), (7, 7)]
    assert run.records["every3"][0][1] == float(params_of(model)["0.weight"].norm())
    assert run.records["every3"][-1][1] == float(run.params["0.weight"].norm())
    assert run.steps_taken == 10 and run.stop is None and run.monitored == []
    empty = training.train(loss_fn, params_of(model), sgd(0.3), 0, monitor=lambda p: 1.0)
    assert empty.monitored == [(0, 1.0)] and empty.steps_taken == 0
    assert all(torch.equal(empty.params[n], p) for n, p in params_of(model).items())


def test_projection_holds_a_norm_after_every_step():
    model, x, y = _problem(seed=1)
    loss_fn = training.indexed_loss(model, torch.nn.CrossEntropyLoss(), (x, y))
    unit = lambda p: {**p, "2.weight": p["2.weight"] / p["2.weight"].norm()}
    norms = lambda step, p: float(p["2.weight"].norm())
    runs = {}
    for at_start in (False, True):
        runs[at_start] = training.train(
            loss_fn,
            params_of(model),
            sgd(0.5),
            6,
            hooks=[training.Projection(unit, at_start=at_start), training.Monitor("norm", norms)],
        )
        values = [v for _, v in runs[at_start].records["norm"]]
        assert all(v == pytest.approx(1.0, rel=1e-14) for v in values[1:])
        assert (values[0] == pytest.approx(1.0, rel=1e-14)) == at_start
    # the same run written by hand: a gradient step, then the rescaling
    params = params_of(model)
    for _ in range(6):
        grads = torch.func.grad(lambda q: loss_fn(q))(params)
        params = unit({n: params[n] - 0.5 * grads[n] for n in params})
    for name in params:
        assert_close(runs[False].params[name], params[name], rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="projection must return the same parameter names and shapes"):
        training.train(
            loss_fn,
            params_of(model),
            sgd(0.5),
            2,
            hooks=[training.Projection(lambda p: {"0.weight": p["0.weight"]})],
        )


def test_divergence_stop_records_the_event_instead_of_a_nan():
    model, x, y = _problem(seed=2)
    loss_fn = training.indexed_loss(model, torch.nn.CrossEntropyLoss(), (x, y))
    exploding = lambda q, i: loss_fn(q, i) * torch.exp(torch.tensor(30.0) * q["2.bias"].sum() ** 2)
    start = params_of(model)
    start["2.bias"] = start["2.bias"] + 0.5
    run = training.train(exploding, start, sgd(1.0), 50, hooks=[training.DivergenceStop()])
    assert run.stop is not None and run.stop.diverged and run.diverged_at == run.stop.step == run.steps_taken
    assert run.stop.reason == "non-finite loss" and not np.isfinite(run.stop.loss)
    assert np.isfinite(run.losses).all()
    with pytest.raises(FloatingPointError, match=f"non-finite at step {run.stop.step}"):
        training.train(exploding, start, sgd(1.0), 50)
    bounded = training.train(loss_fn, params_of(model), sgd(0.1), 20, hooks=[training.DivergenceStop(bound=0.5)])
    full = training.train(loss_fn, params_of(model), sgd(0.1), 20)
    assert full.losses[0] > 0.5
    assert bounded.stop.step == 0 and bounded.stop.reason == "loss above 0.5"
    assert bounded.stop.loss == full.losses[0]


def test_stop_when_ends_the_run_and_monitors_see_the_last_point_once():
    model, x, y = _problem()
    loss_fn = training.indexed_loss(model, torch.nn.CrossEntropyLoss(), (x, y))
    full = training.train(loss_fn, params_of(model), sgd(0.5), 30)
    target = full.losses[12]
    below = lambda step, p: float(loss_fn(p)) <= target
    run = training.train(
        loss_fn,
        params_of(model),
        sgd(0.5),
        30,
        hooks=[
            training.StopWhen(below, "target reached"),
            training.Monitor("loss", lambda step, p: float(loss_fn(p)), every=5),
        ],
    )
    first = int(np.flatnonzero(full.losses <= target)[0])
    assert run.stop == training.loop.StopEvent(first, "target reached") and run.diverged_at is None
    assert [t for t, _ in run.records["loss"]][-1] == first
    assert len({t for t, _ in run.records["loss"]}) == len(run.records["loss"])
    for name in full.params:
        assert torch.equal(run.params[name], training.train(loss_fn, params_of(model), sgd(0.5), first).params[name])


def test_hook_errors_are_named():
    model, x, y = _problem()
    loss_fn = training.indexed_loss(model, torch.nn.CrossEntropyLoss(), (x, y))
    p = params_of(model)
    with pytest.raises(TypeError, match="hooks must be Monitor, Projection, DivergenceStop or StopWhen"):
        training.train(loss_fn, p, sgd(0.1), 2, hooks=[lambda q: q])
    with pytest.raises(ValueError, match="every Monitor needs its own name"):
        twice = [training.Monitor("a", print), training.Monitor("a", print)]
        training.train(loss_fn, p, sgd(0.1), 2, hooks=twice)
    with pytest.raises(ValueError, match="bound must be a number > 0"):
        training.DivergenceStop(bound=0.0)
    with pytest.raises(TypeError, match="Monitor fn must be callable"):
        training.Monitor("a", 3)
    with pytest.raises(ValueError, match="every must be >= 1"):
        training.Monitor("a", print, every=0)
    with pytest.raises(TypeError, match="Projection fn must be callable"):
        training.Projection(None)
    with pytest.raises(TypeError, match="StopWhen predicate must be callable"):
        training.StopWhen(True)
    with pytest.raises(ValueError, match="arithmetic must be one of"):
        sgd(0.1, arithmetic="numpy")
    with pytest.raises(ValueError, match="no decoupled weight decay for SGD"):
        sgd(0.1, weight_decay=0.1, decoupled=True, arithmetic="torch")

"""Tests of Chapter 11's experiment: teacher-student task, students trained at once, the generalisation bound."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lossgeom import flatness
from lossgeom.training.loop import train
from lossgeom.training.rules import adam, sgd
from lossgeom_book import relu_generalisation as rg
from lossgeom_book import relu_students as rs
from lossgeom_book.models import regression_loss, relu_network, two_layer_relu

from conftest import assert_close

NETWORKS = [
    {"id": "m10-default", "m": 10, "seed": 0, "scale": 1.0},
    {"id": "m6-small", "m": 6, "seed": 1, "scale": 0.3},
    {"id": "m15-large", "m": 15, "seed": 2, "scale": 4.0},
]


@pytest.fixture(autouse=True)
def one_thread():
    """These tensors are tiny: one thread avoids thread start-up costs that dominate under load."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def task():
    return rs.teacher_student(n=25, d=4, m_teacher=4, seed=0)


def _weights(case):
    network = two_layer_relu(4, case["m"], seed=case["seed"], init_scale=case["scale"])
    return flatness.relu_quotient.two_layer_weights(network)


def _random_scales(m, seed, spread=100.0):
    g = torch.Generator().manual_seed(seed)
    return torch.exp(torch.empty(m).uniform_(-np.log(spread), np.log(spread), generator=g))


# ---------------------------------------------------------------------------------------
# Test distribution, kinks and the generalisation bound
# ---------------------------------------------------------------------------------------


def test_ball_union_sampler_is_uniform_on_the_union():
    centres = torch.tensor([[0.0], [1.0]])  # union of [-1, 1] and [0, 2] is [-1, 2]
    sample = rg.sample_ball_union(centres, 1.0, 60_000, seed=0)
    x = sample.x[:, 0]
    assert float(x.min()) >= -1 and float(x.max()) <= 2
    assert abs(float(((x > 0) & (x < 1)).double().mean()) - 1 / 3) <= 0.01
    assert abs(sample.nu - 4 / 3) <= 0.02


def test_kink_remainder_bounds_the_departure_from_the_tangent(task):
    a, W = _weights(NETWORKS[2])
    K = rg.kink_remainder(a, W, task.x, 0.15)
    g = torch.Generator().manual_seed(0)
    x = task.x.clone().requires_grad_(True)
    grads = torch.autograd.grad(relu_network(a, W, x).sum(), x)[0]
    F0 = relu_network(a, W, task.x)
    for _ in range(200):
        h = torch.randn(25, 4, generator=g)
        h = h / h.norm(dim=1, keepdim=True) * 0.15 * torch.rand(25, 1, generator=g)
        moved = torch.stack([relu_network(a, W, task.x[i] + h[i : i + 1])[0] for i in range(25)])
        assert bool(((moved - F0 - (grads * h).sum(1)).abs() <= K + 1e-12).all())


def test_generalisation_bound_holds_for_untrained_students(task):
    a, W, _ = rs.init_students(4, [8, 20], [0, 1], (1.0, 3.0))
    test = rg.sample_ball_union(task.x, 0.15, 20_000, seed=2)
    error, se = rg.generalisation_error(a, W, task, test.x)
    bound = rg.generalisation_bound(a, W, task, 0.15, nu=test.nu)
    assert bool((error + 3 * se <= bound.total).all())
    assert bool((bound.flatness > 0).all() and (bound.kinks >= 0).all())


# ---------------------------------------------------------------------------------------
# Training many students at once
# ---------------------------------------------------------------------------------------


def test_train_students_equals_training_each_alone(task):
    a0, W0, labels = rs.init_students(4, [6, 10], [0], (1.0,))
    fits = rs.train_students(
        a0, W0, task.x, task.y, learning_rate=0.1, target_loss=1e-30, max_steps=300, check_every=100
    )
    assert fits.steps.tolist() == [0, 100, 200, 300] and not fits.converged.any()
    for i, (_, m, _) in enumerate(labels):
        loss = lambda p, idx=None: regression_loss(p["a"], p["W"], task.x, task.y)
        alone = train(loss, {"a": a0[i, :m], "W": W0[i, :m]}, sgd(0.1), 300).params
        assert_close(fits.final[0][i, :m], alone["a"], rtol=1e-10, atol=1e-13)
        assert_close(fits.final[1][i, :m], alone["W"], rtol=1e-10, atol=1e-13)
        assert torch.equal(fits.final[1][i, m:], torch.zeros(10 - m, 4))


def test_train_students_freezes_each_student_at_its_target(task):
    a0, W0, _ = rs.init_students(4, [10], [0, 1], (1.0,))
    start_loss = regression_loss(a0, W0, task.x, task.y)
    fits = rs.train_students(
        a0,
        W0,
        task.x,
        task.y,
        learning_rate=0.1,
        target_loss=torch.stack([start_loss[0] * 2, start_loss[1] / 2]),
        max_steps=2000,
        check_every=50,
    )
    assert fits.converged.tolist() == [True, True]
    assert torch.equal(fits.final[0][0], a0[0])  # below its target at step 0: never moved
    assert float(fits.history["loss"][1, -1]) < float(start_loss[1]) / 2
    assert fits.steps[-1] < 2000


def test_student_gradients_match_autograd(task):
    a, W, _ = rs.init_students(4, [6, 10], [0, 1], (1.0, 3.0))
    loss, grad_a, grad_W = rs.student_gradients(a, W, task.x, task.y)
    assert_close(loss, regression_loss(a, W, task.x, task.y))
    leaves = (a.clone().requires_grad_(True), W.clone().requires_grad_(True))
    ref_a, ref_W = torch.autograd.grad(regression_loss(*leaves, task.x, task.y).sum(), leaves)
    assert_close(grad_a, ref_a, atol=1e-15)
    assert_close(grad_W, ref_W, atol=1e-15)
    assert torch.equal(grad_W[0, 6:], torch.zeros(4, 4))  # absent neurons stay absent


def test_fit_students_with_sgd_equals_train_students(task):
    a0, W0, _ = rs.init_students(4, [6, 10], [0, 1], (1.0, 8.0))
    kwargs = dict(target_loss=2e-3, max_steps=600, check_every=100)
    slow = rs.train_students(a0, W0, task.x, task.y, learning_rate=0.1, **kwargs)
    fast = rs.fit_students(a0, W0, task.x, task.y, sgd(0.1), **kwargs)
    assert 0 < int(fast.converged.sum()) < 8 and fast.converged.tolist() == slow.converged.tolist()
    assert fast.steps.tolist() == slow.steps.tolist()
    assert_close(fast.a, slow.a, rtol=1e-10, atol=1e-13)
    assert_close(fast.W, slow.W, rtol=1e-10, atol=1e-13)
    for key in slow.history:
        assert_close(fast.history[key], slow.history[key], rtol=1e-10, atol=1e-13)


def test_fit_students_with_adam_equals_training_each_alone(task):
    a0, W0, labels = rs.init_students(4, [6, 10], [0], (1.0,))
    fits = rs.fit_students(a0, W0, task.x, task.y, adam(0.01), target_loss=1e-30, max_steps=200, check_every=100)
    assert fits.steps.tolist() == [0, 100, 200] and not fits.converged.any()
    for i, (_, m, _) in enumerate(labels):
        loss = lambda p, idx=None: regression_loss(p["a"], p["W"], task.x, task.y)
        alone = train(loss, {"a": a0[i, :m], "W": W0[i, :m]}, adam(0.01), 200).params
        assert_close(fits.final[0][i, :m], alone["a"], rtol=1e-9, atol=1e-12)
        assert_close(fits.final[1][i, :m], alone["W"], rtol=1e-9, atol=1e-12)


def test_fit_students_freezes_parameters_and_momentum(task):
    a0, W0, _ = rs.init_students(4, [10], [0, 1], (1.0,))
    start = regression_loss(a0, W0, task.x, task.y)
    fits = rs.fit_students(
        a0,
        W0,
        task.x,
        task.y,
        sgd(0.05, momentum=0.9),
        check_every=50,
        max_steps=1000,
        target_loss=torch.stack([start[0] / 3, torch.tensor(1e-30)]),
    )
    first = int(np.argmax(fits.history["loss"][0] < float(start[0]) / 3))
    assert 0 < first < len(fits.steps) - 1 and fits.converged.tolist() == [True, False]
    for j in range(first, len(fits.steps)):  # a velocity left running would keep moving it
        assert torch.equal(fits.a[0, j], fits.a[0, first]) and torch.equal(fits.W[0, j], fits.W[0, first])
    assert not torch.equal(fits.a[1, -1], fits.a[1, first])


def _fits_with_losses(losses, steps):
    losses = np.asarray(losses, dtype=np.float64)
    S, T = losses.shape
    zeros = torch.zeros(S, T, 3)
    return rs.StudentFits(
        zeros, torch.zeros(S, T, 3, 2), torch.zeros(S, dtype=torch.bool), np.asarray(steps), {"loss": losses}
    )


def test_first_check_below_and_steps_at_recent_pace():
    t = np.arange(0, 1001, 100)
    losses = np.stack([1e-2 * np.exp(-0.02 * t), 1e-2 * np.exp(-0.001 * t), np.full(t.shape, 1e-3)])
    fits = _fits_with_losses(losses, t)
    index = rs.first_check_below(fits, (5e-3, 1e-4))
    assert index.tolist() == [[1, 3], [7, -1], [0, -1]]
    needed = rs.steps_at_recent_pace(fits, 1e-7, window=500)
    assert needed[0] == 0.0 and needed[2] == np.inf  # below already; not falling
    assert abs(needed[1] - (np.log(1e-7 / losses[1, -1]) / -0.001)) <= 1e-9 * needed[1]
    assert_close(rs.loss_pace(fits, 300, end_step=400), [0.02, 0.001, 0.0], atol=1e-15)
    with pytest.raises(ValueError, match="window must be a multiple"):
        rs.steps_at_recent_pace(fits, 1e-7, window=250)
    with pytest.raises(ValueError, match="window must be a multiple"):
        rs.loss_pace(fits, 500, end_step=300)
    with pytest.raises(ValueError, match="threshold must be > 0"):
        rs.first_check_below(fits, (0.0,))


def test_stable_counts_at_checks(task):
    a0, W0, _ = rs.init_students(4, [10], [0, 1], (1.0, 8.0))
    fits = rs.fit_students(a0, W0, task.x, task.y, sgd(0.1), target_loss=1e-30, max_steps=400, check_every=200)
    etas, batches = (0.1, 0.5, 1.0), (1, 5)
    checks = np.array([[0, 2], [1, -1], [2, 2], [-1, 0]])
    counts = rs.stable_counts(fits, task.x, etas, batches, checks)
    for (i, t), j in np.ndenumerate(checks):
        if j < 0:
            assert np.isnan(counts[i, t])
        else:
            grid = flatness.stability.stable_pair_grid(fits.a[i, j], fits.W[i, j], task.x, etas, batches)
            assert counts[i, t] == grid.sum()
    with pytest.raises(ValueError, match="checks must be an integer array"):
        rs.stable_counts(fits, task.x, etas, batches, np.zeros((3, 2), dtype=int))
    with pytest.raises(ValueError, match=r"checks must lie in \[-1, 2\]"):
        rs.stable_counts(fits, task.x, etas, batches, np.full((4, 1), 3))


def test_fitting_profile_on_a_known_run():
    loss = np.array([1.0, 0.5, 0.2, 0.1, 0.01, 0.001])
    measure = np.array([1.0, 2.0, 4.0, 3.0, 3.5, 2.0])
    profile = rs.fitting_profile(loss, measure)
    assert profile.peak_position == 2 / 5 and profile.co_moving == 3 / 5 and profile.loss_monotone
    assert abs(profile.loss_share_before_peak - 0.8 / 0.999) <= 1e-15
    assert abs(profile.decades_before_peak - np.log10(5) / 3) <= 1e-15
    assert profile.fall_after_peak == 0.5
    frozen = rs.fitting_profile(np.r_[loss, [0.001] * 4], np.r_[measure, [2.0] * 4])
    assert frozen == profile  # the frozen tail is not part of the run
    negative_start = rs.fitting_profile(loss, measure - 3.0)  # Flat^Q can start negative
    assert negative_start.fall_after_peak == 2.0 and negative_start.peak_position == profile.peak_position
    with pytest.raises(ValueError, match="must fall"):
        rs.fitting_profile(loss[::-1], measure)
    with pytest.raises(ValueError, match="1-D of one length"):
        rs.fitting_profile(loss, measure[:-1])


def test_tangent_departure_is_zero_for_the_teacher_and_bounded_by_the_kinks(task):
    test = rg.sample_ball_union(task.x, 0.15, 4000, seed=3)
    teacher = rg.tangent_departure(task.teacher_a, task.teacher_W, task, test.x, 0.15)
    assert float(teacher.ratio_max) == 0.0 and float(teacher.untouched_max) == 0.0 and teacher.pairs >= 4000
    a, W, _ = rs.init_students(4, [10, 40], [0, 1], (1.0, 4.0))
    report = rg.tangent_departure(a, W, task, test.x, 0.15)
    assert bool((report.ratio_max <= 1 + 1e-12).all()) and bool((report.untouched_max <= 1e-13).all())
    assert bool((report.ratio_max > 0.3).all())  # the worst case K_i is approached, not loose
    # the teacher's kinks matter: without them the remainder exceeds the student's K_i
    bare = rs.TeacherStudentTask(task.x, task.y, task.teacher_a * 0, task.teacher_W, task.description)
    student_only = rg.tangent_departure(a, W, bare, test.x, 0.15)
    assert not torch.equal(student_only.ratio_max, report.ratio_max)


# ---------------------------------------------------------------------------------------
# Slices
# ---------------------------------------------------------------------------------------


def test_slices_raw_move_quotient_do_not():
    g = torch.Generator().manual_seed(0)
    a, W = torch.randn(12, 3, generator=g), torch.randn(12, 5, generator=g)
    x, y = torch.randn(30, 5, generator=g), torch.randint(0, 3, (30,), generator=g)
    c = _random_scales(12, 1, spread=5.0)
    moved = (a / c[:, None], W * c[:, None])
    from lossgeom.landscape import plane_grid

    for coordinates in ("raw", "quotient"):
        planes = [
            plane_grid(*rs.slice_directions(*net, seed=3, coordinates=coordinates), 1.0, 5)[2]
            for net in ((a, W), moved)
        ]
        grids = [rs.slice_cross_entropy(points, x, y, 12, 3, coordinates) for points in planes]
        centre_loss = torch.nn.functional.cross_entropy(torch.relu(x @ W.T) @ a, y)
        assert abs(grids[0][2, 2] - float(centre_loss)) <= 1e-12
        gap = np.abs(grids[0] - grids[1]).max()
        assert (gap <= 1e-12) if coordinates == "quotient" else (gap > 1e-2)


def test_raw_directions_are_filter_normalised():
    g = torch.Generator().manual_seed(1)
    a, W = torch.randn(12, 3, generator=g), torch.randn(12, 5, generator=g)
    _, d1, _ = rs.slice_directions(a, W, seed=0)
    da, dW = torch.as_tensor(d1[:36]).reshape(12, 3), torch.as_tensor(d1[36:]).reshape(12, 5)
    assert_close(dW.norm(dim=1), W.norm(dim=1))
    assert_close(da.norm(dim=0), a.norm(dim=0))
    _, q1, _ = rs.slice_directions(a, W, seed=0, coordinates="quotient")
    _, U = flatness.quotient_coordinates(a, W)
    dU = torch.as_tensor(q1[36:]).reshape(12, 5)
    assert_close((dU * U).sum(1), torch.zeros(12), atol=1e-14)
    assert_close(dU.norm(dim=1), torch.ones(12))


def test_rejects_bad_radii_targets_and_coordinates(task):
    with pytest.raises(ValueError, match="radius must be > 0"):
        rg.sample_ball_union(task.x, -0.1, 10)
    with pytest.raises(ValueError, match="target_loss must be > 0"):
        a, W, _ = rs.init_students(4, [6], [0])
        rs.train_students(a, W, task.x, task.y, learning_rate=0.1, target_loss=0.0, max_steps=10)
    with pytest.raises(ValueError, match="coordinates must be"):
        rs.slice_directions(torch.ones(2), torch.eye(2), seed=0, coordinates="polar")

"""Modular-arithmetic data and the three classifier families: shapes, labels, features, errors."""

import functools

import numpy as np
import pytest
import torch

from lossgeom import flatness
from lossgeom.flatness import softmax_gauge as softmax
from lossgeom.models import accuracy
from lossgeom.symmetries import audit_symmetry
from lossgeom_book import regulariser_checks, tasks

P = 7


@pytest.mark.parametrize("operation", tasks.OPERATIONS)
def test_modular_split_covers_every_pair_once_with_correct_labels(operation):
    split = tasks.modular_arithmetic(P, operation, train_fraction=0.6, seed=3)
    x = torch.cat([split.x_train, split.x_test])
    y = torch.cat([split.y_train, split.y_test])
    assert split.x_train.shape == (round(0.6 * P * P), 2) and x.dtype == torch.int64
    assert len({(int(a), int(b)) for a, b in x}) == P * P
    a, b = x[:, 0].tolist(), x[:, 1].tolist()
    by_hand = {
        "add": [(i + j) % P for i, j in zip(a, b)],
        "subtract": [(i - j) % P for i, j in zip(a, b)],
        "multiply": [(i * j) % P for i, j in zip(a, b)],
    }[operation]
    assert y.tolist() == by_hand


def test_modular_split_is_seeded():
    a, b, c = (tasks.modular_arithmetic(P, "add", 0.5, seed=s) for s in (0, 0, 1))
    assert torch.equal(a.x_train, b.x_train) and not torch.equal(a.x_train, c.x_train)


def test_modular_errors_are_named():
    with pytest.raises(ValueError, match="p must be >= 3"):
        tasks.modular_arithmetic(2)
    with pytest.raises(ValueError, match="operation must be one of"):
        tasks.modular_arithmetic(P, "divide")
    with pytest.raises(ValueError, match="train_fraction must leave both splits non-empty"):
        tasks.modular_arithmetic(P, "add", train_fraction=1.0)
    with pytest.raises(TypeError, match="p must be an int"):
        tasks.modular_arithmetic(7.0)


def family_cases():
    return {
        "transformer": (
            tasks.ModularTransformer(P, d_model=8, n_heads=2, d_mlp=16, seed=0),
            tasks.modular_arithmetic(P).x_test,
        ),
        "mlp": (tasks.MLPClassifier(None, (12,), P, modulus=P, seed=0), tasks.modular_arithmetic(P, "subtract").x_test),
        "digits-mlp": (
            tasks.MLPClassifier(5, (6, 4), 3, seed=0),
            torch.rand(9, 5, generator=torch.Generator().manual_seed(0)),
        ),
        "probe": (tasks.LinearProbe(4, 3, seed=0), torch.randn(9, 4, generator=torch.Generator().manual_seed(0))),
    }


@pytest.mark.parametrize("name", list(family_cases()))
def test_logits_are_features_times_classifier_and_shift_is_a_symmetry(name, close):
    model, x = family_cases()[name]
    params = {k: v.detach() for k, v in model.named_parameters()}
    assert tasks.CLASSIFIER in params and params[tasks.CLASSIFIER].dtype == torch.float64
    h = tasks.features(model, params, x)
    close(model(x), h @ params[tasks.CLASSIFIER].T)
    v = torch.linspace(-3, 3, h.shape[1])
    probs = lambda q, inp: torch.softmax(torch.func.functional_call(model, q, (inp,)), -1)
    report = audit_symmetry(probs, params, softmax.row_shift_symmetry(v, tasks.CLASSIFIER), x.double(), tol=1e-12)
    assert report.is_symmetry


def test_seeded_models_are_reproducible_and_seed_dependent():
    a, b, c = (tasks.ModularTransformer(P, 8, 2, 16, seed=s) for s in (0, 0, 1))
    assert torch.equal(a.token, b.token) and not torch.equal(a.token, c.token)
    state = torch.random.get_rng_state()
    tasks.MLPClassifier(3, (4,), 2, seed=5)
    assert torch.equal(state, torch.random.get_rng_state())  # the global generator is left alone


def test_seeded_models_leave_the_global_random_state_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    tasks.ModularTransformer(P, d_model=8, n_heads=2, d_mlp=8, seed=5)
    tasks.MLPClassifier(None, (8,), P, modulus=P, seed=6)
    tasks.LinearProbe(4, 3, seed=7)
    assert torch.equal(torch.rand(3), expected)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        reference = torch.nn.Linear(4, 3, bias=False, dtype=torch.float64).weight.detach()
    assert torch.equal(tasks.LinearProbe(4, 3, seed=7).classifier.weight.detach(), reference)


def test_transformer_reads_only_its_own_pair():
    model = tasks.ModularTransformer(P, 8, 2, 16, seed=0)
    x = torch.tensor([[1, 2], [3, 4]])
    close_rows = model(x)
    torch.testing.assert_close(model(x[:1]), close_rows[:1], rtol=1e-12, atol=1e-12)


def test_fit_learns_the_training_set_and_keeps_snapshots():
    split = tasks.modular_arithmetic(P, "add", 0.7, seed=0)
    model = tasks.MLPClassifier(None, (32,), P, modulus=P, seed=0)
    result = tasks.fit(model, split, steps=60, lr=3e-2, weight_decay=0.0, snapshot_every=20)
    assert result.train_accuracy == 1.0
    assert [s for s, _ in result.snapshots] == [20, 40, 60]
    params = dict(model.named_parameters())
    assert all(torch.equal(result.snapshots[-1][1][k], params[k].detach()) for k in params)


def test_model_errors_are_named():
    with pytest.raises(ValueError, match="d_model must be divisible by n_heads"):
        tasks.ModularTransformer(P, d_model=10, n_heads=4)
    with pytest.raises(ValueError, match="in_dim must be None or 2 \\* modulus"):
        tasks.MLPClassifier(5, (4,), P, modulus=P)
    with pytest.raises(ValueError, match="hidden must list at least one width"):
        tasks.MLPClassifier(5, (), 3)
    model = tasks.MLPClassifier(None, (4,), P, modulus=P)
    with pytest.raises(ValueError, match=r"x must be a tensor of shape \(n, 2\)"):
        model(torch.zeros(3, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="token ids in"):
        model(torch.tensor([[0, P]]))
    with pytest.raises(ValueError, match="integer token ids"):
        model(torch.tensor([[0.5, 1.0]]))
    with pytest.raises(ValueError, match="steps must be >= 1"):
        tasks.fit(model, tasks.modular_arithmetic(P), steps=0)
    with pytest.raises(ValueError, match="weight_decay must be >= 0"):
        tasks.fit(model, tasks.modular_arithmetic(P), steps=1, weight_decay=-1.0)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        tasks.fit(functools.partial(model), tasks.modular_arithmetic(P), steps=1)


def test_multiplication_labels_have_the_zero_row():
    split = tasks.modular_arithmetic(P, "multiply", train_fraction=0.5, seed=0)
    x, y = torch.cat([split.x_train, split.x_test]), torch.cat([split.y_train, split.y_test])
    assert torch.all(y[(x[:, 0] == 0) | (x[:, 1] == 0)] == 0)
    assert "(a * b) mod 7" in split.description


def test_fit_with_projection_moves_only_the_function_null_coordinate(close):
    split = tasks.modular_arithmetic(P, "add", train_fraction=0.6, seed=1)
    plain, held = (tasks.MLPClassifier(None, (10,), P, modulus=P, seed=2) for _ in range(2))
    direction = torch.linspace(-1.0, 1.0, 10)
    fit_plain = tasks.fit(plain, split, 20, lr=0.02, weight_decay=1.0, snapshot_every=10)
    fit_held = tasks.fit(
        held,
        split,
        20,
        lr=0.02,
        weight_decay=1.0,
        snapshot_every=10,
        project=regulariser_checks.fix_raw_ratio(50.0, direction),
    )
    for (_, q_plain), (_, q_held) in zip(fit_plain.snapshots, fit_held.snapshots):
        W, W_held = q_plain[tasks.CLASSIFIER], q_held[tasks.CLASSIFIER]
        h = tasks.features(held, q_held, split.x_test)
        close(tasks.features(plain, q_plain, split.x_test), h, rtol=1e-9, atol=1e-10)
        close(softmax.probabilities(W_held, h), softmax.probabilities(W, h), atol=1e-10)
        close(flatness.b_raw(W_held, h) / flatness.b_quot(W_held, h), 50.0, rtol=1e-10)


def test_accuracy_curve_and_onset():
    split = tasks.modular_arithmetic(P, "add", train_fraction=0.6, seed=1)
    model = tasks.MLPClassifier(None, (10,), P, modulus=P, seed=2)
    result = tasks.fit(model, split, 30, lr=0.05, weight_decay=0.0, snapshot_every=10)
    curve = tasks.accuracy_curve(model, result, split.x_train, split.y_train)
    assert [step for step, _ in curve] == [10, 20, 30]
    assert curve[-1][1] == accuracy(model, (split.x_train, split.y_train), params=result.snapshots[-1][1])
    assert tasks.onset_step([(10, 0.0), (20, 0.4), (30, 0.9)], 0.4) == 20
    assert tasks.onset_step([(10, 0.0), (20, 0.3)], 0.5) is None
    with pytest.raises(ValueError, match="threshold must lie in"):
        tasks.onset_step(curve, 0.0)
    with pytest.raises(ValueError, match="result must be a FitResult with checkpoints"):
        tasks.accuracy_curve(model, tasks.fit(model, split, 1), split.x_train, split.y_train)
    with pytest.raises(TypeError, match="project must be callable"):
        tasks.fit(model, split, 1, project=3)
    with pytest.raises(ValueError, match="projection must return the same parameter names"):
        tasks.fit(model, split, 1, project=lambda q: {})


def test_grokking_curve_stops_at_the_first_checkpoint_past_the_threshold():
    from lossgeom import training

    split = tasks.modular_arithmetic(P, "add", train_fraction=0.6, seed=1)
    model = tasks.QuadraticMLP(P, 16, seed=0)
    rule = training.adam(0.05, weight_decay=0.5)
    full = tasks.grokking_curve(model, split, rule, 120, every=10)
    reference = tasks.generalisation_curve(model, split, rule, 120, every=10)
    assert list(full.checkpoints) == list(reference.checkpoints)
    assert np.array_equal(full.test_accuracy, reference.test_accuracy)
    target = float(full.test_accuracy.max())
    assert target > full.test_accuracy[0]  # the run learns something, so stopping is not trivial
    stopped = tasks.grokking_curve(model, split, rule, 120, every=10, stop_at=target)
    end = full.steps_to_reach(target)[1]
    assert stopped.checkpoints[-1] == end and stopped.test_accuracy[-1] >= target
    assert np.all(stopped.test_accuracy[:-1] < target)
    assert np.array_equal(stopped.test_accuracy, full.test_accuracy[: len(stopped.checkpoints)])


def test_grokking_sweep_records_crossings_and_paired_speedups():
    sweep = tasks.grokking_sweep(
        P, 16, 0.05, (0.0, 0.5), (0.0, 0.1), (0, 1), max_steps=80, every=10, threshold=0.3, train_fraction=0.6
    )
    assert sweep.memorised.shape == sweep.generalised.shape == (2, 2, 2)
    for i, wd in enumerate(sweep.weight_decays):
        for j, radius in enumerate(sweep.radii):
            for k, seed in enumerate(sweep.seeds):
                curve = sweep.curves[wd, radius, seed]
                crossing = curve.steps_to_reach(0.3)
                assert sweep.generalised[i, j, k] == (np.inf if crossing is None else crossing[1])
                if radius and crossing is not None:
                    assert curve.checkpoints[-1] == crossing[1]  # a SAM run stops at its crossing
                if not radius:
                    assert curve.checkpoints[-1] == 80  # a plain run goes the whole budget
    with np.errstate(invalid="ignore", divide="ignore"):
        expected = sweep.generalised[:, :1] / sweep.generalised
    np.testing.assert_array_equal(sweep.speedup(), expected)
    assert np.all(sweep.delay == sweep.generalised - sweep.memorised)


def test_grokking_sweep_summary_and_errors():
    inf = np.inf
    sweep = tasks.GrokkingSweep(
        (0.0, 0.1),
        (0.0, 0.5),
        (0, 1, 2),
        0.5,
        100,
        np.full((2, 2, 3), 20.0),
        np.array([[[inf, inf, inf], [inf, inf, inf]], [[60, 80, 90], [30, 40, inf]]]),
        {},
    )
    np.testing.assert_array_equal(sweep.speedup()[1, 1], [2.0, 2.0, 0.0])
    lines = sweep.summary().splitlines()
    assert "never" in lines[1] and lines[3].split()[2:6] == ["20", "[20,", "20]", "80"]
    assert "35 [30, 40] in 2/3" in lines[4] and lines[4].rstrip().endswith("2 [0, 2]")
    no_plain = tasks.GrokkingSweep((0.1,), (0.5,), (0,), 0.5, 10, np.zeros((1, 1, 1)), np.ones((1, 1, 1)), {})
    with pytest.raises(ValueError, match="needs radius 0"):
        no_plain.speedup()
    with pytest.raises(ValueError, match="weight_decays and radii must be >= 0"):
        tasks.grokking_sweep(P, 4, 0.05, (-0.1,), (0.0,), (0,), 10)
    with pytest.raises(ValueError, match="threshold must lie in"):
        tasks.grokking_sweep(P, 4, 0.05, (0.1,), (0.0,), (0,), 10, threshold=0.0)
    with pytest.raises(ValueError, match="must not be empty"):
        tasks.grokking_sweep(P, 4, 0.05, (), (0.0,), (0,), 10)
    with pytest.raises(ValueError, match="stop_at must lie in"):
        tasks.grokking_curve(tasks.QuadraticMLP(P, 4), tasks.modular_arithmetic(P), None, 10, stop_at=1.5)

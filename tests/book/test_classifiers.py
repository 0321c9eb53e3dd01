"""The small softmax classifiers of the chapters: the module, its parameter dict, its training."""

import pytest
import torch

from lossgeom.flatness import softmax_gauge as sm
from lossgeom_book import classifiers as cl

from conftest import assert_close


def test_init_classifier_and_features():
    params = cl.init_classifier([5, 4, 3], seed=1, init_scale=2.0)
    assert set(params) == {"hidden.0.weight", "hidden.0.bias", "weight"}
    assert params["weight"].shape == (3, 4) and params["weight"].abs().max() <= 2.0 / 4**0.5
    again = cl.init_classifier([5, 4, 3], seed=1, init_scale=2.0)
    assert all(torch.equal(params[k], again[k]) for k in params)
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    h = cl.classifier_features(params, x)
    assert_close(h, torch.relu(x @ params["hidden.0.weight"].T + params["hidden.0.bias"]), rtol=1e-15)
    assert_close(cl.classifier_logits(params, x), h @ params["weight"].T, rtol=1e-15)
    linear = cl.init_classifier([5, 3], seed=0)
    assert set(linear) == {"weight"} and torch.equal(cl.classifier_features(linear, x), x)
    with pytest.raises(ValueError, match="sizes must list"):
        cl.init_classifier([5, 1])
    with pytest.raises(ValueError, match="init_scale must be > 0"):
        cl.init_classifier([5, 3], init_scale=0.0)
    with pytest.raises(ValueError, match="features of width 5 but W expects 4"):
        cl.classifier_features({"weight": torch.zeros(3, 4)}, x)
    with pytest.raises(ValueError, match="params must hold the classifier"):
        cl.classifier_features({}, x)


def test_softmax_classifier_is_a_module_whose_parameter_dict_is_init_classifier():
    model = cl.SoftmaxClassifier([5, 4, 3], seed=1, init_scale=2.0)
    params = cl.init_classifier([5, 4, 3], seed=1, init_scale=2.0)
    assert list(params) == [name for name, _ in model.named_parameters()]
    assert all(torch.equal(p, params[name]) for name, p in model.named_parameters())
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(model(x), cl.classifier_logits(params, x))
        assert torch.equal(model(x, return_features=True), cl.classifier_features(params, x))
    moved = {k: v + 0.1 for k, v in params.items()}
    by_call = torch.func.functional_call(model, moved, (x,))
    assert torch.equal(by_call, cl.classifier_logits(moved, x))
    skeleton = cl.SoftmaxClassifier.for_params(params)
    assert all(p.is_meta for p in skeleton.parameters())
    assert [tuple(p.shape) for p in skeleton.parameters()] == [tuple(p.shape) for p in params.values()]
    global_state = torch.random.get_rng_state()
    cl.SoftmaxClassifier([5, 3], seed=4)
    assert torch.equal(torch.random.get_rng_state(), global_state)  # seeded by its own generator
    with pytest.raises(ValueError, match="params must hold exactly"):
        cl.classifier_logits({**params, "extra.weight": torch.zeros(2)}, x)


def test_sgd_keeps_the_mean_row_and_weight_decay_shrinks_it():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(20, 4, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (20,), generator=gen)
    params = cl.init_classifier([4, 3], seed=0)
    trained, hist = cl.train_classifier(
        params, x, y, steps=30, lr=0.1, record_every=10, record=lambda s, q: (s, float(sm.mean_row_share(q["weight"])))
    )
    assert [s for s, _ in hist] == [0, 10, 20, 30]
    assert_close(sm.mean_row(trained["weight"]), sm.mean_row(params["weight"]), rtol=1e-12, atol=1e-14)
    decayed, _ = cl.train_classifier(params, x, y, steps=30, lr=0.1, weight_decay=0.1)
    assert sm.mean_row(decayed["weight"]).norm() < 0.5 * sm.mean_row(params["weight"]).norm()
    adam, _ = cl.train_classifier(params, x, y, steps=30, lr=0.01, optimizer="adam")
    assert (sm.mean_row(adam["weight"]) - sm.mean_row(params["weight"])).norm() > 1e-4
    loss = lambda q: torch.nn.functional.cross_entropy(cl.classifier_logits(q, x), y)
    assert loss(trained) < loss(params)
    with pytest.raises(ValueError, match="optimizer must be"):
        cl.train_classifier(params, x, y, steps=1, lr=0.1, optimizer="lbfgs")
    with pytest.raises(ValueError, match="lr must be > 0"):
        cl.train_classifier(params, x, y, steps=1, lr=0.0)
    with pytest.raises(ValueError, match="weight_decay must be >= 0"):
        cl.train_classifier(params, x, y, steps=1, lr=0.1, weight_decay=-1.0)
    with pytest.raises(ValueError, match="steps must be >= 0"):
        cl.train_classifier(params, x, y, steps=-1, lr=0.1)


def test_train_setting_is_train_classifier_with_the_sweeps_recipe():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(24, 5, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (24,), generator=gen)
    record = lambda s, q: (s, float(sm.mean_row_share(q["weight"])))
    for optimizer, lr in (("sgd", 0.1), ("adam", 0.01)):
        setting = ((5, 4, 3), optimizer, 2.0, 1e-2)
        got, hist = cl.train_setting(setting, x, y, seed=3, steps=20, record_every=10, record=record)
        start = cl.init_classifier([5, 4, 3], seed=3, init_scale=2.0)
        want, want_hist = cl.train_classifier(
            start, x, y, steps=20, lr=lr, weight_decay=1e-2, optimizer=optimizer, record_every=10, record=record
        )
        assert all(torch.equal(got[k], want[k]) for k in want) and hist == want_hist
        assert [s for s, _ in hist] == [0, 10, 20]
    default, _ = cl.train_setting(((5, 3), "sgd", 1.0, 0.0), x, y, steps=5)
    by_hand, _ = cl.train_classifier(cl.init_classifier([5, 3], seed=0), x, y, steps=5, lr=0.1)
    assert torch.equal(default["weight"], by_hand["weight"])  # seed 0 by default
    with pytest.raises(ValueError, match="setting must be"):
        cl.train_setting(((5, 3), "sgd", 1.0), x, y)
    with pytest.raises(ValueError, match="optimizer must be one of"):
        cl.train_setting(((5, 3), "lbfgs", 1.0, 0.0), x, y)


def test_gauge_sweep_lists_the_chapters_settings():
    sweep = cl.GAUGE_SWEEP
    assert len(sweep) == len(set(sweep)) == 12
    assert all(len(s) == 4 and s[1] in cl.LEARNING_RATES and s[0][-1] == 10 for s in sweep)
    mlp_sgd = {(scale, decay) for sizes, opt, scale, decay in sweep if sizes == (64, 64, 10) and opt == "sgd"}
    assert {(s, d) for s in (0.3, 1.0, 3.0) for d in (0.0, 1e-2)} <= mlp_sgd
    assert ((64, 64, 10), "adam", 1.0, 0.0) in sweep and ((64, 64, 10), "adam", 1.0, 1e-2) in sweep

"""Every entry point on the models researchers train, against independent dense references.

For each architecture (batch norm and dropout in eval mode, a residual block, tied weights,
a frozen layer, an embedding model, a transformer encoder layer, a convolution) and each
loss, the module-form entry points either match a dense float64 reference built here from
``torch.autograd.functional`` alone (to 1e-10) or, for models they cannot serve (tuple
outputs, layers left in training mode), raise a clear error; and the model's parameters
and buffers are bit-identical afterwards.

The loss module is the definition: cross-entropy with ``ignore_index`` targets present, class
weights and label smoothing, a subclass overriding ``forward``, ``BCEWithLogitsLoss`` and
``NLLLoss`` after a log-softmax agree with the module on all the data as one batch, across
batches of unequal size; the true Fisher agrees with the likelihood's expectation taken by
enumeration, or is refused naming the option. Every batch form (unequal pairs, dict batches
with ``"labels"``, keyword inputs, a streamed ``DataLoader`` over a non-contiguous ``Subset``,
batches already on the parameters' device) is weighted as one big batch, and a random forward
no module check sees (``F.dropout`` in a custom ``forward``) is refused by every entry point.
"""

from __future__ import annotations

import pytest
import torch
from architecture_cases import (
    ARCHITECTURES,
    F64,
    LOSS_MODULES,
    LOSSES,
    KeywordInput,
    Pair,
    PlantedDropout,
    inputs_for,
    reference_hessian,
    reference_true_fisher,
    state_of,
    targets_for,
)
from torch import nn
from torch.utils.data import DataLoader, Subset, TensorDataset

from lossgeom import curvature
from lossgeom.curvature.references import dense_fisher_factor
from lossgeom.models import loss_closure
from lossgeom.risk import EmpiricalRisk


@pytest.mark.parametrize("loss_name", list(LOSSES))
@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_every_entry_point_matches_an_independent_reference_and_leaves_the_model_unchanged(name, loss_name):
    make, kind = ARCHITECTURES[name]
    torch.manual_seed(0)
    model, loss = make(), LOSSES[loss_name]()
    gen = torch.Generator().manual_seed(1)
    x, y = inputs_for(kind, 9, gen), targets_for(loss, 9, gen)
    before = state_of(model)
    reference = reference_hessian(model, loss, x, y)
    scale = float(reference.abs().max())
    dense = curvature.dense_hessian(model, loss, (x, y))
    assert torch.allclose(dense, reference, rtol=0, atol=1e-10 * scale)
    operator = curvature.hessian_operator(model, loss, [(x[:4], y[:4]), (x[4:], y[4:])])  # unequal batches
    v = torch.randn(reference.shape[0], 2, generator=gen, **F64)
    assert torch.allclose(operator @ v, reference @ v, rtol=0, atol=1e-10 * scale * float(v.abs().max()))
    expected = float(torch.linalg.eigvalsh(reference)[-1])
    assert curvature.lambda_max(model, loss, (x, y), tol=1e-12) == pytest.approx(expected, rel=1e-9, abs=1e-10 * scale)
    closure = loss_closure(model, loss, (x, y))
    trainable = {k: p.detach() for k, p in model.named_parameters() if p.requires_grad}
    assert torch.allclose(curvature.closure_hessian(closure, trainable), reference, rtol=0, atol=1e-10 * scale)
    after = state_of(model)
    assert all(torch.equal(before[k], after[k]) for k in before), "parameters or buffers changed"


def test_models_the_entry_points_cannot_serve_are_refused_by_each():
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randn(6, 4, generator=gen, **F64), torch.randint(0, 3, (6,), generator=gen)
    loss = nn.CrossEntropyLoss()
    training = nn.Sequential(nn.Linear(4, 5, **F64), nn.Dropout(0.3), nn.Linear(5, 3, **F64))  # train mode
    for entry in (curvature.dense_hessian, curvature.hessian_operator, curvature.lambda_max, loss_closure):
        with pytest.raises(ValueError, match=r"dropout \(p = 0.3\) in training mode"):
            entry(training, loss, (x, y))
        with pytest.raises(TypeError, match="returns a tuple"):
            result = entry(Pair(), loss, (x, y))
            result(dict(Pair().named_parameters())) if callable(result) else result.dense()
        with pytest.raises(TypeError, match="loss must be"):
            entry(Pair(), "cross_entropy", (x, y))


# The loss module is the definition: options, a subclass, BCEWithLogits and NLL, each on one or two
# architectures (all but the transformer, the slowest, whose losses are above), the reference being
# the module on ALL the data as one batch.
LOSS_CASES = [
    ("cross-entropy ignore_index=-100 present", "embedding"),
    ("cross-entropy ignore_index=-100 present", "residual block"),
    ("cross-entropy sum, ignore_index=2 present", "frozen layer"),
    ("cross-entropy class weights", "batch norm (eval)"),
    ("cross-entropy class weights", "tied weights"),
    ("cross-entropy label_smoothing", "dropout (eval)"),
    ("cross-entropy weights, smoothing and ignore_index", "residual block"),
    ("cross-entropy weights, smoothing and ignore_index", "convolution"),
    ("subclass 2x cross-entropy", "residual block"),
    ("subclass 2x cross-entropy", "batch norm (eval)"),
    ("bce-with-logits multi-label", "tied weights"),
    ("bce-with-logits multi-label", "convolution"),
    ("bce-with-logits pos_weight", "frozen layer"),
    ("nll on log-softmax, ignore_index=-100 present", "embedding"),
    ("nll on log-softmax, ignore_index=-100 present", "dropout (eval)"),
]


def _loss_case(loss_name, name, n=9, seed=1):
    make_loss, make_targets, refusal, log_softmax = LOSS_MODULES[loss_name]
    make, kind = ARCHITECTURES[name]
    torch.manual_seed(0)
    model = make()
    if log_softmax:
        model = nn.Sequential(model, nn.LogSoftmax(dim=1))
    gen = torch.Generator().manual_seed(seed)
    return model, make_loss(), inputs_for(kind, n, gen), make_targets(n, gen), refusal, gen


def _assert_matches(actual, reference, what):
    scale = float(reference.abs().max())
    error = float((actual - reference).abs().max())
    assert error <= 1e-10 * scale, f"{what}: max |error| {error:.3g} against a reference of scale {scale:.3g}"


@pytest.mark.parametrize(("loss_name", "name"), LOSS_CASES, ids=[f"{n}-{a}" for n, a in LOSS_CASES])
def test_every_loss_module_is_the_definition_across_unequal_batches(loss_name, name):
    model, loss, x, y, refusal, gen = _loss_case(loss_name, name)
    before = state_of(model)
    reference = reference_hessian(model, loss, x, y)
    scale = float(reference.abs().max())
    _assert_matches(curvature.dense_hessian(model, loss, (x, y)), reference, "dense_hessian")
    batches = [(x[:4], y[:4]), (x[4:], y[4:])]  # unequal sizes, and unequal kept counts or class weights
    v = torch.randn(reference.shape[0], 2, generator=gen, **F64)
    _assert_matches(curvature.hessian_operator(model, loss, batches) @ v, reference @ v, "hessian_operator")
    expected = float(torch.linalg.eigvalsh(reference)[-1])
    assert curvature.lambda_max(model, loss, batches, tol=1e-10) == pytest.approx(expected, rel=1e-9, abs=1e-10 * scale)
    trainable = {k: p.detach() for k, p in model.named_parameters() if p.requires_grad}
    _assert_matches(curvature.closure_hessian(loss_closure(model, loss, (x, y)), trainable), reference, "closure")
    likelihood_entries = (
        lambda data: curvature.fisher_operator(model, loss, data, kind="true") @ v,
        lambda data: dense_fisher_factor(model, loss, data),
        lambda data: curvature.dense_fisher(model, loss, data, kind="true"),
    )
    if refusal is None:
        fisher = reference_true_fisher(model, loss, x, y)
        product, factor, dense = (entry(batches) for entry in likelihood_entries)
        _assert_matches(product, fisher @ v, "fisher_operator(kind='true')")
        _assert_matches(factor.T @ factor, fisher, "dense_fisher_factor")
        _assert_matches(dense, fisher, "dense_fisher(kind='true')")
    else:
        for entry in likelihood_entries:
            with pytest.raises(ValueError, match=rf"the true Fisher \(kind='true'\) needs a likelihood.*{refusal}"):
                entry(batches)
    after = state_of(model)
    assert all(torch.equal(before[k], after[k]) for k in before), "parameters or buffers changed"


class _CountingSubset(Subset):
    """A ``Subset`` that counts the examples read, so that a streamed loader is seen to be re-read."""

    reads = 0

    def __getitem__(self, i):
        type(self).reads += 1
        return super().__getitem__(i)

    def __getitems__(self, indices):
        return [self[i] for i in indices]


def _batch_form(form, model, x, y):
    """``(model, data)`` in the batch form ``form`` holding exactly the examples ``x, y`` (in order)."""
    if form == "list of unequal pairs":
        return model, [(x[:2], y[:2]), (x[2:7], y[2:7]), (x[7:], y[7:])]
    if form == "dict batches with labels":
        return KeywordInput(model), [{"inputs": x[:5], "labels": y[:5]}, {"inputs": x[5:], "labels": y[5:]}]
    if form == "(keyword inputs, y) pairs":
        return KeywordInput(model), [({"inputs": x[:6]}, y[:6]), ({"inputs": x[6:]}, y[6:])]
    if form == "batches on torch.device('cpu')":
        cpu = torch.device("cpu")
        return model.to(cpu), [(x[:3].to(cpu), y[:3].to(cpu)), (x[3:].to(cpu), y[3:].to(cpu))]
    raise AssertionError(form)


BATCH_FORMS = [
    "list of unequal pairs",
    "dict batches with labels",
    "(keyword inputs, y) pairs",
    "batches on torch.device('cpu')",
    "streamed DataLoader over a non-contiguous Subset",
]


@pytest.mark.parametrize("name", ["residual block", "embedding"])
@pytest.mark.parametrize("form", BATCH_FORMS)
def test_every_batch_form_is_weighted_as_one_big_batch(form, name):
    make, kind = ARCHITECTURES[name]
    torch.manual_seed(0)
    model, loss = make(), nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(3)
    x, y = inputs_for(kind, 20, gen), torch.randint(0, 3, (20,), generator=gen)
    y[[0, 1, 4, 13]] = -100  # padding: the batches hold unequal counts of kept targets
    before = state_of(model)
    if form.startswith("streamed"):
        index = [0, 1, 3, 4, 6, 9, 10, 13, 15, 16, 18]  # non-contiguous: the subset's examples are x[index]
        subset = _CountingSubset(TensorDataset(x, y), index)
        data = DataLoader(subset, batch_size=4, shuffle=False)  # batches of 4, 4, 3
        x, y = x[index], y[index]
    else:
        x, y = x[:12], y[:12]
        model, data = _batch_form(form, model, x, y)
    base = model.inner if isinstance(model, KeywordInput) else model  # the same parameters, in the same order
    reference = reference_hessian(base, loss, x, y)
    scale = float(reference.abs().max())
    v = torch.randn(reference.shape[0], 2, generator=gen, **F64)
    _assert_matches(curvature.dense_hessian(model, loss, data), reference, "dense_hessian")
    operator = curvature.hessian_operator(model, loss, data)
    reads = _CountingSubset.reads
    _assert_matches(operator @ v, reference @ v, "hessian_operator")
    if form.startswith("streamed"):
        assert _CountingSubset.reads >= reads + len(index), "the DataLoader was not read again for a product"
    if form == "batches on torch.device('cpu')":  # already on the parameters' device: not copied
        held = [b.args[0].data_ptr() for b in EmpiricalRisk(model, loss, data).batches()]
        assert held == [b[0].data_ptr() for b in data]
    expected = float(torch.linalg.eigvalsh(reference)[-1])
    assert curvature.lambda_max(model, loss, data, tol=1e-10) == pytest.approx(expected, rel=1e-9, abs=1e-10 * scale)
    fisher = reference_true_fisher(base, loss, x, y)
    _assert_matches(curvature.fisher_operator(model, loss, data, kind="true") @ v, fisher @ v, "fisher_operator")
    factor = dense_fisher_factor(model, loss, data)
    _assert_matches(factor.T @ factor, fisher, "dense_fisher_factor")
    after = state_of(base)
    assert all(torch.equal(before[k], after[k]) for k in before), "parameters or buffers changed"


def test_a_planted_random_forward_is_refused_by_every_entry_point():
    torch.manual_seed(0)
    model = PlantedDropout()  # left in train mode: F.dropout(h, 0.3, self.training) draws a mask per call
    gen = torch.Generator().manual_seed(4)
    x, y = torch.randn(10, 4, generator=gen, **F64), torch.randint(0, 3, (10,), generator=gen)
    loss, data = nn.CrossEntropyLoss(), [(x[:6], y[:6]), (x[6:], y[6:])]
    before = state_of(model)
    trainable = {k: p.detach() for k, p in model.named_parameters()}
    entries = {
        "dense_hessian": lambda: curvature.dense_hessian(model, loss, data),
        "hessian_operator": lambda: curvature.hessian_operator(model, loss, data),
        "lambda_max": lambda: curvature.lambda_max(model, loss, data),
        "ggn_operator": lambda: curvature.ggn_operator(model, loss, data),
        "dense_ggn": lambda: curvature.dense_ggn(model, loss, data),
        "fisher_operator (empirical)": lambda: curvature.fisher_operator(model, loss, data),
        "fisher_operator (true)": lambda: curvature.fisher_operator(model, loss, data, kind="true"),
        "dense_fisher_factor": lambda: dense_fisher_factor(model, loss, data),
        "closure_hessian of loss_closure": lambda: curvature.closure_hessian(
            loss_closure(model, loss, (x, y)), trainable
        ),
    }
    for what, entry in entries.items():
        with pytest.raises(ValueError, match=r"not a fixed function(.|\n)*F\.dropout\(h, p, self\.training\)") as err:
            entry()
        assert "eval()" in str(err.value), what
    assert all(torch.equal(before[k], t) for k, t in state_of(model).items()), "parameters or buffers changed"
    model.eval()  # the same model in eval mode is a fixed function, and measured
    _assert_matches(curvature.dense_hessian(model, loss, data), reference_hessian(model, loss, x, y), "eval mode")

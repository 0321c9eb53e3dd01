"""The flatness measures call the user's loss module: options, masked targets and subclasses.

Every measure is checked against an independent float64 reference on models the rest of
the suite does not use: the same measure on the examples the loss keeps (``ignore_index``),
a per-example reverse-mode loop (the Fisher-Rao norm), ``torch.autograd.functional.hessian``
of the loss module (class weights, subclasses).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lossgeom import curvature, flatness
from lossgeom.flatness import LossPoint
from lossgeom.flatness.loss_point import NotApplicable

F64 = dict(dtype=torch.float64)
RTOL = 1e-10


class GatedClassifier(nn.Module):
    """Softplus features with a LayerNorm and a batch norm (eval, running statistics), a Linear head."""

    def __init__(self, d_in: int = 3, width: int = 5, classes: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(d_in, width, **F64)
        self.norm = nn.LayerNorm(width, **F64)
        self.bn = nn.BatchNorm1d(width, **F64)
        self.head = nn.Linear(width, classes, **F64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.bn(nn.functional.softplus(self.norm(self.inp(x)))))


def gated(seed: int = 11) -> GatedClassifier:
    torch.manual_seed(seed)
    model = GatedClassifier()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.3, 0.3)
        model.bn.running_var.uniform_(0.5, 1.5)
        model.bn.num_batches_tracked.fill_(7)
    return model.eval()


def masked_data(ignore: int, n: int = 26, seed: int = 5):
    """Inputs, class targets with about a third set to ``ignore``, and the mask of the kept ones."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=gen, **F64)
    y = torch.randint(0, 4, (n,), generator=gen)
    drop = torch.rand(n, generator=gen) < 0.35
    y = torch.where(drop, torch.full_like(y, ignore), y)
    kept = y != ignore
    assert 0 < int((~kept).sum()) < n
    return x, y, kept


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same_state(model: nn.Module, before: dict[str, torch.Tensor]) -> bool:
    now = model.state_dict()
    return set(now) == set(before) and all(torch.equal(now[k], before[k]) for k in before)


MEASURES = [
    (curvature.lambda_max, {"tol": 1e-12}),
    (flatness.hessian_trace, {"method": "exact"}),
    (flatness.hessian_trace, {"n_probes": 30, "seed": 3}),
    (flatness.keskar_sharpness, {"max_iter": 5}),
    (flatness.sam_sharpness, {}),
    (flatness.adaptive_sharpness, {}),
    (flatness.fisher_rao_norm, {}),
    (flatness.relative_flatness, {}),
    (flatness.classifier_kappa_exact, {}),
    (flatness.classifier_b_raw, {}),
    (flatness.classifier_b_quot, {}),
    (flatness.riemannian_sharpness, {"fisher": "true"}),
    (flatness.riemannian_sharpness, {"fisher": "diagonal"}),
    (flatness.model_wolkowicz_styan_bound, {}),
]


def close(a: float, b: float, rtol: float = RTOL) -> bool:
    return abs(a - b) <= rtol * max(abs(a), abs(b), 1e-300)


@pytest.mark.parametrize("ignore", [-100, 2], ids=["ignore=-100", "ignore=class 2"])
def test_every_measure_with_ignored_targets_is_that_of_the_kept_examples(ignore):
    model = gated()
    x, y, kept = masked_data(ignore)
    before = state(model)
    masked, plain = nn.CrossEntropyLoss(ignore_index=ignore), nn.CrossEntropyLoss()
    batches = [(x[:9], y[:9]), (x[9:], y[9:])]
    point = LossPoint(model, masked, batches)
    reference_point = LossPoint(model, plain, (x[kept], y[kept]))
    assert point.n_dropped == int((~kept).sum()) and point.x.shape[0] == int(kept.sum())
    assert close(point.value(), reference_point.value(), 1e-14)
    for measure, options in MEASURES:
        got = measure(model, masked, batches, **options)
        want = measure(model, plain, (x[kept], y[kept]), **options)
        assert close(got, want), (measure.__name__, options, got, want)
        at_point = flatness.measure_at(point, measure, **options)
        assert close(at_point, flatness.measure_at(reference_point, measure, **options)), measure.__name__
    # the numbers the issue reported wrong differ from the measure over all rows, ignored ones included
    everything = (x, torch.where(kept, y, 0))
    assert not close(
        flatness.fisher_rao_norm(model, masked, batches), flatness.fisher_rao_norm(model, plain, everything), 1e-3
    )
    assert same_state(model, before)


def test_nll_on_log_probabilities_with_ignored_targets_matches_the_cross_entropy_on_logits():
    """NLL(log_softmax z) is CE(z): same loss, Hessian, Fisher (in the NLL's own likelihood) and Fisher-Rao norm."""
    torch.manual_seed(12)
    logits_model = nn.Sequential(nn.Linear(3, 4, **F64), nn.Tanh(), nn.Linear(4, 4, **F64))
    log_probs = nn.Sequential(logits_model, nn.LogSoftmax(dim=1))
    x, y, kept = masked_data(-100, n=60, seed=6)
    nll, ce = nn.NLLLoss(), nn.CrossEntropyLoss()
    for measure, options in [
        (flatness.hessian_trace, {"method": "exact"}),
        (flatness.fisher_rao_norm, {}),
        (flatness.riemannian_sharpness, {"fisher": "true"}),
    ]:
        got = measure(log_probs, nll, (x, y), **options)
        assert close(got, measure(logits_model, ce, (x[kept], y[kept]), **options)), measure.__name__
    with pytest.raises(NotApplicable, match="softmax cross-entropy"):
        flatness.classifier_kappa_exact(log_probs, nll, (x, y))


def test_all_targets_ignored_is_refused():
    x, y, _ = masked_data(-100)
    with pytest.raises(ValueError, match="every target of data is ignored"):
        LossPoint(gated(), nn.CrossEntropyLoss(), (x, torch.full_like(y, -100)))


class BagOfTokens(nn.Module):
    """Mean of token embeddings (padding index 0), a tanh layer and a Linear head."""

    def __init__(self, vocab: int = 7, dim: int = 3, classes: int = 3) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim, padding_idx=0, **F64)
        self.hidden = nn.Linear(dim, 4, **F64)
        self.head = nn.Linear(4, classes, **F64)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.hidden(self.emb(tokens).mean(dim=1))))


def test_fisher_rao_norm_with_a_padding_embedding_matches_a_per_example_reverse_mode_loop():
    torch.manual_seed(21)
    model = BagOfTokens()
    with torch.no_grad():
        model.emb.weight[0] = torch.tensor([0.7, -1.1, 0.4], **F64)  # a padding row that is not zero
    gen = torch.Generator().manual_seed(22)
    tokens = torch.randint(1, 7, (12, 5), generator=gen)
    tokens[:, 3:] = 0  # padded sequences
    y = torch.randint(0, 3, (12,), generator=gen)
    loss = nn.CrossEntropyLoss()
    before = state(model)
    params = dict(model.named_parameters())
    theta = torch.cat([p.detach().reshape(-1) for p in params.values()])
    projections = []
    for i in range(tokens.shape[0]):
        model.zero_grad()
        loss(model(tokens[i : i + 1]), y[i : i + 1]).backward()
        g = torch.cat([p.grad.reshape(-1) for p in params.values()])
        projections.append(float(g @ theta))
    model.zero_grad(set_to_none=True)
    reference = math.sqrt(sum(p * p for p in projections) / len(projections))
    with pytest.warns(RuntimeWarning, match="reverse mode is used instead"):
        got = flatness.fisher_rao_norm(model, loss, (tokens, y))
    assert close(got, reference), (got, reference)
    # forward mode differentiates the padding row, which the gradient holds fixed: a different number
    point = LossPoint(model, loss, (tokens, y))
    _, directional = torch.func.jvp(
        lambda v: nn.functional.cross_entropy(point.outputs(point.unflatten(v)), y, reduction="none"),
        (point.flat(),),
        (point.flat(),),
    )
    assert not close(float(directional.pow(2).mean().sqrt()), reference, 1e-3)
    assert same_state(model, before)


class Doubled(nn.CrossEntropyLoss):
    """Twice the cross-entropy: a subclass that overrides forward."""

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return 2 * super().forward(input, target)


class DoubledSquare(nn.MSELoss):
    """Three times the squared error."""

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return 3 * super().forward(input, target)


def dense_hessian_of(model: nn.Module, loss: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``torch.autograd.functional.hessian`` of ``loss(model(x), y)`` in the flat parameters."""
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def value(v: torch.Tensor) -> torch.Tensor:
        pieces, start = {}, 0
        for name, shape in zip(names, shapes):
            size = math.prod(shape)
            pieces[name] = v[start : start + size].reshape(shape)
            start += size
        return loss(torch.func.functional_call(model, pieces, (x,)), y)

    return torch.autograd.functional.hessian(value, flat)


def test_a_subclass_is_measured_through_its_own_forward():
    model = gated(seed=13)
    x, y, _ = masked_data(-100, seed=7)
    y = y.clamp_min(0)
    before = state(model)
    plain = flatness.hessian_trace(model, nn.CrossEntropyLoss(), (x, y), method="exact")
    doubled = flatness.hessian_trace(model, Doubled(), (x, y), method="exact")
    assert close(doubled, 2 * plain, 1e-12)
    point = LossPoint(model, Doubled(), (x, y))
    assert close(flatness.measure_at(point, flatness.hessian_trace, method="exact"), 2 * plain, 1e-12)
    assert close(
        flatness.measure_at(point, curvature.lambda_max, tol=1e-12),
        2 * curvature.lambda_max(model, nn.CrossEntropyLoss(), (x, y), tol=1e-12),
    )
    for measure in (
        flatness.fisher_rao_norm,
        flatness.classifier_kappa_exact,
        flatness.classifier_b_raw,
        flatness.classifier_b_quot,
        flatness.riemannian_sharpness,
    ):
        with pytest.raises(NotApplicable, match="overrides the forward of CrossEntropyLoss"):
            measure(model, Doubled(), (x, y))
    assert same_state(model, before)


def test_a_square_loss_subclass_gives_its_own_hessian_and_no_flat_q():
    torch.manual_seed(14)
    model = nn.Sequential(nn.Linear(3, 4, bias=False, **F64), nn.ReLU(), nn.Linear(4, 1, bias=False, **F64))
    gen = torch.Generator().manual_seed(15)
    x, y = torch.randn(10, 3, generator=gen, **F64), torch.randn(10, 1, generator=gen, **F64)
    H = dense_hessian_of(model, DoubledSquare(), x, y)
    assert close(flatness.hessian_trace(model, DoubledSquare(), (x, y), method="exact"), float(H.trace()), 1e-12)
    flatness.model_quotient_flatness(model, nn.MSELoss(), (x, y))  # applies to the plain square loss
    with pytest.raises(NotApplicable, match="overrides the forward of MSELoss"):
        flatness.model_quotient_flatness(model, DoubledSquare(), (x, y))


@pytest.mark.parametrize(
    "loss, option",
    [
        (nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.5, 0.5, 1.5], **F64)), "weight"),
        (nn.CrossEntropyLoss(label_smoothing=0.2), "label_smoothing"),
    ],
    ids=["weight", "label_smoothing"],
)
def test_options_keep_the_hessian_exact_and_refuse_the_likelihood_by_name(loss, option):
    model = gated(seed=16)
    x, y, _ = masked_data(-100, seed=8)
    y = y.clamp_min(0)
    before = state(model)
    H = dense_hessian_of(model, loss, x, y)
    assert close(flatness.hessian_trace(model, loss, (x, y), method="exact"), float(H.trace()), 1e-12)
    point = LossPoint(model, loss, (x, y))
    assert close(flatness.measure_at(point, flatness.hessian_trace, method="exact"), float(H.trace()), 1e-12)
    with torch.no_grad():
        assert close(point.value(), float(loss(model(x), y)), 1e-14)
    for measure in (
        flatness.fisher_rao_norm,
        flatness.classifier_kappa_exact,
        flatness.classifier_b_raw,
        flatness.classifier_b_quot,
        flatness.riemannian_sharpness,
    ):
        with pytest.raises(NotApplicable, match=rf"CrossEntropyLoss\({option}=\.\.\.\)"):
            measure(model, loss, (x, y))
    assert same_state(model, before)


def test_a_loss_module_the_library_does_not_know_is_measured_where_no_likelihood_is_needed():
    class Cubic(nn.Module):
        def forward(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return ((out - y) ** 2 + 0.1 * (out - y) ** 4).mean()

    torch.manual_seed(17)
    model = nn.Sequential(nn.Linear(3, 4, **F64), nn.Tanh(), nn.Linear(4, 2, **F64))
    gen = torch.Generator().manual_seed(18)
    x, y = torch.randn(9, 3, generator=gen, **F64), torch.randn(9, 2, generator=gen, **F64)
    H = dense_hessian_of(model, Cubic(), x, y)
    point = LossPoint(model, Cubic(), (x, y))
    assert close(flatness.measure_at(point, flatness.hessian_trace, method="exact"), float(H.trace()), 1e-12)
    with pytest.raises(NotApplicable, match="not one the library knows"):
        flatness.measure_at(point, flatness.fisher_rao_norm)


@pytest.mark.parametrize(
    "loss, error, match",
    [
        (nn.CrossEntropyLoss(reduction="sum"), ValueError, "reduction='mean'"),
        (nn.CrossEntropyLoss(reduction="none"), ValueError, "reduction must be one of"),
        ("cross_entropy", TypeError, "loss module"),
        (nn.functional.cross_entropy, TypeError, "nn.CrossEntropyLoss\\(\\)"),
    ],
)
def test_losses_that_are_not_a_mean_loss_module_are_refused(loss, error, match):
    x, y, _ = masked_data(-100)
    with pytest.raises(error, match=match):
        LossPoint(gated(), loss, (x, y.clamp_min(0)))


def test_targets_out_of_range_or_of_the_wrong_shape_are_refused():
    x, y, _ = masked_data(-100)
    with pytest.raises(ValueError, match="class indices in \\[0, 4\\) or the loss's ignore_index -100"):
        LossPoint(gated(), nn.CrossEntropyLoss(), (x, torch.where(y < 0, 9, y)))
    with pytest.raises(ValueError, match="must have shape \\(26,\\)"):
        LossPoint(gated(), nn.CrossEntropyLoss(), (x, y.clamp_min(0)[:, None]))

"""Outputs as models give them: one rule (a tensor, ``output=``, or a tensor ``logits``) at every model-first entry."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from lossgeom import flatness
from lossgeom.atlas import atlas
from lossgeom.atlas.records import feature_norm_change
from lossgeom.flatness import LossPoint, measure_at
from lossgeom.symmetries import audit, find_symmetries


class Net(nn.Module):
    """Linear -> BatchNorm (eval, running statistics) -> ReLU -> Linear, returning its logits in one of four forms."""

    def __init__(self, form: str) -> None:
        super().__init__()
        self.form = form
        self.inp = nn.Linear(3, 5)
        self.bn = nn.BatchNorm1d(5)
        self.out = nn.Linear(5, 4)

    def forward(self, x: torch.Tensor):
        h = torch.relu(self.bn(self.inp(x)))
        logits = self.out(h)
        if self.form == "tensor":
            return logits
        if self.form == "dict":
            return {"hidden": h, "logits": logits}
        if self.form == "tuple":
            return h, logits
        if self.form == "scores":
            return {"scores": logits}
        return SimpleNamespace(hidden=h, logits=logits)  # a ModelOutput-like object


def _net(form: str) -> nn.Module:
    torch.manual_seed(11)
    model = Net(form).double()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    return model.eval()


GEN = torch.Generator().manual_seed(5)
X = torch.randn(12, 3, dtype=torch.float64, generator=GEN)
Y = torch.randint(0, 4, (12,), generator=GEN)
CE = nn.CrossEntropyLoss()

#: model forms and the output= each needs (None: the default rule reads it)
FORMS = {"dict": None, "object": None, "tuple": lambda out: out[1], "scores": lambda out: out["scores"]}

MEASURES = [
    (flatness.hessian_trace, {"method": "exact"}),
    (flatness.hessian_trace, {"n_probes": 12}),
    (flatness.keskar_sharpness, {"max_iter": 3}),
    (flatness.sam_sharpness, {}),
    (flatness.adaptive_sharpness, {}),
    (flatness.fisher_rao_norm, {}),
    (flatness.relative_flatness, {}),
    (flatness.classifier_kappa_exact, {}),
    (flatness.classifier_b_raw, {}),
    (flatness.classifier_b_quot, {}),
    (flatness.riemannian_sharpness, {}),
    (flatness.model_wolkowicz_styan_bound, {}),
]


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}


def _unchanged(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict(keep_vars=True)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize(("measure", "options"), MEASURES, ids=lambda v: getattr(v, "__name__", str(v)))
def test_each_measure_matches_the_tensor_model(form, measure, options):
    reference = measure(_net("tensor"), CE, (X, Y), **options)
    model = _net(form)
    state = _state(model)
    value = measure(model, CE, (X, Y), output=FORMS[form], **options)
    assert math.isclose(value, reference, rel_tol=1e-12, abs_tol=1e-14)
    _unchanged(model, state)


def test_model_quotient_flatness_refuses_a_selected_output_clearly():
    with pytest.raises(flatness.loss_point.NotApplicable, match="square loss"):
        flatness.model_quotient_flatness(_net("tuple"), CE, (X, Y), output=lambda out: out[1])


def _flat_loss(vector: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy of the tensor model at a flat parameter vector, written out (no lossgeom)."""
    model = _net("tensor")
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    pieces = torch.split(vector, [math.prod(s) for s in shapes])
    params = {n: piece.reshape(s) for n, piece, s in zip(names, pieces, shapes)}
    logits = torch.func.functional_call(model, params, (X,))
    return -(logits.log_softmax(-1)[torch.arange(len(Y)), Y]).mean()


def test_dense_float64_references():
    theta = torch.cat([p.detach().reshape(-1) for p in _net("tensor").parameters()])
    H = torch.autograd.functional.hessian(_flat_loss, theta)
    trace = flatness.hessian_trace(_net("tuple"), CE, (X, Y), method="exact", output=lambda out: out[1])
    assert abs(trace - float(H.trace())) <= 1e-10 * abs(float(H.trace()))
    g = torch.autograd.functional.jacobian(_flat_loss, theta)
    rho = 0.05
    sam = float(_flat_loss(theta + rho * g / g.norm()) - _flat_loss(theta))
    assert abs(flatness.sam_sharpness(_net("dict"), CE, (X, Y), rho=rho) - sam) <= 1e-10 * abs(sam)
    # Fisher-Rao: per-example directional derivatives <theta, g_i>, one example at a time
    terms = []
    for i in range(len(Y)):
        model = _net("tensor")
        names = [n for n, _ in model.named_parameters()]
        params = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
        loss_i = nn.functional.cross_entropy(torch.func.functional_call(model, params, (X[i : i + 1],)), Y[i : i + 1])
        grads = torch.autograd.grad(loss_i, [params[n] for n in names])
        terms.append(sum(float((gr * params[n].detach()).sum()) for gr, n in zip(grads, names)) ** 2)
    fr = math.sqrt(sum(terms) / len(terms))
    assert abs(flatness.fisher_rao_norm(_net("object"), CE, (X, Y)) - fr) <= 1e-10 * fr


@pytest.mark.parametrize("form", ["tuple", "scores"])
def test_an_unrecognised_output_is_refused_naming_output(form):
    for call in (
        lambda m: flatness.sam_sharpness(m, CE, (X, Y)),
        lambda m: flatness.hessian_trace(m, CE, (X, Y)),
        lambda m: LossPoint(m, CE, (X, Y)),
        lambda m: audit(m, None, X, loss=CE),
        lambda m: atlas(m, CE, (X, Y), probe=X, measures=["sam"]),
    ):
        model = _net(form)
        state = _state(model)
        with pytest.raises(TypeError, match=r"output=.*callable"):
            call(model)
        _unchanged(model, state)


def test_a_bad_output_argument_is_refused():
    with pytest.raises(TypeError, match="output must be None or a callable"):
        flatness.sam_sharpness(_net("tuple"), CE, (X, Y), output=1)
    with pytest.raises(TypeError, match="output must select one tensor"):
        flatness.sam_sharpness(_net("tuple"), CE, (X, Y), output=lambda out: out)
    point = LossPoint(_net("dict"), CE, (X, Y))
    with pytest.raises(TypeError, match="output"):
        measure_at(point, flatness.sam_sharpness, output=lambda out: out["logits"])


def test_loss_point_fisher_and_classifier_match():
    reference = LossPoint(_net("tensor"), CE, (X, Y))
    model = _net("tuple")
    state = _state(model)
    point = LossPoint(model, CE, (X, Y), output=lambda out: out[1])
    assert torch.equal(point.outputs(point.params), reference.outputs(reference.params))
    assert abs(point.fisher() - reference.fisher()).max() <= 1e-12 * abs(reference.fisher()).max()
    for got, want in zip(point.classifier(), reference.classifier()):
        assert torch.equal(got, want)
    copy = point.model_at_point()
    assert type(copy).__name__ == "Net" and isinstance(copy(X), torch.Tensor)
    _unchanged(model, state)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_audit_matches_the_tensor_model(form):
    def norm(m: nn.Module) -> float:
        return sum(float(p.detach().pow(2).sum()) for p in m.parameters())

    reference = audit(_net("tensor"), norm, X, loss=CE)
    model = _net(form)
    state = _state(model)
    table = audit(model, norm, X, loss=CE, output=FORMS[form])
    assert [r["symmetry"] for r in table.rows()] == [r["symmetry"] for r in reference.rows()]
    assert any(r["symmetry"].startswith("softmax row shift") for r in table.rows())
    for got, want in zip(table.rows(), reference.rows()):
        assert got["is_symmetry"] and got["after"] == want["after"]
    _unchanged(model, state)


def test_the_registry_reads_the_selected_output():
    found = find_symmetries(_net("tensor"), loss=CE)
    from lossgeom.outputs import _output_model

    view = _output_model(_net("tuple"), lambda out: out[1])
    assert [s.name for s in find_symmetries(view, loss=CE)] == [s.name for s in found]


@pytest.mark.parametrize("form", ["dict", "tuple"])
def test_atlas_matches_the_tensor_model(form):
    measures = ["sam", "fisher_rao", "kappa_exact", "b_quot"]
    reference = atlas(_net("tensor"), CE, (X, Y), probe=X, measures=measures)
    model = _net(form)
    state = _state(model)
    table = atlas(model, CE, (X, Y), probe=X, measures=measures, output=FORMS[form])
    for key in measures:
        for column in reference.columns:
            got, want = table.cell(key, column.key), reference.cell(key, column.key)
            assert got.status == want.status
            if want.after is not None:
                assert math.isclose(got.after, want.after, rel_tol=1e-12, abs_tol=1e-14)
    _unchanged(model, state)


def test_feature_norm_change_reads_the_selected_output():
    symmetry = find_symmetries(_net("tensor"), loss=CE).symmetries[0]
    want = feature_norm_change(_net("tensor"), CE, (X, Y), symmetry=symmetry)
    got = feature_norm_change(_net("tuple"), CE, (X, Y), symmetry=symmetry, output=lambda out: out[1])
    assert got == want

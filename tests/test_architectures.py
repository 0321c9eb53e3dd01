"""Every entry point on the models researchers train, against independent dense references.

For each architecture (batch norm and dropout in eval mode, a residual block, tied weights,
a frozen layer, an embedding model, a transformer encoder layer, a convolution) and each
loss, the module-form entry points either match a dense float64 reference built here from
``torch.autograd.functional`` alone (to 1e-10) or, for models they cannot serve (tuple
outputs, layers left in training mode), raise a clear error; and the model's parameters
and buffers are bit-identical afterwards.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from lossgeom import curvature
from lossgeom.models import loss_closure

F64 = {"dtype": torch.float64}


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.block, self.out = nn.Linear(4, 5, **F64), nn.Linear(5, 5, **F64), nn.Linear(5, 3, **F64)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        return self.out(h + torch.tanh(self.block(h)))


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.out = nn.Linear(4, 4, **F64), nn.Linear(4, 4, **F64), nn.Linear(4, 3, **F64)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.out(torch.tanh(self.b(torch.tanh(self.a(x)))))


class Bag(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.out = nn.Embedding(7, 4, **F64), nn.Linear(4, 3, **F64)

    def forward(self, tokens):
        return self.out(torch.tanh(self.embed(tokens).mean(1)))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(4, 2, dim_feedforward=6, dropout=0.1, batch_first=True, **F64)
        self.out = nn.Linear(4, 3, **F64)

    def forward(self, x):
        return self.out(self.layer(x).mean(1))


class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.out = nn.Linear(4, 3, **F64)

    def forward(self, x):
        return self.out(x), x


def _batch_norm():
    model = nn.Sequential(nn.Linear(4, 5, **F64), nn.BatchNorm1d(5, **F64), nn.ReLU(), nn.Linear(5, 3, **F64))
    model(torch.randn(16, 4, **F64))  # running statistics away from their initial values
    return model.eval()


def _frozen():
    model = nn.Sequential(nn.Linear(4, 5, **F64), nn.Tanh(), nn.Linear(5, 3, **F64))
    model[0].requires_grad_(False)
    return model


def _conv():
    return nn.Sequential(
        nn.Unflatten(1, (1, 2, 2)), nn.Conv2d(1, 2, 2, **F64), nn.Tanh(), nn.Flatten(), nn.Linear(2, 3, **F64)
    )


ARCHITECTURES = {
    "batch norm (eval)": (_batch_norm, "features"),
    "dropout (eval)": (
        lambda: nn.Sequential(nn.Linear(4, 5, **F64), nn.Dropout(0.3), nn.Tanh(), nn.Linear(5, 3, **F64)).eval(),
        "features",
    ),
    "residual block": (Residual, "features"),
    "tied weights": (Tied, "features"),
    "frozen layer": (_frozen, "features"),
    "embedding": (Bag, "tokens"),
    "transformer encoder layer (eval)": (lambda: Encoder().eval(), "sequence"),
    "convolution": (_conv, "features"),
}
LOSSES = {
    "cross-entropy mean": lambda: nn.CrossEntropyLoss(),
    "cross-entropy sum": lambda: nn.CrossEntropyLoss(reduction="sum"),
    "mse mean": lambda: nn.MSELoss(),
}


def _inputs(kind, n, gen):
    if kind == "tokens":
        return torch.randint(0, 7, (n, 3), generator=gen)
    if kind == "sequence":
        return torch.randn(n, 3, 4, generator=gen, **F64)
    return torch.randn(n, 4, generator=gen, **F64)


def _targets(loss, n, gen):
    if isinstance(loss, nn.MSELoss):
        return torch.randn(n, 3, generator=gen, **F64)
    return torch.randint(0, 3, (n,), generator=gen)


def _reference_hessian(model, loss, x, y):
    """The Hessian in the trainable parameters by torch.autograd.functional, nothing of lossgeom."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    shapes = [p.shape for n, p in model.named_parameters() if p.requires_grad]
    flat = torch.cat([p.detach().reshape(-1) for n, p in model.named_parameters() if p.requires_grad])

    def risk(vector):
        pieces, i = {}, 0
        for name, shape in zip(names, shapes):
            pieces[name] = vector[i : i + shape.numel()].reshape(shape)
            i += shape.numel()
        return loss(torch.func.functional_call(model, pieces, (x,)), y)

    with sdpa_kernel([SDPBackend.MATH]):
        return torch.autograd.functional.hessian(risk, flat)


def _state(model):
    return {k: v.detach().clone() for k, v in list(model.named_parameters()) + list(model.named_buffers())}


@pytest.mark.parametrize("loss_name", list(LOSSES))
@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_every_entry_point_matches_an_independent_reference_and_leaves_the_model_unchanged(name, loss_name):
    make, kind = ARCHITECTURES[name]
    torch.manual_seed(0)
    model, loss = make(), LOSSES[loss_name]()
    gen = torch.Generator().manual_seed(1)
    x, y = _inputs(kind, 9, gen), _targets(loss, 9, gen)
    before = _state(model)
    reference = _reference_hessian(model, loss, x, y)
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
    after = _state(model)
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

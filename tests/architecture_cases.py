"""The architectures and losses of the property tests (test_architectures*.py), with a dense reference Hessian.

Eight ``torch.nn`` architectures (batch norm and dropout in eval mode, a residual block, tied
weights, a frozen layer, an embedding model, a transformer encoder layer, a convolution),
three loss configurations, seeded inputs and targets, and the Hessian in the trainable
parameters built from ``torch.autograd.functional`` alone.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from lossgeom.curvature.references import closure_hessian

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


def inputs_for(kind, n, gen):
    if kind == "tokens":
        return torch.randint(0, 7, (n, 3), generator=gen)
    if kind == "sequence":
        return torch.randn(n, 3, 4, generator=gen, **F64)
    return torch.randn(n, 4, generator=gen, **F64)


def targets_for(loss, n, gen):
    if isinstance(loss, nn.MSELoss):
        return torch.randn(n, 3, generator=gen, **F64)
    return torch.randint(0, 3, (n,), generator=gen)


def reference_hessian(model, loss, x, y):
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
        return closure_hessian(lambda p: risk(p["flat"]), {"flat": flat})


def state_of(model):
    return {k: v.detach().clone() for k, v in list(model.named_parameters()) + list(model.named_buffers())}

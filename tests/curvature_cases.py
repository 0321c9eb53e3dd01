"""Plain torch.nn models the curvature tests audit, as a researcher would build them.

Each case is a seeded, small (under 200 parameters) model with its loss module and data:
a small CNN, a tanh MLP with the squared error, an LSTM classifier, a LayerNorm MLP, a
``TransformerEncoderLayer`` and a sequence tagger whose logits are ``(N, C, T)``. They are
built in the requested dtype; the tests compare against finite differences, dense
references and curvlinops. The book's digits MLPs (:data:`DIGITS_CASES`) serve several
test files through the parametrised fixture :func:`digits_case`. The digits come from
``lossgeom_book`` and the cross-checks from curvlinops, both the book's extra: without it,
the tests that use them skip with the reason and the rest run.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn


class LSTMClassifier(nn.Module):
    """An LSTM over a sequence, classified from its last hidden state."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(3, 4, batch_first=True)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        hidden, _ = self.lstm(x)
        return self.head(hidden[:, -1])


class SequenceTagger(nn.Module):
    """Per-position class logits, returned as (N, C, T) as nn.CrossEntropyLoss expects."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(3, 5)
        self.head = nn.Linear(5, 4)

    def forward(self, x):
        return self.head(torch.tanh(self.embed(x))).transpose(1, 2)


def _cnn():
    # smooth activations, so finite differences hold
    return nn.Sequential(nn.Conv2d(1, 2, 3), nn.Tanh(), nn.Flatten(), nn.Linear(2 * 4 * 4, 3))


def _transformer():
    layer = nn.TransformerEncoderLayer(4, 2, dim_feedforward=8, dropout=0.0, batch_first=True)
    return nn.Sequential(layer, nn.Flatten(), nn.Linear(3 * 4, 3))


CASES = {
    # name: (builder, input shape per example, targets, loss)
    "cnn": (_cnn, (1, 6, 6), "classes3", nn.CrossEntropyLoss),
    "tanh-mlp-mse": (lambda: nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)), (4,), "values3", nn.MSELoss),
    "lstm": (LSTMClassifier, (5, 3), "classes3", nn.CrossEntropyLoss),
    "layernorm-mlp": (
        lambda: nn.Sequential(nn.Linear(5, 6), nn.LayerNorm(6), nn.Tanh(), nn.Linear(6, 3)),
        (5,),
        "classes3",
        nn.CrossEntropyLoss,
    ),
    "transformer": (_transformer, (3, 4), "classes3", nn.CrossEntropyLoss),
    "tagger": (SequenceTagger, (7, 3), "tags4x7", nn.CrossEntropyLoss),
}


def build(name: str, dtype: torch.dtype = torch.float64, n_examples: int = 12, seed: int = 0):
    """``(model, loss module, x, y)`` for one case, seeded, in ``dtype``."""
    builder, shape, targets, loss = CASES[name]
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = builder().to(torch.float64).to(dtype)
    x = torch.randn(n_examples, *shape, generator=generator, dtype=torch.float64).to(dtype)  # same values
    if targets == "classes3":
        y = torch.randint(0, 3, (n_examples,), generator=generator)
    elif targets == "values3":
        y = torch.randn(n_examples, 3, generator=generator, dtype=torch.float64).to(dtype)
    else:
        y = torch.randint(0, 4, (n_examples, 7), generator=generator)
    return model, loss(), x, y


def flat_parameters(model: nn.Module) -> torch.Tensor:
    """The model's parameters as one detached vector (named_parameters order)."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def finite_difference_hessian(model: nn.Module, loss: nn.Module, x, y, eps: float = 1e-5) -> torch.Tensor:
    """Central differences of the autograd gradient, column by column: an independent reference."""
    names = [name for name, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]
    sizes = [p.numel() for p in model.parameters()]
    point = flat_parameters(model)

    def gradient(vector):
        leaf = vector.clone().requires_grad_(True)
        pieces = {n: t.reshape(s) for n, t, s in zip(names, torch.split(leaf, sizes), shapes)}
        with torch.enable_grad():
            value = loss(torch.func.functional_call(model, pieces, (x,)), y)
            return torch.autograd.grad(value, leaf)[0]

    eye = torch.eye(point.numel(), dtype=point.dtype)
    return torch.stack([(gradient(point + eps * e) - gradient(point - eps * e)) / (2 * eps) for e in eye], dim=1)


# --- the book's digits MLPs, shared by the operator, spectrum and trace tests ----------

DIGITS_CASES = [
    {"id": "relu-mlp-ce", "sizes": [64, 6, 10], "activation": "relu", "loss": "cross_entropy", "seed": 1},
    {"id": "tanh-mlp-ce", "sizes": [64, 5, 4, 10], "activation": "tanh", "loss": "cross_entropy", "seed": 2},
    {"id": "tanh-mlp-mse", "sizes": [64, 6, 10], "activation": "tanh", "loss": "mse", "seed": 3},
]
LOSS_MODULES = {"cross_entropy": nn.CrossEntropyLoss, "mse": nn.MSELoss}


def digits_setup(case: dict, n: int = 120):
    """``(model, params, x, y, loss_fn, criterion)`` for one digits case (float64, seeded)."""
    from small_models import mlp

    from lossgeom.models import loss_closure
    from lossgeom.parameters import params_of

    digits = pytest.importorskip("lossgeom_book.data").digits  # the book's digits: skipped without its extra

    split = digits(n, 10, seed=case["seed"])
    model = mlp(case["sizes"], activation=case["activation"], seed=case["seed"])
    x = split.x_train
    if case["loss"] == "mse":
        y = torch.nn.functional.one_hot(split.y_train, 10).to(torch.float64)
    else:
        y = split.y_train
    return (
        model,
        params_of(model),
        x,
        y,
        loss_closure(model, LOSS_MODULES[case["loss"]](), (x, y)),
        LOSS_MODULES[case["loss"]](),
    )


@pytest.fixture(params=DIGITS_CASES, ids=[c["id"] for c in DIGITS_CASES])
def digits_case(request):
    """``(spec, model, params, x, y, loss_fn, criterion)``, parametrised over :data:`DIGITS_CASES`.

    ``tests/conftest.py`` registers it for every test.
    """
    return request.param, *digits_setup(request.param)


def curvlinops():
    """The curvlinops module, its torch.jit deprecation notices silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # linear_operator uses torch.jit.script
        module = pytest.importorskip("curvlinops", reason="the cross-check needs curvlinops (the book's extra)")
    return module


def loaded(model: nn.Module, params) -> nn.Module:
    """``model`` with ``params`` copied into its parameters (for curvlinops, which reads the model)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[name])
    return model

"""The architectures and losses of the property tests (test_architectures*.py), with dense references.

Eight ``torch.nn`` architectures (batch norm and dropout in eval mode, a residual block, tied
weights, a frozen layer, an embedding model, a transformer encoder layer, a convolution),
three loss configurations, seeded inputs and targets, and the Hessian in the trainable
parameters built from ``torch.autograd.functional`` alone. For ``test_architectures.py``
also: loss modules with options and a subclass (``LOSS_MODULES``, each with its targets and
whether it has a likelihood), the true Fisher by enumerating the likelihood's outcomes
(``reference_true_fisher``), a model called with a keyword input and one with a planted
``F.dropout``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

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


def _risk_of_flat(model):
    """``(flat, call)``: the trainable parameters as one vector and ``call(vector, x)``, the model at a vector."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    names, shapes = [n for n, _ in trainable], [p.shape for _, p in trainable]
    flat = torch.cat([p.detach().reshape(-1) for _, p in trainable])

    def call(vector, x):
        pieces, i = {}, 0
        for name, shape in zip(names, shapes):
            pieces[name] = vector[i : i + shape.numel()].reshape(shape)
            i += shape.numel()
        return torch.func.functional_call(model, pieces, (x,))

    return flat, call


def reference_hessian(model, loss, x, y):
    """The Hessian in the trainable parameters by torch.autograd.functional, nothing of lossgeom.

    The loss is the loss module on all the data as one batch (torch's own weighting).
    """
    flat, call = _risk_of_flat(model)
    with sdpa_kernel([SDPBackend.MATH]):
        return torch.autograd.functional.hessian(lambda v: loss(call(v, x), y), flat)


def reference_true_fisher(model, loss, x, y):
    """The true Fisher ``sum_i c_i E_{t ~ p(.|x_i)} [grad log p(t|x_i) grad log p(t|x_i)^T]``, by enumeration.

    ``p`` is the likelihood whose negative log is the loss: the softmax of the outputs for
    ``nn.CrossEntropyLoss``, the outputs as log-probabilities for ``nn.NLLLoss``, independent
    Bernoulli labels (all ``2^K`` label vectors enumerated) for ``nn.BCEWithLogitsLoss``.
    ``c_i`` is the weight of one term of the loss: one over the count of kept terms under
    mean reduction (examples whose target is ``ignore_index`` hold none), one under sum.
    The log-probabilities' Jacobian is ``torch.autograd.functional.jacobian``'s.
    """
    flat, call = _risk_of_flat(model)
    with torch.no_grad():
        classes = call(flat, x).shape[1]
    if isinstance(loss, nn.BCEWithLogitsLoss):
        outcomes = torch.cartesian_prod(*[torch.tensor([0.0, 1.0], **F64)] * classes)  # (2^K, K)

        def log_probabilities(v):
            out = call(v, x)
            return F.logsigmoid(out) @ outcomes.T + F.logsigmoid(-out) @ (1 - outcomes).T

        kept, terms = torch.ones(x.shape[0], dtype=torch.bool), x.shape[0] * classes
    else:

        def log_probabilities(v):
            out = call(v, x)
            return out if isinstance(loss, nn.NLLLoss) else torch.log_softmax(out, dim=1)

        kept = y != loss.ignore_index
        terms = int(kept.sum())
    with sdpa_kernel([SDPBackend.MATH]):
        jac = torch.autograd.functional.jacobian(log_probabilities, flat)  # (N, outcomes, n)
        p = log_probabilities(flat).detach().exp()
    c = 1.0 if loss.reduction == "sum" else 1.0 / terms
    weights = c * p * kept[:, None]
    return torch.einsum("io,ion,iom->nm", weights, jac, jac)


def state_of(model):
    return {k: v.detach().clone() for k, v in list(model.named_parameters()) + list(model.named_buffers())}


class Doubled(nn.CrossEntropyLoss):
    """A subclass overriding forward: twice the cross-entropy (its Hessian is twice the base class's)."""

    def forward(self, out, y):
        return 2 * super().forward(out, y)


class KeywordInput(nn.Module):
    """An architecture called with a keyword input, ``model(inputs=x)`` (a dict batch's layout)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, inputs):
        return self.inner(inputs)


class PlantedDropout(nn.Module):
    """A random forward no module check sees: ``F.dropout(h, 0.3, self.training)`` in a custom forward."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 6, **F64), nn.Linear(6, 3, **F64)

    def forward(self, x):
        return self.b(F.dropout(torch.tanh(self.a(x)), 0.3, self.training))


def _ignored(y, index, rows=(1, 2, 7)):
    """``y`` with the targets of ``rows`` set to ``index``: two of the first four, one of the last five."""
    y = y.clone()
    y[list(rows)] = index
    return y


def _soft_labels(n, gen):
    """Multi-label targets in [0, 1]: hard 0/1 labels on the first column, probabilities elsewhere."""
    y = torch.rand(n, 3, generator=gen, **F64)
    y[:, 0] = (y[:, 0] > 0.5).to(torch.float64)
    return y


_CLASS_WEIGHT = (0.4, 1.0, 2.5)
#: loss modules for ``test_architectures.py``: name -> (loss, targets(n, gen), refusal of the likelihood
#: (a regex of the ValueError of the true Fisher, or None when it has one), log-softmax head on the model)
LOSS_MODULES = {
    "cross-entropy ignore_index=-100 present": (
        nn.CrossEntropyLoss,
        lambda n, gen: _ignored(torch.randint(0, 3, (n,), generator=gen), -100),
        None,
        False,
    ),
    "cross-entropy sum, ignore_index=2 present": (
        lambda: nn.CrossEntropyLoss(reduction="sum", ignore_index=2),
        lambda n, gen: torch.randint(0, 3, (n,), generator=gen),
        None,
        False,
    ),
    "cross-entropy class weights": (
        lambda: nn.CrossEntropyLoss(weight=torch.tensor(_CLASS_WEIGHT, **F64)),
        lambda n, gen: torch.randint(0, 3, (n,), generator=gen),
        r"CrossEntropyLoss\(weight=\.\.\.\) is not a negative log-likelihood",
        False,
    ),
    "cross-entropy label_smoothing": (
        lambda: nn.CrossEntropyLoss(label_smoothing=0.2),
        lambda n, gen: torch.randint(0, 3, (n,), generator=gen),
        r"CrossEntropyLoss\(label_smoothing=\.\.\.\) is not a negative log-likelihood",
        False,
    ),
    "cross-entropy weights, smoothing and ignore_index": (
        lambda: nn.CrossEntropyLoss(weight=torch.tensor(_CLASS_WEIGHT, **F64), label_smoothing=0.1),
        lambda n, gen: _ignored(torch.randint(0, 3, (n,), generator=gen), -100),
        r"\(weight=\.\.\.\) is not a negative log-likelihood",
        False,
    ),
    "subclass 2x cross-entropy": (
        Doubled,
        lambda n, gen: torch.randint(0, 3, (n,), generator=gen),
        r"Doubled overrides the forward of CrossEntropyLoss",
        False,
    ),
    "bce-with-logits multi-label": (nn.BCEWithLogitsLoss, _soft_labels, None, False),
    "bce-with-logits pos_weight": (
        lambda: nn.BCEWithLogitsLoss(pos_weight=torch.tensor([0.5, 2.0, 1.0], **F64)),
        _soft_labels,
        r"BCEWithLogitsLoss\(pos_weight=\.\.\.\) is not a negative log-likelihood",
        False,
    ),
    "nll on log-softmax, ignore_index=-100 present": (
        nn.NLLLoss,
        lambda n, gen: _ignored(torch.randint(0, 3, (n,), generator=gen), -100),
        None,
        True,
    ),
}

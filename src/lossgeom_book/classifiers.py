"""Small softmax classifiers for the chapters' experiments (*The softmax gauge*, *Certificates*).

:class:`SoftmaxClassifier` is a ReLU MLP with a bias-free classifier ``W``, so the
common-row shift of :mod:`lossgeom.flatness.softmax_gauge` acts on ``W`` alone;
:func:`init_classifier` draws a seeded parameter dict, :func:`classifier_features` and
:func:`classifier_logits` evaluate it, and :func:`train_classifier` trains it full-batch
(a wrapper of :func:`lossgeom.training.loop.train`). :data:`GAUGE_SWEEP` lists the training
settings that *The softmax gauge* and its sub-page *Reproducing the source's numbers* both
train, and :func:`train_setting` trains one of them with the recipe both pages use.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from lossgeom.training.loop import Monitor, train
from lossgeom.training.rules import adam, sgd
from lossgeom.types import Params
from lossgeom_book.checks import finite_tensor, positive


class SoftmaxClassifier(nn.Module):
    """A ReLU MLP whose last layer is a bias-free classifier ``W``: logits ``W h(x)``.

    Parameters (``named_parameters()``): ``hidden.i.weight`` and ``hidden.i.bias`` of each
    hidden layer and ``weight``, the classifier ``W`` (K x d), which carries no bias so the
    common-row shift acts on it alone. ``sizes = [d, K]`` is the linear softmax model (its
    feature ``h`` is the input itself). Hidden layers compute ``ReLU(h A^T + b)``.

    Args:
        sizes: widths ``[input, hidden..., K]``.
        seed: seed of the generator that draws the weights (layer by layer, weight then
            bias, the classifier last), from PyTorch's default uniform initialisation
            ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` times ``init_scale``.
        init_scale: multiplies every weight and bias.
        device: ``"meta"`` builds a skeleton without drawing any weight (for
            ``torch.func.functional_call`` with a parameter dict).
    """

    def __init__(
        self, sizes: Sequence[int], seed: int = 0, init_scale: float = 1.0, device: str | torch.device | None = None
    ) -> None:
        super().__init__()
        sizes = [int(s) for s in sizes]
        if len(sizes) < 2 or min(sizes) < 1 or sizes[-1] < 2:
            raise ValueError(f"sizes must list >= 2 positive widths ending in K >= 2 classes, got {sizes}")
        init_scale = positive("init_scale", init_scale)
        meta = device is not None and torch.device(device).type == "meta"
        gen = None if meta else torch.Generator().manual_seed(int(seed))

        def uniform(shape, fan_in) -> nn.Parameter:
            if meta:
                return nn.Parameter(torch.empty(shape, dtype=torch.float64, device="meta"))
            bound = init_scale / fan_in**0.5
            return nn.Parameter((2 * torch.rand(shape, generator=gen, dtype=torch.float64) - 1) * bound)

        self.hidden = nn.ModuleList()
        for n_in, n_out in zip(sizes[:-2], sizes[1:-1]):
            layer = nn.Module()
            layer.weight = uniform((n_out, n_in), n_in)
            layer.bias = uniform((n_out,), n_in)
            self.hidden.append(layer)
        self.weight = uniform((sizes[-1], sizes[-2]), sizes[-2])

    @classmethod
    def for_params(cls, params: Params) -> SoftmaxClassifier:
        """A skeleton (meta device, no weights drawn) of the architecture ``params`` belong to."""
        if "weight" not in params:
            raise ValueError("params must hold the classifier under 'weight' (see init_classifier)")
        sizes, i = [], 0
        while f"hidden.{i}.weight" in params:
            sizes.append(params[f"hidden.{i}.weight"].shape[1])
            i += 1
        W = params["weight"]
        if W.ndim != 2:
            raise ValueError(f"params['weight'] must be the (K, d) classifier, got shape {tuple(W.shape)}")
        expected = {f"hidden.{j}.{k}" for j in range(i) for k in ("weight", "bias")} | {"weight"}
        if set(params) != expected:
            raise ValueError(f"params must hold exactly {sorted(expected)}, got {sorted(params)}")
        return cls([*sizes, W.shape[1], W.shape[0]] if sizes else [W.shape[1], W.shape[0]], device="meta")

    def forward(self, x: torch.Tensor, return_features: bool = False) -> torch.Tensor:
        h = x
        for layer in self.hidden:
            h = torch.relu(h @ layer.weight.T + layer.bias)
        if h.shape[-1] != self.weight.shape[1]:
            raise ValueError(f"x gives features of width {h.shape[-1]} but W expects {self.weight.shape[1]}")
        return h if return_features else h @ self.weight.T


def init_classifier(sizes, seed: int = 0, init_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """The parameter dict of a seeded :class:`SoftmaxClassifier` (``named_parameters()``, detached).

    ``{"hidden.i.weight", "hidden.i.bias", ..., "weight"}``; ``"weight"`` is ``W`` (K x d).
    """
    model = SoftmaxClassifier(sizes, seed=seed, init_scale=init_scale)
    return {name: p.detach() for name, p in model.named_parameters()}


def classifier_features(params: Params, x: torch.Tensor) -> torch.Tensor:
    """The last-layer features ``h`` of :class:`SoftmaxClassifier` with ``params`` (ReLU hidden layers)."""
    x = finite_tensor("x", x)
    return torch.func.functional_call(
        SoftmaxClassifier.for_params(params), dict(params), (x,), {"return_features": True}
    )


def classifier_logits(params: Params, x: torch.Tensor) -> torch.Tensor:
    """Logits ``W h(x)`` of :class:`SoftmaxClassifier` with ``params``."""
    x = finite_tensor("x", x)
    return torch.func.functional_call(SoftmaxClassifier.for_params(params), dict(params), (x,))


def train_classifier(
    params: Params,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    steps: int,
    lr: float,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    optimizer: str = "sgd",
    record_every: int = 0,
    record=None,
) -> tuple[dict[str, torch.Tensor], list]:
    """Full-batch training of the mean cross-entropy; returns trained params and a history.

    ``optimizer="sgd"`` is heavy-ball SGD with coupled L2 weight decay (``torch.optim.SGD``);
    ``"adam"`` is ``torch.optim.Adam`` with the same coupled decay, both computed by
    ``torch.optim`` (``arithmetic="torch"``) through :func:`lossgeom.training.loop.train`.
    Every ``record_every`` steps (and at step 0 and the end) ``record(step, params)`` is
    appended to the history.
    """
    steps = int(steps)
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    lr = positive("lr", lr)
    if optimizer not in ("sgd", "adam"):
        raise ValueError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
    if optimizer == "sgd":
        rule = sgd(lr, momentum=momentum, weight_decay=weight_decay, arithmetic="torch")
    else:
        rule = adam(lr, weight_decay=weight_decay, decoupled=False, arithmetic="torch")
    model = SoftmaxClassifier.for_params(params)
    loss = lambda q, idx: nn.functional.cross_entropy(torch.func.functional_call(model, q, (x,)), y)
    hooks = []
    if record is not None and record_every:

        def record_without_grad(step: int, q: dict):
            with torch.no_grad():
                return record(step, q)

        hooks.append(Monitor("history", record_without_grad, every=int(record_every)))
    run = train(loss, params, rule, steps, hooks=hooks)
    return run.params, [value for _, value in run.records.get("history", [])]


#: Learning rate of each optimiser in the softmax-gauge experiments (full-batch, 150 steps).
LEARNING_RATES = {"sgd": 0.1, "adam": 0.01}

#: The sweep of *The softmax gauge*, as ``(sizes, optimizer, init_scale, weight_decay)``: the
#: linear model (``[64, 10]``) at two initialisation scales and with Adam; the MLP
#: ``[64, 64, 10]`` over initialisation scale x weight decay with SGD, with SGD and a small
#: decay, and with Adam with and without decay.
GAUGE_SWEEP = (
    ((64, 10), "sgd", 1.0, 0.0),
    ((64, 10), "sgd", 3.0, 0.0),
    ((64, 10), "adam", 1.0, 0.0),
    *(((64, 64, 10), "sgd", scale, decay) for scale in (0.3, 1.0, 3.0) for decay in (0.0, 1e-2)),
    ((64, 64, 10), "sgd", 1.0, 1e-3),
    *(((64, 64, 10), "adam", 1.0, decay) for decay in (0.0, 1e-2)),
)


def train_setting(
    setting: Sequence,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    seed: int = 0,
    steps: int = 150,
    record_every: int = 0,
    record=None,
) -> tuple[dict[str, torch.Tensor], list]:
    """Train one ``setting = (sizes, optimizer, init_scale, weight_decay)`` full-batch on ``(x, y)``.

    The classifier starts from ``init_classifier(sizes, seed, init_scale)`` and trains for
    ``steps`` steps with :func:`train_classifier` at the optimiser's rate in
    :data:`LEARNING_RATES` (heavy-ball momentum 0.9 for SGD; coupled weight decay); the
    history is recorded as there.

    Returns:
        The trained parameter dict and the history.
    """
    if not isinstance(setting, (tuple, list)) or len(setting) != 4:
        raise ValueError(f"setting must be (sizes, optimizer, init_scale, weight_decay), got {setting!r}")
    sizes, optimizer, init_scale, weight_decay = setting
    if optimizer not in LEARNING_RATES:
        raise ValueError(f"optimizer must be one of {sorted(LEARNING_RATES)}, got {optimizer!r}")
    params = init_classifier(sizes, seed=seed, init_scale=init_scale)
    return train_classifier(
        params,
        x,
        y,
        steps=steps,
        lr=LEARNING_RATES[optimizer],
        weight_decay=weight_decay,
        optimizer=optimizer,
        record_every=record_every,
        record=record,
    )

"""The architectures people train, at CPU scale: a BatchNorm ResNet and a small transformer.

Used by the chapter "The symmetries of the architectures people train"
(``chapters/ch13_modern_architectures``). :class:`DigitsResNet` is a ResNet for sklearn's
8x8 digits (stem conv-BN-ReLU, an identity-shortcut BasicBlock, a BasicBlock with a
stride-2 1x1 conv-BN shortcut, average pool, Linear); :class:`ModularEncoder` is a one-layer
``nn.TransformerEncoder`` on ``(a, b)`` pairs of :func:`lossgeom_book.tasks.modular_arithmetic`,
read at the last position. Both are float64 and seeded.

:func:`train_model` trains either through :func:`lossgeom.training.train`, the library's
one loop. BatchNorm is trained honestly: the training loss calls a train-mode twin of the
model (batch statistics; its running statistics are frozen by ``momentum=0``), and after
training :func:`calibrate_batchnorm` sets the running statistics to those of the whole
training set, after which the model stays in eval mode for every measurement.

The family's moves are the library's (:mod:`lossgeom.symmetries`): the eval-mode
BatchNorm scale invariance with the running statistics moved along
(:func:`~lossgeom.symmetries.batchnorm_scale_invariance`) and the BN affine rescaling through
a ReLU (:func:`~lossgeom.symmetries.relu_neuron_rescaling`), composed by :func:`mlp_symmetries`.
:func:`family_study` trains a family of small ResNets and correlates measures with the
generalisation gap before and after such transforms (Kendall tau).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy.stats import kendalltau
from torch import nn

from lossgeom import symmetries, training
from lossgeom.models import accuracy
from lossgeom_book.checks import positive, positive_int
from lossgeom_book.data import Split

_KW = dict(dtype=torch.float64)


class BasicBlock(nn.Module):
    """``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))`` (He et al. 2016).

    The shortcut is the identity when ``stride == 1`` and the widths agree, else a
    bias-free 1x1 convolution of stride ``stride`` followed by a BatchNorm.
    """

    def __init__(self, c_in: int, c_out: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False, **_KW)
        self.bn1 = nn.BatchNorm2d(c_out, **_KW)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False, **_KW)
        self.bn2 = nn.BatchNorm2d(c_out, **_KW)
        if stride == 1 and c_in == c_out:
            self.shortcut = nn.Identity()
        else:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False, **_KW), nn.BatchNorm2d(c_out, **_KW)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class DigitsResNet(nn.Module):
    """A ResNet for 8x8 digits: stem (w channels), block1 (w, identity), block2 (2w, stride 2).

    Inputs are ``(n, 64)`` pixel rows (reshaped to ``(n, 1, 8, 8)``); outputs are logits
    ``(n, classes)``. Initialised by torch's defaults under ``torch.manual_seed(seed)``
    (inside ``torch.random.fork_rng``: the caller's random state is untouched).
    """

    def __init__(self, width: int = 4, classes: int = 10, seed: int = 0) -> None:
        super().__init__()
        w, classes = positive_int("width", width), positive_int("classes", classes)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            self.conv = nn.Conv2d(1, w, 3, 1, 1, bias=False, **_KW)
            self.bn = nn.BatchNorm2d(w, **_KW)
            self.block1 = BasicBlock(w, w, 1)
            self.block2 = BasicBlock(w, 2 * w, 2)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(2 * w, classes, **_KW)
        self.width = w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.conv(x.reshape(-1, 1, 8, 8))))
        h = self.block2(self.block1(h))
        return self.fc(self.pool(h).flatten(1))


class DigitsBNMLP(nn.Module):
    """``Linear-BN-ReLU-Linear-BN-ReLU-Linear`` on 64 pixels (bias-free before each BN).

    The family of the X6 study: cheap enough to train a family of in seconds, with the same BatchNorm
    symmetries as :class:`DigitsResNet`.
    """

    def __init__(self, width: int = 16, classes: int = 10, seed: int = 0) -> None:
        super().__init__()
        w = positive_int("width", width)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            self.fc1, self.bn1 = nn.Linear(64, w, bias=False, **_KW), nn.BatchNorm1d(w, **_KW)
            self.fc2, self.bn2 = nn.Linear(w, w, bias=False, **_KW), nn.BatchNorm1d(w, **_KW)
            self.out = nn.Linear(w, positive_int("classes", classes), **_KW)
        self.width = w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn1(self.fc1(x)))
        return self.out(torch.relu(self.bn2(self.fc2(h))))


class ModularEncoder(nn.Module):
    """Token + position embedding, ``nn.TransformerEncoder`` (batch_first, dropout 0), readout.

    Reads pairs ``(a, b)`` (int64, shape ``(n, 2)``) and returns logits over ``Z_p`` from
    the last position. With ``norm_first=True`` (pre-LN) a final LayerNorm precedes the
    readout, as in pre-LN transformers (Vaswani et al. 2017 is post-LN).
    """

    def __init__(
        self,
        p: int = 11,
        d_model: int = 8,
        n_heads: int = 2,
        d_ff: int = 16,
        n_layers: int = 1,
        norm_first: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.p, self.n_heads = positive_int("p", p), positive_int("n_heads", n_heads)
        if d_model % n_heads:
            raise ValueError(f"d_model must be divisible by n_heads, got {d_model} and {n_heads}")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            self.token = nn.Embedding(p, d_model, **_KW)
            self.position = nn.Parameter(torch.randn(2, d_model, **_KW) / d_model**0.5)
            layer = nn.TransformerEncoderLayer(
                d_model, n_heads, d_ff, dropout=0.0, batch_first=True, norm_first=norm_first, **_KW
            )
            norm = nn.LayerNorm(d_model, **_KW) if norm_first else None
            self.encoder = nn.TransformerEncoder(
                layer, positive_int("n_layers", n_layers), norm=norm, enable_nested_tensor=False
            )
            self.readout = nn.Linear(d_model, p, **_KW)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.token(x.long()) + self.position)
        return self.readout(h[:, -1])


# --------------------------------------------------------------------------- training


def calibrate_batchnorm(model: nn.Module, x: torch.Tensor) -> nn.Module:
    """Set every BatchNorm's running statistics to those of ``x`` (one pass), then ``eval()``.

    ``momentum=None`` makes the running averages cumulative, so one pass stores the batch
    mean and the unbiased batch variance of ``x`` (the normalisation in train mode uses the
    biased one: the eval-mode model differs from the train-mode one by that factor).
    """
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    with torch.no_grad():
        for bn in bns:
            bn.reset_running_stats()
            bn.momentum, bn.training = None, True
        model(x)
        for bn in bns:
            bn.momentum = 0.1
    return model.eval()


@dataclass(frozen=True)
class TrainedModel:
    """A trained model (eval mode) and its losses and accuracies, all measured in eval mode."""

    model: nn.Module
    losses: np.ndarray
    train_loss: float
    test_loss: float
    train_accuracy: float
    test_accuracy: float

    @property
    def gap(self) -> float:
        """The generalisation gap, the test cross-entropy minus the training cross-entropy (eval mode)."""
        return self.test_loss - self.train_loss


def eval_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Mean cross-entropy of ``model`` in eval mode on ``(x, y)``."""
    with torch.no_grad():
        return float(nn.functional.cross_entropy(model.eval()(x), y))


def train_model(
    model: nn.Module,
    split: Split,
    *,
    steps: int,
    lr: float,
    weight_decay: float = 0.0,
    batch_size: int | None = None,
    seed: int = 0,
) -> TrainedModel:
    """Train a copy of ``model`` with Adam (decoupled decay) through :func:`lossgeom.training.train`.

    The loss is the cross-entropy of a train-mode twin (BatchNorm on batch statistics,
    running statistics untouched), full batch or on seeded mini-batches
    (:func:`lossgeom.training.batch_schedule`); BatchNorm is then calibrated on the whole
    training set (:func:`calibrate_batchnorm`) and everything is measured in eval mode.
    """
    x, y = split.x_train, split.y_train
    twin = copy.deepcopy(model).train()
    for m in twin.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.track_running_stats = False  # batch statistics, running statistics untouched

    def loss_fn(params, indices):
        xb, yb = (x, y) if indices is None else (x[indices], y[indices])
        return nn.functional.cross_entropy(torch.func.functional_call(twin, params, (xb,)), yb)

    batches = None
    steps = positive_int("steps", steps)
    if batch_size is not None and batch_size < len(y):
        batches = training.batch_schedule(len(y), batch_size, steps, seed)
    rule = training.adam(positive("lr", lr), weight_decay=weight_decay, decoupled=True)
    start = {k: v.detach() for k, v in model.named_parameters()}
    run = training.train(loss_fn, start, rule, steps, batches)
    trained = copy.deepcopy(model)
    with torch.no_grad():
        for name, value in trained.named_parameters():
            value.copy_(run.params[name])
    calibrate_batchnorm(trained, x)
    return TrainedModel(
        trained,
        run.losses,
        eval_loss(trained, x, y),
        eval_loss(trained, split.x_test, split.y_test),
        accuracy(trained, (x, y)),
        accuracy(trained, (split.x_test, split.y_test)),
    )


# --------------------------------------------------------------------------- the family study


def mlp_symmetries(model: DigitsBNMLP, size: float = 3.0, seed: int = 0) -> symmetries.Symmetry:
    """All the BN moves of a :class:`DigitsBNMLP` at once: both BN scales, both BN affine
    rescalings through their ReLU, scales ``exp(u log size)``, ``u`` uniform in ``[-1, 1]``."""
    w, g = model.width, torch.Generator().manual_seed(seed)
    draw = lambda: torch.exp((2 * torch.rand(w, generator=g, dtype=torch.float64) - 1) * np.log(size))
    eps = lambda name: float(model.get_submodule(name).eps)
    return symmetries.compose(
        [
            symmetries.batchnorm_scale_invariance("fc1", "bn1", draw(), eps=eps("bn1")),
            symmetries.batchnorm_scale_invariance("fc2", "bn2", draw(), eps=eps("bn2")),
            symmetries.relu_neuron_rescaling("bn1", "fc2", draw()),
            symmetries.relu_neuron_rescaling("bn2", "out", draw()),
        ],
        "BN scales and BN affine rescalings",
    )


@dataclass(frozen=True)
class FamilyStudy:
    """The X6 study: per model its settings, gap, measures before/after, and Kendall tau.

    ``before[m]`` and ``after[m]`` are arrays over the family; ``tau_before[m]``,
    ``tau_after[m]`` are ``(tau, p-value)`` of measure ``m`` against ``gaps`` (test minus
    training cross-entropy, eval mode).
    """

    settings: list[dict]
    gaps: np.ndarray
    before: dict[str, np.ndarray]
    after: dict[str, np.ndarray]
    tau_before: dict[str, tuple[float, float]]
    tau_after: dict[str, tuple[float, float]]
    output_gap: float


def family_study(
    split: Split,
    settings: Sequence[dict],
    measures: Mapping[str, Callable],
    data: tuple,
    size: float = 3.0,
) -> FamilyStudy:
    """Train one :class:`DigitsBNMLP` per setting, measure, transform, measure again.

    Each setting is a dict of ``width, lr, batch_size, weight_decay, seed, steps``. Every
    measure is ``measure(model, data) -> float``; "after" is at the model moved by
    :func:`mlp_symmetries` (drawn with the setting's seed). ``output_gap`` is the largest
    relative output change over the family (on the test inputs, by :func:`lossgeom.symmetries.audit`).
    """
    gaps, before, after, worst = [], {m: [] for m in measures}, {m: [] for m in measures}, 0.0
    for s in settings:
        net = DigitsBNMLP(s["width"], seed=s["seed"])
        fit = train_model(
            net,
            split,
            steps=s["steps"],
            lr=s["lr"],
            weight_decay=s["weight_decay"],
            batch_size=s["batch_size"],
            seed=s["seed"],
        )
        move = mlp_symmetries(fit.model, size, s["seed"])
        (receipt,) = symmetries.audit(fit.model, None, split.x_test, symmetries=[move])
        worst = max(worst, receipt.relative_discrepancy)
        moved = move.applied(fit.model)
        gaps.append(fit.gap)
        for name, fn in measures.items():
            before[name].append(fn(fit.model, data))
            after[name].append(fn(moved, data))
    gaps = np.array(gaps)
    tau = lambda v: tuple(float(t) for t in kendalltau(v, gaps))
    b = {k: np.array(v) for k, v in before.items()}
    a = {k: np.array(v) for k, v in after.items()}
    return FamilyStudy(
        list(settings), gaps, b, a, {k: tau(v) for k, v in b.items()}, {k: tau(v) for k, v in a.items()}, worst
    )


def family_settings(n: int = 16, steps: int = 150) -> list[dict]:
    """``n`` settings cycling through widths, learning rates, batch sizes, decays and seeds.

    A deterministic mixed-radix walk (not a grid), so ``n = 16`` covers every value of
    every factor: width in (8, 16, 32), lr in (0.003, 0.01, 0.03), batch in (32, 128, full),
    weight decay in (0, 0.01, 0.1), seed ``i``.
    """
    widths, lrs, batches, decays = (8, 16, 32), (0.003, 0.01, 0.03), (32, 128, None), (0.0, 0.01, 0.1)
    return [
        dict(
            width=widths[i % 3],
            lr=lrs[(i // 3) % 3],
            batch_size=batches[(i + i // 3) % 3],
            weight_decay=decays[(i + 2 * (i // 3)) % 3],
            seed=i,
            steps=steps,
        )
        for i in range(positive_int("n", n))
    ]

"""Small tasks and model families for the regulariser experiments.

Used by the chapter "A regulariser must move equivalent models alike"
(``chapters/ch10_regulariser_updates``). Modular arithmetic (``a + b``, ``a - b`` and
``a * b`` mod ``p``, the grokking tasks of Power et al. 2022) at a small modulus, and three
families of softmax classifiers whose last layer is a bias-free linear map ``W``
(``K x d``) applied to features ``h``:

- :class:`ModularTransformer`: a one-layer transformer (token and position embeddings,
  one multi-head attention layer, an MLP, the unembedding ``W``) read at the ``=`` token;
- :class:`MLPClassifier`: a ReLU MLP, on one-hot pairs (modular subtraction) or on
  pixels (sklearn digits);
- :class:`LinearProbe`: a classifier on frozen features.

Every family stores ``W`` as the parameter ``"classifier.weight"`` (:data:`CLASSIFIER`)
and its ``forward(x, return_features=True)`` returns ``h``, so ``torch.func.functional_call``
gives both logits ``h W^T`` and features from one parameter dict. All float64, seeded
(inside ``torch.random.fork_rng``, so the caller's random state is untouched).
:func:`fit` trains a family full-batch with AdamW through
:func:`lossgeom.training.train` (optionally projecting the parameters after every
step); :func:`accuracy_curve` and :func:`onset_step` read its checkpoints.
:class:`QuadraticMLP` is the square-activation network that groks modular addition
(chapter ``ch12_high_dimensions``): :func:`generalisation_curve` and :func:`grokking_curve`
record its accuracies along a run, and :func:`grokking_sweep` times memorisation and
generalisation over weight decays, SAM radii and seeds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from lossgeom import training
from lossgeom.models import accuracy
from lossgeom_book.checks import as_real, positive, positive_int
from lossgeom_book.data import Split

#: Name of the softmax classifier's weight ``W`` in every model family here.
CLASSIFIER = "classifier.weight"
OPERATIONS = ("add", "subtract", "multiply")
_SYMBOLS = {"add": "+", "subtract": "-", "multiply": "*"}


def modular_arithmetic(p: int = 23, operation: str = "add", train_fraction: float = 0.5, seed: int = 0) -> Split:
    """All pairs ``(a, b)`` in ``Z_p x Z_p`` with label ``a + b``, ``a - b`` or ``a * b`` mod ``p``.

    Inputs are int64 tensors of shape ``(n, 2)`` holding ``(a, b)``; the ``p^2`` pairs are
    split at random (``numpy.random.default_rng(seed)``) into ``round(train_fraction p^2)``
    training pairs and the rest for testing.

    Raises:
        ValueError: if ``p < 3``, ``operation`` is unknown, or the split leaves a side empty.
    """
    p = positive_int("p", p)
    if p < 3:
        raise ValueError(f"p must be >= 3, got {p}")
    if operation not in OPERATIONS:
        raise ValueError(f"operation must be one of {OPERATIONS}, got {operation!r}")
    train_fraction = as_real("train_fraction", train_fraction)
    n = p * p
    n_train = int(round(train_fraction * n))
    if not 0 < n_train < n:
        raise ValueError(f"train_fraction must leave both splits non-empty, got {train_fraction} of {n} pairs")
    a, b = np.divmod(np.arange(n), p)
    y = {"add": a + b, "subtract": a - b, "multiply": a * b}[operation] % p
    x = np.stack([a, b], axis=1).astype(np.int64)
    order = np.random.default_rng(seed).permutation(n)
    tr, te = order[:n_train], order[n_train:]
    desc = f"(a {_SYMBOLS[operation]} b) mod {p}, {n_train} train / {n - n_train} test pairs, seed {seed}"
    return Split(
        torch.from_numpy(x[tr]),
        torch.from_numpy(y[tr].astype(np.int64)),
        torch.from_numpy(x[te]),
        torch.from_numpy(y[te].astype(np.int64)),
        desc,
    )


def _token_ids(x: torch.Tensor, p: int) -> torch.Tensor:
    """Integer pairs (n, 2) in [0, p); floats are accepted when integral (audits cast probes)."""
    if not isinstance(x, torch.Tensor) or x.ndim != 2 or x.shape[1] != 2:
        raise ValueError(
            f"x must be a tensor of shape (n, 2) holding pairs (a, b), got "
            f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}"
        )
    if torch.is_floating_point(x):
        if not torch.equal(x, x.round()):
            raise ValueError("x must hold integer token ids")
        x = x.long()
    if x.numel() and (x.min() < 0 or x.max() >= p):
        raise ValueError(f"x must hold token ids in [0, {p})")
    return x


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Seed torch's global generator inside the block (``torch.random.fork_rng``): the
    ``nn.Linear`` initialisers draw from it, and the caller's random state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


class ModularTransformer(nn.Module):
    """One-layer transformer on the sequence ``(a, b, =)``; logits ``W h`` at ``=``.

    ``h = r + MLP(r)`` with ``r = e + Attn(e)``, ``e`` the token plus position embedding of
    the last position (attention is causal, so only the ``=`` position is read).
    """

    def __init__(self, p: int = 23, d_model: int = 32, n_heads: int = 4, d_mlp: int = 64, seed: int = 0) -> None:
        super().__init__()
        self.p = positive_int("p", p)
        d_model, n_heads, d_mlp = (
            positive_int(n, v) for n, v in (("d_model", d_model), ("n_heads", n_heads), ("d_mlp", d_mlp))
        )
        if d_model % n_heads:
            raise ValueError(f"d_model must be divisible by n_heads, got {d_model} and {n_heads}")
        self.n_heads = n_heads
        kw = dict(dtype=torch.float64)
        with _seeded(seed):
            self.token = nn.Parameter(torch.randn(p + 1, d_model, **kw) / math.sqrt(d_model))
            self.position = nn.Parameter(torch.randn(3, d_model, **kw) / math.sqrt(d_model))
            self.qkv = nn.Linear(d_model, 3 * d_model, bias=False, **kw)
            self.out = nn.Linear(d_model, d_model, bias=False, **kw)
            self.mlp_in = nn.Linear(d_model, d_mlp, **kw)
            self.mlp_out = nn.Linear(d_mlp, d_model, **kw)
            self.classifier = nn.Linear(d_model, p, bias=False, **kw)

    def forward(self, x: torch.Tensor, return_features: bool = False) -> torch.Tensor:
        ids = _token_ids(x, self.p)
        seq = torch.cat([ids, torch.full_like(ids[:, :1], self.p)], dim=1)
        e = self.token[seq] + self.position
        n, t, d = e.shape
        q, k, v = self.qkv(e).view(n, t, 3, self.n_heads, d // self.n_heads).unbind(2)
        scores = torch.einsum("nqhc,nkhc->nhqk", q, k) / math.sqrt(d // self.n_heads)
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        attended = torch.einsum("nhqk,nkhc->nqhc", scores.softmax(-1), v).reshape(n, t, d)
        r = (e + self.out(attended))[:, -1]
        h = r + self.mlp_out(torch.relu(self.mlp_in(r)))
        return h if return_features else self.classifier(h)


class MLPClassifier(nn.Module):
    """ReLU MLP ``h = ReLU(... ReLU(A_1 x))``, logits ``W h``; one-hot pairs when ``modulus`` is set.

    With ``modulus=p`` the input is an ``(n, 2)`` pair ``(a, b)`` encoded as the
    concatenation of two one-hot vectors of length ``p`` (pass ``in_dim=None``);
    otherwise a float ``(n, in_dim)``.
    """

    def __init__(
        self, in_dim: int | None, hidden: Sequence[int], n_classes: int, modulus: int | None = None, seed: int = 0
    ) -> None:
        super().__init__()
        self.modulus = None if modulus is None else positive_int("modulus", modulus)
        if self.modulus is not None:
            if in_dim not in (None, 2 * self.modulus):
                raise ValueError(
                    f"in_dim must be None or 2 * modulus = {2 * self.modulus} for one-hot pairs, got {in_dim}"
                )
            in_dim = 2 * self.modulus
        else:
            in_dim = positive_int("in_dim", in_dim)
        hidden = [positive_int("hidden width", w) for w in hidden]
        if not hidden:
            raise ValueError("hidden must list at least one width")
        n_classes = positive_int("n_classes", n_classes)
        with _seeded(seed):
            sizes = [in_dim, *hidden]
            self.body = nn.ModuleList(nn.Linear(i, o, dtype=torch.float64) for i, o in zip(sizes[:-1], sizes[1:]))
            self.classifier = nn.Linear(sizes[-1], n_classes, bias=False, dtype=torch.float64)

    def forward(self, x: torch.Tensor, return_features: bool = False) -> torch.Tensor:
        if self.modulus is not None:
            ids = _token_ids(x, self.modulus)
            x = torch.cat(
                [nn.functional.one_hot(ids[:, 0], self.modulus), nn.functional.one_hot(ids[:, 1], self.modulus)], dim=1
            ).to(torch.float64)
        h = x
        for layer in self.body:
            h = torch.relu(layer(h))
        return h if return_features else self.classifier(h)


class LinearProbe(nn.Module):
    """Softmax classifier on frozen features: ``h = x`` and logits ``W x``."""

    def __init__(self, d: int, n_classes: int, seed: int = 0) -> None:
        super().__init__()
        with _seeded(seed):
            self.classifier = nn.Linear(
                positive_int("d", d), positive_int("n_classes", n_classes), bias=False, dtype=torch.float64
            )

    def forward(self, x: torch.Tensor, return_features: bool = False) -> torch.Tensor:
        return x if return_features else self.classifier(x)


def features(model: nn.Module, params: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """The classifier's input ``h`` (rows are examples) for ``model`` with ``params``."""
    return torch.func.functional_call(model, dict(params), (x,), {"return_features": True})


@dataclass(frozen=True)
class FitResult:
    """Final accuracies of :func:`fit` and the parameter snapshots it kept (step, params)."""

    train_accuracy: float
    test_accuracy: float
    snapshots: list


def fit(
    model: nn.Module,
    split: Split,
    steps: int,
    lr: float = 1e-2,
    weight_decay: float = 1.0,
    snapshot_every: int = 0,
    project: Callable[[dict], dict] | None = None,
) -> FitResult:
    """Train ``model`` in place with full-batch AdamW on cross-entropy.

    A wrapper of :func:`lossgeom.training.train` (``torch.optim.AdamW`` arithmetic) on
    the model's parameter dict, evaluated with ``torch.func.functional_call``; the trained
    parameters are copied back into ``model``. Full batch makes the run deterministic given
    the model's seeded initialisation. ``weight_decay`` is AdamW's decoupled decay (the
    grokking recipe). Every ``snapshot_every`` steps (if > 0) a copy of the parameters is
    kept as a checkpoint (a monitor). ``project`` (if given) maps the parameter dict to the
    parameters to continue from; it is applied once before training and after every step
    (a projection hook; for example :func:`lossgeom_book.regulariser_checks.fix_raw_ratio`, which
    moves only a function-null coordinate). The optimiser state is kept as it is.
    """
    steps = positive_int("steps", steps)
    lr = positive("lr", lr)
    weight_decay = as_real("weight_decay", weight_decay)
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    snapshot_every = int(snapshot_every)
    if project is not None and not callable(project):
        raise TypeError("project must be callable as project(params) -> params")
    adamw = training.adam(lr, weight_decay=weight_decay, decoupled=True, arithmetic="torch")
    x, y = split.x_train, split.y_train
    loss = lambda q, _indices: nn.functional.cross_entropy(torch.func.functional_call(model, q, (x,)), y)
    hooks = [] if project is None else [training.Projection(project, at_start=True)]
    if snapshot_every > 0:
        copy = lambda _step, q: {k: v.clone() for k, v in q.items()}
        hooks.append(training.Monitor("snapshots", copy, at=tuple(range(snapshot_every, steps + 1, snapshot_every))))
    run = training.train(loss, {k: v.detach() for k, v in model.named_parameters()}, adamw, steps, hooks=hooks)
    with torch.no_grad():
        for name, value in model.named_parameters():
            value.copy_(run.params[name])
    params = {k: v.detach() for k, v in model.named_parameters()}
    return FitResult(
        accuracy(model, (split.x_train, split.y_train), params=params),
        accuracy(model, (split.x_test, split.y_test), params=params),
        run.records.get("snapshots", []),
    )


def accuracy_curve(model: nn.Module, result: FitResult, x: torch.Tensor, y: torch.Tensor) -> list[tuple[int, float]]:
    """``(step, accuracy on (x, y))`` at every checkpoint :func:`fit` kept."""
    if not isinstance(result, FitResult) or not result.snapshots:
        raise ValueError("result must be a FitResult with checkpoints (fit with snapshot_every > 0)")
    return [(step, accuracy(model, (x, y), params=params)) for step, params in result.snapshots]


def onset_step(curve: Sequence[tuple[int, float]], threshold: float) -> int | None:
    """The first checkpoint step whose accuracy reaches ``threshold`` (None if none does)."""
    threshold = as_real("threshold", threshold)
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must lie in (0, 1], got {threshold}")
    return next((step for step, acc in curve if acc >= threshold), None)


class QuadraticMLP(nn.Module):
    """Two-layer MLP with a square activation on a pair ``(a, b)``: logits ``W (A e_ab)^2``.

    ``e_ab`` is the concatenation of the one-hot codes of ``a`` and ``b`` (length ``2p``),
    ``A`` (``"input.weight"``, ``width x 2p``) is applied by gathering its two columns
    (the same numbers as the dense product, at a fraction of the cost), the square acts
    elementwise and ``W`` (``"classifier.weight"``, ``p x width``) reads it. No biases.
    This is the network of Gromov (2023), which groks modular addition; the square is
    homogeneous of degree 2, so ``A_j -> c A_j``, ``W_j -> W_j / c^2`` keeps the function
    (:func:`lossgeom.symmetries.homogeneous_neuron_rescaling`). Parameters are drawn
    uniformly in ``+- init_scale / sqrt(fan_in)`` with ``seed``.
    """

    def __init__(self, p: int, width: int, seed: int = 0, init_scale: float = 1.0) -> None:
        super().__init__()
        self.p = positive_int("p", p)
        width = positive_int("width", width)
        init_scale = positive("init_scale", init_scale)
        gen = torch.Generator().manual_seed(int(seed))

        def uniform(shape, fan_in):
            return (2 * torch.rand(shape, generator=gen, dtype=torch.float64) - 1) * init_scale / math.sqrt(fan_in)

        self.input = nn.Linear(2 * self.p, width, bias=False, dtype=torch.float64)
        self.classifier = nn.Linear(width, self.p, bias=False, dtype=torch.float64)
        with torch.no_grad():
            self.input.weight.copy_(uniform((width, 2 * self.p), 2 * self.p))
            self.classifier.weight.copy_(uniform((self.p, width), width))

    def forward(self, x: torch.Tensor, return_features: bool = False) -> torch.Tensor:
        ids = _token_ids(x, self.p)
        columns = self.input.weight.T
        h = (columns[ids[:, 0]] + columns[self.p + ids[:, 1]]) ** 2
        return h if return_features else self.classifier(h)


@dataclass(frozen=True)
class GeneralisationCurve:
    """A training run on a split with both accuracies recorded along the way.

    Attributes:
        params: the final parameters.
        checkpoints: the steps at which the accuracies were measured (0, every, ..., steps).
        train_accuracy: the training accuracy at each checkpoint.
        test_accuracy: the test accuracy at each checkpoint.
        final_loss: the training loss before the last update.
    """

    params: dict
    checkpoints: np.ndarray
    train_accuracy: np.ndarray
    test_accuracy: np.ndarray
    final_loss: float

    def steps_to_reach(self, threshold: float, split: str = "test") -> tuple[int, int] | None:
        """The bracket ``(a, b]`` of steps in which an accuracy first reaches ``threshold``.

        ``b`` is the first checkpoint where the ``split`` (``"test"`` or ``"train"``) accuracy
        is >= ``threshold`` and ``a`` the checkpoint before it; ``None`` if it is never reached.
        A bracket, not a step count: the accuracy is only measured at checkpoints, and the
        crossing of a threshold is the kind of quantity whose exact step another machine's
        rounding may shift.
        """
        threshold = as_real("threshold", threshold)
        if split not in ("test", "train"):
            raise ValueError(f"split must be 'test' or 'train', got {split!r}")
        curve = self.test_accuracy if split == "test" else self.train_accuracy
        hits = np.nonzero(curve >= threshold)[0]
        if hits.size == 0:
            return None
        i = int(hits[0])
        return (int(self.checkpoints[i - 1]) if i else 0, int(self.checkpoints[i]))


def generalisation_curve(model: nn.Module, split: Split, optimiser, steps: int, every: int = 10) -> GeneralisationCurve:
    """Train a copy of ``model``'s parameters full-batch on cross-entropy, recording accuracies.

    The run is :func:`lossgeom.training.train` with a monitor that measures the training
    and test accuracy every ``every`` steps; ``model`` itself is not modified.
    """

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    loss_fn = training.indexed_loss(model, nn.CrossEntropyLoss(), (split.x_train, split.y_train))

    def both(q):
        return accuracy(model, (split.x_train, split.y_train), params=q), accuracy(
            model, (split.x_test, split.y_test), params=q
        )

    run = training.train(
        loss_fn,
        params,
        optimiser,
        positive_int("steps", steps),
        monitor=both,
        monitor_every=positive_int("every", every),
    )
    checkpoints = np.array([s for s, _ in run.monitored])
    train, test = (np.array([a[i] for _, a in run.monitored]) for i in (0, 1))
    return GeneralisationCurve(run.params, checkpoints, train, test, float(run.losses[-1]))


# --------------------------------------------------------------------------- grokking times


def grokking_curve(
    model: nn.Module, split: Split, optimiser, max_steps: int, every: int = 10, stop_at: float | None = None
) -> GeneralisationCurve:
    """:func:`generalisation_curve`, optionally stopped once the test accuracy reaches ``stop_at``.

    The run is :func:`lossgeom.training.train` (full batch, cross-entropy) with a monitor
    of both accuracies every ``every`` steps; with ``stop_at`` a
    :class:`lossgeom.training.StopWhen` ends it at the first checkpoint whose test
    accuracy is ``>= stop_at`` (so only the crossing is paid for), else it runs
    ``max_steps``. ``model`` itself is not modified.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if stop_at is not None:
        stop_at = as_real("stop_at", stop_at)
        if not 0 < stop_at <= 1:
            raise ValueError(f"stop_at must lie in (0, 1], got {stop_at}")
    every = positive_int("every", every)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    loss_fn = training.indexed_loss(model, nn.CrossEntropyLoss(), (split.x_train, split.y_train))
    latest = {"test": 0.0}

    def both(_step, q):
        pair = (
            accuracy(model, (split.x_train, split.y_train), params=q),
            accuracy(model, (split.x_test, split.y_test), params=q),
        )
        latest["test"] = pair[1]
        return pair

    hooks = [training.Monitor("accuracy", both, every)]
    if stop_at is not None:
        hooks.append(training.StopWhen(lambda _step, _q: latest["test"] >= stop_at, "test accuracy reached"))
    run = training.train(loss_fn, params, optimiser, positive_int("max_steps", max_steps), hooks=hooks)
    records = run.records["accuracy"]
    checkpoints = np.array([s for s, _ in records])
    train, test = (np.array([a[i] for _, a in records]) for i in (0, 1))
    return GeneralisationCurve(run.params, checkpoints, train, test, float(run.losses[-1]))


@dataclass(frozen=True)
class GrokkingSweep:
    """Times to memorise and to generalise over weight decays x SAM radii x seeds.

    Arrays have shape ``(len(weight_decays), len(radii), len(seeds))``; a radius of 0 means
    plain AdamW. ``memorised`` is the first checkpoint with training accuracy 1 and
    ``generalised`` the first with test accuracy ``>= threshold``; ``inf`` where the run
    never got there within ``max_steps``. ``curves[(wd, radius, seed)]`` holds each run.
    """

    weight_decays: tuple[float, ...]
    radii: tuple[float, ...]
    seeds: tuple[int, ...]
    threshold: float
    max_steps: int
    memorised: np.ndarray
    generalised: np.ndarray
    curves: dict

    @property
    def delay(self) -> np.ndarray:
        """``generalised - memorised``: how long a run interpolates before it generalises."""
        return self.generalised - self.memorised

    def speedup(self) -> np.ndarray:
        """Per seed, the plain run's time to generalise over each radius's: shape ``(W, R, S)``.

        Paired by seed (same split, same initialisation). ``> 1``: SAM generalised sooner;
        ``nan`` where neither run generalised; ``0`` or ``inf`` where only one did.

        Raises:
            ValueError: if the sweep has no radius 0 (no plain run to compare with).
        """
        if 0.0 not in self.radii:
            raise ValueError("the sweep needs radius 0 (plain AdamW) among its radii to define a speed-up")
        plain = self.generalised[:, self.radii.index(0.0)][:, None, :]
        with np.errstate(invalid="ignore", divide="ignore"):
            return plain / self.generalised

    def summary(self, sig: int = 2) -> str:
        """A text table: per weight decay and radius, the median ``[min, max]`` over seeds of the
        steps to memorise and to generalise, the delay between them and SAM's speed-up.

        A run that never got there counts as ``inf``; an entry lists how many seeds reached
        it when not all did, and reads ``never`` when none did.
        """
        from lossgeom.formatting import fmt

        def span(values: np.ndarray, digits: int | None = None) -> str:
            done = values[np.isfinite(values)]
            if done.size == 0:
                return "never"
            show = (lambda v: fmt(float(v), digits)) if digits else (lambda v: str(int(v)))
            text = f"{show(np.median(done))} [{show(done.min())}, {show(done.max())}]"
            return text if done.size == values.size else f"{text} in {done.size}/{values.size}"

        speedup = self.speedup() if 0.0 in self.radii else None
        lines = [f"{'wd':>5} {'radius':>6}  {'memorised':<16}{'generalised':<18}{'delay':<18}speed-up"]
        for i, wd in enumerate(self.weight_decays):
            for j, radius in enumerate(self.radii):
                row = [span(self.memorised[i, j]), span(self.generalised[i, j]), span(self.delay[i, j])]
                both = speedup[i, j][np.isfinite(speedup[i, j])] if speedup is not None else np.array([])
                row.append(span(both, sig) if radius and both.size else "-")
                lines.append(f"{fmt(wd):>5} {fmt(radius):>6}  {row[0]:<16}{row[1]:<18}{row[2]:<18}{row[3]}")
        return "\n".join(lines)


def grokking_sweep(
    p: int,
    width: int,
    learning_rate: float,
    weight_decays: Sequence[float],
    radii: Sequence[float],
    seeds: Sequence[int],
    max_steps: int,
    every: int = 10,
    threshold: float = 0.5,
    train_fraction: float = 0.5,
    stop_sam_runs_early: bool = True,
) -> GrokkingSweep:
    """Grokking on ``(a + b) mod p`` with :class:`QuadraticMLP` for every weight decay, SAM radius and seed.

    Each seed draws its split (:func:`modular_arithmetic`) and its initialisation; every run
    trains full batch with AdamW (:func:`lossgeom.training.adam`, decoupled weight decay,
    step ``learning_rate``), wrapped in :func:`lossgeom.training.sam` when the radius is
    > 0, through :func:`grokking_curve`. Runs without SAM go the full ``max_steps`` (their
    curves and end points are kept); with ``stop_sam_runs_early`` a SAM run stops at its
    crossing of ``threshold``, which is all the speed-up needs.
    """
    weight_decays = tuple(as_real("weight_decays", w) for w in weight_decays)
    radii = tuple(as_real("radii", r) for r in radii)
    seeds = tuple(int(s) for s in seeds)
    if not weight_decays or not radii or not seeds:
        raise ValueError("weight_decays, radii and seeds must not be empty")
    if min(weight_decays) < 0 or min(radii) < 0:
        raise ValueError("weight_decays and radii must be >= 0 (radius 0: no SAM)")
    threshold = as_real("threshold", threshold)
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must lie in (0, 1], got {threshold}")
    shape = (len(weight_decays), len(radii), len(seeds))
    memorised, generalised = np.full(shape, np.inf), np.full(shape, np.inf)
    curves = {}
    for k, seed in enumerate(seeds):
        split = modular_arithmetic(p, "add", train_fraction=train_fraction, seed=seed)
        model = QuadraticMLP(p, width, seed=seed)
        for i, wd in enumerate(weight_decays):
            for j, radius in enumerate(radii):
                rule = training.adam(learning_rate, weight_decay=wd)
                rule = training.sam(rule, radius) if radius else rule
                stop = threshold if (radius and stop_sam_runs_early) else None
                curve = grokking_curve(model, split, rule, max_steps, every, stop_at=stop)
                curves[wd, radius, seed] = curve
                for table, bracket in (
                    (memorised, curve.steps_to_reach(1.0, "train")),
                    (generalised, curve.steps_to_reach(threshold, "test")),
                ):
                    if bracket is not None:
                        table[i, j, k] = bracket[1]
    return GrokkingSweep(weight_decays, radii, seeds, threshold, int(max_steps), memorised, generalised, curves)

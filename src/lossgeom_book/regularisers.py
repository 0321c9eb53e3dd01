"""Regularisers as interventions: do equivalent models receive the same update?

The chapter "A regulariser must move equivalent models alike"
(``chapters/ch10_regulariser_updates``) derives and tests what follows.

A regulariser ``S`` added to a training loss moves the *function* with the velocity

    V_S(theta) = J_F(theta) grad_theta S(theta),

``J_F`` the Jacobian of the model outputs ``F`` (probabilities on a probe set) in the
parameters (:func:`functional_velocity`). If ``S`` is a property of the predictor, two
parameter points implementing one predictor (a model and its common-row-shifted twin,
:mod:`lossgeom.flatness.softmax_gauge`) must get the same velocity and, after one matched optimiser
step, must still agree. :func:`paired_step` runs that test; :func:`train` runs the
long-horizon version and records the function-null mean row ``wbar`` of the classifier.

The objectives are ``CE + sign * alpha * S`` with ``S`` one of the proxies of
:mod:`lossgeom.flatness` (``"raw"``: ``B_raw``, ``"quot"``: ``B_quot``, ``"exact"``:
``kappa_exact``) or nothing (``"ce"``). ``sign = +1`` penalises the proxy (a flatness
regulariser); ``sign = -1`` is the sharpness-raising intervention (gradient ascent on
``alpha * S``), under which the raw proxy multiplies ``wbar`` by ``1 + 2 eta alpha s_t``
per SGD step (``s = ||h||^2 (1 - ||p||^2)`` averaged over the batch).

Seed 004 asks three things of a score ``S`` (:func:`identification_checklist`):
approximation validity (``kappa_exact <= S``), value identification (``S`` is the same
at every representative) and interventional identification (its functional velocity is
the same at every representative). :func:`paired_one_step_test` is the paired experiment
on a trained model; :func:`train_then_remove` the long-horizon one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from lossgeom import flatness, training
from lossgeom.flatness import softmax_gauge as softmax
from lossgeom.symmetries import Symmetry, audit_symmetry
from lossgeom.types import Params
from lossgeom_book.checks import as_real, finite_tensor, positive, positive_int

Features = Callable[[Params, torch.Tensor], torch.Tensor]

#: The objectives compared in the regulariser chapter and the proxy each adds to cross-entropy.
PROXIES: dict[str, Callable | None] = {
    "ce": None,
    "raw": flatness.b_raw,
    "quot": flatness.b_quot,
    "exact": flatness.kappa_exact,
}
OPTIMISERS = ("sgd", "adam")


def _check_objective(objective: str) -> str:
    if objective not in PROXIES:
        raise ValueError(f"objective must be one of {tuple(PROXIES)}, got {objective!r}")
    return objective


def _check_params(params, weight: str) -> dict[str, torch.Tensor]:
    if not isinstance(params, Mapping) or not params:
        raise TypeError("params must be a non-empty dict of name -> tensor")
    if not isinstance(weight, str) or weight not in params:
        raise ValueError(f"weight must name the classifier W in params; {weight!r} is not one of {sorted(params)}")
    if params[weight].ndim != 2:
        raise ValueError(f"params[{weight!r}] must be the (K, d) classifier, got shape {tuple(params[weight].shape)}")
    return {k: finite_tensor(f"params[{k!r}]", v) for k, v in params.items()}


def _check_sign(sign) -> float:
    sign = as_real("sign", sign)
    if sign not in (1.0, -1.0):
        raise ValueError(f"sign must be +1 (penalty) or -1 (sharpness-raising ascent), got {sign}")
    return sign


def _check_data(x, y) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise TypeError("x and y must be torch tensors")
    if y.ndim != 1 or y.dtype != torch.int64:
        raise ValueError(
            f"y must be a 1-D int64 tensor of class indices, got dtype {y.dtype} and shape {tuple(y.shape)}"
        )
    if x.shape[0] != y.shape[0] or y.shape[0] == 0:
        raise ValueError(f"x and y must hold the same positive number of examples, got {x.shape[0]} and {y.shape[0]}")
    return x, y


def logits_and_features(
    features: Features, params: Params, x: torch.Tensor, weight: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(h W^T, h)`` with ``h = features(params, x)`` and ``W = params[weight]``."""
    h = features(params, x)
    W = params[weight]
    if h.ndim != 2 or h.shape[1] != W.shape[1]:
        raise ValueError(
            f"features must return (n, {W.shape[1]}) to match W of shape {tuple(W.shape)}, got {tuple(h.shape)}"
        )
    return h @ W.T, h


def objective_fn(
    features: Features,
    x: torch.Tensor,
    y: torch.Tensor,
    objective: str,
    alpha: float = 0.0,
    sign: float = 1.0,
    weight: str = "classifier.weight",
) -> Callable[[Params], torch.Tensor]:
    """Return ``loss(params) = CE(h W^T, y) + sign * alpha * S(W, h)`` (mean over the batch).

    Args:
        features: ``features(params, x) -> h`` of shape (n, d), differentiable in params.
        x, y: inputs and int64 class labels.
        objective: ``"ce"``, ``"raw"``, ``"quot"`` or ``"exact"`` (see :data:`PROXIES`).
        alpha: the regulariser's weight (>= 0; ignored for ``"ce"``).
        sign: ``+1`` penalises ``S``; ``-1`` raises it (the sharpness-raising intervention).
        weight: the parameter name of the classifier ``W``.
    """
    proxy = PROXIES[_check_objective(objective)]
    alpha = as_real("alpha", alpha)
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    sign = _check_sign(sign)
    x, y = _check_data(x, y)
    if not callable(features):
        raise TypeError("features must be callable as features(params, x)")

    def loss(params: Params) -> torch.Tensor:
        z, h = logits_and_features(features, params, x, weight)
        value = torch.nn.functional.cross_entropy(z, y)
        if proxy is not None and alpha != 0:
            value = value + sign * alpha * proxy(params[weight], h)
        return value

    return loss


def probabilities_fn(
    features: Features, probe: torch.Tensor, weight: str = "classifier.weight"
) -> Callable[[Params], torch.Tensor]:
    """Return ``F(params) = softmax(W h(probe))``, shape (n, K): the outputs a velocity moves."""
    if not callable(features):
        raise TypeError("features must be callable as features(params, x)")

    def F(params: Params) -> torch.Tensor:
        return torch.softmax(logits_and_features(features, params, probe, weight)[0], dim=-1)

    return F


def functional_velocity(
    output_fn: Callable[[Params], torch.Tensor], score_fn: Callable[[Params], torch.Tensor], params: Params
) -> torch.Tensor:
    """``V_S = J_F(theta) grad_theta S(theta)``: how gradient flow on ``S`` moves the outputs ``F``.

    ``grad S`` by ``torch.func.grad``, then one forward-mode product ``torch.func.jvp`` of
    ``F`` along it (no Jacobian is formed). Gradient *descent* on ``S`` moves ``F`` by
    ``-eta V_S`` to first order; ``V`` of ``B_raw`` has a closed form (seed 004, Prop. 5).
    """
    if not callable(output_fn) or not callable(score_fn):
        raise TypeError("output_fn and score_fn must be callable on a parameter dict")
    if not isinstance(params, Mapping) or not params:
        raise TypeError("params must be a non-empty dict of name -> tensor")
    params = {k: finite_tensor(f"params[{k!r}]", v) for k, v in params.items()}
    score = score_fn(params)
    if not isinstance(score, torch.Tensor) or score.ndim != 0:
        raise ValueError("score_fn must return a scalar tensor")
    grad = torch.func.grad(score_fn)(params)
    _, velocity = torch.func.jvp(output_fn, (params,), (grad,))
    return velocity


def shift_for_ratio(W: torch.Tensor, ratio: float, direction: torch.Tensor) -> torch.Tensor:
    """The shift ``v`` along ``direction`` with ``||W_c + 1 v^T||_F^2 = ratio ||W_c||_F^2``.

    Then ``B_raw(W_c + 1 v^T, h) = ratio * B_quot(W, h)`` for every feature ``h`` (the two
    parts are orthogonal), while ``p``, ``B_quot`` and ``kappa_exact`` are unchanged:
    ``||v|| = sqrt((ratio - 1) ||W_c||_F^2 / K)``.
    """
    ratio = as_real("ratio", ratio)
    if ratio < 1:
        raise ValueError(f"ratio must be >= 1 (the centred W is the orbit's minimum), got {ratio}")
    direction = finite_tensor("direction", direction)
    if direction.shape != (W.shape[1],) or float(direction.norm()) == 0:
        raise ValueError(
            f"direction must be a nonzero vector of shape ({W.shape[1]},), got shape {tuple(direction.shape)}"
        )
    return softmax.shift_for_norm_factor(softmax.centre(W), direction, ratio)


def twin_at_ratio(W: torch.Tensor, ratio: float, direction: torch.Tensor) -> torch.Tensor:
    """The representative ``W_c + 1 v^T`` of ``W``'s predictor with ``B_raw = ratio * B_quot``.

    ``W_c`` is the row-centred ``W`` and ``v = shift_for_ratio(W, ratio, direction)``
    (:func:`shift_for_ratio`), so ``||W_c + 1 v^T||_F^2 = ratio ||W_c||_F^2`` while the
    probabilities, ``B_quot`` and ``kappa_exact`` are those of ``W``; ``ratio = 1`` gives ``W_c``.
    """
    W = finite_tensor("W", W)
    if W.ndim != 2:
        raise ValueError(f"W must be the (K, d) classifier, got shape {tuple(W.shape)}")
    return softmax.common_row_shift(softmax.centre(W), shift_for_ratio(W, ratio, direction))


def _update_rule(name: str, lr: float, momentum: float, weight_decay: float) -> training.Optimiser:
    """``torch.optim.SGD`` or ``Adam`` (coupled decay), computed by torch (``arithmetic="torch"``)."""
    if name == "sgd":
        return training.sgd(lr, momentum=momentum, weight_decay=weight_decay, arithmetic="torch")
    return training.adam(lr, weight_decay=weight_decay, decoupled=False, arithmetic="torch")


def optimiser_step(
    loss_fn: Callable[[Params], torch.Tensor],
    params: Params,
    *,
    lr: float,
    optimizer: str = "sgd",
    momentum: float = 0.0,
    weight_decay: float = 0.0,
) -> dict[str, torch.Tensor]:
    """One step of a fresh ``torch.optim`` optimiser on ``loss_fn`` from ``params`` (a copy).

    A one-step run of :func:`lossgeom.training.train`.
    """
    if optimizer not in OPTIMISERS:
        raise ValueError(f"optimizer must be one of {OPTIMISERS}, got {optimizer!r}")
    lr = positive("lr", lr)
    run = training.train(
        lambda q, _indices: loss_fn(q),
        params,
        _update_rule(optimizer, lr, momentum, weight_decay),
        1,
        hooks=[training.DivergenceStop()],
    )
    if run.stop is not None:
        raise ValueError("the objective is not finite at params")
    return run.params


@dataclass(frozen=True)
class PairedStep:
    """Receipt of one paired step: two representatives of one predictor, one matched update.

    Attributes:
        objective, alpha: the objective ``CE + sign * alpha * S`` both models took a step on.
        gap_before: largest probability difference on the probe before the step (audited).
        gap_after: largest probability difference after the step.
        disagreement: fraction of probe inputs whose predicted class differs after the step.
        step_size: largest probability change of the first model over the step (the scale
            against which ``gap_after`` is small or not).
    """

    objective: str
    alpha: float
    gap_before: float
    gap_after: float
    disagreement: float
    step_size: float


def paired_steps(
    features: Features,
    params: Params,
    symmetries,
    x: torch.Tensor,
    y: torch.Tensor,
    probe: torch.Tensor,
    *,
    objective,
    alpha: float,
    lr: float,
    sign: float = 1.0,
    optimizer: str = "sgd",
    momentum: float = 0.0,
    weight: str = "classifier.weight",
    tol: float = 1e-10,
) -> list[PairedStep]:
    """One matched optimiser step from ``params`` and from each ``symmetry(params)``; compare outputs.

    Each pair is first audited with :func:`lossgeom.symmetries.audit_symmetry` on the
    probe's probabilities (raises ``ValueError`` if they differ by more than ``tol``).
    Every model then takes one step of a fresh optimiser (same data, hyperparameters and
    state) on the same objective ``CE + sign * alpha * S``; equivalent models should still
    agree afterwards. The audit and the step from ``params`` are shared by all pairs.

    Args:
        objective: one name of :data:`PROXIES`, or a sequence of names to test in turn.

    Returns:
        One :class:`PairedStep` per (objective, symmetry), objectives outermost.
    """
    params = _check_params(params, weight)
    if isinstance(symmetries, Symmetry):
        raise TypeError("symmetries must be a list of Symmetry; use paired_step for one")
    symmetries = list(symmetries)
    if not symmetries or not all(isinstance(t, Symmetry) for t in symmetries):
        raise TypeError("symmetries must be a non-empty list of lossgeom Symmetry objects")
    objectives = [objective] if isinstance(objective, str) else list(objective)
    for name in objectives:
        _check_objective(name)
    F = probabilities_fn(features, probe, weight)
    audits = [audit_symmetry(lambda q, _probe: F(q), params, t, probe, tol=tol) for t in symmetries]
    twins = [t(params) for t in symmetries]
    kw = dict(lr=lr, optimizer=optimizer, momentum=momentum)
    with torch.no_grad():
        p0 = F(params)
    out = []
    for name in objectives:
        loss_fn = objective_fn(features, x, y, name, alpha, sign, weight)
        after = optimiser_step(loss_fn, params, **kw)
        with torch.no_grad():
            p1 = F(after)
        for twin, audit in zip(twins, audits):
            twin_after = optimiser_step(loss_fn, twin, **kw)
            with torch.no_grad():
                q1 = F(twin_after)
            if not (torch.isfinite(p1).all() and torch.isfinite(q1).all()):
                raise ValueError("the step produced non-finite probabilities; lower lr or alpha")
            disagreement = float((p1.argmax(-1) != q1.argmax(-1)).double().mean())
            out.append(
                PairedStep(
                    name,
                    float(alpha),
                    audit.max_output_discrepancy,
                    float((p1 - q1).abs().max()),
                    disagreement,
                    float((p1 - p0).abs().max()),
                )
            )
    return out


def paired_step(
    features: Features,
    params: Params,
    symmetry: Symmetry,
    x: torch.Tensor,
    y: torch.Tensor,
    probe: torch.Tensor,
    **kwargs,
) -> PairedStep:
    """:func:`paired_steps` for one symmetry: audit the pair, step both, compare probabilities."""
    if not isinstance(symmetry, Symmetry):
        raise TypeError(f"symmetry must be a lossgeom Symmetry, got {type(symmetry).__name__}")
    return paired_steps(features, params, [symmetry], x, y, probe, **kwargs)[0]


def mean_score(features: Features, params: Params, x: torch.Tensor, weight: str = "classifier.weight") -> torch.Tensor:
    """``s = mean_i ||h_i||^2 (1 - ||p_i||^2)``, so that ``B_raw = ||W||_F^2 s``."""
    z, h = logits_and_features(features, params, x, weight)
    p = torch.softmax(z, dim=-1)
    return ((h**2).sum(-1) * (1 - (p**2).sum(-1))).mean()


def train(
    features: Features,
    params: Params,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    objective: str,
    alpha: float,
    steps: int,
    lr: float,
    sign: float = 1.0,
    weight_decay: float = 0.0,
    centred_cap: float | None = None,
    weight: str = "classifier.weight",
    record: Callable[[int, dict[str, torch.Tensor]], dict] | None = None,
    record_every: int = 0,
) -> tuple[dict[str, torch.Tensor], dict]:
    """Full-batch plain SGD (coupled L2 ``weight_decay``) on ``CE + sign * alpha * S``.

    A wrapper of :func:`lossgeom.training.train` (``torch.optim.SGD`` arithmetic) with
    its hooks: monitors record the mean row ``wbar_t`` of ``W`` and ``s_t``
    (:func:`mean_score`) at the point where each gradient is taken, so the per-step factor
    ``wbar_{t+1} = (1 - eta lambda - 2 sign eta alpha s_t) wbar_t`` of the raw objective
    can be checked. ``centred_cap`` (if given) is a projection after every step onto
    ``||W_c||_F <= centred_cap``, rescaling the centred part and leaving ``wbar`` alone:
    a cap on the function-relevant part of ``W`` that leaves the common row unconstrained.
    ``record(step, params)`` is called every ``record_every`` steps and at the end. A run
    whose objective stops being finite (or whose logits overflow) ends early with
    ``diverged_at`` set (a divergence stop).

    Returns:
        The final parameters and a history dict with keys ``mean_row`` (shape (T+1, d)),
        ``s`` (shape (T,)), ``records`` (a list) and ``diverged_at`` (int or None).
    """
    params = _check_params(params, weight)
    steps = positive_int("steps", steps)
    record_every = int(record_every)
    proxy = PROXIES[_check_objective(objective)]
    alpha, sign = as_real("alpha", alpha), _check_sign(sign)
    x, y = _check_data(x, y)
    if centred_cap is not None:
        centred_cap = positive("centred_cap", centred_cap)
    rule = _update_rule("sgd", positive("lr", lr), 0.0, as_real("weight_decay", weight_decay))

    def loss_fn(q: Params, _indices) -> torch.Tensor:
        z, h = logits_and_features(features, q, x, weight)
        if not torch.isfinite(z).all():  # the proxies are undefined at overflowing logits
            return torch.tensor(math.inf, dtype=z.dtype)
        value = torch.nn.functional.cross_entropy(z, y)
        if proxy is not None and alpha != 0:
            value = value + sign * alpha * proxy(q[weight], h)
        return value

    def cap(q: dict) -> dict:
        W = q[weight]
        mean = W.mean(0, keepdim=True)
        norm = float((W - mean).norm())
        return {**q, weight: (W - mean) * (centred_cap / norm) + mean} if norm > centred_cap else q

    hooks = [
        training.DivergenceStop(),
        training.Monitor("mean_row", lambda _step, q: q[weight].detach().mean(0).clone()),
        training.Monitor("s", lambda _step, q: float(mean_score(features, q, x, weight))),
    ]
    if record is not None:
        every = {"every": record_every} if record_every else {"at": (steps,)}
        hooks.append(training.Monitor("records", record, **every))
    if centred_cap is not None:
        hooks.append(training.Projection(cap))
    run = training.train(loss_fn, params, rule, steps, hooks=hooks)
    scores = [s for _, s in run.records["s"][: run.steps_taken]]  # s_t of the steps taken
    return run.params, {
        "mean_row": torch.stack([row for _, row in run.records["mean_row"]]),
        "s": torch.tensor(scores, dtype=torch.float64),
        "records": [value for _, value in run.records.get("records", [])],
        "diverged_at": run.diverged_at,
    }

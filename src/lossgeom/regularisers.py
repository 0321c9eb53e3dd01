"""Regularisers as interventions: do equivalent models receive the same update? (Chapter 9)

A regulariser ``S`` added to a training loss moves the *function* with the velocity

    V_S(theta) = J_F(theta) grad_theta S(theta),

``J_F`` the Jacobian of the model outputs ``F`` (probabilities on a probe set) in the
parameters (:func:`functional_velocity`). If ``S`` is a property of the predictor, two
parameter points implementing one predictor (a model and its common-row-shifted twin,
:mod:`lossgeom.softmax`) must get the same velocity and, after one matched optimiser
step, must still agree. :func:`paired_step` runs that test; :func:`train` runs the
long-horizon version and records the function-null mean row ``wbar`` of the classifier.

The objectives are ``CE + sign * alpha * S`` with ``S`` one of the proxies of
:mod:`lossgeom.softmax` (``"raw"``: ``B_raw``, ``"quot"``: ``B_quot``, ``"exact"``:
``kappa_exact``) or nothing (``"ce"``). ``sign = +1`` penalises the proxy (a flatness
regulariser); ``sign = -1`` is the sharpness-raising intervention (gradient ascent on
``alpha * S``), under which the raw proxy multiplies ``wbar`` by ``1 + 2 eta alpha s_t``
per SGD step (Chapter 9 derives it; ``s = ||h||^2 (1 - ||p||^2)`` averaged over the batch).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from lossgeom import softmax
from lossgeom._checks import as_real, finite_tensor, positive, positive_int
from lossgeom.symmetries import Symmetry, audit_symmetry

Params = Mapping[str, torch.Tensor]
Features = Callable[[Params, torch.Tensor], torch.Tensor]

#: The objectives compared in Chapter 9 and the proxy each adds to cross-entropy.
PROXIES: dict[str, Callable | None] = {
    "ce": None,
    "raw": softmax.b_raw,
    "quot": softmax.b_quot,
    "exact": softmax.kappa_exact,
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
        raise ValueError(f"y must be a 1-D int64 tensor of class indices, got dtype {y.dtype} and shape {tuple(y.shape)}")
    if x.shape[0] != y.shape[0] or y.shape[0] == 0:
        raise ValueError(f"x and y must hold the same positive number of examples, got {x.shape[0]} and {y.shape[0]}")
    return x, y


def logits_and_features(features: Features, params: Params, x: torch.Tensor,
                        weight: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(h W^T, h)`` with ``h = features(params, x)`` and ``W = params[weight]``."""
    h = features(params, x)
    W = params[weight]
    if h.ndim != 2 or h.shape[1] != W.shape[1]:
        raise ValueError(f"features must return (n, {W.shape[1]}) to match W of shape {tuple(W.shape)}, "
                         f"got {tuple(h.shape)}")
    return h @ W.T, h


def objective_fn(features: Features, x: torch.Tensor, y: torch.Tensor, objective: str, alpha: float = 0.0,
                 sign: float = 1.0, weight: str = "classifier.weight") -> Callable[[Params], torch.Tensor]:
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


def probabilities_fn(features: Features, probe: torch.Tensor, weight: str = "classifier.weight"
                     ) -> Callable[[Params], torch.Tensor]:
    """Return ``F(params) = softmax(W h(probe))``, shape (n, K): the outputs a velocity moves."""
    if not callable(features):
        raise TypeError("features must be callable as features(params, x)")

    def F(params: Params) -> torch.Tensor:
        return torch.softmax(logits_and_features(features, params, probe, weight)[0], dim=-1)

    return F


def functional_velocity(output_fn: Callable[[Params], torch.Tensor], score_fn: Callable[[Params], torch.Tensor],
                        params: Params) -> torch.Tensor:
    """``V_S = J_F(theta) grad_theta S(theta)``: how gradient flow on ``S`` moves the outputs ``F``.

    ``grad S`` by ``torch.func.grad``, then one forward-mode product ``torch.func.jvp`` of
    ``F`` along it (no Jacobian is formed). Gradient *descent* on ``S`` moves ``F`` by
    ``-eta V_S`` to first order. Chapter 9 derives ``V`` for ``B_raw`` in closed form.
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
        raise ValueError(f"direction must be a nonzero vector of shape ({W.shape[1]},), got shape {tuple(direction.shape)}")
    return softmax.shift_for_norm_factor(softmax.centre(W), direction, ratio)


def _optimiser(name: str, leaves, lr: float, momentum: float, weight_decay: float):
    if name == "sgd":
        return torch.optim.SGD(leaves, lr=lr, momentum=momentum, weight_decay=weight_decay)
    return torch.optim.Adam(leaves, lr=lr, weight_decay=weight_decay)


def optimiser_step(loss_fn: Callable[[Params], torch.Tensor], params: Params, *, lr: float,
                   optimizer: str = "sgd", momentum: float = 0.0, weight_decay: float = 0.0) -> dict[str, torch.Tensor]:
    """One step of a fresh ``torch.optim`` optimiser on ``loss_fn`` from ``params`` (a copy)."""
    if optimizer not in OPTIMISERS:
        raise ValueError(f"optimizer must be one of {OPTIMISERS}, got {optimizer!r}")
    lr = positive("lr", lr)
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    opt = _optimiser(optimizer, list(leaves.values()), lr, momentum, weight_decay)
    loss = loss_fn(leaves)
    if not torch.isfinite(loss):
        raise ValueError("the objective is not finite at params")
    loss.backward()
    opt.step()
    return {k: v.detach() for k, v in leaves.items()}


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


def paired_steps(features: Features, params: Params, symmetries, x: torch.Tensor, y: torch.Tensor,
                 probe: torch.Tensor, *, objective, alpha: float, lr: float, sign: float = 1.0,
                 optimizer: str = "sgd", momentum: float = 0.0, weight: str = "classifier.weight",
                 tol: float = 1e-10) -> list[PairedStep]:
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
            out.append(PairedStep(name, float(alpha), audit.max_output_discrepancy, float((p1 - q1).abs().max()),
                                  float((p1.argmax(-1) != q1.argmax(-1)).double().mean()), float((p1 - p0).abs().max())))
    return out


def paired_step(features: Features, params: Params, symmetry: Symmetry, x: torch.Tensor, y: torch.Tensor,
                probe: torch.Tensor, **kwargs) -> PairedStep:
    """:func:`paired_steps` for one symmetry: audit the pair, step both, compare probabilities."""
    if not isinstance(symmetry, Symmetry):
        raise TypeError(f"symmetry must be a lossgeom Symmetry, got {type(symmetry).__name__}")
    return paired_steps(features, params, [symmetry], x, y, probe, **kwargs)[0]


def mean_score(features: Features, params: Params, x: torch.Tensor, weight: str = "classifier.weight") -> torch.Tensor:
    """``s = mean_i ||h_i||^2 (1 - ||p_i||^2)``, so that ``B_raw = ||W||_F^2 s``."""
    z, h = logits_and_features(features, params, x, weight)
    p = torch.softmax(z, dim=-1)
    return ((h**2).sum(-1) * (1 - (p**2).sum(-1))).mean()


def train(features: Features, params: Params, x: torch.Tensor, y: torch.Tensor, *, objective: str, alpha: float,
          steps: int, lr: float, sign: float = 1.0, weight_decay: float = 0.0, centred_cap: float | None = None,
          weight: str = "classifier.weight", record: Callable[[int, dict[str, torch.Tensor]], dict] | None = None, record_every: int = 0
          ) -> tuple[dict[str, torch.Tensor], dict]:
    """Full-batch plain SGD (coupled L2 ``weight_decay``) on ``CE + sign * alpha * S``.

    Every step records the mean row ``wbar_t`` of ``W`` and ``s_t`` (:func:`mean_score`)
    at the point where the gradient is taken, so the per-step factor
    ``wbar_{t+1} = (1 - eta lambda - 2 sign eta alpha s_t) wbar_t`` of the raw objective
    can be checked. ``centred_cap`` (if given) projects after every step onto
    ``||W_c||_F <= centred_cap``, rescaling the centred part and leaving ``wbar`` alone:
    a cap on the function-relevant part of ``W`` that leaves the common row unconstrained.
    ``record(step, params)`` is called every ``record_every`` steps and
    at the end. A run whose loss stops being finite ends early with ``diverged_at`` set.

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
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    opt = _optimiser("sgd", list(leaves.values()), positive("lr", lr), 0.0, as_real("weight_decay", weight_decay))
    mean_rows, scores, records, diverged = [leaves[weight].detach().mean(0).clone()], [], [], None
    for step in range(steps):
        if record is not None and record_every and step % record_every == 0:
            records.append(record(step, {k: v.detach() for k, v in leaves.items()}))
        opt.zero_grad()
        z, h = logits_and_features(features, leaves, x, weight)
        loss = torch.nn.functional.cross_entropy(z, y)
        if proxy is not None and alpha != 0 and torch.isfinite(z).all():
            loss = loss + sign * alpha * proxy(leaves[weight], h)
        if not (torch.isfinite(loss) and torch.isfinite(z).all()):
            diverged = step
            break
        loss.backward()
        with torch.no_grad():
            p = torch.softmax(z, dim=-1)
            scores.append(float(((h**2).sum(-1) * (1 - (p**2).sum(-1))).mean()))
        opt.step()
        if centred_cap is not None:
            with torch.no_grad():
                W = leaves[weight]
                mean = W.mean(0, keepdim=True)
                norm = float((W - mean).norm())
                if norm > centred_cap:
                    W.copy_((W - mean) * (centred_cap / norm) + mean)
        mean_rows.append(leaves[weight].detach().mean(0).clone())
    final = {k: v.detach().clone() for k, v in leaves.items()}
    if record is not None and diverged is None:
        records.append(record(steps, final))
    return final, {"mean_row": torch.stack(mean_rows), "s": torch.tensor(scores), "records": records,
                   "diverged_at": diverged}

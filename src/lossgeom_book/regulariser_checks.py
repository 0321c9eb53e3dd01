"""The checks of Chapter *Regularisers as interventions* built on :mod:`lossgeom_book.regularisers`.

The identification checklist of a softmax gauge pair (and its report), the velocity gap of
a score between two representatives, the gradient-gap ratio and its calibration, the paired
one-step test, the raw-ratio fix and the comparison of a temporal null's two runs, the
runaway factor, training with a regulariser and then removing it, and the velocity minor of
the exact derivation.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from lossgeom import flatness
from lossgeom.flatness import softmax_gauge as softmax
from lossgeom.formatting import fmt, rounding_level
from lossgeom.types import Params
from lossgeom_book import tasks
from lossgeom_book.checks import as_real, finite_tensor, positive, positive_int
from lossgeom_book.data import Split
from lossgeom_book.regularisers import (
    PROXIES,
    Features,
    _check_data,
    _check_params,
    _check_sign,
    functional_velocity,
    logits_and_features,
    paired_steps,
    shift_for_ratio,
    train,
    twin_at_ratio,
)


def identification_checklist(W: torch.Tensor, h: torch.Tensor, v: torch.Tensor) -> dict[str, dict[str, float]]:
    """Seed 004's three requirements, measured for ``B_raw``, ``B_quot`` and ``kappa_exact``.

    At the classifier ``W`` on features ``h`` and its twin ``W + 1 v^T`` (one predictor):

    - ``slack = (S(W) - kappa_exact(W)) / S(W)``: approximation validity asks ``>= 0``;
    - ``value_gap = |S(W + 1 v^T) - S(W)| / S(W)``: value identification asks 0;
    - ``velocity_gap = ||V_S(W + 1 v^T) - V_S(W)|| / ||V_S(W)||`` with ``F = softmax(W h)``
      (:func:`functional_velocity`): interventional identification asks 0.

    Returns:
        ``{"raw" | "quot" | "exact": {"slack", "value_gap", "velocity_gap"}}`` as floats.
    """
    W = finite_tensor("W", W)
    twin = softmax.common_row_shift(W, v)
    F = lambda q: softmax.probabilities(q["W"], h)
    kappa = float(flatness.kappa_exact(W, h))
    out = {}
    for name in ("raw", "quot", "exact"):
        proxy = PROXIES[name]
        score = lambda q, proxy=proxy: proxy(q["W"], h)
        value, value_twin = float(proxy(W, h)), float(proxy(twin, h))
        velocity = functional_velocity(F, score, {"W": W})
        velocity_twin = functional_velocity(F, score, {"W": twin})
        out[name] = {
            "slack": (value - kappa) / value,
            "value_gap": abs(value_twin - value) / value,
            "velocity_gap": float((velocity_twin - velocity).norm() / velocity.norm()),
        }
    return out


def checklist_report(checklist: dict[str, dict[str, float]], floor: float = 1e-12) -> str:
    """One line per score of an :func:`identification_checklist`: is each requirement met, and by how much.

    Approximation validity is met when the slack is ``>= 0`` (the slack at 3 digits); an
    identification requirement when its gap is below ``floor``, reported by its order
    (:func:`lossgeom.formatting.rounding_level`), otherwise the gap at 3 digits.
    """
    floor = positive("floor", floor)

    def passes(gap: float) -> str:
        return f"yes, gap {rounding_level(gap, floor)}" if gap < floor else f"no, gap {fmt(gap, 3)}"

    lines = []
    for name, c in checklist.items():
        validity = f"{'yes' if c['slack'] >= 0 else 'no'}, slack {fmt(c['slack'], 3)}"
        lines.append(
            f"{name:5s}: validity {validity} | value identification {passes(c['value_gap'])} | "
            f"interventional identification {passes(c['velocity_gap'])}"
        )
    return "\n".join(lines)


def velocity_gap(
    score: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], W: torch.Tensor, h: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    """``V_S(W + 1 v^T) - V_S(W)``: how differently a score moves two representatives of one predictor.

    ``V_S`` is the :func:`functional_velocity` of ``S(W) = score(W, h)`` on the outputs
    ``F(W) = softmax(W h)``; for ``score = B_raw`` it is ``-2 Delta_v ||h||^4 P(p)^2 p``
    (seed 004, Prop. 5), for the gauge-invariant scores zero.
    """
    if not callable(score):
        raise TypeError("score must be callable as score(W, h), for example lossgeom.flatness.b_raw")
    W = finite_tensor("W", W)
    F = lambda q: softmax.probabilities(q["W"], h)
    S = lambda q: score(q["W"], h)
    return functional_velocity(F, S, {"W": softmax.common_row_shift(W, v)}) - functional_velocity(F, S, {"W": W})


def gradient_gap_ratio(score_fn: Callable[[Params], torch.Tensor], params: Params, twin: Params) -> float:
    """``||grad S(twin) - grad S(params)|| / ||grad S(params)||`` over every parameter.

    Seed 004's Fig. 2b: for ``S = B_raw`` and a twin whose ``B_raw`` is ``r`` times the
    centred value, the non-classifier gradient is scaled by ``r`` exactly, so the ratio is
    about ``r - 1``; for the invariant proxies it is zero in exact arithmetic.
    """
    if set(params) != set(twin):
        raise ValueError("twin must have the same parameter names as params")
    grad, grad_twin = torch.func.grad(score_fn)(dict(params)), torch.func.grad(score_fn)(dict(twin))
    norm = math.sqrt(sum(float((g**2).sum()) for g in grad.values()))
    if norm == 0:
        raise ValueError("the gradient of score_fn vanishes at params: the ratio is undefined")
    gap = math.sqrt(sum(float(((grad_twin[k] - grad[k]) ** 2).sum()) for k in grad))
    return gap / norm


def gradient_gap_at_ratio(
    score_fn: Callable[[Params], torch.Tensor],
    params: Params,
    ratio: float,
    direction: torch.Tensor | None = None,
    weight: str = "classifier.weight",
) -> float:
    """:func:`gradient_gap_ratio` between the centred ``params`` and their ``ratio``-fold twin.

    The classifier ``W = params[weight]`` is replaced by its centred ``W_c`` and by the twin
    ``W_c + 1 v^T`` of :func:`lossgeom_book.regularisers.twin_at_ratio` (``v`` along
    ``direction``, by default the all-ones vector), whose ``B_raw`` is ``ratio`` times the
    centred value; the other parameters are shared.
    """
    params = _check_params(params, weight)
    W = params[weight]
    direction = torch.ones(W.shape[1], dtype=W.dtype) if direction is None else direction
    centred = {**params, weight: softmax.centre(W)}
    twin = {**params, weight: twin_at_ratio(W, ratio, direction)}
    return gradient_gap_ratio(score_fn, centred, twin)


def calibrate_alpha(
    features: Features,
    params: Params,
    x: torch.Tensor,
    y: torch.Tensor,
    fraction: float,
    weight: str = "classifier.weight",
) -> float:
    """The ``alpha`` with ``alpha * B_quot = fraction * CE`` at ``params`` (seed 004 calibrates once)."""
    fraction = positive("fraction", fraction)
    with torch.no_grad():
        z, h = logits_and_features(features, params, x, weight)
        ce = float(torch.nn.functional.cross_entropy(z, y))
        return fraction * ce / float(flatness.b_quot(params[weight], h))


def paired_one_step_test(
    features: Features,
    params: Params,
    x: torch.Tensor,
    y: torch.Tensor,
    probe: torch.Tensor,
    *,
    ratios: Sequence[float] = (10.0, 100.0),
    n_directions: int = 2,
    seed: int = 0,
    fraction: float = 0.1,
    lr: float = 0.1,
    objectives: Sequence[str] = ("raw", "quot", "exact", "ce"),
    weight: str = "classifier.weight",
) -> list[dict]:
    """Seed 004's paired one-step test at one checkpoint.

    The classifier is centred (a function-preserving move); each twin adds a common row
    ``1 v^T`` sized by :func:`shift_for_ratio` so that ``B_raw(twin) = ratio * B_raw(W_c)``
    on the training features, along ``n_directions`` seeded Gaussian directions per ratio.
    ``alpha`` is calibrated once at the centred model (:func:`calibrate_alpha`) and reused
    at every twin; every model then takes one plain SGD step on each objective
    (:func:`paired_steps`, which first audits each pair on the probe).

    Returns:
        list[dict]: one dict per twin, with ``ratio``, ``raw_ratio`` (measured ``B_raw(twin) / B_raw(W_c)``),
        ``quot_change`` and ``exact_change`` (relative changes of ``B_quot``, ``kappa_exact``),
        ``quot_over_exact`` (``B_quot / kappa_exact`` at the checkpoint),
        ``before`` (largest probability gap before the step), ``alpha``, and for each
        objective its gap after the step and ``<objective>_disagree`` (fraction of probe
        predictions that differ).
    """
    params = _check_params(params, weight)
    n_directions = positive_int("n_directions", n_directions)
    x, y = _check_data(x, y)
    centred = {**params, weight: softmax.centre(params[weight])}
    W_c = centred[weight]
    with torch.no_grad():
        h = features(centred, x)
        base = {k: float(PROXIES[k](W_c, h)) for k in ("raw", "quot", "exact")}
    gen = torch.Generator().manual_seed(int(seed))
    rows, symmetries = [], []
    for ratio in ratios:
        for _ in range(n_directions):
            v = shift_for_ratio(W_c, ratio, torch.randn(W_c.shape[1], generator=gen, dtype=W_c.dtype))
            twin = softmax.common_row_shift(W_c, v)
            with torch.no_grad():
                measured = {k: float(PROXIES[k](twin, h)) for k in base}
            rows.append(
                {
                    "ratio": float(ratio),
                    "raw_ratio": measured["raw"] / base["raw"],
                    "quot_over_exact": base["quot"] / base["exact"],
                    "quot_change": abs(measured["quot"] / base["quot"] - 1),
                    "exact_change": abs(measured["exact"] / base["exact"] - 1),
                }
            )
            symmetries.append(softmax.row_shift_symmetry(v, weight))
    alpha = calibrate_alpha(features, centred, x, y, fraction, weight)
    results = paired_steps(
        features, centred, symmetries, x, y, probe, objective=tuple(objectives), alpha=alpha, lr=lr, weight=weight
    )
    for k, res in enumerate(results):
        row = rows[k % len(rows)]
        row.update(
            {
                res.objective: res.gap_after,
                res.objective + "_disagree": res.disagreement,
                "before": res.gap_before,
                "alpha": alpha,
            }
        )
    return rows


def paired_test_on_model(model: nn.Module, split: Split, params: Params, **kwargs) -> list[dict]:
    """:func:`paired_one_step_test` for a :mod:`lossgeom_book.tasks` model at ``params``.

    The features are the classifier's inputs (:func:`lossgeom_book.tasks.features`), the
    step is taken on ``split``'s training set and the pairs are compared on its test inputs;
    ``kwargs`` go to :func:`paired_one_step_test` (``seed``, ``ratios``, ``objectives``, ...).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    features = functools.partial(tasks.features, model)
    return paired_one_step_test(features, params, split.x_train, split.y_train, split.x_test, **kwargs)


def fix_raw_ratio(
    ratio: float, direction: torch.Tensor, weight: str = "classifier.weight"
) -> Callable[[Params], dict[str, torch.Tensor]]:
    """A projection that resets only the function-null coordinate: ``W -> W_c + 1 v^T``.

    ``v`` lies along ``direction`` and is sized so that ``||W_c + 1 v^T||_F^2 = ratio
    ||W_c||_F^2`` (``ratio = 1``: the centred ``W_c``), hence ``B_raw = ratio * B_quot`` on
    every feature while probabilities, ``B_quot`` and ``kappa_exact`` are untouched.
    Seed 004's temporal null applies it after every step of a training run
    (``lossgeom_book.tasks.fit(..., project=...)``).
    """
    ratio = as_real("ratio", ratio)
    if ratio < 1:
        raise ValueError(f"ratio must be >= 1 (the centred W is the orbit's minimum), got {ratio}")
    direction = finite_tensor("direction", direction)

    def project(params: Params) -> dict[str, torch.Tensor]:
        W = params[weight]
        if ratio == 1:
            return {**params, weight: softmax.centre(W)}
        return {**params, weight: twin_at_ratio(W, ratio, direction)}

    return project


def compare_null_runs(
    model: nn.Module,
    split: Split,
    control: tasks.FitResult,
    twin: tasks.FitResult,
    *,
    onset_level: float = 0.1,
    weight: str = "classifier.weight",
) -> dict:
    """Compare the two runs of a temporal null: one predictor trained twice, a function-null coordinate apart.

    ``control`` and ``twin`` are :func:`lossgeom_book.tasks.fit` results of the same seeded
    ``model`` with checkpoints at the same steps, run with :func:`fix_raw_ratio` at two ratios.

    Returns:
        ``onsets``: ``[control, twin]``, the first checkpoint at which each run's test accuracy
        reaches ``onset_level`` (:func:`lossgeom_book.tasks.onset_step`, None if never);
        ``memorised``: the first checkpoint at which the control's training accuracy is 1;
        ``gaps``: the largest test-probability difference between the runs at each checkpoint;
        ``raw_ratio``: ``B_raw`` of the twin over the control's at the last checkpoint, both on
        the twin's training features.
    """
    if [s for s, _ in control.snapshots] != [s for s, _ in twin.snapshots] or not control.snapshots:
        raise ValueError("control and twin must hold checkpoints at the same, non-empty list of steps")
    curves = [tasks.accuracy_curve(model, f, split.x_test, split.y_test) for f in (control, twin)]
    onsets = [tasks.onset_step(curve, onset_level) for curve in curves]
    memorised = tasks.onset_step(tasks.accuracy_curve(model, control, split.x_train, split.y_train), 1.0)

    def probabilities(fit: tasks.FitResult) -> list[torch.Tensor]:
        return [torch.softmax(torch.func.functional_call(model, q, (split.x_test,)), -1) for _, q in fit.snapshots]

    gaps = [float((a - b).abs().max()) for a, b in zip(probabilities(control), probabilities(twin), strict=True)]
    h = tasks.features(model, twin.snapshots[-1][1], split.x_train)
    raw = [float(flatness.b_raw(f.snapshots[-1][1][weight], h)) for f in (control, twin)]
    return {"onsets": onsets, "memorised": memorised, "gaps": gaps, "raw_ratio": raw[1] / raw[0]}


def runaway_factor_deviation(
    history: dict, lr: float, alpha: float, sign: float = -1.0, weight_decay: float = 0.0
) -> float:
    """Largest relative deviation of a :func:`lossgeom_book.regularisers.train` history from the mean-row recursion.

    ``wbar_{t+1} = (1 - eta lambda - 2 sign eta alpha s_t) wbar_t`` for the raw objective
    (seed 004, Eq. 20; ``sign = -1`` is the sharpness-raising ascent). Returns
    ``max_t ||wbar_{t+1} - factor_t wbar_t|| / ||wbar_{t+1}||``.
    """
    wbar, s = history["mean_row"], history["s"]
    if wbar.shape[0] != s.shape[0] + 1:
        raise ValueError("history must hold one more mean row than scores (a train() history)")
    factor = 1 - lr * weight_decay - 2 * _check_sign(sign) * lr * as_real("alpha", alpha) * s
    predicted = factor[:, None] * wbar[:-1]
    return float(((wbar[1:] - predicted).norm(dim=1) / wbar[1:].norm(dim=1)).max())


def train_then_remove(
    features: Features,
    params: Params,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    objective: str,
    alpha: float,
    steps_on: int,
    steps_off: int,
    lr: float,
    sign: float = -1.0,
    centred_cap: float | None = None,
    record: Callable | None = None,
    record_every: int = 0,
    weight: str = "classifier.weight",
) -> dict:
    """Train on ``CE + sign * alpha * S`` for ``steps_on`` steps, then on CE alone for ``steps_off``.

    Both phases use :func:`lossgeom_book.regularisers.train` with the same step size and cap. A run that overflows
    while the regulariser is on has no second phase.

    Returns:
        ``on`` and ``off``: the ``record`` values of each phase (``off`` empty after an
        overflow); ``history``: the first phase's :func:`lossgeom_book.regularisers.train` history;
        ``common_row_norm``: ``sqrt(K) ||wbar_t||`` at every step of the first phase;
        ``diverged_at``: the step of an overflow, or None.
    """
    steps_off = int(steps_off)
    if steps_off < 0:
        raise ValueError(f"steps_off must be >= 0, got {steps_off}")
    common = dict(lr=lr, centred_cap=centred_cap, record=record, record_every=record_every, weight=weight)
    mid, on = train(features, params, x, y, objective=objective, alpha=alpha, sign=sign, steps=steps_on, **common)
    K = params[weight].shape[0]
    out = {
        "on": on["records"],
        "off": [],
        "history": on,
        "diverged_at": on["diverged_at"],
        "common_row_norm": on["mean_row"].norm(dim=1) * math.sqrt(K),
    }
    if on["diverged_at"] is None and steps_off > 0:
        _, off = train(features, mid, x, y, objective="ce", alpha=0.0, steps=steps_off, **common)
        out["off"] = off["records"]
    return out


def velocity_minor(p) -> np.ndarray:
    """First-two-rows minor of ``[P(p) log p, P(p)^2 p]`` for probability vectors ``p``.

    For one fixed feature the raw proxy's velocity is ``A + c B`` with ``A`` along
    ``P(p) log p`` and ``B`` along ``P(p)^2 p`` (seed 004, Corollary 3); a nonzero minor
    makes them independent, so no scalar retuning aligns two representatives.

    Args:
        p: array of shape (K,) or (n, K), K >= 2, strictly positive rows summing to one.

    Returns:
        The minor ``A_1 B_2 - A_2 B_1`` (shape () or (n,)).
    """
    p = np.asarray(p, dtype=np.float64)
    if p.ndim not in (1, 2) or p.shape[-1] < 2:
        raise ValueError(f"p must have shape (K,) or (n, K) with K >= 2, got {p.shape}")
    if not np.all(np.isfinite(p)) or np.any(p <= 0) or not np.allclose(p.sum(-1), 1.0, atol=1e-12):
        raise ValueError("p must hold strictly positive probabilities that sum to one")
    P = p[..., :, None] * np.eye(p.shape[-1]) - p[..., :, None] * p[..., None, :]
    A = np.einsum("...ij,...j->...i", P, np.log(p))
    B = np.einsum("...ij,...jk,...k->...i", P, P, p)
    return A[..., 0] * B[..., 1] - A[..., 1] * B[..., 0]

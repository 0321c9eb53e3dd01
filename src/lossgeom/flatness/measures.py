r"""Flatness and sharpness measures of a model, each ``f(model, loss, data, *, params=None, group=None, ...)``.

Each measure takes a ``torch.nn.Module``, a loss module with mean reduction (called for every
value and derivative: see :class:`~lossgeom.flatness.loss_point.LossPoint`) and data (an ``(x, y)``
pair or an iterable of batches), evaluates the model in its own dtype at its own parameters (or at ``params``) and
returns a Python float: :func:`hessian_trace`, :func:`keskar_sharpness`,
:func:`sam_sharpness`, :func:`adaptive_sharpness`, :func:`fisher_rao_norm`,
:func:`relative_flatness`, :func:`classifier_kappa_exact`, :func:`classifier_b_raw`,
:func:`classifier_b_quot`, :func:`model_quotient_flatness`, :func:`riemannian_sharpness` and
:func:`model_wolkowicz_styan_bound`; the largest Hessian eigenvalue is
:func:`lossgeom.curvature.lambda_max`. A measure that is not defined for the model or loss
at hand raises :class:`~lossgeom.flatness.loss_point.NotApplicable`.

``group=`` (a ``torch.distributed`` process group whose ranks each hold a shard of the
data) reaches the measures computed from Hessian-vector products, :func:`hessian_trace` and
:func:`lossgeom.curvature.lambda_max`; the others need every example on one process and
refuse a group with a ``ValueError``.

:func:`measure_at` evaluates any of them at a stored
:class:`~lossgeom.flatness.loss_point.LossPoint`, which keeps the dense Hessian and Fisher
that several measures share, so that they are formed once per point.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from torch import nn

from lossgeom._validation import positive_int
from lossgeom.curvature import hessian_operator, hutchpp_trace, lambda_max
from lossgeom.flatness.at_point import (
    MAX_DENSE,
    _adaptive_sharpness_at,
    _classifier_b_quot_at,
    _classifier_b_raw_at,
    _classifier_kappa_exact_at,
    _dense_check,
    _fisher_rao_norm_at,
    _hessian_trace_at,
    _keskar_sharpness_at,
    _lambda_max_at,
    _model_quotient_flatness_at,
    _model_wolkowicz_styan_bound_at,
    _point,
    _relative_flatness_at,
    _riemannian_sharpness_at,
    _sam_sharpness_at,
)
from lossgeom.flatness.loss_point import LossPoint
from lossgeom.outputs import _output_model
from lossgeom.types import Data, Group, Output, Params


def hessian_trace(
    model: nn.Module,
    loss: nn.Module,
    data: Data,
    *,
    params: Params | None = None,
    group: Group = None,
    output: Output = None,
    method: str = "hutchpp",
    n_probes: int = 99,
    seed: int = 0,
    max_dense: int = MAX_DENSE,
) -> float:
    r""":math:`\operatorname{tr} H`: the trace of the loss Hessian (the expected loss increase under isotropic noise).

    ``method="hutchpp"`` (default) estimates it matrix-free from ``n_probes`` Hessian-vector
    products with Hutch++ (:func:`lossgeom.curvature.hutchpp_trace`, Meyer et al. 2021);
    ``method="exact"`` sums the diagonal of the dense Hessian, formed from :math:`n`
    products and :math:`n^2` numbers of memory.

    A linear model :math:`w^\top x` on the mean squared error over the three inputs
    :math:`x_i = a_i e_i` has :math:`H = \tfrac23 \operatorname{diag}(a_i^2)`; with
    :math:`a_i^2 = \tfrac32 (1, 2, 3)` that is :math:`\operatorname{diag}(1, 2, 3)`, of trace
    6, and Hutch++ is exact once its sketch spans the rank-3 range:

    >>> import torch
    >>> from torch import nn
    >>> from lossgeom.flatness import hessian_trace
    >>> model = nn.Linear(3, 1, bias=False, dtype=torch.float64)
    >>> x = torch.diag(torch.tensor([1.5, 3.0, 4.5], dtype=torch.float64).sqrt())
    >>> y = torch.zeros(3, 1, dtype=torch.float64)
    >>> round(hessian_trace(model, nn.MSELoss(), (x, y), method="exact"), 10)
    6.0
    >>> round(hessian_trace(model, nn.MSELoss(), (x, y), n_probes=12), 10)
    6.0

    Args:
        model: the network (a ``torch.nn.Module``).
        loss: the loss module, mean reduction (called for every value and derivative; see :mod:`lossgeom.losses`).
        data: one batch or an iterable of batches (see :mod:`lossgeom.batches`), taken as one batch.
        params: the point (``None``: the model's own trainable parameters).
        group: a ``torch.distributed`` process group (``data`` is then this rank's shard;
            every rank returns the same value), or ``None`` for one process.
        output: selects the tensor of outputs from what ``model`` returns (see :class:`LossPoint`).
        method: ``"hutchpp"`` (matrix-free estimate) or ``"exact"`` (dense Hessian).
        n_probes: the product budget of Hutch++ (``method="hutchpp"`` only).
        seed: the seed of the Hutch++ probes (``method="hutchpp"`` only).
        max_dense: the largest parameter count for ``method="exact"``.

    Returns:
        :math:`\operatorname{tr} H` (estimated or exact), a float.

    Raises:
        ValueError: if ``method`` is neither ``"hutchpp"`` nor ``"exact"``.
        NotApplicable: for ``method="exact"`` with more than ``max_dense`` parameters.
    """
    if method not in ("hutchpp", "exact"):
        raise ValueError(f"method must be 'hutchpp' or 'exact', got {method!r}")
    operator = hessian_operator(_output_model(model, output), loss, data, params=params, group=group)
    if method == "hutchpp":
        return float(hutchpp_trace(operator, n_probes=n_probes, seed=seed).estimate)
    _dense_check("hessian_trace", operator.shape[0], positive_int("max_dense", max_dense))
    return float(np.trace(operator.dense()))


def keskar_sharpness(
    model: nn.Module,
    loss: nn.Module,
    data: Data,
    *,
    params: Params | None = None,
    group: Group = None,
    output: Output = None,
    epsilon: float = 1e-3,
    max_iter: int = 20,
) -> float:
    r"""Keskar et al.'s (2017) :math:`\epsilon`-sharpness, in percent, over a box that grows with :math:`|\theta_i|`.

    :math:`100\,(\max_{z \in C} L(\theta + z) - L(\theta)) / (1 + L(\theta))` with
    :math:`C = \{z : |z_i| \le \epsilon(|\theta_i| + 1)\}` in the full parameter space (their
    :math:`A = I`); the maximum is sought as they do, by L-BFGS-B
    (``scipy.optimize.minimize``) from :math:`z = 0` for at most ``max_iter`` iterations, so
    the value is a lower bound on the true maximum. The box grows with :math:`|\theta_i|`,
    so a rescaling that preserves the function changes the set searched.

    Args:
        model: the network (a ``torch.nn.Module``).
        loss: the loss module, mean reduction (called for every value and derivative; see :mod:`lossgeom.losses`).
        data: one batch or an iterable of batches (see :mod:`lossgeom.batches`), taken as one batch.
        params: the point (``None``: the model's own trainable parameters).
        group: must be ``None`` (the search needs every example on one process).
        output: selects the tensor of outputs from what ``model`` returns (see :class:`LossPoint`).
        epsilon: the relative half-width of the box (positive).
        max_iter: the most L-BFGS-B iterations (a positive integer).

    Returns:
        the :math:`\epsilon`-sharpness in percent (:math:`\ge 0`), a float.
    """
    point = _point("keskar_sharpness", model, loss, data, params, group, output)
    return _keskar_sharpness_at(point, epsilon=epsilon, max_iter=max_iter)


def sam_sharpness(
    model: nn.Module,
    loss: nn.Module,
    data: Data,
    *,
    params: Params | None = None,
    group: Group = None,
    output: Output = None,
    rho: float = 0.05,
) -> float:
    r"""SAM sharpness (Foret et al. 2021): :math:`L(\theta + \rho g / \lVert g \rVert) - L(\theta)`, :math:`g=\nabla L`.

    The first-order solution of :math:`\max_{\lVert e \rVert_2 \le \rho} L(\theta + e) - L(\theta)`,
    the quantity sharpness-aware minimisation adds to the loss; zero where the gradient
    vanishes.

    Args:
        model: the network (a ``torch.nn.Module``).
        loss: the loss module, mean reduction (called for every value and derivative; see :mod:`lossgeom.losses`).
        data: one batch or an iterable of batches (see :mod:`lossgeom.batches`), taken as one batch.
        params: the point (``None``: the model's own trainable parameters).
        group: must be ``None`` (every example on one process).
        output: selects the tensor of outputs from what ``model`` returns (see :class:`LossPoint`).
        rho: the radius of the Euclidean ball (positive).

    Returns:
        :math:`L(\theta + \rho g / \lVert g \rVert) - L(\theta)`, a float (0.0 where :math:`g = 0`).
    """
    return _sam_sharpness_at(_point("sam_sharpness", model, loss, data, params, group, output), rho=rho)


def adaptive_sharpness(
    model: nn.Module,
    loss: nn.Module,
    data: Data,
    *,
    params: Params | None = None,
    group: Group = None,
    output: Output = None,
    rho: float = 0.5,
    eta: float = 0.01,
) -> float:
    r"""ASAM's adaptive sharpness (Kwon et al. 2021): :math:`L(\theta + \rho T^2 g / \lVert T g \rVert) - L(\theta)`.

    The first-order solution of :math:`\max_{\lVert T^{-1} e \rVert_2 \le \rho} L(\theta + e) - L(\theta)`
    with the element-wise normalisation :math:`T = \operatorname{diag}(|w| + \eta)` on weight
    parameters and :math:`T = 1` on biases and other parameters, as in the authors'
    implementation (which reads parameter names, so normalisation gains named ``weight``
    are normalised too). With :math:`\eta = 0` and no bias the ball moves with a per-neuron
    rescaling and the value is invariant under it; :math:`\eta > 0` and unnormalised biases
    make the invariance approximate.

    Args:
        model: the network (a ``torch.nn.Module``).
        loss: the loss module, mean reduction (called for every value and derivative; see :mod:`lossgeom.losses`).
        data: one batch or an iterable of batches (see :mod:`lossgeom.batches`), taken as one batch.
        params: the point (``None``: the model's own trainable parameters).
        group: must be ``None`` (every example on one process).
        output: selects the tensor of outputs from what ``model`` returns (see :class:`LossPoint`).
        rho: the radius of the normalised ball (positive).
        eta: the offset of the normalisation :math:`|w| + \eta` (finite, :math:`\ge 0`).

    Returns:
        :math:`L(\theta + e) - L(\theta)`, a float (0.0 where :math:`T g = 0`).

    Raises:
        ValueError: if ``eta`` is negative or not finite.
    """
    point = _point("adaptive_sharpness", model, loss, data, params, group, output)
    return _adaptive_sharpness_at(point, rho=rho, eta=eta)


def fisher_rao_norm(
    model: nn.Module,
    loss: nn.Module,
    data: Data,
    *,
    params: Params | None = None,
    group: Group = None,
    output: Output = None,
) -> float:
    r"""The Fisher-Rao norm (Liang et al. 2019): :math:`\sqrt{\langle \theta, I(\theta)\,\theta \rangle}`.

    With the empirical Fisher :math:`I = \frac1N \sum_i g_i g_i^\top` (:math:`g_i` the gradient
    of example :math:`i`'s loss), :math:`\langle \theta, I \theta \rangle = \frac1N \sum_i
    \langle \theta, g_i \rangle^2`; the directional derivatives :math:`\langle \theta, g_i
    \rangle` come from one checked product of :func:`lossgeom.curvature.fisher_operator`. A
    linear change of coordinates :math:`\theta = D \psi` that keeps the function keeps every
    :math:`\langle \theta, g_i \rangle`, so the norm is invariant under rescalings and
    permutations; a common-row shift adds a direction the per-example gradients are
    orthogonal to.

    Args:
        model: the network (a ``torch.nn.Module``).
        loss: the loss module, mean reduction (called for every value and derivative; see :mod:`lossgeom.losses`).
        data: one batch or an iterable of batches (see :mod:`lossgeom.batches`), taken as one batch.
        params: the point (``None``: the model's own trainable parameters).
        group: must be ``None`` (every example on one process).
        output: selects the tensor of outputs from what ``model`` returns (see :class:`LossPoint`).

    Returns:
        :math:`\sqrt{\frac1N \sum_i \langle \theta, g_i \rangle^2}`, a float.

    Raises:
        NotApplicable: for a loss that is not a likelihood :func:`lossgeom.losses.likelihood` knows.
    """
    return _fisher_rao_norm_at(_point("fisher_rao_norm", model, loss, data, params, group, output))


def relative_flatness(
    model: nn.Module,
    loss: nn.Module,
    data: Data,
    *,
    params: Params | None = None,
    group: Group = None,
    output: Output = None,
    layer: str | None = None,
    max_dense: int = MAX_DENSE,
) -> float:
    r"""Relative flatness of one layer (Petzka et al. 2021), invariant under rescaling its units.

    :math:`\kappa = \sum_{s,s'} \langle w_s, w_{s'} \rangle \operatorname{tr} H_{s,s'}`.

    :math:`w_s` is row :math:`s` of the layer's weight (the weights into unit or channel
    :math:`s`, flattened for a convolution) and :math:`H_{s,s'}` the Hessian block of the
    loss between rows :math:`s` and :math:`s'`. Rescaling the layer's units (rows) by
    :math:`c_s` multiplies :math:`\langle w_s, w_{s'} \rangle` by :math:`c_s c_{s'}` and
    divides :math:`H_{s,s'}` by it, so the value is kept; for the last layer of a softmax
    classifier it is :func:`classifier_kappa_exact`.

    Args:
        model: the network (a ``torch.nn.Module``).
        loss: the loss module, mean reduction (called for every value and derivative; see :mod:`lossgeom.losses`).
        data: one batch or an iterable of batches (see :mod:`lossgeom.batches`), taken as one batch.
        params: the point (``None``: the model's own trainable parameters).
        group: must be ``None`` (the dense Hessian is formed on one process).
        output: selects the tensor of outputs from what ``model`` returns (see :class:`LossPoint`).
        layer: the layer's name prefix (``"0"`` for ``model[0]``); default the first
            parameter named ``*weight`` with two or more dimensions.
        max_dense: the largest parameter count for which the dense Hessian is formed.

    Returns:
        :math:`\sum_{s,s'} \langle w_s, w_{s'} \rangle \operatorname{tr} H_{s,s'}`, a float.

    Raises:
        ValueError: if ``layer`` has no weight matrix of two or more dimensions.
        NotApplicable: if ``layer`` is None and the model has no such weight, or the model has
            more than ``max_dense`` parameters.
    """
    point = _point("relative_flatness", model, loss, data, params, group, output, max_dense)
    return _relative_flatness_at(point, layer=layer)


def classifier_kappa_exact(
    model: nn.Module,
    loss: nn.Module,
    data: Data,
    *,
    params: Params | None = None,
    group: Group = None,
    output: Output = None,
) -> float:
    r"""The last layer's relative flatness :math:`\kappa_{\rm exact}` (Petzka et al. 2021).

    :math:`\kappa_{\rm exact} = \frac1N \sum_i \lVert h_i \rVert^2 \operatorname{tr}(W^\top P(p_i) W)`.

    :func:`~lossgeom.flatness.kappa_exact` at the classifier and features of
    :meth:`LossPoint.classifier` (a bias joins :math:`W` as a column, :math:`h` gains a 1),
    with :math:`P(p) = \operatorname{diag}(p) - p p^\top` the softmax covariance.

    Args:
        model: the network (a ``torch.nn.Module``).
        loss: ``nn.CrossEntropyLoss()``, mean reduction.
        data: one batch or an iterable of batches (see :mod:`lossgeom.batches`), taken as one batch.
        params: the point (``None``: the model's own trainable parameters).
        group: must be ``None`` (every example on one process).
        output: selects the tensor of outputs from what ``model`` returns (see :class:`LossPoint`).

    Returns:
        :math:`\kappa_{\rm exact}` of the last layer, a float.

    Raises:
        NotApplicable: if the loss is not a softmax cross-entropy or the outputs are not an
            ``nn.Linear`` layer's output.
    """
    return _classifier_kappa_exact_at(_point("classifier_kappa_exact", model, loss, data, params, group, output))


def classifier_b_raw(
    model: nn.Module,
    loss: nn.Module,
    data: Data,
    *,
    params: Params | None = None,
    group: Group = None,
    output: Output = None,
) -> float:
    r"""The last layer's bound :math:`B_{\rm raw} \ge \kappa_{\rm exact}`.

    :math:`B_{\rm raw} = \lVert W \rVert_F^2 \frac1N \sum_i \lVert h_i \rVert^2 (1 - \lVert p_i \rVert^2)`.

    :func:`~lossgeom.flatness.b_raw` at the classifier and features of :meth:`LossPoint.classifier`.

    Args:
        model: the network (a ``torch.nn.Module``).
        loss: ``nn.CrossEntropyLoss()``, mean reduction.
        data: one batch or an iterable of batches (see :mod:`lossgeom.batches`), taken as one batch.
        params: the point (``None``: the model's own trainable parameters).
        group: must be ``None`` (every example on one process).
        output: selects the tensor of outputs from what ``model`` returns (see :class:`LossPoint`).

    Returns:
        :math:`B_{\rm raw}` of the last layer, a float.

    Raises:
        NotApplicable: if the loss is not a softmax cross-entropy or the outputs are not an
            ``nn.Linear`` layer's output.
    """
    return _classifier_b_raw_at(_point("classifier_b_raw", model, loss, data, params, group, output))


def classifier_b_quot(
    model: nn.Module,
    loss: nn.Module,
    data: Data,
    *,
    params: Params | None = None,
    group: Group = None,
    output: Output = None,
) -> float:
    r""":math:`B_{\rm quot}`: :math:`B_{\rm raw}` at the centred classifier :math:`W - \mathbf{1} \bar w^\top`.

    :func:`~lossgeom.flatness.b_quot` at the classifier and features of :meth:`LossPoint.classifier`.

    Args:
        model: the network (a ``torch.nn.Module``).
        loss: ``nn.CrossEntropyLoss()``, mean reduction.
        data: one batch or an iterable of batches (see :mod:`lossgeom.batches`), taken as one batch.
        params: the point (``None``: the model's own trainable parameters).
        group: must be ``None`` (every example on one process).
        output: selects the tensor of outputs from what ``model`` returns (see :class:`LossPoint`).

    Returns:
        :math:`B_{\rm quot}` of the last layer, a float.

    Raises:
        NotApplicable: if the loss is not a softmax cross-entropy or the outputs are not an
            ``nn.Linear`` layer's output.
    """
    return _classifier_b_quot_at(_point("classifier_b_quot", model, loss, data, params, group, output))


def model_quotient_flatness(
    model: nn.Module,
    loss: nn.Module,
    data: Data,
    *,
    params: Params | None = None,
    group: Group = None,
    output: Output = None,
) -> float:
    r""":math:`\operatorname{Flat}^Q` of a two-layer bias-free ReLU regression network (Miyagawa 2026).

    :func:`~lossgeom.flatness.quotient_flatness` (the trace of the Riemannian Hessian on the
    rescaling quotient) times 2, since ``nn.MSELoss`` is :math:`\frac1N \sum (F - y)^2`,
    twice the :math:`\frac1{2N} \sum (F - y)^2` it is derived for.

    Args:
        model: the network (a ``torch.nn.Module``).
        loss: ``nn.MSELoss()``, mean reduction.
        data: ``(x, y)`` tensors or an iterable of ``(x, y)`` batches (inputs flattened to ``(N, d)``).
        params: the point (``None``: the model's own trainable parameters).
        group: must be ``None`` (every example on one process).
        output: selects the tensor of outputs from what ``model`` returns (see :class:`LossPoint`).

    Returns:
        :math:`2 \operatorname{Flat}^Q`, a float.

    Raises:
        NotApplicable: unless the model is ``Sequential(Linear(d, m, bias=False), ReLU(),
            Linear(m, 1, bias=False))`` and the loss ``nn.MSELoss()``.
    """
    return _model_quotient_flatness_at(_point("model_quotient_flatness", model, loss, data, params, group, output))


def riemannian_sharpness(
    model: nn.Module,
    loss: nn.Module,
    data: Data,
    *,
    params: Params | None = None,
    group: Group = None,
    output: Output = None,
    fisher: str = "true",
    max_dense: int = MAX_DENSE,
) -> float:
    r"""Fisher-Riemannian sharpness: the largest eigenvalue of the Hessian :math:`H` in a Fisher metric :math:`F`.

    ``fisher="true"``: :func:`~lossgeom.flatness.fisher_riemannian_sharpness_from_matrices` of
    the dense Hessian and the Fisher of :meth:`LossPoint.fisher`, :math:`\max_v v^\top H v /
    v^\top F v` over :math:`v` in the range of :math:`F`; ``fisher="diagonal"``:
    :func:`~lossgeom.flatness.diagonal_fisher_sharpness_from_matrices` with the Fisher's
    diagonal :math:`D`, :math:`\lambda_{\max}(D^{-1/2} H D^{-1/2})` over the parameters whose
    diagonal entry is positive (a dead unit's weights have no Fisher mass and, being dead, no
    curvature either; a parameter with curvature but no Fisher mass is an error, the value
    being infinite) (Ahmed et al. 2026).

    Both are invariant under a linear change of coordinates (a diagonal one for the
    diagonal version) when :math:`H` vanishes on the kernel of :math:`F`; where it does not
    (``kernel_leakage`` of :func:`~lossgeom.flatness.fisher_riemannian_sharpness_from_matrices`,
    away from a critical point), the restriction to the range of :math:`F` depends on the
    coordinates.

    Args:
        model: the network (a ``torch.nn.Module``).
        loss: the loss module, mean reduction (called for every value and derivative; see :mod:`lossgeom.losses`).
        data: one batch or an iterable of batches (see :mod:`lossgeom.batches`), taken as one batch.
        params: the point (``None``: the model's own trainable parameters).
        group: must be ``None`` (the dense matrices are formed on one process).
        output: selects the tensor of outputs from what ``model`` returns (see :class:`LossPoint`).
        fisher: ``"true"`` (the dense Fisher) or ``"diagonal"`` (its diagonal).
        max_dense: the largest parameter count for which the dense Hessian and Fisher are formed.

    Returns:
        the Fisher-Riemannian sharpness, a float.

    Raises:
        ValueError: if ``fisher`` is neither ``"true"`` nor ``"diagonal"``; for ``"diagonal"``, if
            the Fisher is zero or the Hessian has curvature where the Fisher diagonal is zero.
        NotApplicable: if the model has more than ``max_dense`` parameters.
    """
    point = _point("riemannian_sharpness", model, loss, data, params, group, output, max_dense)
    return _riemannian_sharpness_at(point, fisher=fisher)


def model_wolkowicz_styan_bound(
    model: nn.Module,
    loss: nn.Module,
    data: Data,
    *,
    params: Params | None = None,
    group: Group = None,
    output: Output = None,
    max_dense: int = MAX_DENSE,
) -> float:
    r"""The Wolkowicz-Styan bound :math:`m + s\sqrt{n - 1} \ge \lambda_{\max}(H)` of the loss Hessian.

    :func:`~lossgeom.flatness.wolkowicz_styan_bound` of the dense Hessian:
    :math:`m = \operatorname{tr} H / n` and :math:`s^2 = \operatorname{tr}(H^2) / n - m^2`
    (Wolkowicz and Styan 1980).

    Args:
        model: the network (a ``torch.nn.Module``).
        loss: the loss module, mean reduction (called for every value and derivative; see :mod:`lossgeom.losses`).
        data: one batch or an iterable of batches (see :mod:`lossgeom.batches`), taken as one batch.
        params: the point (``None``: the model's own trainable parameters).
        group: must be ``None`` (the dense Hessian is formed on one process).
        output: selects the tensor of outputs from what ``model`` returns (see :class:`LossPoint`).
        max_dense: the largest parameter count for which the dense Hessian is formed.

    Returns:
        :math:`m + s\sqrt{n - 1}` of the dense loss Hessian, a float.

    Raises:
        NotApplicable: if the model has more than ``max_dense`` parameters.
    """
    point = _point("model_wolkowicz_styan_bound", model, loss, data, params, group, output, max_dense)
    return _model_wolkowicz_styan_bound_at(point)


#: Each model-first measure and its form at a stored :class:`LossPoint`.
_AT_POINT: dict[Callable[..., float], Callable[..., float]] = {
    lambda_max: _lambda_max_at,
    hessian_trace: _hessian_trace_at,
    keskar_sharpness: _keskar_sharpness_at,
    sam_sharpness: _sam_sharpness_at,
    adaptive_sharpness: _adaptive_sharpness_at,
    fisher_rao_norm: _fisher_rao_norm_at,
    relative_flatness: _relative_flatness_at,
    classifier_kappa_exact: _classifier_kappa_exact_at,
    classifier_b_raw: _classifier_b_raw_at,
    classifier_b_quot: _classifier_b_quot_at,
    model_quotient_flatness: _model_quotient_flatness_at,
    riemannian_sharpness: _riemannian_sharpness_at,
    model_wolkowicz_styan_bound: _model_wolkowicz_styan_bound_at,
}


def measure_at(point: LossPoint, measure: Callable[..., Any], **options: Any) -> float:
    r"""A model-first measure evaluated at a stored point: ``measure(model, loss, data, params=..., **options)``.

    For the measures of this module and :func:`lossgeom.curvature.lambda_max`, the point's
    dense Hessian and Fisher (:meth:`LossPoint.hessian`, :meth:`LossPoint.fisher`) are
    formed once and shared by every measure evaluated at it; ``lambda_max`` there uses
    reverse-over-reverse Hessian-vector products of the point's loss. Any other callable
    ``measure(model, loss, data, **options)`` is called on a copy of the model carrying the
    point's parameters.

    The softmax cross-entropy of a linear classifier at :math:`W = 0` has the Hessian
    :math:`\frac1N \sum_i P(p_i) \otimes x_i x_i^\top` with :math:`P = \tfrac1K I - \tfrac1{K^2}
    \mathbf 1 \mathbf 1^\top`; for :math:`K = 2` and :math:`x_i x_i^\top` averaging to
    :math:`I_2` its trace is :math:`2 \cdot \tfrac12 = 1`:

    >>> import torch
    >>> from torch import nn
    >>> from lossgeom.flatness import LossPoint, hessian_trace, measure_at
    >>> model = nn.Linear(2, 2, bias=False, dtype=torch.float64)
    >>> _ = nn.init.zeros_(model.weight)
    >>> x, y = torch.eye(2, dtype=torch.float64) * 2**0.5, torch.tensor([0, 1])
    >>> point = LossPoint(model, nn.CrossEntropyLoss(), (x, y))
    >>> round(measure_at(point, hessian_trace, method="exact"), 12)
    1.0

    Args:
        point: the stored point (model, loss, data and parameters).
        measure: a model-first measure, e.g. :func:`sam_sharpness` or
            :func:`lossgeom.curvature.lambda_max`.
        **options: the measure's keyword arguments other than ``params``, ``group``,
            ``max_dense`` and ``output``, which are the point's.

    Returns:
        the measure's value at the point, a float.

    Raises:
        TypeError: if ``point`` is not a :class:`LossPoint`, ``measure`` is not callable, or
            ``options`` holds ``params``, ``group``, ``max_dense`` or ``output``.
    """
    if not isinstance(point, LossPoint):
        raise TypeError(f"point must be a LossPoint, got {type(point).__name__}")
    if not callable(measure):
        raise TypeError(f"measure must be a callable measure(model, loss, data, ...), got {type(measure).__name__}")
    fixed = sorted({"params", "group", "max_dense", "output"} & set(options))
    if fixed:
        raise TypeError(
            f"measure_at: {fixed} belong to the point; build LossPoint(model, loss, data, params=..., "
            "max_dense=..., output=...) instead (a stored point is on one process)"
        )
    at_point = _AT_POINT.get(measure)
    if at_point is not None:
        return float(at_point(point, **options))
    return measure(point.model_at_point(), point.loss, point.data, **options)

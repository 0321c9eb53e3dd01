"""Module-first flatness measures: each takes a model, a loss module and data (the symmetry audit atlas).

The atlas appendix (:mod:`lossgeom.atlas`) measures each of these on a
``torch.nn.Module``, a loss module and data (or one
:class:`~lossgeom.flatness.loss_point.LossPoint`, which keeps the dense curvature they
share): :func:`lambda_max`, :func:`hessian_trace`, :func:`keskar_sharpness`,
:func:`sam_sharpness`, :func:`adaptive_sharpness`, :func:`fisher_rao_norm`,
:func:`relative_flatness`, :func:`classifier_kappa_exact`, :func:`classifier_b_raw`,
:func:`classifier_b_quot`, :func:`model_quotient_flatness`, :func:`riemannian_sharpness`
and :func:`model_wolkowicz_styan_bound`. The model is evaluated in its own dtype; results
are Python floats. A measure that is not defined for the model or loss at hand raises
:class:`~lossgeom.flatness.loss_point.NotApplicable`.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
from scipy.optimize import Bounds, minimize

from lossgeom._validation import positive, positive_int
from lossgeom.curvature import HessianOperator, closure_lambda_max, hutchpp_trace
from lossgeom.flatness.loss_point import LossPoint, NotApplicable, _point
from lossgeom.flatness.relu_quotient import quotient_flatness, two_layer_weights
from lossgeom.flatness.riemannian import diagonal_fisher_sharpness, fisher_riemannian_sharpness
from lossgeom.flatness.softmax_head import b_quot, b_raw, kappa_exact
from lossgeom.flatness.spectral import wolkowicz_styan_bound


def lambda_max(model, loss=None, data=None, *, tol: float = 1e-8, seed: int = 0) -> float:
    """``lambda_max(H)``: the largest eigenvalue of the loss Hessian, by Lanczos (raw sharpness).

    :func:`lossgeom.curvature.top_eigenpairs` (``scipy.sparse.linalg.eigsh``) on
    Hessian-vector products (reverse-over-reverse, the cheapest per product when many
    are taken at one point); no dense matrix is formed. Chapters ``ch04_curvature_spectrum``
    and ``ch05_step_size`` derive what it governs.

    Args:
        model: a ``torch.nn.Module``, or a :class:`LossPoint` (then ``loss`` and ``data`` are omitted).
        loss: ``nn.CrossEntropyLoss()`` or ``nn.MSELoss()``, mean reduction.
        data: ``(x, y)`` tensors or an iterable of ``(x, y)`` batches.
        tol: the relative tolerance of the Lanczos iteration (positive).
        seed: the seed of the Lanczos start vector.

    Returns:
        the largest eigenvalue of the loss Hessian, a float.

    Raises:
        ValueError: if the model has fewer than two parameters.
    """
    point = _point(model, loss, data)
    if point.n_parameters < 2:
        raise ValueError("lambda_max needs at least two parameters (Lanczos)")
    return closure_lambda_max(
        point.loss_fn, point.params, tol=positive("tol", tol), seed=seed, method="reverse-over-reverse"
    )


def hessian_trace(model, loss=None, data=None, *, method: str = "exact", n_hvp: int = 99, seed: int = 0) -> float:
    """``tr(H)``: the trace of the loss Hessian (the expected loss increase under isotropic noise).

    ``method="exact"`` sums the diagonal of the dense Hessian (:meth:`LossPoint.hessian`);
    ``method="hutchpp"`` estimates it from ``n_hvp`` products with Hutch++
    (:func:`lossgeom.curvature.hutchpp_trace`, Meyer et al. 2021) for models too large to
    form ``H``.

    Args:
        model: a ``torch.nn.Module``, or a :class:`LossPoint` (then ``loss`` and ``data`` are omitted).
        loss: ``nn.CrossEntropyLoss()`` or ``nn.MSELoss()``, mean reduction.
        data: ``(x, y)`` tensors or an iterable of ``(x, y)`` batches.
        method: ``"exact"`` (dense Hessian) or ``"hutchpp"`` (matrix-free estimate).
        n_hvp: the number of Hessian-vector products of Hutch++ (``method="hutchpp"`` only).
        seed: the seed of the Hutch++ probes (``method="hutchpp"`` only).

    Returns:
        ``tr(H)`` (exact or estimated), a float.

    Raises:
        ValueError: if ``method`` is neither ``"exact"`` nor ``"hutchpp"``.
        NotApplicable: for ``method="exact"`` with more than ``max_dense`` parameters.
    """
    point = _point(model, loss, data)
    if method == "exact":
        return float(np.trace(point.hessian()))
    if method == "hutchpp":
        return float(hutchpp_trace(HessianOperator(point.loss_fn, point.params), n_hvp=n_hvp, seed=seed).estimate)
    raise ValueError(f"method must be 'exact' or 'hutchpp', got {method!r}")


def keskar_sharpness(model, loss=None, data=None, *, epsilon: float = 1e-3, max_iter: int = 20) -> float:
    """Keskar et al.'s (2017) epsilon-sharpness, in percent, over the box ``|z_i| <= epsilon (|theta_i| + 1)``.

    ``100 (max_{z in C} L(theta + z) - L(theta)) / (1 + L(theta))`` with the box ``C`` in the
    full parameter space (their ``A = I``); the maximum is sought as they do, by L-BFGS-B
    (``scipy.optimize.minimize``) from ``z = 0`` for at most ``max_iter`` iterations, so the
    value is a lower bound on the true maximum. The box grows with ``|theta_i|``, so a
    rescaling that preserves the function changes the set searched.

    Args:
        model: a ``torch.nn.Module``, or a :class:`LossPoint` (then ``loss`` and ``data`` are omitted).
        loss: ``nn.CrossEntropyLoss()`` or ``nn.MSELoss()``, mean reduction.
        data: ``(x, y)`` tensors or an iterable of ``(x, y)`` batches.
        epsilon: the relative half-width of the box (positive).
        max_iter: the most L-BFGS-B iterations (a positive integer).

    Returns:
        the epsilon-sharpness in percent (``>= 0``), a float.
    """
    point = _point(model, loss, data)
    epsilon, max_iter = positive("epsilon", epsilon), positive_int("max_iter", max_iter)
    theta = point.flat()
    base = point.value()
    half_width = (epsilon * (theta.abs() + 1.0)).numpy()

    def negative(z: np.ndarray) -> tuple[float, np.ndarray]:
        value, grad = point.value_and_gradient(theta + torch.from_numpy(z))
        return -value, -grad.numpy()

    # no stopping on a small projected gradient or a small decrease: a box of width 1e-3
    # around a trained point has both, and the search would stop at z = 0
    result = minimize(
        negative,
        np.zeros(theta.numel()),
        jac=True,
        method="L-BFGS-B",
        bounds=Bounds(-half_width, half_width),
        options={"maxiter": max_iter, "gtol": 0.0, "ftol": 0.0},
    )
    highest = max(-float(result.fun), base)
    return 100.0 * (highest - base) / (1.0 + base)


def sam_sharpness(model, loss=None, data=None, *, rho: float = 0.05) -> float:
    """SAM sharpness (Foret et al. 2021): ``L(theta + rho g / |g|) - L(theta)``, ``g`` the gradient.

    The first-order solution of ``max_{|e|_2 <= rho} L(theta + e) - L(theta)``, the quantity
    sharpness-aware minimisation adds to the loss; zero where the gradient vanishes.

    Args:
        model: a ``torch.nn.Module``, or a :class:`LossPoint` (then ``loss`` and ``data`` are omitted).
        loss: ``nn.CrossEntropyLoss()`` or ``nn.MSELoss()``, mean reduction.
        data: ``(x, y)`` tensors or an iterable of ``(x, y)`` batches.
        rho: the radius of the Euclidean ball (positive).

    Returns:
        ``L(theta + rho g / |g|) - L(theta)``, a float (0.0 where ``g = 0``).
    """
    point = _point(model, loss, data)
    rho = positive("rho", rho)
    theta = point.flat()
    base, grad = point.value_and_gradient(theta)
    norm = float(grad.norm())
    if norm == 0.0:
        return 0.0
    with torch.no_grad():
        return float(point.loss_fn(point.unflatten(theta + (rho / norm) * grad))) - base


def _asam_scale(point: LossPoint, eta: float) -> torch.Tensor:
    """ASAM's ``T_w``: ``|w| + eta`` on weights (parameters named ``*weight*``), 1 on the others.

    The rule is the authors' implementation's: it reads names, so the gains of a
    normalisation layer (``LayerNorm.weight``, ``BatchNorm.weight``) count as weights too.
    """
    pieces = [
        (p.detach().to(torch.float64).abs() + eta) if "weight" in name else torch.ones(p.numel(), dtype=torch.float64)
        for name, p in point.params.items()
    ]
    return torch.cat([piece.reshape(-1) for piece in pieces])


def adaptive_sharpness(model, loss=None, data=None, *, rho: float = 0.5, eta: float = 0.01) -> float:
    """ASAM's adaptive sharpness (Kwon et al. 2021): ``L(theta + e) - L(theta)``, ``e = rho T^2 g / |T g|``.

    The first-order solution of ``max_{|T^-1 e|_2 <= rho} L(theta + e) - L(theta)`` with the
    element-wise normalisation ``T = diag(|w| + eta)`` on weight parameters and ``T = 1`` on
    biases and other parameters, as in the authors' implementation (which reads parameter
    names, so normalisation gains named ``weight`` are normalised too). With ``eta = 0`` and no
    bias the ball moves with a per-neuron rescaling and the value is invariant under it;
    ``eta > 0`` and unnormalised biases make the invariance approximate.

    Args:
        model: a ``torch.nn.Module``, or a :class:`LossPoint` (then ``loss`` and ``data`` are omitted).
        loss: ``nn.CrossEntropyLoss()`` or ``nn.MSELoss()``, mean reduction.
        data: ``(x, y)`` tensors or an iterable of ``(x, y)`` batches.
        rho: the radius of the normalised ball (positive).
        eta: the offset of the normalisation ``|w| + eta`` (finite, ``>= 0``).

    Returns:
        ``L(theta + e) - L(theta)``, a float (0.0 where ``T g = 0``).

    Raises:
        ValueError: if ``eta`` is negative or not finite.
    """
    point = _point(model, loss, data)
    rho, eta = positive("rho", rho), float(eta)
    if not (math.isfinite(eta) and eta >= 0):
        raise ValueError(f"eta must be finite and >= 0, got {eta}")
    theta = point.flat()
    base, grad = point.value_and_gradient(theta)
    scale = _asam_scale(point, eta)
    norm = float((scale * grad).norm())
    if norm == 0.0:
        return 0.0
    with torch.no_grad():
        return float(point.loss_fn(point.unflatten(theta + (rho / norm) * scale**2 * grad))) - base


def fisher_rao_norm(model, loss=None, data=None) -> float:
    """The Fisher-Rao norm (Liang et al. 2019): ``|theta|_fr = sqrt(<theta, I(theta) theta>)``.

    With the empirical Fisher ``I = (1/N) sum_i g_i g_i^T`` (``g_i`` the gradient of example
    ``i``'s loss), ``<theta, I theta> = (1/N) sum_i <theta, g_i>^2``; the directional
    derivatives ``<theta, g_i>`` of all examples come from one forward-mode product
    (``torch.func.jvp``). A linear change of coordinates ``theta = D psi`` that keeps the
    function keeps every ``<theta, g_i>``, so the norm is invariant under rescalings and
    permutations; a common-row shift adds a direction the per-example gradients are
    orthogonal to.

    Args:
        model: a ``torch.nn.Module``, or a :class:`LossPoint` (then ``loss`` and ``data`` are omitted).
        loss: ``nn.CrossEntropyLoss()`` or ``nn.MSELoss()``, mean reduction.
        data: ``(x, y)`` tensors or an iterable of ``(x, y)`` batches.

    Returns:
        ``sqrt((1/N) sum_i <theta, g_i>^2)``, a float.
    """
    point = _point(model, loss, data)
    theta = point.flat()

    def losses(vector: torch.Tensor) -> torch.Tensor:
        return point.per_example_losses(point.unflatten(vector)).to(torch.float64)

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*", category=DeprecationWarning)
        _, directional = torch.func.jvp(losses, (theta,), (theta,))
    return float(directional.pow(2).mean().sqrt())


def _first_weight(point: LossPoint) -> str:
    for name, value in point.params.items():
        if name.endswith("weight") and value.ndim >= 2:
            return name.removesuffix(".weight").removesuffix("weight")
    raise NotApplicable(
        "relative flatness needs a layer with a weight matrix (a parameter '<layer>.weight' of two or more dimensions)"
    )


def relative_flatness(model, loss=None, data=None, *, layer: str | None = None) -> float:
    """Petzka et al.'s (2021) relative flatness of one layer: ``sum_{s,s'} <w_s, w_s'> Tr(H_{s,s'})``.

    ``w_s`` is row ``s`` of the layer's weight (the weights into unit or channel ``s``,
    flattened for a convolution) and ``H_{s,s'}`` the Hessian block of the loss between
    rows ``s`` and ``s'``. Rescaling the layer's units (rows) by ``c_s`` multiplies
    ``<w_s, w_s'>`` by ``c_s c_s'`` and divides ``H_{s,s'}`` by it, so the value is kept; for
    the last layer of a softmax classifier it is ``kappa_exact`` (chapter
    ``ch08_softmax_gauge``).

    Args:
        model: a ``torch.nn.Module``, or a :class:`LossPoint` (then ``loss`` and ``data`` are omitted).
        loss: ``nn.CrossEntropyLoss()`` or ``nn.MSELoss()``, mean reduction.
        data: ``(x, y)`` tensors or an iterable of ``(x, y)`` batches.
        layer: the layer's name prefix (``"0"`` for ``model[0]``); default the first
            parameter named ``*weight`` with two or more dimensions.

    Returns:
        ``sum_{s,s'} <w_s, w_s'> Tr(H_{s,s'})``, a float.

    Raises:
        ValueError: if ``layer`` has no weight matrix of two or more dimensions.
        NotApplicable: if ``layer`` is None and the model has no such weight, or the model has
            more than ``max_dense`` parameters (the dense Hessian is formed).
    """
    point = _point(model, loss, data)
    layer = _first_weight(point) if layer is None else layer
    name = f"{layer}.weight" if layer else "weight"
    if name not in point.params or point.params[name].ndim < 2:
        raise ValueError(
            f"layer {layer!r} has no weight matrix {name!r}; weights are "
            f"{[k for k, v in point.params.items() if v.ndim >= 2]}"
        )
    weight = point.params[name].detach().to(torch.float64)
    rows, width = weight.shape[0], weight[0].numel()
    index = point.block_indices(name)
    block = point.hessian()[np.ix_(index, index)].reshape(rows, width, rows, width)
    traces = np.einsum("sjtj->st", block)
    W = weight.reshape(rows, width).numpy()
    return float(((W @ W.T) * traces).sum())


def classifier_kappa_exact(model, loss=None, data=None) -> float:
    """``kappa_exact`` of the model's last layer: ``mean_i |h_i|^2 Tr(W^T P(p_i) W)``.

    :func:`kappa_exact` at the classifier and features of :meth:`LossPoint.classifier`
    (a bias joins ``W`` as a column, ``h`` gains a 1); the chapter *The softmax gauge*.

    Args:
        model: a ``torch.nn.Module``, or a :class:`LossPoint` (then ``loss`` and ``data`` are omitted).
        loss: ``nn.CrossEntropyLoss()``, mean reduction.
        data: ``(x, y)`` tensors or an iterable of ``(x, y)`` batches.

    Returns:
        ``kappa_exact`` of the last layer, a float.

    Raises:
        NotApplicable: if the loss is not a softmax cross-entropy or the outputs are not an
            ``nn.Linear`` layer's output.
    """
    W, h = _point(model, loss, data).classifier()
    return float(kappa_exact(W, h))


def classifier_b_raw(model, loss=None, data=None) -> float:
    """``B_raw = |W|_F^2 mean_i |h_i|^2 (1 - |p_i|^2)`` of the model's last layer (:func:`b_raw`).

    Args:
        model: a ``torch.nn.Module``, or a :class:`LossPoint` (then ``loss`` and ``data`` are omitted).
        loss: ``nn.CrossEntropyLoss()``, mean reduction.
        data: ``(x, y)`` tensors or an iterable of ``(x, y)`` batches.

    Returns:
        ``B_raw`` at the classifier and features of :meth:`LossPoint.classifier`, a float.

    Raises:
        NotApplicable: if the loss is not a softmax cross-entropy or the outputs are not an
            ``nn.Linear`` layer's output.
    """
    W, h = _point(model, loss, data).classifier()
    return float(b_raw(W, h))


def classifier_b_quot(model, loss=None, data=None) -> float:
    """``B_quot``: ``B_raw`` at the centred classifier ``W - 1 wbar^T`` (:func:`b_quot`).

    Args:
        model: a ``torch.nn.Module``, or a :class:`LossPoint` (then ``loss`` and ``data`` are omitted).
        loss: ``nn.CrossEntropyLoss()``, mean reduction.
        data: ``(x, y)`` tensors or an iterable of ``(x, y)`` batches.

    Returns:
        ``B_quot`` at the classifier and features of :meth:`LossPoint.classifier`, a float.

    Raises:
        NotApplicable: if the loss is not a softmax cross-entropy or the outputs are not an
            ``nn.Linear`` layer's output.
    """
    W, h = _point(model, loss, data).classifier()
    return float(b_quot(W, h))


def model_quotient_flatness(model, loss=None, data=None) -> float:
    """``Flat^Q`` of a two-layer bias-free ReLU regression network (chapter ``ch11_quotient_flatness``).

    :func:`quotient_flatness` (the trace of the Riemannian Hessian on the
    rescaling quotient) times 2, since ``nn.MSELoss`` is ``(1/N) sum (F - y)^2``, twice the
    ``(1/2N) sum (F - y)^2`` of that chapter.

    Args:
        model: a ``torch.nn.Module``, or a :class:`LossPoint` (then ``loss`` and ``data`` are omitted).
        loss: ``nn.MSELoss()``, mean reduction.
        data: ``(x, y)`` tensors or an iterable of ``(x, y)`` batches (inputs flattened to ``(N, d)``).

    Returns:
        ``2 Flat^Q``, a float.

    Raises:
        NotApplicable: unless the model is ``Sequential(Linear(d, m, bias=False), ReLU(),
            Linear(m, 1, bias=False))`` and the loss ``nn.MSELoss()``.
    """
    point = _point(model, loss, data)
    if point.kind != "mse":
        raise NotApplicable("Flat^Q is derived for the square loss (nn.MSELoss)")
    try:
        a, W = two_layer_weights(point.params)
        two_layer_weights(point.model)
    except (TypeError, ValueError) as err:
        raise NotApplicable(f"Flat^Q is defined for two-layer bias-free ReLU networks: {err}") from None
    if a.ndim != 1:
        raise NotApplicable("Flat^Q is derived for one output")
    x = point.x.to(torch.float64).reshape(point.x.shape[0], -1)
    return 2.0 * float(
        quotient_flatness(a.to(torch.float64), W.to(torch.float64), x, point.y.to(torch.float64).reshape(-1))
    )


def riemannian_sharpness(model, loss=None, data=None, *, fisher: str = "true") -> float:
    """Fisher-Riemannian sharpness: ``lambda_max`` of the Hessian in a Fisher metric (chapter ``ch12_high_dimensions``).

    ``fisher="true"``: :func:`fisher_riemannian_sharpness` of the dense Hessian and the
    Fisher of :meth:`LossPoint.fisher` (the largest generalised eigenvalue on the Fisher's
    range); ``fisher="diagonal"``: :func:`diagonal_fisher_sharpness` with the Fisher's
    diagonal, over the parameters whose diagonal entry is positive (a dead unit's weights
    have no Fisher mass and, being dead, no curvature either; a parameter with curvature
    but no Fisher mass is an error, the value being infinite).

    Both are invariant under a linear change of coordinates (a diagonal one for the
    diagonal version) when the Hessian vanishes on the Fisher's kernel; where it does not
    (``kernel_leakage`` of :func:`fisher_riemannian_sharpness`, away from a critical
    point), the restriction to the Fisher's range depends on the coordinates.

    Args:
        model: a ``torch.nn.Module``, or a :class:`LossPoint` (then ``loss`` and ``data`` are omitted).
        loss: ``nn.CrossEntropyLoss()`` or ``nn.MSELoss()``, mean reduction.
        data: ``(x, y)`` tensors or an iterable of ``(x, y)`` batches.
        fisher: ``"true"`` (the dense Fisher) or ``"diagonal"`` (its diagonal).

    Returns:
        the Fisher-Riemannian sharpness, a float.

    Raises:
        ValueError: if ``fisher`` is neither ``"true"`` nor ``"diagonal"``; for ``"diagonal"``, if
            the Fisher is zero or the Hessian has curvature where the Fisher diagonal is zero.
        NotApplicable: if the model has more than ``max_dense`` parameters.
    """
    point = _point(model, loss, data)
    H, F = point.hessian(), point.fisher()
    if fisher == "true":
        return fisher_riemannian_sharpness(H, F).value
    if fisher == "diagonal":
        diagonal = np.diag(F)
        seen = diagonal > 0
        if not seen.any():
            raise ValueError("the Fisher is zero: there is no metric to measure the Hessian in")
        blind = ~seen
        if blind.any() and np.abs(H[blind]).max() > 1e-12 * np.abs(H).max():
            raise ValueError(
                "the Hessian has curvature in parameters the Fisher does not see (zero Fisher "
                "diagonal): the diagonal-Fisher sharpness is infinite there"
            )
        if seen.sum() < 2:
            return float(H[seen][:, seen].item() / diagonal[seen].item())
        return diagonal_fisher_sharpness(H[np.ix_(seen, seen)], diagonal[seen])
    raise ValueError(f"fisher must be 'true' or 'diagonal', got {fisher!r}")


def model_wolkowicz_styan_bound(model, loss=None, data=None) -> float:
    """The Wolkowicz-Styan bound ``m + s sqrt(n - 1) >= lambda_max(H)`` (chapter ``ch12_high_dimensions``).

    :func:`wolkowicz_styan_bound` of the dense Hessian: ``m = tr(H) / n`` and
    ``s^2 = tr(H^2) / n - m^2``.

    Args:
        model: a ``torch.nn.Module``, or a :class:`LossPoint` (then ``loss`` and ``data`` are omitted).
        loss: ``nn.CrossEntropyLoss()`` or ``nn.MSELoss()``, mean reduction.
        data: ``(x, y)`` tensors or an iterable of ``(x, y)`` batches.

    Returns:
        ``m + s sqrt(n - 1)`` of the dense loss Hessian, a float.

    Raises:
        NotApplicable: if the model has more than ``max_dense`` parameters.
    """
    return wolkowicz_styan_bound(_point(model, loss, data).hessian())

"""Flatness and sharpness measures, as functions of curvature matrices and losses.

The home of the book's flatness measures; each says what it reads from the loss and the
chapter that derives it (``chapters/ch12_high_dimensions`` for the ones here):

- the Wolkowicz-Styan bound (Wolkowicz and Styan 1980): for a real symmetric ``n x n``
  matrix ``A`` with ``m = tr(A) / n`` and ``s^2 = tr(A^2) / n - m^2``,
  ``lambda_max(A) <= m + s sqrt(n - 1)`` (:func:`wolkowicz_styan_bound`, also from the two
  traces alone, :func:`wolkowicz_styan_from_traces`); its gradient in ``A``
  (:func:`wolkowicz_styan_gradient`) and, through the Hessian, in the parameters
  (:func:`hessian_wolkowicz_styan`);
- Fisher-Riemannian sharpness: the largest eigenvalue of the Hessian measured in the
  Fisher metric, ``sup_v v^T H v / v^T F v`` over directions the Fisher sees
  (:func:`fisher_riemannian_sharpness`), and the same with a diagonal estimate of the
  Fisher in place of ``F`` (:func:`diagonal_fisher_sharpness`).

Matrices are float64 torch tensors (or arrays); results are Python floats unless a
function says it stays differentiable.

The last section holds the measures of the symmetry audit atlas (``appendices/atlas``,
:mod:`lossgeom.atlas`) in module-first form: each takes a ``torch.nn.Module``, a loss
module and data (or one :class:`LossPoint`, which keeps the dense curvature they share):
:func:`lambda_max`, :func:`hessian_trace`, :func:`keskar_sharpness`, :func:`sam_sharpness`,
:func:`adaptive_sharpness`, :func:`fisher_rao_norm`, :func:`relative_flatness`,
:func:`classifier_kappa_exact`, :func:`classifier_b_raw`, :func:`classifier_b_quot`,
:func:`model_quotient_flatness`, :func:`riemannian_sharpness` and :func:`wolkowicz_styan`.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
import torch
from torch import nn

from lossgeom._checks import finite_tensor, positive, positive_int
from lossgeom.curvature import flatten_params

Params = Mapping[str, torch.Tensor]


def _symmetric(name: str, matrix, tol: float = 1e-10) -> torch.Tensor:
    A = finite_tensor(name, matrix)
    if A.dtype != torch.float64:
        A = A.to(torch.float64)
    if A.ndim != 2 or A.shape[0] != A.shape[1] or A.shape[0] < 2:
        raise ValueError(f"{name} must be a square matrix of size >= 2, got shape {tuple(A.shape)}")
    scale = float(A.abs().max())
    if float((A - A.T).abs().max()) > tol * max(scale, 1e-300):
        raise ValueError(f"{name} must be symmetric (the bound is about real symmetric matrices)")
    return A


def _moments(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(m, s)`` without checks, differentiable (also inside torch.func transforms)."""
    n = A.shape[0]
    m = torch.diagonal(A).sum() / n
    second = (A * A).sum() / n  # tr(A^2) for symmetric A
    return m, torch.sqrt(torch.clamp(second - m * m, min=0.0))


def spectral_moments(matrix) -> tuple[float, float]:
    """``m = tr(A) / n`` and ``s = sqrt(tr(A^2) / n - m^2)``: mean and spread of the spectrum."""
    m, s = _moments(_symmetric("matrix", matrix))
    return float(m), float(s)


def wolkowicz_styan_from_traces(trace: float, trace_of_square: float, n: int) -> float:
    """``m + s sqrt(n - 1)`` from ``tr(A)``, ``tr(A^2)`` and the size ``n`` (no matrix needed).

    Both traces can be estimated matrix-free (Hutchinson: ``E[z^T A z]`` and
    ``E[|A z|^2]``), which is what makes the bound cheap for a large Hessian.

    Raises:
        ValueError: if ``n < 2`` or the traces are inconsistent (``tr(A^2) < tr(A)^2 / n``).
    """
    n = positive_int("n", n)
    if n < 2:
        raise ValueError(f"n must be >= 2, got {n}")
    trace, trace_of_square = float(trace), float(trace_of_square)
    m = trace / n
    variance = trace_of_square / n - m * m
    if variance < -1e-12 * max(1.0, trace_of_square / n):
        raise ValueError(f"trace_of_square must be >= trace^2 / n (Cauchy-Schwarz), got {trace_of_square} "
                         f"with trace {trace} and n {n}")
    return m + math.sqrt(max(variance, 0.0)) * math.sqrt(n - 1)


def wolkowicz_styan_bound(matrix) -> float:
    """The Wolkowicz-Styan upper bound ``lambda_max(A) <= m + s sqrt(n - 1)`` (chapter ``ch12_high_dimensions``).

    With ``x_i = lambda_i - m``: ``sum x_i = 0`` and ``sum x_i^2 = n s^2``; Cauchy-Schwarz on
    the other ``n - 1`` deviations gives ``x_max^2 <= (n - 1)(n s^2 - x_max^2)``, that is
    ``x_max <= s sqrt(n - 1)``. Equality holds when the other ``n - 1`` eigenvalues coincide.
    """
    A = _symmetric("matrix", matrix)
    m, s = _moments(A)
    return float(m + s * math.sqrt(A.shape[0] - 1))


def wolkowicz_styan_gradient(matrix) -> torch.Tensor:
    """``d/dA (m + s sqrt(n - 1)) = I / n + sqrt(n - 1) (A - m I) / (n s)`` (chapter ``ch12_high_dimensions``).

    From ``dm/dA = I / n`` and ``d tr(A^2) / dA = 2 A``, so ``ds/dA = (A - m I) / (n s)``.

    Raises:
        ValueError: where ``s = 0`` (all eigenvalues equal), where the bound is not
            differentiable.
    """
    A = _symmetric("matrix", matrix)
    n = A.shape[0]
    m, s = _moments(A)
    if float(s) <= 1e-14 * max(1.0, float(A.abs().max())):
        raise ValueError("the bound is not differentiable where all eigenvalues coincide (s = 0)")
    eye = torch.eye(n, dtype=torch.float64)
    return eye / n + math.sqrt(n - 1) * (A - m * eye) / (n * s)


def hessian_wolkowicz_styan(loss_fn: Callable[[dict[str, torch.Tensor]], torch.Tensor],
                            params: Params) -> tuple[float, dict[str, torch.Tensor]]:
    """``WS(theta) = m(H) + s(H) sqrt(n - 1)`` of the loss Hessian ``H(theta)`` and its gradient.

    The gradient ``dWS/dtheta = sum_ij (dWS/dH_ij) dH_ij/dtheta`` needs third derivatives of
    the loss; it is taken by reverse-mode autograd through ``torch.func.hessian`` (the
    closed form of the seed's HSR regulariser is this chain rule written out for one
    architecture). Small models only: the dense Hessian is formed.

    Returns:
        ``(value, gradient)`` with the gradient as a dict shaped like ``params``.
    """
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable as loss_fn(params) -> scalar tensor")
    flat, unflatten = flatten_params(params)
    flat = flat.detach().to(torch.float64)
    n = flat.numel()
    if n < 2:
        raise ValueError("params must hold at least two parameters")

    def bound_at(vector: torch.Tensor) -> torch.Tensor:
        H = torch.func.hessian(lambda v: loss_fn(unflatten(v)).reshape(()))(vector)
        m, s = _moments(0.5 * (H + H.T))
        return m + s * math.sqrt(n - 1)

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*", category=DeprecationWarning)
        grad, value = torch.func.grad_and_value(bound_at)(flat)
    if not torch.isfinite(value) or not torch.isfinite(grad).all():
        raise ValueError("the bound or its gradient is not finite at params")
    return float(value), unflatten(grad.detach())


@dataclass(frozen=True)
class RiemannianSharpness:
    """The Hessian measured in the Fisher metric (chapter ``ch12_high_dimensions``).

    Attributes:
        value: ``max_v v^T H v / v^T F v`` over ``v`` in the range of ``F``: the largest
            eigenvalue of ``F^(+1/2) H F^(+1/2)``.
        trace: the sum of those eigenvalues, ``tr(F^+ H)`` on the range of ``F``.
        rank: the dimension of the range of ``F`` (eigenvalues above the threshold).
        kernel_leakage: ``|H N|_2 / |H|_2`` for an orthonormal basis ``N`` of the kernel of
            ``F``: the curvature in directions the Fisher does not see. The definition is
            a function of the point (invariant under reparametrisation) when this is zero,
            as at a critical point whose Fisher kernel consists of symmetry directions.
    """

    value: float
    trace: float
    rank: int
    kernel_leakage: float


def fisher_riemannian_sharpness(hessian, fisher, rel_threshold: float = 1e-9) -> RiemannianSharpness:
    """Fisher-Riemannian sharpness: the largest eigenvalue of ``H`` in the metric ``F``.

    With ``F = U diag(phi) U^T`` and ``R = U_+ diag(phi_+)^(-1/2)`` over the eigenvalues
    ``phi > rel_threshold * max(phi)``, the value is ``lambda_max(R^T H R)``. Under a
    reparametrisation with invertible Jacobian ``J`` at a critical point, ``H -> J^T H J``
    and ``F -> J^T F J``; the generalised eigenvalues of ``(H, F)`` do not change
    (``det(J^T (H - mu F) J) = det(J)^2 det(H - mu F)``), so neither does the value.

    Raises:
        ValueError: if the matrices are not symmetric of one size, or ``F`` is zero.
    """
    H, F = _symmetric("hessian", hessian), _symmetric("fisher", fisher)
    if H.shape != F.shape:
        raise ValueError(f"hessian and fisher must have the same shape, got {tuple(H.shape)} and {tuple(F.shape)}")
    rel_threshold = positive("rel_threshold", rel_threshold)
    phi, U = np.linalg.eigh(F.numpy())
    if phi[-1] <= 0:
        raise ValueError("fisher must have a positive eigenvalue")
    keep = phi > rel_threshold * phi[-1]
    R = U[:, keep] / np.sqrt(phi[keep])
    mu = np.linalg.eigvalsh(R.T @ H.numpy() @ R)
    kernel = U[:, ~keep]
    h_norm = np.linalg.norm(H.numpy(), 2)
    leakage = float(np.linalg.norm(H.numpy() @ kernel, 2) / h_norm) if kernel.size and h_norm > 0 else 0.0
    return RiemannianSharpness(float(mu[-1]), float(mu.sum()), int(keep.sum()), leakage)


def diagonal_fisher_sharpness(hessian, fisher_diagonal) -> float:
    """``lambda_max(D^(-1/2) H D^(-1/2))`` with ``D`` a diagonal Fisher estimate (chapter ``ch12_high_dimensions``).

    A diagonal reparametrisation ``theta = S psi`` maps ``H -> S H S`` and the Fisher's
    diagonal to ``S D S``, so the value is kept; a non-diagonal ``J`` maps the diagonal of
    ``J^T F J`` to something that is not ``J^T D J``, and the value moves.

    Raises:
        ValueError: if ``fisher_diagonal`` has an entry <= 0 or the wrong length.
    """
    H = _symmetric("hessian", hessian)
    D = finite_tensor("fisher_diagonal", fisher_diagonal).to(torch.float64)
    if D.shape != (H.shape[0],):
        raise ValueError(f"fisher_diagonal must have shape ({H.shape[0]},), got {tuple(D.shape)}")
    if not bool((D > 0).all()):
        raise ValueError("fisher_diagonal must be > 0 everywhere (add damping where a parameter has no Fisher mass)")
    scale = D.rsqrt()
    return float(torch.linalg.eigvalsh(scale[:, None] * H * scale[None, :])[-1])


def hessian_sharpness(loss_fn: Callable[[dict[str, torch.Tensor]], torch.Tensor], params: Params,
                      tol: float = 1e-6, seed: int = 0) -> float:
    """``lambda_max`` of the loss Hessian by Lanczos on Hessian-vector products (the raw sharpness).

    :func:`lossgeom.curvature.top_eigenpairs` of :func:`lossgeom.curvature.hessian_operator`;
    no dense matrix is formed, so it serves networks with thousands of parameters.
    """
    from lossgeom.curvature import hessian_operator, top_eigenpairs

    return float(top_eigenpairs(hessian_operator(loss_fn, params), k=1, tol=positive("tol", tol), seed=seed).values[0])


def scale_to_loss(loss_fn: Callable[[dict[str, torch.Tensor]], torch.Tensor], params: Params, name: str,
                  target: float) -> dict[str, torch.Tensor]:
    """``params`` with ``params[name]`` multiplied by the ``t > 0`` that makes the loss ``target``.

    For a bias-free last layer ``name`` this multiplies every logit by ``t``: the predicted
    classes (and so every accuracy) are kept while the cross-entropy moves monotonically,
    which lets two interpolants be compared at the same training loss. ``t`` is found by
    ``scipy.optimize.brentq`` on ``log t`` in ``[-20, 20]``.

    Raises:
        ValueError: if ``name`` is not a parameter or no ``t`` in ``[e^-20, e^20]`` reaches
            ``target``.
    """
    from scipy.optimize import brentq

    if name not in params:
        raise ValueError(f"name must be one of the parameters {sorted(params)}, got {name!r}")
    target = positive("target", target)

    def scaled(log_t: float) -> dict[str, torch.Tensor]:
        return {**params, name: params[name] * math.exp(log_t)}

    gap = lambda log_t: float(loss_fn(scaled(log_t))) - target
    if gap(-20.0) * gap(20.0) > 0:
        raise ValueError(f"no scale of {name!r} in [e^-20, e^20] brings the loss to target {target}")
    return scaled(brentq(gap, -20.0, 20.0, xtol=1e-12))


# =======================================================================================
# Module-first measures (the symmetry audit atlas, ``appendices/atlas``)
# =======================================================================================
#
# Each measure below takes a ``torch.nn.Module``, a loss module (``nn.CrossEntropyLoss()``
# or ``nn.MSELoss()``, mean reduction) and data ``(x, y)`` (or an iterable of ``(x, y)``
# batches), or instead one :class:`LossPoint` that keeps the dense curvature several
# measures share. The model is evaluated in its own dtype; results are Python floats. A
# measure that is not defined for the model or loss at hand raises :class:`NotApplicable`.


class NotApplicable(ValueError):
    """A measure is not defined for this model or loss (the message says why)."""


_LOSS_KINDS = {nn.CrossEntropyLoss: "cross_entropy", nn.MSELoss: "mse"}


def _loss_kind(loss) -> str:
    for cls, kind in _LOSS_KINDS.items():
        if type(loss) is cls:
            if loss.reduction != "mean":
                raise ValueError(f"loss must use reduction='mean' (the measures are of the mean loss), "
                                 f"got reduction={loss.reduction!r}")
            if kind == "cross_entropy" and (loss.weight is not None or loss.label_smoothing != 0.0):
                raise ValueError("loss must be a plain nn.CrossEntropyLoss() (no class weights, no label "
                                 "smoothing): the Fisher and softmax measures assume the plain likelihood")
            return kind
    raise TypeError(f"loss must be nn.CrossEntropyLoss() or nn.MSELoss() (a loss module, mean reduction), "
                    f"got {type(loss).__name__}")


def _as_data(data) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(t, torch.Tensor) for t in data):
        x, y = data
    else:
        try:
            batches = list(data)
        except TypeError:
            raise TypeError(f"data must be a pair (x, y) of tensors or an iterable of (x, y) batches, got "
                            f"{type(data).__name__}") from None
        if not batches or not all(isinstance(b, (tuple, list)) and len(b) == 2
                                  and all(isinstance(t, torch.Tensor) for t in b) for b in batches):
            raise TypeError("data must be a pair (x, y) of tensors or a non-empty iterable of (x, y) tensor batches")
        # the mean loss over all examples is the size-weighted mean of the batch means
        x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    if x.ndim == 0 or x.shape[0] == 0:
        raise ValueError(f"data must hold at least one example, got x of shape {tuple(x.shape)}")
    if y.ndim == 0 or y.shape[0] != x.shape[0]:
        raise ValueError(f"data must hold one target per example: x has {x.shape[0]} rows, y has shape "
                         f"{tuple(y.shape)}")
    return x, y


class LossPoint:
    """A model at one parameter point, with its loss and data, and the curvature computed there.

    The measures of this section accept a ``LossPoint`` in place of ``(model, loss,
    data)``: build one to evaluate several measures at one point without recomputing the
    dense Hessian (:meth:`hessian`) and the Fisher (:meth:`fisher`), which are kept after
    their first use. The parameters are copied when the point is made; the model itself
    is only called (``torch.func.functional_call``), never changed.

    Args:
        model: a ``torch.nn.Module`` whose parameters share one float dtype; layers with
            state (batch norm) must be in eval mode.
        loss: ``nn.CrossEntropyLoss()`` (outputs are logits ``(N, K)``, targets class
            indices) or ``nn.MSELoss()`` (targets of the outputs' shape), mean reduction.
        data: ``(x, y)`` tensors or an iterable of ``(x, y)`` batches (concatenated: the
            mean loss over all examples is the size-weighted mean of the batch means).
        params: evaluate at these parameters (a dict with the names, shapes and dtypes of
            ``model.named_parameters()``) instead of the model's own.
        max_dense: the largest parameter count for which a dense Hessian or Fisher is
            formed (their cost grows as ``n^2`` in memory and ``n`` products).

    Raises:
        TypeError, ValueError: on a bad model, loss, data or params (named), or a
            non-finite loss.
    """

    def __init__(self, model: nn.Module, loss: nn.Module, data, *, params: Params | None = None,
                 max_dense: int = 5000) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.kind = _loss_kind(loss)
        floating = [p for p in model.parameters() if torch.is_floating_point(p)]
        if not floating:
            raise ValueError(f"model {type(model).__name__} has no floating-point parameters")
        dtypes = {p.dtype for p in floating}
        if len(dtypes) > 1:
            raise ValueError(f"model parameters must share one dtype, got {sorted(map(str, dtypes))}")
        if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()) and model.training:
            raise ValueError("model has batch norm in training mode: call model.eval() so the loss is a fixed function")
        self.model, self.loss, self.dtype = model, loss, dtypes.pop()
        self.max_dense = positive_int("max_dense", max_dense)
        x, y = _as_data(data)
        self.x = x.to(self.dtype) if torch.is_floating_point(x) else x
        self.y = y.to(self.dtype) if torch.is_floating_point(y) else y
        own = dict(model.named_parameters())
        if params is None:
            params = own
        elif not isinstance(params, Mapping) or set(params) != set(own):
            raise ValueError(f"params must be a dict with exactly the model's parameter names {list(own)}")
        for name, value in params.items():
            if not isinstance(value, torch.Tensor) or value.shape != own[name].shape or value.dtype != own[name].dtype:
                raise ValueError(f"params[{name!r}] must be a tensor of shape {tuple(own[name].shape)} and dtype "
                                 f"{own[name].dtype} like the model's")
        self.params = {name: params[name].detach().clone() for name in own}
        with torch.no_grad():
            try:
                outputs = self.outputs(self.params)
            except RuntimeError as err:
                raise ValueError(f"model failed on x of shape {tuple(self.x.shape)}: {err}") from err
            if self.kind == "cross_entropy" and (outputs.ndim != 2 or self.y.shape != (outputs.shape[0],)
                                                 or torch.is_floating_point(self.y)):
                raise ValueError(f"nn.CrossEntropyLoss needs logits (N, K) and integer class targets (N,), got "
                                 f"outputs {tuple(outputs.shape)} and y {tuple(self.y.shape)} {self.y.dtype}")
            if self.kind == "mse" and self.y.shape != outputs.shape:
                raise ValueError(f"nn.MSELoss needs targets of the outputs' shape {tuple(outputs.shape)}, got "
                                 f"{tuple(self.y.shape)} (a mismatch would broadcast silently)")
            value = self.loss(outputs, self.y)
        if not torch.isfinite(value):
            raise ValueError(f"the loss is not finite ({value.item()}) at the model's parameters")
        self._hessian: np.ndarray | None = None
        self._fisher: np.ndarray | None = None

    @property
    def n_parameters(self) -> int:
        return sum(p.numel() for p in self.params.values())

    @property
    def data(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x, self.y

    def model_at_point(self) -> nn.Module:
        """A copy of the model carrying the point's parameters (the model itself is not changed)."""
        import copy

        twin = copy.deepcopy(self.model)
        with torch.no_grad():
            for name, value in twin.named_parameters():
                value.copy_(self.params[name])
        return twin

    def _typed(self, params: Params) -> dict[str, torch.Tensor]:
        return {k: (v.to(self.dtype) if torch.is_floating_point(v) else v) for k, v in params.items()}

    def outputs(self, params: Params) -> torch.Tensor:
        """The model's outputs on the data with ``params``."""
        return torch.func.functional_call(self.model, self._typed(params), (self.x,))

    def loss_fn(self, params: Params) -> torch.Tensor:
        """The mean loss on the data at ``params`` (a scalar tensor)."""
        return self.loss(self.outputs(params), self.y)

    def per_example_losses(self, params: Params) -> torch.Tensor:
        """The loss of each example at ``params``; their mean is :meth:`loss_fn`."""
        out = self.outputs(params)
        if self.kind == "cross_entropy":
            return nn.functional.cross_entropy(out, self.y, reduction="none")
        return ((out - self.y) ** 2).reshape(out.shape[0], -1).mean(dim=1)

    def value(self) -> float:
        """The mean loss at the point."""
        with torch.no_grad():
            return float(self.loss_fn(self.params))

    def flat(self) -> torch.Tensor:
        """The parameters as one float64 vector (the order of ``model.named_parameters()``)."""
        return flatten_params(self.params)[0].detach().to(torch.float64)

    def unflatten(self, vector: torch.Tensor) -> dict[str, torch.Tensor]:
        return flatten_params(self.params)[1](vector)

    def value_and_gradient(self, vector: torch.Tensor) -> tuple[float, torch.Tensor]:
        """The loss and its gradient (float64, flat) at the flat parameter vector ``vector``."""
        leaf = vector.detach().to(torch.float64).clone().requires_grad_(True)
        value = self.loss_fn(self.unflatten(leaf))
        (grad,) = torch.autograd.grad(value, leaf)
        return float(value.detach()), grad.detach()

    def _check_dense(self, what: str) -> None:
        if self.n_parameters > self.max_dense:
            raise NotApplicable(f"{what} needs the dense {self.n_parameters} x {self.n_parameters} matrix, above "
                                f"max_dense = {self.max_dense}; raise max_dense if memory allows")

    def hessian(self) -> np.ndarray:
        """The dense loss Hessian (float64, symmetrised), from Hessian-vector products.

        Reverse-over-reverse products of :func:`lossgeom.curvature.hessian_operator`, one per
        column; computed once per point.
        """
        if self._hessian is None:
            from lossgeom.curvature import hessian_operator

            self._check_dense("the dense Hessian")
            operator = hessian_operator(self.loss_fn, self.params, method="reverse-over-reverse")
            H = np.asarray(operator.matmat(np.eye(operator.shape[0])), dtype=np.float64)
            self._hessian = 0.5 * (H + H.T)
        return self._hessian

    def fisher(self) -> np.ndarray:
        """The Fisher of the likelihood whose mean negative log-likelihood is the loss (float64, dense).

        For the softmax cross-entropy this is the true Fisher
        ``(1/N) sum_i J_i^T (diag p_i - p_i p_i^T) J_i``; for the mean squared error, that of
        the Gaussian likelihood with the variance that makes its mean negative
        log-likelihood the loss. Both equal the generalised Gauss-Newton matrix
        (Martens 2020), computed by :func:`lossgeom.curvature.dense_ggn`; for a model in
        another dtype than float64, on a float64 copy of it.
        """
        if self._fisher is None:
            import copy

            from lossgeom.curvature import dense_ggn

            self._check_dense("the dense Fisher")
            model, params, x, y = self.model, self.params, self.x, self.y
            if self.dtype != torch.float64:
                model = copy.deepcopy(model).to(torch.float64)
                params = {k: v.to(torch.float64) for k, v in params.items()}
                x = x.to(torch.float64) if torch.is_floating_point(x) else x
                y = y.to(torch.float64) if torch.is_floating_point(y) else y
            G = dense_ggn(model, params, x, y, self.kind).detach()
            G = np.asarray(G.to(torch.float64).numpy())
            self._fisher = 0.5 * (G + G.T)
        return self._fisher

    def block_indices(self, name: str) -> np.ndarray:
        """The positions of parameter ``name`` in the flat vector (and in the Hessian's rows)."""
        if name not in self.params:
            raise ValueError(f"{name!r} is not a parameter of the model; parameters are {sorted(self.params)}")
        start = 0
        for key, value in self.params.items():
            if key == name:
                return np.arange(start, start + value.numel())
            start += value.numel()
        raise AssertionError("unreachable")

    def classifier(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``([W b], [h 1])``: the last Linear layer (bias as an extra column) and its input features.

        The features are what the Linear layer whose output is the model's output reads on
        the data (found with forward hooks, so any model whose logits come straight from an
        ``nn.Linear`` qualifies). A bias ``b`` joins ``W`` as a last column and ``h`` gains a
        constant 1, so the logits are ``[W b] [h; 1]`` and the common-row shift acts on the
        augmented rows.

        Raises:
            NotApplicable: if the loss is not a softmax cross-entropy, or the outputs are
                not an ``nn.Linear`` layer's output.
        """
        if self.kind != "cross_entropy":
            raise NotApplicable("the softmax proxies need a softmax cross-entropy loss (nn.CrossEntropyLoss)")
        seen: list[tuple[nn.Linear, torch.Tensor, torch.Tensor]] = []
        hooks = [m.register_forward_hook(lambda mod, args, out: seen.append((mod, args[0], out)))
                 for m in self.model.modules() if isinstance(m, nn.Linear)]
        try:
            with torch.no_grad():
                out = self.outputs(self.params)
        finally:
            for hook in hooks:
                hook.remove()
        found = [(mod, h) for mod, h, o in seen if o is out]
        if not found:
            raise NotApplicable("the model's outputs are not the output of an nn.Linear layer, so there is no "
                                "softmax classifier W to read")
        module, h = found[-1]
        name = next(n for n, m in self.model.named_modules() if m is module)
        W = self.params[f"{name}.weight" if name else "weight"].detach().to(torch.float64)
        h = h.detach().to(torch.float64).reshape(h.shape[0], -1)
        if module.bias is not None:
            b = self.params[f"{name}.bias" if name else "bias"].detach().to(torch.float64)
            W = torch.cat([W, b[:, None]], dim=1)
            h = torch.cat([h, torch.ones(h.shape[0], 1, dtype=torch.float64)], dim=1)
        return W, h


def _point(model, loss, data) -> LossPoint:
    if isinstance(model, LossPoint):
        if loss is not None or data is not None:
            raise TypeError("pass either a LossPoint alone or (model, loss, data), not both")
        return model
    if loss is None or data is None:
        raise TypeError("a measure needs (model, loss, data), or one LossPoint")
    return LossPoint(model, loss, data)


def lambda_max(model, loss=None, data=None, *, tol: float = 1e-8, seed: int = 0) -> float:
    """``lambda_max(H)``: the largest eigenvalue of the loss Hessian, by Lanczos (raw sharpness).

    :func:`lossgeom.curvature.top_eigenpairs` (``scipy.sparse.linalg.eigsh``) on
    Hessian-vector products (reverse-over-reverse, the cheapest per product when many
    are taken at one point); no dense matrix is formed. Chapters ``ch04_curvature_spectrum``
    and ``ch05_step_size`` derive what it governs.
    """
    from lossgeom.curvature import hessian_operator, top_eigenpairs

    point = _point(model, loss, data)
    if point.n_parameters < 2:
        raise ValueError("lambda_max needs at least two parameters (Lanczos)")
    operator = hessian_operator(point.loss_fn, point.params, method="reverse-over-reverse")
    return float(top_eigenpairs(operator, k=1, tol=positive("tol", tol), seed=seed).values[0])


def hessian_trace(model, loss=None, data=None, *, method: str = "exact", n_hvp: int = 99, seed: int = 0) -> float:
    """``tr(H)``: the trace of the loss Hessian (the expected loss increase under isotropic noise).

    ``method="exact"`` sums the diagonal of the dense Hessian (:meth:`LossPoint.hessian`);
    ``method="hutchpp"`` estimates it from ``n_hvp`` products with Hutch++
    (:func:`lossgeom.curvature.hutchpp_trace`, Meyer et al. 2021) for models too large to
    form ``H``.
    """
    point = _point(model, loss, data)
    if method == "exact":
        return float(np.trace(point.hessian()))
    if method == "hutchpp":
        from lossgeom.curvature import hessian_operator, hutchpp_trace

        return float(hutchpp_trace(hessian_operator(point.loss_fn, point.params), n_hvp=n_hvp, seed=seed).estimate)
    raise ValueError(f"method must be 'exact' or 'hutchpp', got {method!r}")


def keskar_sharpness(model, loss=None, data=None, *, epsilon: float = 1e-3, max_iter: int = 20) -> float:
    """Keskar et al.'s (2017) epsilon-sharpness, in percent, over the box ``|z_i| <= epsilon (|theta_i| + 1)``.

    ``100 (max_{z in C} L(theta + z) - L(theta)) / (1 + L(theta))`` with the box ``C`` in the
    full parameter space (their ``A = I``); the maximum is sought as they do, by L-BFGS-B
    (``scipy.optimize.minimize``) from ``z = 0`` for at most ``max_iter`` iterations, so the
    value is a lower bound on the true maximum. The box grows with ``|theta_i|``, so a
    rescaling that preserves the function changes the set searched.
    """
    from scipy.optimize import Bounds, minimize

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
    result = minimize(negative, np.zeros(theta.numel()), jac=True, method="L-BFGS-B",
                      bounds=Bounds(-half_width, half_width),
                      options={"maxiter": max_iter, "gtol": 0.0, "ftol": 0.0})
    highest = max(-float(result.fun), base)
    return 100.0 * (highest - base) / (1.0 + base)


def sam_sharpness(model, loss=None, data=None, *, rho: float = 0.05) -> float:
    """SAM sharpness (Foret et al. 2021): ``L(theta + rho g / |g|) - L(theta)``, ``g`` the gradient.

    The first-order solution of ``max_{|e|_2 <= rho} L(theta + e) - L(theta)``, the quantity
    sharpness-aware minimisation adds to the loss; zero where the gradient vanishes.
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
    """ASAM's ``T_w``: ``|w| + eta`` on weights (parameters named ``*weight*``), 1 on the others."""
    pieces = [(p.detach().to(torch.float64).abs() + eta) if "weight" in name
              else torch.ones(p.numel(), dtype=torch.float64) for name, p in point.params.items()]
    return torch.cat([piece.reshape(-1) for piece in pieces])


def adaptive_sharpness(model, loss=None, data=None, *, rho: float = 0.5, eta: float = 0.01) -> float:
    """ASAM's adaptive sharpness (Kwon et al. 2021): ``L(theta + e) - L(theta)``, ``e = rho T^2 g / |T g|``.

    The first-order solution of ``max_{|T^-1 e|_2 <= rho} L(theta + e) - L(theta)`` with the
    element-wise normalisation ``T = diag(|w| + eta)`` on weight parameters and ``T = 1`` on
    biases and other parameters, as in the authors' implementation. With ``eta = 0`` and no
    bias the ball moves with a per-neuron rescaling and the value is invariant under it;
    ``eta > 0`` and unnormalised biases make the invariance approximate.
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
    raise NotApplicable("relative flatness needs a layer with a weight matrix (a parameter '<layer>.weight' of "
                        "two or more dimensions)")


def relative_flatness(model, loss=None, data=None, *, layer: str | None = None) -> float:
    """Petzka et al.'s (2021) relative flatness of one layer: ``sum_{s,s'} <w_s, w_s'> Tr(H_{s,s'})``.

    ``w_s`` is row ``s`` of the layer's weight (the weights into unit or channel ``s``,
    flattened for a convolution) and ``H_{s,s'}`` the Hessian block of the loss between
    rows ``s`` and ``s'``. Rescaling the layer's units (rows) by ``c_s`` multiplies
    ``<w_s, w_s'>`` by ``c_s c_s'`` and divides ``H_{s,s'}`` by it, so the value is kept; for
    the last layer of a softmax classifier it is ``kappa_exact`` (chapter
    ``ch07_softmax_gauge``).

    Args:
        layer: the layer's name prefix (``"0"`` for ``model[0]``); default the first
            parameter named ``*weight`` with two or more dimensions.
    """
    point = _point(model, loss, data)
    layer = _first_weight(point) if layer is None else layer
    name = f"{layer}.weight" if layer else "weight"
    if name not in point.params or point.params[name].ndim < 2:
        raise ValueError(f"layer {layer!r} has no weight matrix {name!r}; weights are "
                         f"{[k for k, v in point.params.items() if v.ndim >= 2]}")
    weight = point.params[name].detach().to(torch.float64)
    rows, width = weight.shape[0], weight[0].numel()
    index = point.block_indices(name)
    block = point.hessian()[np.ix_(index, index)].reshape(rows, width, rows, width)
    traces = np.einsum("sjtj->st", block)
    W = weight.reshape(rows, width).numpy()
    return float(((W @ W.T) * traces).sum())


def classifier_kappa_exact(model, loss=None, data=None) -> float:
    """``kappa_exact`` of the model's last layer: ``mean_i |h_i|^2 Tr(W^T P(p_i) W)`` (chapter ``ch07_softmax_gauge``).

    :func:`lossgeom.softmax.kappa_exact` at the classifier and features of
    :meth:`LossPoint.classifier` (a bias joins ``W`` as a column, ``h`` gains a 1).
    """
    from lossgeom import softmax

    W, h = _point(model, loss, data).classifier()
    return float(softmax.kappa_exact(W, h))


def classifier_b_raw(model, loss=None, data=None) -> float:
    """``B_raw = |W|_F^2 mean_i |h_i|^2 (1 - |p_i|^2)`` of the model's last layer (chapter ``ch07_softmax_gauge``)."""
    from lossgeom import softmax

    W, h = _point(model, loss, data).classifier()
    return float(softmax.b_raw(W, h))


def classifier_b_quot(model, loss=None, data=None) -> float:
    """``B_quot``: ``B_raw`` at the centred classifier ``W - 1 wbar^T`` (chapter ``ch07_softmax_gauge``)."""
    from lossgeom import softmax

    W, h = _point(model, loss, data).classifier()
    return float(softmax.b_quot(W, h))


def model_quotient_flatness(model, loss=None, data=None) -> float:
    """``Flat^Q`` of a two-layer bias-free ReLU regression network (chapter ``ch11_quotient_flatness``).

    :func:`lossgeom.quotient.quotient_flatness` (the trace of the Riemannian Hessian on the
    rescaling quotient) times 2, since ``nn.MSELoss`` is ``(1/N) sum (F - y)^2``, twice the
    ``(1/2N) sum (F - y)^2`` of that chapter.

    Raises:
        NotApplicable: unless the model is ``Sequential(Linear(d, m, bias=False), ReLU(),
            Linear(m, 1, bias=False))`` and the loss ``nn.MSELoss()``.
    """
    from lossgeom import quotient

    point = _point(model, loss, data)
    if point.kind != "mse":
        raise NotApplicable("Flat^Q is derived for the square loss (nn.MSELoss)")
    try:
        a, W = quotient.two_layer_weights(point.params)
        quotient.two_layer_weights(point.model)
    except (TypeError, ValueError) as err:
        raise NotApplicable(f"Flat^Q is defined for two-layer bias-free ReLU networks: {err}") from None
    if a.ndim != 1:
        raise NotApplicable("Flat^Q is derived for one output")
    x = point.x.to(torch.float64).reshape(point.x.shape[0], -1)
    return 2.0 * float(quotient.quotient_flatness(a.to(torch.float64), W.to(torch.float64), x,
                                                  point.y.to(torch.float64).reshape(-1)))


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
            raise ValueError("the Hessian has curvature in parameters the Fisher does not see (zero Fisher "
                             "diagonal): the diagonal-Fisher sharpness is infinite there")
        if seen.sum() < 2:
            return float(H[seen][:, seen].item() / diagonal[seen].item())
        return diagonal_fisher_sharpness(H[np.ix_(seen, seen)], diagonal[seen])
    raise ValueError(f"fisher must be 'true' or 'diagonal', got {fisher!r}")


def wolkowicz_styan(model, loss=None, data=None) -> float:
    """The Wolkowicz-Styan bound ``m + s sqrt(n - 1) >= lambda_max(H)`` (chapter ``ch12_high_dimensions``).

    :func:`wolkowicz_styan_bound` of the dense Hessian: ``m = tr(H) / n`` and
    ``s^2 = tr(H^2) / n - m^2``.
    """
    return wolkowicz_styan_bound(_point(model, loss, data).hessian())

"""Curvature matrices as linear operators, their spectra, traces and densities (Chapter 4).

Every curvature matrix of a loss ``L(theta)`` is exposed as a float64
``scipy.sparse.linalg.LinearOperator`` of shape (n, n) over the flattened parameters
(order of :func:`flatten_params`) that counts its matrix-vector products in ``n_hvp``:

- :func:`hessian_operator`: the Hessian H = d^2 L / d theta^2, one Hessian-vector product
  (HVP) by forward-over-reverse differentiation, ``jvp(grad L)``;
- :func:`ggn_operator`: the generalised Gauss-Newton G = J^T (d^2 l / d f^2) J of a
  model's outputs f (Schraudolph); positive semi-definite for convex losses;
- :func:`fisher_operator`: the true (type-I) Fisher for cross-entropy (equal to G, the
  loss being a canonical exponential family, Martens 2020) or the empirical Fisher
  (1/N) sum_i g_i g_i^T of per-example gradients (Kunstner et al. 2019).

Spectral tools work on any symmetric operator and report the products they used:
:func:`top_eigenpairs` (Lanczos through ``scipy.sparse.linalg.eigsh``),
:func:`power_iteration` (the baseline), :func:`hutchinson_trace` and
:func:`hutchpp_trace` (Girard-Hutchinson and Hutch++ with Rademacher probes),
:func:`spectral_density` (stochastic Lanczos quadrature with Gaussian broadening) and
:func:`spectrum_summary` (largest, most negative, trace, restricted condition number).
Dense float64 references for small models: :func:`dense_hessian`, :func:`dense_ggn`,
:func:`dense_fisher`, :func:`dense_spectral_density`. curvlinops' operators compute the
same matrices and the tests compare against them.

Zero eigenvalues and what predicts them: :func:`count_near_zero` (the count against a
threshold), :func:`relu_rescaling_tangents` and :func:`softmax_shift_tangents` (the
symmetry directions of a two-layer ReLU classifier), :func:`data_blind_directions`
(first-layer directions the training data cannot see). Along a training run:
:func:`sharpness` and :func:`sharpness_during_training`. :func:`relative_operator_difference`
compares two operators on random probes.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
import torch
from scipy.linalg import eigh_tridiagonal
from scipy.sparse.linalg import LinearOperator, aslinearoperator, eigsh
from torch import nn

from lossgeom._checks import finite_array, finite_tensor, positive, positive_int

Params = Mapping[str, torch.Tensor]
LossFn = Callable[[dict[str, torch.Tensor]], torch.Tensor]
_LOSSES = ("cross_entropy", "mse")


def flatten_params(params: Params) -> tuple[torch.Tensor, Callable[[torch.Tensor], dict[str, torch.Tensor]]]:
    """Concatenate a parameter dict into one vector; return it and the inverse map.

    The order is the dict's insertion order, so Hessian rows follow it too.
    """
    if not isinstance(params, Mapping) or not params:
        raise TypeError("params must be a non-empty dict of name -> tensor")
    names = list(params)
    tensors = []
    for name in names:
        value = params[name]
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"params[{name!r}] must be a torch.Tensor, got {type(value).__name__}")
        tensors.append(finite_tensor(f"params[{name!r}]", value))
    shapes = [t.shape for t in tensors]
    sizes = [t.numel() for t in tensors]
    flat = torch.cat([t.reshape(-1) for t in tensors])

    def unflatten(vector: torch.Tensor) -> dict[str, torch.Tensor]:
        pieces = torch.split(vector, sizes)
        return {n: p.reshape(s) for n, p, s in zip(names, pieces, shapes)}

    return flat, unflatten


def dense_hessian(loss_fn: Callable[[dict[str, torch.Tensor]], torch.Tensor], params: Params) -> torch.Tensor:
    """The full Hessian of ``loss_fn(params)`` w.r.t. all parameters, as an (n, n) tensor.

    ``loss_fn`` maps a parameter dict to a scalar tensor. Rows and columns follow the
    parameter dict's order (see :func:`flatten_params`).
    """
    flat, unflatten = flatten_params(params)

    def scalar(vector: torch.Tensor) -> torch.Tensor:
        value = loss_fn(unflatten(vector))
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise ValueError("loss_fn must return a scalar tensor")
        return value.reshape(())

    value = scalar(flat.detach())
    if not torch.isfinite(value):
        raise ValueError(f"loss_fn returned a non-finite loss ({value.item()}) at params")
    with warnings.catch_warnings():
        # torch's forward-mode AD registers its decompositions with torch.jit.script on
        # first use and warns that jit is deprecated; the warning is about torch itself.
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*", category=DeprecationWarning)
        return torch.func.hessian(scalar)(flat.detach())


def dense_gradient(loss_fn: Callable[[dict[str, torch.Tensor]], torch.Tensor], params: Params) -> torch.Tensor:
    """The gradient of ``loss_fn(params)`` as one flat vector (same order as :func:`dense_hessian`)."""
    flat, unflatten = flatten_params(params)
    return torch.func.grad(lambda v: loss_fn(unflatten(v)).reshape(()))(flat.detach())


# ---------------------------------------------------------------------------------------
# Curvature operators
# ---------------------------------------------------------------------------------------


class CurvatureOperator(LinearOperator):
    """A symmetric float64 operator on flattened parameters that counts its products.

    Subclasses implement ``_product(v: torch.Tensor) -> torch.Tensor`` for one vector.
    ``n_hvp`` counts curvature-vector products (one per column of a matrix product);
    :meth:`reset_count` sets it back to zero.
    """

    def __init__(self, n: int) -> None:
        super().__init__(dtype=np.dtype(np.float64), shape=(n, n))
        self.n_hvp = 0

    def reset_count(self) -> None:
        """Set the product counter ``n_hvp`` back to zero."""
        self.n_hvp = 0

    def _product(self, v: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _matvec(self, v: np.ndarray) -> np.ndarray:
        vec = torch.as_tensor(np.asarray(v, dtype=np.float64).reshape(-1))
        if vec.numel() != self.shape[0]:
            raise ValueError(f"vector must have {self.shape[0]} entries, got {vec.numel()}")
        with _quiet_jit_ctx():
            out = self._product(vec)
        self.n_hvp += 1
        return out.detach().numpy().reshape(np.shape(v))

    def _matmat(self, m: np.ndarray) -> np.ndarray:
        m = np.asarray(m, dtype=np.float64)
        return np.column_stack([self._matvec(m[:, j]) for j in range(m.shape[1])])

    def _rmatvec(self, v: np.ndarray) -> np.ndarray:
        return self._matvec(v)

    def _adjoint(self) -> "CurvatureOperator":
        return self

    def dense(self) -> np.ndarray:
        """The full matrix, column by column (n products; small models only)."""
        return self._matmat(np.eye(self.shape[0]))


class _quiet_jit_ctx:
    def __enter__(self):
        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*", category=DeprecationWarning)

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


def _checked_scalar_loss(loss_fn: LossFn, params: Params):
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable as loss_fn(params) -> scalar tensor")
    if not isinstance(params, Mapping) or not params:
        raise ValueError("params must be a non-empty dict of name -> tensor")
    flat, unflatten = flatten_params(params)
    flat = flat.detach().to(torch.float64)

    def scalar(vector: torch.Tensor) -> torch.Tensor:
        value = loss_fn(unflatten(vector))
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise ValueError("loss_fn must return a scalar tensor")
        return value.reshape(())

    with torch.no_grad():
        value = scalar(flat)
    if not torch.isfinite(value):
        raise ValueError(f"loss_fn returned a non-finite loss ({value.item()}) at params")
    return flat, scalar


_HVP_METHODS = ("forward-over-reverse", "linearized", "reverse-over-reverse")


class HessianOperator(CurvatureOperator):
    """The loss Hessian H at fixed parameters; ``H @ v`` is one Hessian-vector product (HVP).

    H v = d/dt grad L(theta + t v) at t = 0. ``method`` chooses how it is differentiated:

    - ``"forward-over-reverse"`` (default): ``torch.func.jvp`` of ``torch.func.grad`` on
      every product; nothing is stored between products.
    - ``"linearized"``: the same forward-over-reverse map traced once with
      ``torch.func.linearize`` (an up-front cost of seconds), then replayed per product.
    - ``"reverse-over-reverse"``: the gradient's graph is built once with
      ``create_graph=True`` and each product is one backward pass through it (PyHessian's
      approach; uses the memory of that graph).
    """

    def __init__(self, loss_fn: LossFn, params: Params, method: str = "forward-over-reverse") -> None:
        if method not in _HVP_METHODS:
            raise ValueError(f"method must be one of {list(_HVP_METHODS)}, got {method!r}")
        flat, scalar = _checked_scalar_loss(loss_fn, params)
        super().__init__(flat.numel())
        self.point = flat
        self._scalar = scalar
        self._grad = torch.func.grad(scalar)
        self._fast = None
        #: how products are computed; "forward-over-reverse" may switch to
        #: "reverse-over-reverse" on first use (see _product)
        self.mode = method
        if method == "linearized":
            with _quiet_jit_ctx(), warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # make_fx notes about constants
                self._fast = torch.func.linearize(self._grad, self.point)[1]
        elif method == "reverse-over-reverse":
            self._use_stored_graph()

    def _use_stored_graph(self) -> None:
        leaf = self.point.clone().requires_grad_(True)
        with torch.enable_grad():
            (grad,) = torch.autograd.grad(self._scalar(leaf), leaf, create_graph=True)

        def product(v: torch.Tensor) -> torch.Tensor:
            return torch.autograd.grad(grad, leaf, v, retain_graph=True)[0].detach()

        self._fast, self.mode = product, "reverse-over-reverse"

    def _product(self, v: torch.Tensor) -> torch.Tensor:
        if self._fast is None:
            try:
                return torch.func.jvp(self._grad, (self.point,), (v,))[1]
            except RuntimeError as err:
                # torch's forward-mode rule for the double backward of some losses
                # (nn.functional.mse_loss in torch 2.x) writes into an immutable zero
                # tensor; H is symmetric, so reverse-over-reverse computes the same H v.
                if "ZeroTensor" not in str(err):
                    raise
                self._use_stored_graph()
        return self._fast(v)

    def gradient(self) -> np.ndarray:
        """The gradient of the loss at the operator's point (not counted as an HVP)."""
        return self._grad(self.point).detach().numpy()


def hessian_operator(loss_fn: LossFn, params: Params, method: str = "forward-over-reverse") -> HessianOperator:
    """The Hessian of ``loss_fn`` at ``params`` as a counting LinearOperator (Chapter 4).

    Args:
        loss_fn: maps a parameter dict to a scalar tensor (e.g. from
            :func:`lossgeom.models.loss_closure`).
        params: the point, a non-empty dict of float64 tensors.
        method: how an HVP is differentiated (see :class:`HessianOperator`); the default
            is forward-over-reverse, ``torch.func.jvp`` of ``torch.func.grad``.

    Raises:
        ValueError: if ``params`` is empty, the loss is not finite at ``params``, or
            ``method`` is unknown.
    """
    return HessianOperator(loss_fn, params, method)


def _model_loss_setup(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor, loss: str):
    """Validate a (model, params, data, loss) tuple the way ``loss_closure`` does."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()) and model.training:
        raise ValueError("model has batch norm and is in training mode: call model.eval() so the loss is a fixed function")
    if loss not in _LOSSES:
        raise ValueError(f"loss must be one of {list(_LOSSES)}, got {loss!r}")
    if not isinstance(params, Mapping) or not params:
        raise ValueError("params must be a non-empty dict of name -> tensor")
    x = finite_tensor("x", x)
    if x.ndim == 0 or x.shape[0] == 0:
        raise ValueError("x must hold at least one example (empty data)")
    if not isinstance(y, torch.Tensor) or y.ndim == 0 or y.shape[0] != x.shape[0]:
        raise ValueError(f"y must be a tensor with one entry per example of x ({x.shape[0]})")
    flat, unflatten = flatten_params(params)
    flat = flat.detach().to(torch.float64)

    def outputs(vector: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(model, unflatten(vector), (x,))

    with torch.no_grad():
        out = outputs(flat)
        if loss == "cross_entropy":
            value = nn.functional.cross_entropy(out, y)
        else:
            if y.shape != out.shape:
                raise ValueError(f"for loss='mse' y must have the output's shape {tuple(out.shape)}, got {tuple(y.shape)}")
            value = nn.functional.mse_loss(out, y)
    if not torch.isfinite(value):
        raise ValueError(f"the loss is non-finite ({value.item()}) at params")
    return flat, outputs, out


def _output_jacobian(outputs, flat: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """d outputs / d theta as an (N, K, n) tensor, forward mode when n < N K (less memory)."""
    jac_fn = torch.func.jacfwd if flat.numel() < out.numel() else torch.func.jacrev
    return jac_fn(outputs)(flat).reshape(out.shape[0], -1, flat.numel())


def _output_hessian_product(out: torch.Tensor, u: torch.Tensor, loss: str) -> torch.Tensor:
    """(d^2 l / d f^2) u for the mean loss over the batch, with f the (N, K) outputs."""
    n = out.shape[0]
    if loss == "cross_entropy":
        p = torch.softmax(out, dim=1)
        return (p * u - p * (p * u).sum(dim=1, keepdim=True)) / n
    return 2.0 * u / out.numel()


class GGNOperator(CurvatureOperator):
    """The generalised Gauss-Newton G = J^T Lambda J (Chapter 4).

    J is the Jacobian of the model's outputs on the data w.r.t. the flattened
    parameters and Lambda the Hessian of the mean loss w.r.t. those outputs: for
    cross-entropy Lambda_i = (diag p_i - p_i p_i^T) / N, for mean squared error
    2 I / (N K). One product costs one Jacobian-vector and one vector-Jacobian product.
    """

    def __init__(self, model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor,
                 loss: str = "cross_entropy") -> None:
        flat, outputs, out = _model_loss_setup(model, params, x, y, loss)
        super().__init__(flat.numel())
        self.point, self._outputs, self._out, self._loss = flat, outputs, out, loss
        _, self._vjp = torch.func.vjp(outputs, flat)

    def _product(self, v: torch.Tensor) -> torch.Tensor:
        jv = torch.func.jvp(self._outputs, (self.point,), (v,))[1]
        return self._vjp(_output_hessian_product(self._out, jv, self._loss))[0]


def ggn_operator(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor,
                 loss: str = "cross_entropy") -> GGNOperator:
    """The GGN of ``loss`` (``"cross_entropy"`` or ``"mse"``, mean reduction) as an operator.

    Raises:
        ValueError: on empty data, a batch-norm model in training mode, an unknown
            loss, or a non-finite loss.
    """
    return GGNOperator(model, params, x, y, loss)


def _per_example_losses(out: torch.Tensor, y: torch.Tensor, loss: str) -> torch.Tensor:
    if loss == "cross_entropy":
        return nn.functional.cross_entropy(out, y, reduction="none")
    return ((out - y) ** 2).reshape(out.shape[0], -1).mean(dim=1)


class FisherOperator(CurvatureOperator):
    """A Fisher matrix as M^T M / N from a stored (rows, n) matrix of score vectors.

    ``kind="empirical"``: rows are the per-example gradients g_i of the loss l_i (the
    mean loss is (1/N) sum_i l_i), so F = (1/N) sum_i g_i g_i^T.
    ``kind="true"`` (cross-entropy only): rows are sqrt(p_ic) grad log p_ic for every
    class c, so F = (1/N) sum_i sum_c p_ic grad log p_ic grad log p_ic^T, the expected
    outer product under the model's own predictive distribution.
    """

    def __init__(self, model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor,
                 loss: str = "cross_entropy", kind: str = "empirical") -> None:
        if kind not in ("empirical", "true"):
            raise ValueError(f"kind must be 'empirical' or 'true', got {kind!r}")
        if kind == "true" and loss != "cross_entropy":
            raise ValueError("kind='true' is implemented for loss='cross_entropy'; for a Gaussian "
                             "likelihood (mse) the true Fisher is proportional to the GGN: use ggn_operator")
        flat, outputs, out = _model_loss_setup(model, params, x, y, loss)
        super().__init__(flat.numel())
        self.point, self.kind = flat, kind
        n_examples = out.shape[0]
        with _quiet_jit_ctx():
            jac = _output_jacobian(outputs, flat, out)  # (N, K, n)
        if kind == "empirical":
            out_req = out.detach().clone().requires_grad_(True)
            losses = _per_example_losses(out_req, y, loss)
            (dl_df,) = torch.autograd.grad(losses.sum(), out_req)
            rows = torch.einsum("ik,ikn->in", dl_df.reshape(n_examples, -1), jac)
        else:
            p = torch.softmax(out, dim=1)
            eye = torch.eye(out.shape[1], dtype=out.dtype)
            # grad_f log p_c = e_c - p, so grad_theta log p_c = J^T (e_c - p)
            dlog = eye[None, :, :] - p[:, None, :]  # (N, c, K)
            rows = torch.einsum("ick,ikn->icn", dlog, jac) * p.sqrt()[:, :, None]
            rows = rows.reshape(-1, flat.numel())
        self.scores = rows.detach() / math.sqrt(n_examples)

    def _product(self, v: torch.Tensor) -> torch.Tensor:
        return self.scores.T @ (self.scores @ v)

    def dense(self) -> np.ndarray:
        """The full matrix M^T M / N from the stored scores (no products counted)."""
        return (self.scores.T @ self.scores).numpy()


def fisher_operator(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor,
                    loss: str = "cross_entropy", kind: str = "empirical") -> FisherOperator:
    """The empirical (``kind="empirical"``) or true (``kind="true"``) Fisher as an operator.

    Stores per-example (or per-example-and-class) score vectors: small models only.
    """
    return FisherOperator(model, params, x, y, loss, kind)


def dense_ggn(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor,
              loss: str = "cross_entropy") -> torch.Tensor:
    """Dense reference G = sum_i J_i^T Lambda_i J_i from the full output Jacobian."""
    flat, outputs, out = _model_loss_setup(model, params, x, y, loss)
    with _quiet_jit_ctx():
        jac = _output_jacobian(outputs, flat, out)
    n_examples, k = jac.shape[0], jac.shape[1]
    if loss == "cross_entropy":
        p = torch.softmax(out, dim=1)
        lam = (torch.diag_embed(p) - p[:, :, None] * p[:, None, :]) / n_examples
    else:
        lam = 2.0 * torch.eye(k).expand(n_examples, k, k) / out.numel()
    return torch.einsum("ikn,ikl,ilm->nm", jac, lam, jac)


def dense_fisher(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor,
                 loss: str = "cross_entropy", kind: str = "empirical") -> torch.Tensor:
    """Dense reference of :func:`fisher_operator`, from per-example gradients by autograd."""
    if kind not in ("empirical", "true"):
        raise ValueError(f"kind must be 'empirical' or 'true', got {kind!r}")
    if kind == "true":
        scores = FisherOperator(model, params, x, y, loss, kind).scores
        return scores.T @ scores
    flat, outputs, out = _model_loss_setup(model, params, x, y, loss)
    def example_loss(vector, xi, yi):
        o = torch.func.functional_call(model, flatten_params(params)[1](vector), (xi[None],))
        return _per_example_losses(o, yi[None], loss)[0]

    grads = torch.func.vmap(torch.func.grad(example_loss), in_dims=(None, 0, 0))(flat, x, y)
    return grads.T @ grads / x.shape[0]


# ---------------------------------------------------------------------------------------
# Spectra
# ---------------------------------------------------------------------------------------


class _Counted(LinearOperator):
    """Wrap any square operator and count its matrix-vector products."""

    def __init__(self, operator) -> None:
        if isinstance(operator, torch.Tensor):
            operator = operator.detach().numpy()
        op = aslinearoperator(operator)
        if op.shape[0] != op.shape[1]:
            raise ValueError(f"operator must be square, got shape {op.shape}")
        super().__init__(dtype=np.dtype(np.float64), shape=op.shape)
        self._op, self.count = op, 0

    def _matvec(self, v):
        self.count += 1
        return np.asarray(self._op.matvec(np.asarray(v, dtype=np.float64)), dtype=np.float64)

    def _matmat(self, m):
        return np.column_stack([self._matvec(m[:, j]) for j in range(m.shape[1])])

    def _adjoint(self):
        return self


@dataclass(frozen=True)
class EigenResult:
    """Extreme eigenpairs of a symmetric operator and what they cost.

    Attributes:
        values: eigenvalues, descending for ``which="largest"``, ascending for ``"smallest"``.
        vectors: (n, k) orthonormal eigenvectors, column j for ``values[j]``.
        n_hvp: products the eigensolver used (the k residual checks excluded).
        residuals: ||A v_j - lambda_j v_j|| for each pair (k extra products).
    """

    values: np.ndarray
    vectors: np.ndarray
    n_hvp: int
    residuals: np.ndarray


def top_eigenpairs(operator, k: int = 1, which: str = "largest", tol: float = 1e-10,
                   seed: int = 0, ncv: int | None = None) -> EigenResult:
    """The k largest (or smallest, i.e. most negative) eigenpairs by Lanczos (Chapter 4).

    Implicitly restarted Lanczos, ``scipy.sparse.linalg.eigsh`` with ``which='LA'`` or
    ``'SA'``, from a start vector drawn by ``numpy.random.default_rng(seed)``.

    ``ncv`` is the Lanczos basis size kept between restarts (eigsh's default
    max(2k + 1, 20) when None); the first restart cycle alone costs ``ncv`` products.

    Raises:
        ValueError: if ``k < 1``, ``k >= n`` (eigsh needs k < n; use
            ``numpy.linalg.eigh`` of a dense reference instead) or ``which`` is not
            ``"largest"`` or ``"smallest"``.
    """
    if which not in ("largest", "smallest"):
        raise ValueError(f"which must be 'largest' or 'smallest', got {which!r}")
    counted = _Counted(operator)
    n = counted.shape[0]
    k = positive_int("k", k)
    if k >= n:
        raise ValueError(f"k must be < n = {n} for Lanczos (eigsh needs k < n), got k = {k}; "
                         "for all eigenvalues of a small model use numpy.linalg.eigh on a dense "
                         "reference (dense_hessian)")
    tol = positive("tol", tol)
    v0 = np.random.default_rng(seed).standard_normal(n)
    if ncv is not None:
        ncv = positive_int("ncv", ncv)
        if not k < ncv <= n:
            raise ValueError(f"ncv must satisfy k < ncv <= n = {n}, got ncv = {ncv} with k = {k}")
    values, vectors = eigsh(counted, k=k, which="LA" if which == "largest" else "SA", tol=tol, v0=v0, ncv=ncv)
    order = np.argsort(values)[::-1] if which == "largest" else np.argsort(values)
    values, vectors = values[order], vectors[:, order]
    used = counted.count
    residuals = np.linalg.norm(counted.matmat(vectors) - vectors * values, axis=0)
    return EigenResult(values, vectors, used, residuals)


def power_iteration(operator, rel_tol: float = 1e-8, max_iter: int = 10_000, seed: int = 0,
                    reference: float | None = None) -> tuple[float, int]:
    """The dominant eigenvalue by plain power iteration (the baseline Lanczos is compared with).

    Iterates v <- A v / ||A v|| and the Rayleigh quotient v^T A v. Stops when it changes by
    less than ``rel_tol`` relatively or, if ``reference`` is given, as soon as it is within
    ``rel_tol`` of it (an oracle stop: the fewest products power iteration could need).

    Returns:
        (eigenvalue estimate, number of products).
    """
    counted = _Counted(operator)
    rel_tol = positive("rel_tol", rel_tol)
    max_iter = positive_int("max_iter", max_iter)
    v = np.random.default_rng(seed).standard_normal(counted.shape[0])
    v /= np.linalg.norm(v)
    estimate = None
    for _ in range(max_iter):
        w = counted.matvec(v)
        new = float(v @ w)
        if reference is not None:
            if abs(new - reference) <= rel_tol * abs(reference):
                return new, counted.count
        elif estimate is not None and abs(new - estimate) <= rel_tol * abs(new):
            return new, counted.count
        estimate = new
        norm = np.linalg.norm(w)
        if norm == 0:
            return 0.0, counted.count
        v = w / norm
    return float(estimate), counted.count


@dataclass(frozen=True)
class TraceEstimate:
    """A stochastic trace estimate: value, standard error, products and probes used."""

    estimate: float
    std_error: float
    n_hvp: int
    n_probes: int


def _rademacher(rng: np.random.Generator, n: int, m: int) -> np.ndarray:
    return rng.choice(np.array([-1.0, 1.0]), size=(n, m))


def hutchinson_trace(operator, n_probes: int = 100, seed: int = 0,
                     target_rel_se: float | None = None, max_probes: int = 10_000,
                     batch: int = 10) -> TraceEstimate:
    """Girard-Hutchinson trace estimate mean_j z_j^T A z_j with Rademacher z_j (Chapter 4).

    Unbiased; its standard error is the sample standard deviation of z^T A z over sqrt(m).
    With ``target_rel_se``, probes are added ``batch`` at a time (from ``n_probes``) until
    ``std_error <= target_rel_se * abs(estimate)`` or ``max_probes`` is reached.
    """
    counted = _Counted(operator)
    n = counted.shape[0]
    n_probes = positive_int("n_probes", n_probes)
    if n_probes < 2:
        raise ValueError("n_probes must be >= 2 to estimate a standard error")
    rng = np.random.default_rng(seed)
    samples: list[float] = []

    def draw(m):
        z = _rademacher(rng, n, m)
        samples.extend(np.einsum("ij,ij->j", z, counted.matmat(z)).tolist())

    draw(n_probes)
    if target_rel_se is not None:
        target = positive("target_rel_se", target_rel_se)
        max_probes = positive_int("max_probes", max_probes)
        while len(samples) < max_probes:
            s = np.asarray(samples)
            if s.std(ddof=1) / math.sqrt(len(s)) <= target * abs(s.mean()):
                break
            draw(min(batch, max_probes - len(samples)))
    s = np.asarray(samples)
    return TraceEstimate(float(s.mean()), float(s.std(ddof=1) / math.sqrt(len(s))), counted.count, len(s))


def hutchpp_trace(operator, n_hvp: int = 99, seed: int = 0) -> TraceEstimate:
    """Hutch++ (Meyer et al. 2021): exact trace on a sketched top subspace, Hutchinson on the rest.

    With m = n_hvp // 3: S, G Rademacher (n x m); Q = orth(A S);
    tr(A) ~ tr(Q^T A Q) + mean_j g_j^T (I - QQ^T) A (I - QQ^T) g_j. The standard error is
    that of the second (Hutchinson) term. Uses 3m products.
    """
    counted = _Counted(operator)
    n = counted.shape[0]
    n_hvp = positive_int("n_hvp", n_hvp)
    m = n_hvp // 3
    if m < 2:
        raise ValueError(f"n_hvp must be >= 6 (three blocks of >= 2 probes), got {n_hvp}")
    rng = np.random.default_rng(seed)
    s, g = _rademacher(rng, n, m), _rademacher(rng, n, m)
    q, _ = np.linalg.qr(counted.matmat(s))
    low_rank = float(np.trace(q.T @ counted.matmat(q)))
    g_perp = g - q @ (q.T @ g)
    samples = np.einsum("ij,ij->j", g_perp, counted.matmat(g_perp))
    return TraceEstimate(low_rank + float(samples.mean()), float(samples.std(ddof=1) / math.sqrt(m)),
                         counted.count, 2 * m)


@dataclass(frozen=True)
class SpectralDensity:
    """A smoothed spectral density phi(x) = (1/n) sum_i N(x; lambda_i, sigma^2), estimated.

    Attributes:
        grid: the points x where the density is evaluated.
        density: phi on the grid (integrates to about 1 over a wide enough grid).
        nodes, weights: per probe, the Ritz values and quadrature weights (n_probes rows).
        sigma: the Gaussian broadening.
        n_hvp: products used (n_probes * n_lanczos at most).
    """

    grid: np.ndarray
    density: np.ndarray
    nodes: np.ndarray
    weights: np.ndarray
    sigma: float
    n_hvp: int


def _lanczos(counted: LinearOperator, v: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Lanczos tridiagonalisation with full reorthogonalisation; returns (alpha, beta)."""
    n = counted.shape[0]
    basis = np.zeros((n, steps))
    alpha, beta = [], []
    q = v / np.linalg.norm(v)
    for j in range(steps):
        basis[:, j] = q
        w = counted.matvec(q)
        alpha.append(float(q @ w))
        w = w - basis[:, : j + 1] @ (basis[:, : j + 1].T @ w)
        w = w - basis[:, : j + 1] @ (basis[:, : j + 1].T @ w)
        b = float(np.linalg.norm(w))
        if j == steps - 1 or b <= 1e-12 * max(1.0, abs(alpha[0])):
            break
        beta.append(b)
        q = w / b
    return np.asarray(alpha), np.asarray(beta)


def gaussian_broadening(points: np.ndarray, weights: np.ndarray, grid: np.ndarray, sigma: float) -> np.ndarray:
    """sum_k w_k N(x; points_k, sigma^2) evaluated on ``grid``."""
    z = (np.asarray(grid)[:, None] - np.asarray(points)[None, :]) / sigma
    return (np.exp(-0.5 * z**2) @ np.asarray(weights)) / (sigma * math.sqrt(2 * math.pi))


def spectral_density(operator, grid, n_probes: int = 10, n_lanczos: int = 80, sigma: float = 0.01,
                     seed: int = 0) -> SpectralDensity:
    """Stochastic Lanczos quadrature (Lin, Saad and Yang 2016; Ghorbani et al. 2019).

    For each Rademacher probe z, ``n_lanczos`` Lanczos steps from z / ||z|| give a
    tridiagonal T = U diag(theta) U^T; the quadrature nodes are theta_k with weights
    U[0, k]^2, so sum_k U[0,k]^2 f(theta_k) ~ z^T f(A) z / ||z||^2. The density is the
    probe average of the nodes broadened by Gaussians of width ``sigma``.
    """
    counted = _Counted(operator)
    n = counted.shape[0]
    grid = finite_array("grid", grid, ndim=1)
    n_probes = positive_int("n_probes", n_probes)
    n_lanczos = positive_int("n_lanczos", n_lanczos)
    if n_lanczos > n:
        raise ValueError(f"n_lanczos must be <= n = {n}, got {n_lanczos}")
    sigma = positive("sigma", sigma)
    rng = np.random.default_rng(seed)
    nodes = np.full((n_probes, n_lanczos), np.nan)
    weights = np.zeros((n_probes, n_lanczos))
    density = np.zeros_like(grid)
    for p in range(n_probes):
        alpha, beta = _lanczos(counted, _rademacher(rng, n, 1)[:, 0], n_lanczos)
        theta, u = eigh_tridiagonal(alpha, beta) if len(alpha) > 1 else (alpha, np.ones((1, 1)))
        w = u[0, :] ** 2
        nodes[p, : len(theta)], weights[p, : len(theta)] = theta, w
        density += gaussian_broadening(theta, w, grid, sigma) / n_probes
    return SpectralDensity(grid, density, nodes, weights, sigma, counted.count)


def dense_spectral_density(eigenvalues, grid, sigma: float) -> np.ndarray:
    """The exact smoothed density (1/n) sum_i N(x; lambda_i, sigma^2) from all eigenvalues."""
    ev = finite_array("eigenvalues", eigenvalues, ndim=1)
    sigma = positive("sigma", sigma)
    return gaussian_broadening(ev, np.full(len(ev), 1.0 / len(ev)), finite_array("grid", grid, ndim=1), sigma)


@dataclass(frozen=True)
class SpectrumSummary:
    """Statistics of a symmetric matrix's spectrum that answer different questions (claim M2).

    With ``threshold = rel_threshold * largest``: ``largest`` and ``most_negative`` are
    the extreme eigenvalues, ``trace`` their sum, ``n_negative`` and ``negative_mass`` the
    count and sum of eigenvalues below ``-threshold``, ``condition_number`` is the largest
    over the smallest eigenvalue above ``threshold`` (the positive part only), and
    ``n_near_zero`` counts eigenvalues with ``abs(lambda) <= threshold``.
    """

    largest: float
    most_negative: float
    trace: float
    n_negative: int
    negative_mass: float
    condition_number: float
    n_near_zero: int
    rel_threshold: float


def spectrum_summary(eigenvalues, rel_threshold: float = 1e-6) -> SpectrumSummary:
    """Summarise a full spectrum; the condition number is restricted to eigenvalues > threshold."""
    ev = np.sort(finite_array("eigenvalues", eigenvalues, ndim=1))
    if ev.size == 0:
        raise ValueError("eigenvalues must not be empty")
    rel_threshold = positive("rel_threshold", rel_threshold)
    if ev[-1] <= 0:
        raise ValueError("the largest eigenvalue must be > 0 for a relative threshold")
    thr = rel_threshold * ev[-1]
    above = ev[ev > thr]
    negative = ev[ev < -thr]
    return SpectrumSummary(float(ev[-1]), float(ev[0]), float(ev.sum()), int(negative.size),
                           float(negative.sum()), float(ev[-1] / above[0]), int(np.sum(np.abs(ev) <= thr)),
                           rel_threshold)


def taylor_remainders(loss_fn: LossFn, params: Params, direction, steps) -> tuple[np.ndarray, np.ndarray]:
    """Remainders of the first- and second-order Taylor models along ``direction``.

    ``r1(t) = abs(L(theta + t d) - L - t g.d)`` (order t^2) and
    ``r2(t) = abs(L(theta + t d) - L - t g.d - t^2/2 d.H d)`` (order t^3, H d one HVP):
    the log-log slopes 2 and 3 check the gradient and the HVP (pymanopt's check).
    """
    op = hessian_operator(loss_fn, params)
    flat, scalar = op.point, _checked_scalar_loss(loss_fn, params)[1]
    d = torch.as_tensor(finite_array("direction", direction, ndim=1))
    if d.numel() != flat.numel():
        raise ValueError(f"direction must have {flat.numel()} entries, got {d.numel()}")
    steps = finite_array("steps", steps, ndim=1)
    base = float(scalar(flat))
    slope = float(torch.as_tensor(op.gradient()) @ d)
    curv = float(d @ torch.as_tensor(op.matvec(d.numpy())))
    with torch.no_grad():
        values = np.array([float(scalar(flat + t * d)) for t in steps])
    r1 = np.abs(values - base - steps * slope)
    r2 = np.abs(values - base - steps * slope - 0.5 * steps**2 * curv)
    return r1, r2


# ---------------------------------------------------------------------------------------
# Comparing operators; the sharpness along a run (chapters "Curvature is a spectrum" and
# "Step size meets curvature")
# ---------------------------------------------------------------------------------------


def relative_operator_difference(reference, other, probes) -> float:
    """``max |(A - B) V| / max |A V|`` over the columns of ``probes`` (a Freivalds-type check).

    Compares two symmetric operators (arrays, ``LinearOperator``s, or anything with ``@``)
    on a few random vectors instead of forming them: if ``A != B`` a random ``V`` sees the
    difference with probability one. Used in the chapter "Curvature is a spectrum" to
    compare the HVP operator with the dense Hessian and with curvlinops.

    Args:
        reference: the operator ``A`` the difference is measured against.
        other: the operator ``B``.
        probes: an ``(n, m)`` array of probe vectors (a 1-D array is one probe).

    Raises:
        ValueError: if ``probes`` is not finite, has the wrong number of rows, or
            ``A V`` is zero (no scale to compare with).
    """
    probes = finite_array("probes", probes)
    if probes.ndim == 1:
        probes = probes[:, None]
    if probes.ndim != 2:
        raise ValueError(f"probes must be an (n, m) array, got shape {probes.shape}")
    n = np.shape(reference)[0] if hasattr(reference, "shape") else None
    if n is not None and probes.shape[0] != n:
        raise ValueError(f"probes must have {n} rows (the operator's size), got {probes.shape[0]}")
    a_v = np.asarray(reference @ probes, dtype=np.float64)
    b_v = np.asarray(other @ probes, dtype=np.float64)
    scale = np.abs(a_v).max()
    if scale == 0:
        raise ValueError("reference @ probes is zero: there is no scale to compare the difference with")
    return float(np.abs(a_v - b_v).max() / scale)


def sharpness(loss_fn: LossFn, params: Params, tol: float = 1e-8, seed: int = 0,
              method: str = "reverse-over-reverse") -> float:
    """The sharpness ``lambda_max(H)``: the largest Hessian eigenvalue, by Lanczos.

    :func:`top_eigenpairs` (``k = 1``) on :func:`hessian_operator`; the eigenpair's
    residual ``||H v - lambda v||`` is checked against ``100 * tol * |lambda|``. Gradient
    descent on the local quadratic model is stable iff ``eta * lambda_max < 2`` (chapter
    "Step size meets curvature"). ``method`` is how an HVP is differentiated (see
    :class:`HessianOperator`); reverse-over-reverse is fastest for many products at a point.

    Raises:
        ValueError: on a bad ``loss_fn``/``params``/``method``/``tol`` (as the functions
            called), or if Lanczos returns a pair whose residual is above that check.
    """
    result = top_eigenpairs(hessian_operator(loss_fn, params, method), k=1, which="largest",
                            tol=tol, seed=seed)
    value = float(result.values[0])
    if not result.residuals[0] <= 100 * tol * max(abs(value), 1e-300):
        raise ValueError(f"Lanczos did not converge: residual {result.residuals[0]:.3g} for "
                         f"eigenvalue {value:.6g} (tol {tol:g})")
    return value


@dataclass(frozen=True)
class SharpnessRun:
    """A training run with the sharpness measured at chosen steps.

    Attributes:
        measured_at: the steps at which the sharpness was measured (ascending).
        sharpness: ``lambda_max(H)`` at those steps (before the update of that step; the
            value at ``steps`` is after the last update).
        losses: the loss before each update, ``steps`` values.
        params: the final parameters.
    """

    measured_at: np.ndarray
    sharpness: np.ndarray
    losses: np.ndarray
    params: dict[str, torch.Tensor]


def sharpness_during_training(loss_fn, params: Params, optimiser, steps: int, measure_at,
                              tol: float = 1e-8, seed: int = 0) -> SharpnessRun:
    """Train with :func:`lossgeom.optimisers.train` and measure :func:`sharpness` at given steps.

    ``loss_fn(params, indices)`` is an indexed loss (:func:`lossgeom.optimisers.indexed_loss`);
    the sharpness is that of the full-batch loss ``loss_fn(params, None)``. ``measure_at``
    lists steps in ``0..steps``; only those cost a Lanczos run, so a chapter can sample a
    late phase densely and the rest sparsely (chapter "Step size meets curvature").

    Raises:
        ValueError: if ``measure_at`` is empty or holds a step outside ``0..steps``.
    """
    from lossgeom.optimisers import train

    steps = positive_int("steps", steps)
    wanted = sorted({int(s) for s in np.asarray(measure_at).reshape(-1)})
    if not wanted or wanted[0] < 0 or wanted[-1] > steps:
        raise ValueError(f"measure_at must list steps between 0 and steps = {steps}, got {list(measure_at)}")
    wanted_set, calls = set(wanted), [0]

    def monitor(point):
        step = calls[0]  # train calls the monitor at every step, then once after the last
        calls[0] += 1
        if step not in wanted_set:
            return None
        return sharpness(lambda p: loss_fn(p, None), point, tol=tol, seed=seed)

    run = train(loss_fn, params, optimiser, steps, monitor=monitor, monitor_every=1)
    measured = [(s, v) for s, v in run.monitored if v is not None]
    return SharpnessRun(np.array([s for s, _ in measured]), np.array([v for _, v in measured]),
                        run.losses, run.params)


# ---------------------------------------------------------------------------------------
# Zero eigenvalues predicted by symmetries and by the data (chapter "Curvature is a spectrum")
# ---------------------------------------------------------------------------------------


def relative_magnitudes(eigenvalues) -> np.ndarray:
    """``|lambda_i| / max_j |lambda_j|``, sorted ascending (smallest magnitude first)."""
    ev = finite_array("eigenvalues", eigenvalues, ndim=1)
    if ev.size == 0 or not np.abs(ev).max() > 0:
        raise ValueError("eigenvalues must be non-empty and not all zero")
    return np.sort(np.abs(ev)) / np.abs(ev).max()


def count_near_zero(eigenvalues, rel_thresholds) -> np.ndarray:
    """How many eigenvalues have ``|lambda| <= tau * max|lambda|``, for each ``tau``.

    A count of "zero" eigenvalues needs such a threshold; the chapter "Curvature is a
    spectrum" shows the count as a function of ``tau`` rather than at one value.

    Raises:
        ValueError: if a threshold is not > 0, or the eigenvalues are empty or all zero.
    """
    rel = relative_magnitudes(eigenvalues)
    taus = finite_array("rel_thresholds", rel_thresholds)
    if np.any(taus <= 0):
        raise ValueError("rel_thresholds must be > 0")
    return np.searchsorted(rel, taus, side="right")


def _two_layer(params: Params, in_layer: str, out_layer: str) -> tuple[str, str, str, str]:
    """Validate a two-layer network's parameter names and shapes; return the four names."""
    if not isinstance(params, Mapping) or not params:
        raise TypeError("params must be a non-empty dict of name -> tensor")
    names = tuple(f"{layer}.{kind}" for layer in (in_layer, out_layer) for kind in ("weight", "bias"))
    missing = [n for n in names if n not in params]
    if missing:
        raise ValueError(f"params must hold {list(names)} (a two-layer network with biases); "
                         f"missing {missing}")
    w_in, b_in, w_out, b_out = (params[n] for n in names)
    width = w_in.shape[0]
    if (w_in.ndim != 2 or b_in.shape != (width,) or w_out.ndim != 2 or w_out.shape[1] != width
            or b_out.shape != (w_out.shape[0],)):
        raise ValueError(f"inconsistent shapes: {names[0]} {tuple(w_in.shape)}, {names[1]} "
                         f"{tuple(b_in.shape)}, {names[2]} {tuple(w_out.shape)}, {names[3]} "
                         f"{tuple(b_out.shape)}")
    return names


def _flat_direction(params: Params, pieces: Mapping[str, torch.Tensor]) -> np.ndarray:
    """A flattened parameter vector that is ``pieces`` on their names and zero elsewhere."""
    full = {name: torch.zeros_like(p) for name, p in params.items()}
    full.update(pieces)
    return flatten_params(full)[0].numpy()


def relu_rescaling_generators(params: Params, in_layer: str = "0", out_layer: str = "2") -> np.ndarray:
    """The diagonal generators ``A_j`` of the per-unit ReLU rescalings, one column per unit.

    Rescaling unit ``j`` by ``c`` multiplies its incoming weights and bias by ``c`` and its
    outgoing weights by ``1/c``; its tangent at ``c = 1`` is ``t_j = A_j theta`` with
    ``A_j = +1`` on the incoming entries, ``-1`` on the outgoing ones and 0 elsewhere.
    Column ``j`` holds that diagonal, flattened like :func:`flatten_params`.
    """
    w_in, b_in, w_out, _ = _two_layer(params, in_layer, out_layer)
    columns = []
    for j in range(params[w_in].shape[0]):
        pieces = {name: torch.zeros_like(params[name]) for name in (w_in, b_in, w_out)}
        pieces[w_in][j], pieces[b_in][j], pieces[w_out][:, j] = 1.0, 1.0, -1.0
        columns.append(_flat_direction(params, pieces))
    return np.stack(columns, axis=1)


def relu_rescaling_tangents(params: Params, in_layer: str = "0", out_layer: str = "2") -> np.ndarray:
    """Tangents ``t_j = A_j theta`` of the per-unit ReLU rescalings, one column per hidden unit.

    Since ``relu(c z) = c relu(z)`` for ``c > 0`` the loss is constant along each
    rescaling orbit, so ``grad L . t_j = 0`` everywhere and, differentiating once more,
    ``H t_j = -A_j grad L``: a Hessian null vector only at a critical point (chapter
    "Curvature is a spectrum"; :func:`lossgeom.symmetries.relu_neuron_rescaling` is the
    finite transform).
    """
    flat = flatten_params(params)[0].numpy()
    return relu_rescaling_generators(params, in_layer, out_layer) * flat[:, None]


def softmax_shift_tangents(params: Params, in_layer: str = "0", out_layer: str = "2") -> np.ndarray:
    """Tangents of the softmax shift ``W2 -> W2 + 1 v^T``, ``b2 -> b2 + s 1``: ``width + 1`` columns.

    Softmax only sees differences of logits, so adding the same vector to every row of
    the output weights (and the same number to every output bias) leaves the loss
    unchanged. The tangents are constant (a translation), so they are Hessian null
    vectors at every point (chapter "Curvature is a spectrum"). Columns ``0..width-1``
    shift column ``i`` of every row by one; the last column shifts the bias.
    """
    _, _, w_out, b_out = _two_layer(params, in_layer, out_layer)
    k, width = params[w_out].shape
    columns = []
    for i in range(width):
        shift = torch.zeros(k, width, dtype=params[w_out].dtype)
        shift[:, i] = 1.0
        columns.append(_flat_direction(params, {w_out: shift}))
    columns.append(_flat_direction(params, {b_out: torch.ones(k, dtype=params[b_out].dtype)}))
    return np.stack(columns, axis=1)


def data_blind_directions(params: Params, x: torch.Tensor, in_layer: str = "0", out_layer: str = "2",
                          within_units: bool = False, rel_tol: float = 1e-10) -> np.ndarray:
    """First-layer directions of a two-layer ReLU network that no training output registers.

    For ``f(x) = W2 relu(W1 x + b1) + b2`` a first-layer change ``(dW1, db1)`` moves the
    logits of example ``i`` by ``W2 D_i (dW1 x_i + db1)`` to first order, ``D_i`` the 0/1
    activation pattern of ``x_i``. Softmax ignores multiples of the all-ones vector, so the
    change is invisible on the data iff ``P W2 D_i (dW1 x_i + db1) = 0`` for every ``i``,
    ``P = I - 11^T / K``. Such directions are exact null vectors of the Gauss-Newton matrix
    wherever the softmax probabilities are positive, and of the Hessian where the residuals
    vanish too. They come from the data (pixels seen by few images, units whose active
    inputs are rank-deficient), not from a symmetry of the model (chapter "Curvature is a
    spectrum").

    Args:
        params: the network, with ``f"{in_layer}.weight"``/``.bias`` and
            ``f"{out_layer}.weight"``/``.bias``.
        x: the training inputs, shape ``(N, d)``.
        within_units: if True, return only directions that move one unit's weights with
            ``dW1_j x_i + db1_j = 0`` on every example where unit ``j`` is active (the rank
            deficit of that unit's active inputs); these change no logit at all.
        rel_tol: singular values below ``rel_tol`` times the largest count as zero.

    Returns:
        An ``(n, k)`` array whose columns are an orthonormal basis of those directions,
        flattened like :func:`flatten_params` (zero outside the first layer).

    Raises:
        ValueError: on inconsistent parameter names or shapes, or ``x`` of the wrong width.
    """
    w_in, b_in, w_out, _ = _two_layer(params, in_layer, out_layer)
    x = finite_tensor("x", x)
    width, d = params[w_in].shape
    if x.ndim != 2 or x.shape[1] != d:
        raise ValueError(f"x must have shape (N, {d}) for {w_in} of shape {(width, d)}, got {tuple(x.shape)}")
    rel_tol = positive("rel_tol", rel_tol)
    with torch.no_grad():
        active = ((x @ params[w_in].T + params[b_in]) > 0).numpy().astype(np.float64)
    inputs = np.concatenate([x.numpy(), np.ones((x.shape[0], 1))], axis=1)  # (N, d + 1)

    def kernel(matrix: np.ndarray) -> np.ndarray:
        if matrix.shape[0] == 0:
            return np.eye(matrix.shape[1])
        r = np.linalg.qr(matrix, mode="r") if matrix.shape[0] > matrix.shape[1] else matrix
        _, sing, vt = np.linalg.svd(r)
        sing = np.concatenate([sing, np.zeros(vt.shape[0] - sing.size)])
        return vt[sing <= rel_tol * max(sing.max(), 1e-300)].T

    def embed(blocks: np.ndarray) -> np.ndarray:  # (width, d + 1, k) -> (n, k)
        columns = []
        for c in range(blocks.shape[2]):
            pieces = {w_in: torch.from_numpy(blocks[:, :d, c].copy()),
                      b_in: torch.from_numpy(blocks[:, d, c].copy())}
            columns.append(_flat_direction(params, pieces))
        return np.stack(columns, axis=1) if columns else np.zeros((flatten_params(params)[0].numel(), 0))

    if within_units:
        blocks = []
        for j in range(width):
            null = kernel(inputs[active[:, j] > 0])
            for c in range(null.shape[1]):
                block = np.zeros((width, d + 1))
                block[j] = null[:, c]
                blocks.append(block)
        return embed(np.stack(blocks, axis=2) if blocks else np.zeros((width, d + 1, 0)))
    k = params[w_out].shape[0]
    centred = (np.eye(k) - 1.0 / k) @ params[w_out].numpy()  # P W2, (K, width)
    jacobian = np.einsum("kj,ij,ia->ikja", centred, active, inputs).reshape(-1, width * (d + 1))
    null = kernel(jacobian)
    return embed(null.reshape(width, d + 1, -1))

"""Curvature matrices as torch-native linear operators: Hessian, generalised Gauss-Newton, Fisher.

Every operator here is an ``(n, n)`` symmetric matrix on the flattened parameters
(:func:`lossgeom.curvature.flatten_params`) that is never formed: ``A @ M`` multiplies it
onto an ``(n, k)`` block of vectors in one batched product (``torch.func.vmap`` or
``torch.autograd.grad(..., is_grads_batched=True)``, no Python loop over columns), in the
model's own dtype and on its device. ``n_hvp`` counts products, one per column;
``.to_scipy()`` is a float64 ``scipy.sparse.linalg.LinearOperator`` view for scipy's
eigensolvers; ``@`` with a NumPy array returns a NumPy float64 array.

- :func:`hessian_operator`: ``H = d^2 L / d theta^2``; ``H v = d/dt grad L(theta + t v)``
  at ``t = 0`` (the chapter "Curvature is a spectrum").
- :func:`ggn_operator`: ``G = sum_b J_b^T Lambda_b J_b`` with ``J_b`` the Jacobian of the
  outputs on batch ``b`` and ``Lambda_b`` the Hessian of the loss w.r.t. the outputs
  (Schraudolph 2002); positive semi-definite for convex losses.
- :func:`fisher_operator`: the empirical Fisher ``sum_i a_i grad l_i grad l_i^T`` of the
  per-example losses (Kunstner et al. 2019) or, for the cross-entropy, the true Fisher
  ``E_{y ~ p}[grad log p grad log p^T]``, equal to ``G`` (Martens 2020).

Each takes either the explicit form the chapters use (a closure ``loss_fn(params)`` or
``(model, params, x, y, loss)``) or the module-first form a researcher has at hand:
``(model, loss_module, data)`` with ``data`` an ``(x, y)`` pair or an iterable of batches
(see :class:`lossgeom.risk.EmpiricalRisk`). curvlinops' operators take the same
inputs and compute the same matrices; the tests compare against them.
"""
from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import torch
from scipy.sparse.linalg import LinearOperator
from torch import nn

from lossgeom.parameters import Params
from lossgeom.risk import (
    Data,
    EmpiricalRisk,
    closure_risk_pieces,
    is_loss_module,
    legacy_risk,
    math_attention,
)
from lossgeom.types import LossFn

#: bytes of one block of columns in a batched product (columns per block = this / (n * itemsize))
BLOCK_BYTES = 2**26
MAX_BLOCK_COLUMNS = 64


class quiet_torch_warnings:
    """Silence torch's notices that say nothing about the result.

    Forward-mode AD registers decompositions with ``torch.jit.script`` on first use (a
    deprecation warning about torch itself), and vmap notes when an operation has no
    batching rule and is computed by a slower per-column fallback (same values).
    """

    def __enter__(self):
        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=r".*performance drop.*batching rule.*", category=UserWarning)
        warnings.filterwarnings("ignore", message=r".*is_grads_batched.*", category=UserWarning)

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


class CurvatureOperator:
    """A symmetric ``(n, n)`` operator on flattened parameters, torch-native, counting products.

    Subclasses implement ``_matmat(M)`` for an ``(n, k)`` tensor ``M`` in the operator's
    dtype and device, returning ``A M`` of the same shape. :meth:`matmat` splits ``M`` into
    blocks of at most ``block_columns`` columns (bounding memory at large ``n``) and counts
    one product per column in ``n_hvp``.

    Attributes:
        shape: ``(n, n)``.
        dtype, device: those of the parameters (products are computed in them).
        n_hvp: products so far (one per column); :meth:`reset_count` zeroes it.
    """

    def __init__(self, n: int, dtype: torch.dtype, device: torch.device) -> None:
        self.shape = (int(n), int(n))
        self.dtype, self.device = dtype, torch.device(device)
        self.n_hvp = 0
        itemsize = torch.finfo(dtype).bits // 8 if dtype.is_floating_point else 8
        self._block_columns = int(max(1, min(MAX_BLOCK_COLUMNS, BLOCK_BYTES // max(1, self.shape[0] * itemsize))))

    # -- products --------------------------------------------------------------------
    def _matmat(self, m: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def block_columns(self) -> int:
        """The number of columns per block of a product, ``BLOCK_BYTES / (n * itemsize)`` clipped to 1-64."""
        return self._block_columns

    def matmat(self, m: torch.Tensor) -> torch.Tensor:
        """``A M`` for an ``(n, k)`` tensor (cast to the operator's dtype and device)."""
        if not isinstance(m, torch.Tensor):
            raise TypeError(f"matmat takes a torch.Tensor, got {type(m).__name__}; use A @ array for NumPy")
        if m.dim() != 2 or m.shape[0] != self.shape[0]:
            raise ValueError(f"the block must have shape ({self.shape[0]}, k), got {tuple(m.shape)}")
        if m.dtype != self.dtype or m.device != self.device:
            m = m.to(dtype=self.dtype, device=self.device)
        k = m.shape[1]
        if k == 0:
            return m.clone()
        step = self.block_columns
        with self._product_context():
            if k <= step:
                out = self._matmat(m).detach()
            else:
                out = torch.cat([self._matmat(m[:, j:j + step]).detach() for j in range(0, k, step)], dim=1)
        self.n_hvp += k
        return out

    def _product_context(self):
        """The context products run in (composite attention, torch's notices silenced)."""
        stack = contextlib.ExitStack()
        stack.enter_context(quiet_torch_warnings())
        stack.enter_context(math_attention())
        return stack

    def matvec(self, v):
        """``A v`` for a vector (tensor in, tensor out; array in, float64 array out)."""
        if isinstance(v, torch.Tensor):
            if v.numel() != self.shape[0]:
                raise ValueError(f"vector must have {self.shape[0]} entries, got {v.numel()}")
            return self.matmat(v.reshape(-1, 1)).view(v.shape)
        arr = np.asarray(v, dtype=np.float64)
        if arr.size != self.shape[0]:
            raise ValueError(f"vector must have {self.shape[0]} entries, got {arr.size}")
        out = self.matmat(torch.as_tensor(arr.reshape(-1, 1)))
        return out.to(torch.float64).cpu().numpy().reshape(arr.shape)

    def __matmul__(self, other):
        """``A @ X``: a tensor gives a tensor (operator dtype), an array a float64 array."""
        if isinstance(other, torch.Tensor):
            if other.ndim == 1:
                return self.matvec(other)
            return self.matmat(other)
        arr = np.asarray(other, dtype=np.float64)
        if arr.ndim == 1:
            return self.matvec(arr)
        if arr.ndim != 2:
            raise ValueError(f"A @ X needs a vector or an (n, k) matrix, got shape {arr.shape}")
        out = self.matmat(torch.as_tensor(arr))
        return out.to(torch.float64).cpu().numpy()

    def reset_count(self) -> None:
        """Set the product counter ``n_hvp`` back to zero."""
        self.n_hvp = 0

    @property
    def T(self) -> CurvatureOperator:  # noqa: N802 - the matrix transpose, as in NumPy
        """The operator itself, which is its own transpose (it is symmetric)."""
        return self

    def adjoint(self) -> CurvatureOperator:
        """The adjoint: the operator itself (real symmetric)."""
        return self

    def to_scipy(self) -> LinearOperator:
        """A float64 ``scipy.sparse.linalg.LinearOperator`` view (products counted here)."""
        return _ScipyView(self)

    def dense(self) -> np.ndarray:
        """The full matrix as a float64 array, by ``n`` products (small models only)."""
        eye = torch.eye(self.shape[0], dtype=self.dtype, device=self.device)
        return self.matmat(eye).to(torch.float64).cpu().numpy()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.shape[0]}, dtype={self.dtype}, n_hvp={self.n_hvp})"


class _ScipyView(LinearOperator):
    """A float64 scipy view of a :class:`CurvatureOperator`."""

    def __init__(self, operator: CurvatureOperator) -> None:
        super().__init__(dtype=np.dtype(np.float64), shape=operator.shape)
        self.operator = operator

    def _matvec(self, v):
        return self.operator.matvec(np.asarray(v, dtype=np.float64).reshape(-1)).reshape(np.shape(v))

    def _matmat(self, m):
        return self.operator @ np.asarray(m, dtype=np.float64)

    def _rmatvec(self, v):
        return self._matvec(v)

    def _adjoint(self):
        return self


# ---------------------------------------------------------------------------------------
# The Hessian
# ---------------------------------------------------------------------------------------

HVP_METHODS = ("auto", "reverse-over-reverse", "forward-over-reverse")


def _double_backward(grad: torch.Tensor, leaf: torch.Tensor, m: torch.Tensor, retain: bool,
                     batched: bool) -> torch.Tensor:
    """``H M`` from the graph of ``grad = dL/dleaf``: one vmapped backward pass, or one per column."""
    if not grad.requires_grad:  # the gradient does not depend on the parameters: H = 0
        return torch.zeros_like(m)
    k = m.shape[1]
    if k == 1 or not batched:
        columns = [torch.autograd.grad(grad, leaf, m[:, j], retain_graph=retain or j < k - 1,
                                       materialize_grads=True)[0] for j in range(k)]
        return columns[0][:, None] if k == 1 else torch.stack(columns, dim=1)
    (out,) = torch.autograd.grad(grad, leaf, m.T.contiguous(), retain_graph=retain, is_grads_batched=True,
                                 materialize_grads=True)
    return out.T


class HessianOperator(CurvatureOperator):
    """The Hessian ``H`` of a loss at fixed parameters; ``H M`` costs one batched HVP per block.

    ``H v = d/dt grad L(theta + t v)`` at ``t = 0`` (the chapter "Curvature is a spectrum").
    How a product is differentiated (``method``), by a fixed rule chosen at construction
    and reported in ``mode``; it never changes during a run:

    - ``"auto"`` (default) is ``"reverse-over-reverse"``: measured on CPU (see
      ``appendices/benchmarks.md``) it is the fastest correct mode on every model we
      benchmarked, about 1.5-2 gradients per product, and unlike forward mode it works
      with every torch loss (forward-mode AD of ``mse_loss``'s double backward fails).
    - ``"reverse-over-reverse"``: the gradient is computed with ``create_graph=True`` and a
      product is a backward pass through that graph (PyHessian's approach). With one batch
      (and in the closure form) the graph is built once and kept, so each product is one
      backward pass; with several batches it is rebuilt per batch for each block of
      columns, so memory stays that of one batch.
    - ``"forward-over-reverse"``: ``torch.func.jvp`` of ``torch.func.grad``, vmapped over
      columns; nothing is kept between products.

    ``"linearized"`` (``torch.func.linearize``) is refused: it crashes the interpreter
    on the squared error of a tanh network and replays wrong, non-repeatable products on
    ``nn.LSTM`` (torch 2.x).

    A block of ``k`` columns (``H @ M``) is one call. In reverse-over-reverse mode on the
    CPU it is ``k`` backward passes through the gradient's graph: measured on tanh MLPs
    of 1e4 to 1e6 parameters, that is cheaper per column than one backward pass vmapped
    over the columns (``is_grads_batched``), whose batching overhead exceeds what it saves
    (``appendices/benchmarks.md``). On other devices, and in forward-over-reverse mode
    (where each call pays ``torch.func``'s set-up), the block is one vmapped pass.
    ``batched_columns`` overrides the rule.
    """

    def __init__(self, loss_fn: LossFn, params: Params, method: str = "auto") -> None:
        point, _, scalar = closure_risk_pieces(loss_fn, params)
        self._setup([scalar], point, method)

    @classmethod
    def from_risk(cls, risk: EmpiricalRisk, method: str = "auto") -> HessianOperator:
        """The Hessian of an :class:`~lossgeom.risk.EmpiricalRisk`, summed over its batches."""
        operator = cls.__new__(cls)
        scalars = [lambda v, b=b: risk.batch_value(v, b) for b in range(risk.n_batches)]
        operator._setup(scalars, risk.point, method)
        return operator

    def _setup(self, scalars: Sequence[Callable[[torch.Tensor], torch.Tensor]], point: torch.Tensor,
               method: str) -> None:
        if method == "linearized":
            raise ValueError("method='linearized' (torch.func.linearize) is not supported: it crashes the "
                             "interpreter on some losses (the squared error of a tanh MLP) and replays wrong, "
                             "non-repeatable products on nn.LSTM; use 'reverse-over-reverse' (the default) "
                             "or 'forward-over-reverse'")
        if method not in HVP_METHODS:
            raise ValueError(f"method must be one of {list(HVP_METHODS)}, got {method!r}")
        super().__init__(point.numel(), point.dtype, point.device)
        self.point = point.detach()
        self._scalars = list(scalars)
        self.method = method
        #: how products are computed (fixed at construction)
        self.mode = "reverse-over-reverse" if method == "auto" else method
        self.keeps_graph = self.mode == "reverse-over-reverse" and len(self._scalars) == 1
        #: whether a block of columns is one vmapped pass (see the class docstring)
        self.batched_columns = self.mode == "forward-over-reverse" or self.device.type != "cpu"
        self._kept = None
        if self.keeps_graph:
            self._kept = self._gradient_graph(self._scalars[0])

    def _gradient_graph(self, scalar) -> tuple[torch.Tensor, torch.Tensor]:
        leaf = self.point.clone().requires_grad_(True)
        with torch.enable_grad(), math_attention(), quiet_torch_warnings():
            value = scalar(leaf)
            if not value.requires_grad:
                return torch.zeros_like(leaf), leaf
            (grad,) = torch.autograd.grad(value, leaf, create_graph=True)
        return grad, leaf

    def _product_context(self):
        if self._kept is not None and not self.batched_columns:
            return contextlib.nullcontext()  # backward passes through a kept graph: nothing to set up
        return super()._product_context()

    def matvec(self, v):
        """``H v``; a vector in the operator's dtype and device takes one backward pass, nothing else."""
        if (self._kept is not None and isinstance(v, torch.Tensor) and v.dim() == 1 and v.shape[0] == self.shape[0]
                and v.dtype == self.dtype and v.device == self.device):
            grad, leaf = self._kept
            out = (torch.autograd.grad(grad, leaf, v, retain_graph=True)[0] if grad.requires_grad
                   else torch.zeros_like(v))
            self.n_hvp += 1
            return out
        return super().matvec(v)

    def _matmat(self, m: torch.Tensor) -> torch.Tensor:
        if self.mode == "reverse-over-reverse":
            if self._kept is not None:
                grad, leaf = self._kept
                with torch.enable_grad():
                    return _double_backward(grad, leaf, m, retain=True, batched=self.batched_columns)
            total = torch.zeros_like(m)
            for scalar in self._scalars:
                grad, leaf = self._gradient_graph(scalar)
                with torch.enable_grad():
                    total += _double_backward(grad, leaf, m, retain=False, batched=self.batched_columns)
            return total
        total = torch.zeros_like(m)
        for scalar in self._scalars:
            grad_fn = torch.func.grad(scalar)
            try:
                total += torch.func.vmap(lambda v, g=grad_fn: torch.func.jvp(g, (self.point,), (v,))[1],
                                         in_dims=1, out_dims=1)(m)
            except RuntimeError as err:
                if "ZeroTensor" in str(err):
                    raise ValueError("forward-over-reverse failed on this loss (torch's forward-mode rule for "
                                     "the double backward of mse_loss writes into a ZeroTensor); use "
                                     "method='reverse-over-reverse'") from err
                raise
        return total

    def gradient(self) -> np.ndarray:
        """The gradient of the loss at the operator's point, float64 (not counted as a product)."""
        total = torch.zeros_like(self.point)
        with math_attention(), quiet_torch_warnings():
            for scalar in self._scalars:
                total += torch.func.grad(scalar)(self.point)
        return total.detach().to(torch.float64).cpu().numpy()


def hessian_operator(loss_fn_or_model, params_or_loss, method_or_data=None, method: str | None = None
                     ) -> HessianOperator:
    """The Hessian as a counting, torch-native operator (the chapter "Curvature is a spectrum").

    Two forms:

    - ``hessian_operator(loss_fn, params, method="auto")``: ``loss_fn`` maps a parameter
      dict to a scalar tensor (e.g. :func:`lossgeom.models.loss_closure`); ``params`` is
      the point, in any one floating dtype (products are computed in it).
    - ``hessian_operator(model, loss, data, method="auto")``: a ``torch.nn.Module``, a loss
      module (``nn.CrossEntropyLoss()`` or ``nn.MSELoss()``, its reduction respected) and
      an ``(x, y)`` pair or iterable of batches; the point is the model's parameters.

    ``method`` is how an HVP is differentiated (see :class:`HessianOperator`).

    Raises:
        TypeError: if a model is passed with a parameter dict instead of a loss module
            (``hessian_operator(model, params)``), or ``loss_fn`` is not callable.
        ValueError: if ``params`` is empty, the loss is not finite at the point, the data
            or targets are malformed, or ``method`` is unknown.
    """
    if isinstance(loss_fn_or_model, nn.Module) and not is_loss_module(loss_fn_or_model):
        model = loss_fn_or_model
        if not is_loss_module(params_or_loss):
            raise TypeError("hessian_operator(model, ...) takes a loss module and data: "
                            "hessian_operator(model, nn.CrossEntropyLoss(), (x, y)); got "
                            f"{type(params_or_loss).__name__} as the loss. For a parameter dict pass a loss "
                            "function: hessian_operator(loss_closure(model, x, y), params)")
        if method_or_data is None:
            raise TypeError("hessian_operator(model, loss, data) needs data: an (x, y) pair or an iterable of batches")
        risk = EmpiricalRisk(model, params_or_loss, method_or_data)
        return HessianOperator.from_risk(risk, method or "auto")
    if method is not None and method_or_data is not None:
        raise TypeError("hessian_operator(loss_fn, params, method) takes method once")
    return HessianOperator(loss_fn_or_model, params_or_loss, method or method_or_data or "auto")


# ---------------------------------------------------------------------------------------
# The generalised Gauss-Newton matrix
# ---------------------------------------------------------------------------------------


class GGNOperator(CurvatureOperator):
    """The generalised Gauss-Newton ``G = sum_b J_b^T Lambda_b J_b`` (the chapter "Curvature is a spectrum").

    Built from an :class:`~lossgeom.risk.EmpiricalRisk` or from the arguments of
    :func:`ggn_operator`.

    ``J_b`` is the Jacobian of the outputs on batch ``b`` w.r.t. the flattened parameters
    and ``Lambda_b`` the Hessian of ``w_b loss`` w.r.t. those outputs: for the
    cross-entropy ``c (diag p - p p^T)`` per example and position (``p`` the softmax over
    axis 1), for the squared error ``2 c I``, with ``c`` the weight of one loss term
    (``1 / #terms`` under mean reduction). A block of ``k`` columns costs one vmapped
    Jacobian-vector product and one vmapped vector-Jacobian product per batch.
    """

    def __init__(self, risk_or_model, params_or_loss=None, x_or_data=None, y: torch.Tensor | None = None,
                 loss: str = "cross_entropy") -> None:
        risk = risk_or_model if isinstance(risk_or_model, EmpiricalRisk) else _risk_from_arguments(
            "GGNOperator", risk_or_model, params_or_loss, x_or_data, y, loss)
        super().__init__(risk.n, risk.dtype, risk.device)
        self.risk, self.point = risk, risk.point
        self._kept = None
        if risk.n_batches == 1:
            with math_attention(), quiet_torch_warnings():
                self._kept = torch.func.vjp(lambda v: risk.outputs(v, 0), self.point)

    def _batch_product(self, b: int, m: torch.Tensor, kept=None) -> torch.Tensor:
        risk = self.risk

        def outputs(v):
            return risk.outputs(v, b)

        out, vjp_fn = kept if kept is not None else torch.func.vjp(outputs, self.point)
        out = out.detach()
        jm = torch.func.vmap(lambda v: torch.func.jvp(outputs, (self.point,), (v,))[1], in_dims=1)(m)
        lam_jm = torch.func.vmap(lambda u: risk.output_hessian_product(out, u, b))(jm)
        return torch.func.vmap(lambda u: vjp_fn(u)[0], out_dims=1)(lam_jm)

    def _matmat(self, m: torch.Tensor) -> torch.Tensor:
        if self._kept is not None:
            return self._batch_product(0, m, self._kept)
        total = torch.zeros_like(m)
        for b in range(self.risk.n_batches):
            total += self._batch_product(b, m)
        return total


def _risk_from_arguments(function: str, model, params_or_loss, x_or_data, y, loss) -> EmpiricalRisk:
    if not isinstance(model, nn.Module):
        raise TypeError(f"{function}: model must be a torch.nn.Module, got {type(model).__name__}")
    if is_loss_module(params_or_loss):
        if y is not None:
            raise TypeError(f"{function}(model, loss, data) takes data as one (x, y) pair or an iterable of batches")
        if x_or_data is None:
            raise TypeError(f"{function}(model, loss, data) needs data: an (x, y) pair or an iterable of batches")
        return EmpiricalRisk(model, params_or_loss, x_or_data)
    if x_or_data is None or y is None:
        raise TypeError(f"{function} takes (model, params, x, y, loss=...) or (model, loss_module, data)")
    return legacy_risk(model, params_or_loss, x_or_data, y, loss)


def ggn_operator(model: nn.Module, params_or_loss, x_or_data=None, y: torch.Tensor | None = None,
                 loss: str = "cross_entropy") -> GGNOperator:
    """The generalised Gauss-Newton matrix ``G = J^T Lambda J`` as an operator.

    Two forms: ``ggn_operator(model, params, x, y, loss="cross_entropy")`` (``loss`` one
    of ``"cross_entropy"``/``"mse"``, mean reduction) and ``ggn_operator(model, loss, data)``
    with a loss module and an ``(x, y)`` pair or iterable of batches. Cross-entropy
    outputs may be ``(N, C)`` or ``(N, C, d1, ...)`` (classes on axis 1, every position a
    loss term, as in ``nn.CrossEntropyLoss``).

    Raises:
        ValueError: on empty data, a batch-norm model in training mode, an unknown loss,
            misspelt parameter names, targets of the wrong shape, or a non-finite loss.
    """
    return GGNOperator(_risk_from_arguments("ggn_operator", model, params_or_loss, x_or_data, y, loss))


# ---------------------------------------------------------------------------------------
# Fisher matrices
# ---------------------------------------------------------------------------------------


def _class_last(t: torch.Tensor) -> torch.Tensor:
    """``(N, C, d1, ...) -> (N * d1 * ..., C)``: one row per loss position."""
    if t.ndim == 2:
        return t
    return t.movedim(1, -1).reshape(-1, t.shape[1])


def output_jacobian(outputs: Callable[[torch.Tensor], torch.Tensor], point: torch.Tensor,
                    out: torch.Tensor) -> torch.Tensor:
    """``d outputs / d theta`` as an ``(out.numel(), n)`` tensor (forward mode when n < outputs)."""
    jac_fn = torch.func.jacfwd if point.numel() < out.numel() else torch.func.jacrev
    with quiet_torch_warnings(), math_attention():
        return jac_fn(outputs)(point).reshape(out.numel(), point.numel())


def fisher_scores(risk: EmpiricalRisk, kind: str) -> torch.Tensor:
    """Rows ``s_r`` with ``F = sum_r s_r s_r^T`` (small models: all rows are stored).

    ``kind="empirical"``: one row per example, ``sqrt(a_i) grad l_i`` (``l_i`` the loss
    module on example ``i`` alone, ``L = sum_i a_i l_i``). ``kind="true"`` (cross-entropy):
    one row per example, position and class, ``sqrt(c p_c) J^T (e_c - p)``.
    """
    rows = []
    for b in range(risk.n_batches):
        def outputs(v, b=b):
            return risk.outputs(v, b)

        with torch.no_grad():
            out = outputs(risk.point)
        jac = output_jacobian(outputs, risk.point, out)  # (out.numel(), n)
        n_examples = out.shape[0]
        if kind == "empirical":
            out_req = out.detach().clone().requires_grad_(True)
            (dloss,) = torch.autograd.grad(risk.batch_loss(out_req, b), out_req)  # sum_i a_i dl_i/df
            shares = risk.example_shares(b)
            per_example = dloss.reshape(n_examples, -1) / shares[:, None]  # dl_i / df_i
            jac_examples = jac.reshape(n_examples, -1, risk.n)
            rows.append(torch.einsum("ik,ikn->in", per_example, jac_examples) * shares.sqrt()[:, None])
        else:
            c = risk.term_weights[b]
            logits = _class_last(out)  # (positions, C)
            p = torch.softmax(logits, dim=1)
            n_classes = logits.shape[1]
            jac_positions = jac.reshape(*out.shape, risk.n).movedim(1, -2).reshape(-1, n_classes, risk.n)
            eye = torch.eye(n_classes, dtype=out.dtype, device=out.device)
            directions = eye[None, :, :] - p[:, None, :]  # grad_f log p_c = e_c - p
            scores = torch.einsum("pck,pkn->pcn", directions, jac_positions) * (c * p).sqrt()[:, :, None]
            rows.append(scores.reshape(-1, risk.n))
    return torch.cat(rows).detach()


class FisherOperator(CurvatureOperator):
    """A Fisher matrix ``F = S^T S`` from a stored ``(rows, n)`` matrix ``S`` of scores.

    Built from an :class:`~lossgeom.risk.EmpiricalRisk` and ``kind``, or from the
    arguments of :func:`fisher_operator`.

    ``kind="empirical"``: ``F = sum_i a_i g_i g_i^T`` with ``g_i`` the gradient of example
    ``i``'s own loss ``l_i`` and ``L = sum_i a_i l_i`` (``a_i = 1/N`` for a mean over N
    examples of equal size). ``kind="true"`` (cross-entropy only):
    ``F = sum_positions c E_{y ~ p}[grad log p_y grad log p_y^T]``, the expected outer
    product under the model's own predictive distribution at every position, equal to
    the GGN (the chapter "Curvature is a spectrum").
    """

    def __init__(self, risk_or_model, params_or_loss=None, x_or_data=None, y: torch.Tensor | None = None,
                 loss: str = "cross_entropy", kind: str = "empirical") -> None:
        if isinstance(params_or_loss, str) and isinstance(risk_or_model, EmpiricalRisk):
            kind = params_or_loss  # FisherOperator(risk, kind)
        if kind not in ("empirical", "true"):
            raise ValueError(f"kind must be 'empirical' or 'true', got {kind!r}")
        risk = risk_or_model if isinstance(risk_or_model, EmpiricalRisk) else _risk_from_arguments(
            "FisherOperator", risk_or_model, params_or_loss, x_or_data, y, loss)
        if kind == "true" and not isinstance(risk.loss, nn.CrossEntropyLoss):
            raise ValueError("kind='true' is implemented for the cross-entropy; for a Gaussian likelihood "
                             "(mse) the true Fisher is proportional to the GGN: use ggn_operator")
        super().__init__(risk.n, risk.dtype, risk.device)
        self.risk, self.point, self.kind = risk, risk.point, kind
        self.scores = fisher_scores(risk, kind)

    def _matmat(self, m: torch.Tensor) -> torch.Tensor:
        return self.scores.T @ (self.scores @ m)

    def dense(self) -> np.ndarray:
        """The full matrix ``S^T S`` from the stored scores (no products counted)."""
        return (self.scores.T @ self.scores).to(torch.float64).cpu().numpy()


def fisher_operator(model: nn.Module, params_or_loss, x_or_data=None, y: torch.Tensor | None = None,
                    loss: str = "cross_entropy", kind: str = "empirical") -> FisherOperator:
    """The empirical (``kind="empirical"``) or true (``kind="true"``) Fisher as an operator.

    Forms as :func:`ggn_operator`. Stores one score row per example (empirical) or per
    example, position and class (true): small models only.
    """
    if kind not in ("empirical", "true"):
        raise ValueError(f"kind must be 'empirical' or 'true', got {kind!r}")
    return FisherOperator(_risk_from_arguments("fisher_operator", model, params_or_loss, x_or_data, y, loss), kind)


# ---------------------------------------------------------------------------------------
# Any square matrix as a counting operator (what the spectral tools take)
# ---------------------------------------------------------------------------------------

MATRICES = ("hessian", "ggn", "empirical_fisher", "true_fisher")


def curvature_operator(model: nn.Module, loss, data: Data, matrix: str = "hessian",
                       method: str = "auto") -> CurvatureOperator:
    """The module-first operator of ``matrix`` (``"hessian"``, ``"ggn"``, ``"empirical_fisher"``, ``"true_fisher"``)."""
    if matrix not in MATRICES:
        raise ValueError(f"matrix must be one of {list(MATRICES)}, got {matrix!r}")
    risk = EmpiricalRisk(model, loss, data)
    if matrix == "hessian":
        return HessianOperator.from_risk(risk, method)
    if matrix == "ggn":
        return GGNOperator(risk)
    return FisherOperator(risk, matrix.split("_")[0])


class _DenseOperator(CurvatureOperator):
    """A stored matrix as an operator."""

    def __init__(self, matrix: torch.Tensor) -> None:
        super().__init__(matrix.shape[0], matrix.dtype, matrix.device)
        self.matrix = matrix

    def _matmat(self, m):
        return self.matrix @ m

    def dense(self) -> np.ndarray:
        return self.matrix.to(torch.float64).cpu().numpy()


class _ScipyOperator(CurvatureOperator):
    """A scipy ``LinearOperator`` (or anything ``aslinearoperator`` takes) as a float64 operator."""

    def __init__(self, operator: LinearOperator) -> None:
        super().__init__(operator.shape[0], torch.float64, torch.device("cpu"))
        self.operator = operator

    @property
    def block_columns(self) -> int:
        return self.shape[0]

    def _matmat(self, m):
        out = self.operator.matmat(m.cpu().numpy()) if m.shape[1] > 1 else self.operator.matvec(
            m[:, 0].cpu().numpy()).reshape(-1, 1)
        return torch.as_tensor(np.asarray(out, dtype=np.float64))


class CountingView(CurvatureOperator):
    """Counts the products one algorithm makes with an operator (the operator's own count goes on too)."""

    def __init__(self, operator: CurvatureOperator) -> None:
        super().__init__(operator.shape[0], operator.dtype, operator.device)
        self.operator = operator

    @property
    def block_columns(self) -> int:
        return self.shape[0]

    def _product_context(self):
        return contextlib.nullcontext()  # the wrapped operator sets up its own

    def _matmat(self, m):
        return self.operator.matmat(m)

    def dense(self) -> np.ndarray:
        if isinstance(self.operator, (_DenseOperator, FisherOperator)):
            return self.operator.dense()
        return super().dense()


def symmetric_matrix(matrix: torch.Tensor, argument: str = "operator") -> torch.Tensor:
    """Refuse a square matrix that is not symmetric to rounding (``1e3`` units of its dtype)."""
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"{argument} must be square, got shape {tuple(matrix.shape)}")
    scale = float(matrix.abs().max()) if matrix.numel() else 0.0
    asym = float((matrix - matrix.T).abs().max()) if matrix.numel() else 0.0
    tol = 1e3 * torch.finfo(matrix.dtype).eps * scale
    if asym > tol:
        raise ValueError(f"{argument} must be symmetric: max |A - A^T| = {asym:.3g} is above {tol:.3g} "
                         "(1e3 rounding units of its largest entry); the eigensolvers here assume a "
                         "symmetric matrix")
    return matrix


def as_operator(operator, *, symmetric: bool = True, loss=None, data: Data | None = None,
                matrix: str = "hessian", method: str = "auto") -> CountingView:
    """Any square matrix as a counting torch-native operator.

    Takes a :class:`CurvatureOperator`, a NumPy array or torch tensor (checked to be
    symmetric when ``symmetric``), a scipy ``LinearOperator``, an object with
    ``to_scipy()`` (curvlinops), or a model with ``loss=`` and ``data=`` (then ``matrix``
    picks the curvature matrix, see :func:`curvature_operator`). Operators are assumed
    symmetric; only stored matrices can be checked without extra products.

    Raises:
        ValueError: if the matrix is not square (or not symmetric), or a model comes
            without ``loss`` and ``data``.
    """
    if isinstance(operator, nn.Module):
        if loss is None or data is None:
            raise ValueError("a model needs loss= (a loss module) and data= (an (x, y) pair or batches)")
        operator = curvature_operator(operator, loss, data, matrix, method)
    elif loss is not None or data is not None:
        raise ValueError("loss= and data= are only used with a model (a torch.nn.Module) as the operator")
    if isinstance(operator, CountingView):
        operator = operator.operator
    if isinstance(operator, CurvatureOperator):
        return CountingView(operator)
    if isinstance(operator, (np.ndarray, torch.Tensor)) or (
            isinstance(operator, (list, tuple)) and len(operator) and isinstance(operator[0], (list, tuple))):
        matrix_t = torch.as_tensor(np.asarray(operator, dtype=np.float64)) if not isinstance(
            operator, torch.Tensor) else operator.detach()
        if not torch.is_floating_point(matrix_t):
            matrix_t = matrix_t.to(torch.float64)
        if matrix_t.ndim != 2 or matrix_t.shape[0] != matrix_t.shape[1]:
            raise ValueError(f"operator must be square, got shape {tuple(matrix_t.shape)}")
        if not torch.isfinite(matrix_t).all():
            raise ValueError("operator must contain only finite values")
        if symmetric:
            symmetric_matrix(matrix_t)
        return CountingView(_DenseOperator(matrix_t))
    if hasattr(operator, "to_scipy") and not isinstance(operator, LinearOperator):
        operator = operator.to_scipy()
    from scipy.sparse.linalg import aslinearoperator

    try:
        linear = aslinearoperator(operator)
    except TypeError:
        raise TypeError("operator must be a curvature operator, an array, a tensor, a scipy LinearOperator "
                        f"or a model with loss= and data=, got {type(operator).__name__}") from None
    if linear.shape[0] != linear.shape[1]:
        raise ValueError(f"operator must be square, got shape {linear.shape}")
    return CountingView(_ScipyOperator(linear))


__all__ = ["CurvatureOperator", "FisherOperator", "GGNOperator", "HessianOperator", "as_operator",
           "curvature_operator", "fisher_operator", "ggn_operator", "hessian_operator"]

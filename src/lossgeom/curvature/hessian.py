r"""The Hessian :math:`H = \nabla^2 L(\theta)` as a counting, torch-native operator.

:math:`H v = \frac{d}{dt} \nabla L(\theta + t v) \big|_{t=0}` (Pearlmutter 1994),
computed by reverse-over-reverse or forward-over-reverse automatic differentiation.
Two ways in, each named:

- the closure form :class:`HessianOperator` ``(loss_fn, params, *, method=...)``, with
  ``loss_fn(params) -> scalar``;
- the module form :func:`hessian_operator` ``(model, loss, data, *, params=None, method=...)``,
  built on :class:`lossgeom.risk.EmpiricalRisk` (also :meth:`HessianOperator.from_risk`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import torch
from torch import nn

from lossgeom.curvature.base import CurvatureOperator, fast_path_agrees, probe_vector, quiet_torch_warnings
from lossgeom.distributed import all_reduce_sum
from lossgeom.risk import EmpiricalRisk, closure_risk_pieces, math_attention
from lossgeom.types import Data, Group, LossFn, Output, Params

HVP_METHODS = ("auto", "reverse-over-reverse", "forward-over-reverse")


def _double_backward(
    grad: torch.Tensor, leaf: torch.Tensor, m: torch.Tensor, retain: bool, batched: bool
) -> torch.Tensor:
    """``H M`` from the graph of ``grad = dL/dleaf``: one vmapped backward pass, or one per column."""
    if not grad.requires_grad:  # the gradient does not depend on the parameters: H = 0
        return torch.zeros_like(m)
    k = m.shape[1]
    if k == 1 or not batched:
        columns = [
            torch.autograd.grad(grad, leaf, m[:, j], retain_graph=retain or j < k - 1, materialize_grads=True)[0]
            for j in range(k)
        ]
        return columns[0][:, None] if k == 1 else torch.stack(columns, dim=1)
    (out,) = torch.autograd.grad(
        grad, leaf, m.T.contiguous(), retain_graph=retain, is_grads_batched=True, materialize_grads=True
    )
    return out.T


class HessianOperator(CurvatureOperator):
    r"""The Hessian :math:`H` of a loss at fixed parameters; :math:`H M` costs one batched HVP per block.

    :math:`H v = \frac{d}{dt} \nabla L(\theta + t v) \big|_{t=0}` (Pearlmutter 1994).
    Built like :class:`~lossgeom.curvature.ggn.GGNOperator` and
    :class:`~lossgeom.curvature.fisher.FisherOperator`: ``HessianOperator(model, loss,
    data, *, params=None, group=None)`` (the same as :func:`hessian_operator`), or
    :meth:`from_closure` for a loss ``loss_fn(params) -> scalar`` of a parameter dict, or
    :meth:`from_risk`. A linear model :math:`f(x) = w^\top x` under the summed squared
    error has :math:`H = 2 X^\top X`:

    >>> import torch
    >>> from torch import nn
    >>> from lossgeom.curvature import HessianOperator
    >>> model = nn.Linear(2, 1, bias=False).double()
    >>> x = torch.tensor([[1.0, 0.0], [0.0, 3.0]], dtype=torch.float64)
    >>> H = HessianOperator(model, nn.MSELoss(reduction="sum"), (x, torch.zeros(2, 1, dtype=torch.float64)))
    >>> H.dense().round(10).tolist()
    [[2.0, 0.0], [0.0, 18.0]]

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
      columns; nothing is kept between products. It is used only after it agrees with
      reverse-over-reverse at set-up (one product of each on the first batch and a fixed
      probe vector, not counted in ``n_hvp``); otherwise, or if forward mode fails, a
      ``RuntimeWarning`` says so and ``mode`` is ``"reverse-over-reverse"``. (Torch's
      forward-mode rule for ``nn.Embedding(padding_idx=...)`` differentiates the padding
      row, which reverse mode, and so the gradient, holds fixed.)

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

    Args:
        model: the network (a ``torch.nn.Module``; batch norm in eval mode).
        loss: the loss module (called for every value and derivative; see :mod:`lossgeom.losses`).
        data: one batch or an iterable of batches (see :mod:`lossgeom.batches`).
        params: the point, a dict naming parameters of the model (the others held
            fixed); ``None``: the model's own trainable parameters.
        group: a ``torch.distributed`` process group (``data`` is then this rank's shard),
            or ``None`` for one process.
        output: selects the tensor of outputs from what the model returns (see :mod:`lossgeom.outputs`).
        method: ``"auto"``, ``"reverse-over-reverse"`` or ``"forward-over-reverse"``.

    Raises:
        TypeError: if ``model`` is not a module, ``loss`` is not a loss module or ``data``
            is malformed.
        ValueError: if the loss is not finite at the point, a parameter name is unknown,
            or ``method`` is unknown.
    """

    def __init__(
        self,
        model: nn.Module,
        loss: nn.Module,
        data: Data,
        *,
        params: Params | None = None,
        group: Group = None,
        output: Output = None,
        method: str = "auto",
    ) -> None:
        risk = EmpiricalRisk(model, loss, data, params=params, group=group, output=output)
        self._setup(_risk_scalars(risk), risk.point, method)
        self.group = risk.group

    @classmethod
    def from_closure(cls, loss_fn: LossFn, params: Params, *, method: str = "auto") -> HessianOperator:
        r"""The Hessian of a closure ``loss_fn(params) -> scalar`` at ``params``.

        For :math:`L(w) = \frac12 \sum_i d_i w_i^2` the Hessian is :math:`\operatorname{diag}(d)`:

        >>> import torch
        >>> from lossgeom.curvature import HessianOperator
        >>> d = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
        >>> w = {"w": torch.zeros(3, dtype=torch.float64)}
        >>> H = HessianOperator.from_closure(lambda p: 0.5 * (d * p["w"] ** 2).sum(), w)
        >>> H.dense().round(10).tolist()
        [[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 3.0]]

        Args:
            loss_fn: the loss as a function of a parameter dict (e.g.
                :func:`lossgeom.models.loss_closure`).
            params: the point, a dict of tensors in one floating dtype (products are computed in it).
            method: how an HVP is differentiated (see the class docstring).

        Returns:
            The operator at ``params``, on one process.

        Raises:
            TypeError: if ``loss_fn`` is an ``nn.Module`` or not callable.
            ValueError: if ``params`` is empty, ``loss_fn`` is not a finite scalar at it, or
                ``method`` is unknown.
        """
        operator = cls.__new__(cls)
        point, _, scalar = closure_risk_pieces(loss_fn, params)
        operator._setup(_Scalars(lambda: [scalar], held=True), point, method)
        return operator

    @classmethod
    def from_risk(cls, risk: EmpiricalRisk, *, method: str = "auto") -> HessianOperator:
        """The Hessian ``sum_b d^2 (w_b loss_b) / d theta^2`` of an :class:`~lossgeom.risk.EmpiricalRisk`.

        Args:
            risk: the empirical risk; the point is ``risk.point``.
            method: how an HVP is differentiated (see the class docstring).

        Returns:
            The operator, summed over the risk's batches.

        Raises:
            ValueError: if ``method`` is unknown or ``"linearized"``.
        """
        operator = cls.__new__(cls)
        operator._setup(_risk_scalars(risk), risk.point, method)
        operator.group = risk.group
        return operator

    def _setup(self, scalars: _Scalars, point: torch.Tensor, method: str) -> None:
        if method == "linearized":
            raise ValueError(
                "method='linearized' (torch.func.linearize) is not supported: it crashes the "
                "interpreter on some losses (the squared error of a tanh MLP) and replays wrong, "
                "non-repeatable products on nn.LSTM; use 'reverse-over-reverse' (the default) "
                "or 'forward-over-reverse'"
            )
        if method not in HVP_METHODS:
            raise ValueError(f"method must be one of {list(HVP_METHODS)}, got {method!r}")
        super().__init__(point.numel(), point.dtype, point.device)
        self.point = point.detach()
        self._scalars = scalars
        first = next(iter(scalars()))
        self.method = method
        #: how products are computed (fixed at construction)
        self.mode = "reverse-over-reverse" if method == "auto" else method
        #: whether a block of columns is one vmapped pass (see the class docstring)
        self.batched_columns = self.mode == "forward-over-reverse" or self.device.type != "cpu"
        self._kept = None
        if self.mode == "forward-over-reverse" and not self._forward_mode_agrees(first):
            self.mode = "reverse-over-reverse"
            self.batched_columns = self.device.type != "cpu"
        self.keeps_graph = self.mode == "reverse-over-reverse" and scalars.single
        if self.keeps_graph:
            self._kept = self._gradient_graph(first)

    def _forward_mode_agrees(self, first: Callable[[torch.Tensor], torch.Tensor]) -> bool:
        """Compare forward-over-reverse with reverse-over-reverse on the first batch and a probe vector.

        One product of each kind at set-up, not counted in ``n_hvp``; a gap (or a failure of
        forward mode) warns and returns ``False``.
        """
        v = probe_vector(self.shape[0], self.dtype, self.device)
        fast, failure = None, None
        with super()._product_context():
            try:
                fast = self._forward_product(first, v)
            except (RuntimeError, ValueError, NotImplementedError) as err:
                failure = f"forward mode failed ({type(err).__name__}: {str(err).splitlines()[0]})"
            safe = self._reverse_product(first, v)
        return fast_path_agrees(fast, safe, "HessianOperator(method='forward-over-reverse')", failure)

    def _reverse_product(self, scalar: Callable[[torch.Tensor], torch.Tensor], m: torch.Tensor) -> torch.Tensor:
        """``H_b M`` by reverse-over-reverse, the gradient's graph built for this block."""
        grad, leaf = self._gradient_graph(scalar)
        with torch.enable_grad():
            return _double_backward(grad, leaf, m, retain=False, batched=self.batched_columns)

    def _forward_product(self, scalar: Callable[[torch.Tensor], torch.Tensor], m: torch.Tensor) -> torch.Tensor:
        """``H_b M`` by forward-over-reverse: ``torch.func.jvp`` of ``torch.func.grad``, vmapped over columns."""
        grad_fn = torch.func.grad(scalar)
        try:
            return torch.func.vmap(lambda v: torch.func.jvp(grad_fn, (self.point,), (v,))[1], in_dims=1, out_dims=1)(m)
        except RuntimeError as err:
            if "ZeroTensor" in str(err):
                raise ValueError(
                    "forward-over-reverse failed on this loss (torch's forward-mode rule for "
                    "the double backward of mse_loss writes into a ZeroTensor); use "
                    "method='reverse-over-reverse'"
                ) from err
            raise

    def _gradient_graph(self, scalar: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        leaf = self.point.clone().requires_grad_(True)
        with torch.enable_grad(), math_attention(), quiet_torch_warnings():
            value = scalar(leaf)
            if not value.requires_grad:
                return torch.zeros_like(leaf), leaf
            (grad,) = torch.autograd.grad(value, leaf, create_graph=True)
        return grad, leaf

    def _product_context(self) -> contextlib.AbstractContextManager:
        if self._kept is not None and not self.batched_columns:
            return contextlib.nullcontext()  # backward passes through a kept graph: nothing to set up
        return super()._product_context()

    def matvec(self, v: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
        """``H v``; a vector in the operator's dtype and device takes one backward pass, nothing else.

        That shortcut (through the kept gradient graph) applies in reverse-over-reverse mode
        with one batch; otherwise this is :meth:`lossgeom.curvature.base.CurvatureOperator.matvec`.

        Args:
            v: a tensor or array-like with ``n`` entries.

        Returns:
            ``H v`` with the shape of ``v``: a tensor in the operator's dtype for a tensor,
            otherwise a NumPy float64 array.

        Raises:
            ValueError: if ``v`` does not have ``n`` entries.
        """
        if (
            self._kept is not None
            and isinstance(v, torch.Tensor)
            and v.dim() == 1
            and v.shape[0] == self.shape[0]
            and v.dtype == self.dtype
            and v.device == self.device
        ):
            grad, leaf = self._kept
            out = (
                torch.autograd.grad(grad, leaf, v, retain_graph=True)[0] if grad.requires_grad else torch.zeros_like(v)
            )
            self.n_hvp += 1
            return all_reduce_sum(out, self.group)
        return super().matvec(v)

    def _matmat(self, m: torch.Tensor) -> torch.Tensor:
        if self.mode == "reverse-over-reverse":
            if self._kept is not None:
                grad, leaf = self._kept
                with torch.enable_grad():
                    return _double_backward(grad, leaf, m, retain=True, batched=self.batched_columns)
            product = self._reverse_product
        else:
            product = self._forward_product
        total = torch.zeros_like(m)
        for scalar in self._scalars():
            total += product(scalar, m)
        return total

    def gradient(self) -> np.ndarray:
        """The gradient of the loss at the operator's point, float64 (not counted as a product).

        ``grad L(theta) = sum_b grad loss_b(theta)``, summed over the operator's scalars (one per batch).

        Returns:
            The flat ``(n,)`` NumPy float64 gradient.
        """
        total = torch.zeros_like(self.point)
        with math_attention(), quiet_torch_warnings():
            for scalar in self._scalars():
                total += torch.func.grad(scalar)(self.point)
        return all_reduce_sum(total.detach(), self.group).to(torch.float64).cpu().numpy()


class _Scalars:
    """The per-batch scalars ``theta -> w_b loss_b(theta)`` of a loss, read afresh on every call."""

    def __init__(self, make: Callable[[], Iterable[Callable[[torch.Tensor], torch.Tensor]]], *, held: bool) -> None:
        self._make = make
        #: one scalar held in memory (so its gradient's graph may be kept between products)
        self.single = held and len(list(make())) == 1

    def __call__(self) -> Iterable[Callable[[torch.Tensor], torch.Tensor]]:
        return self._make()


def _risk_scalars(risk: EmpiricalRisk) -> _Scalars:
    """The scalars of an empirical risk: one per batch that holds a term of the loss."""

    def make() -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        for batch in risk.batches():
            yield functools.partial(risk.batch_value, batch=batch)

    return _Scalars(make, held=not risk.source.streamed)


def hessian_operator(
    model: nn.Module,
    loss: nn.Module,
    data: Data,
    *,
    params: Params | None = None,
    group: Group = None,
    output: Output = None,
    method: str = "auto",
) -> HessianOperator:
    r"""The Hessian of a model's empirical risk as a counting, torch-native operator.

    :math:`H = \nabla^2_\theta L` with :math:`L(\theta) = \sum_b w_b\, \ell(f(x_b; \theta), y_b)`
    (see :class:`lossgeom.risk.EmpiricalRisk`), and
    :math:`H v = \frac{d}{dt} \nabla L(\theta + t v) \big|_{t=0}` (Pearlmutter 1994). For a
    closure ``loss_fn(params)`` use :meth:`HessianOperator.from_closure`.

    A linear model :math:`f(x) = w^\top x` under the summed squared error has
    :math:`H = 2 X^\top X`; with :math:`X = \operatorname{diag}(1, 2, 3)` that is
    :math:`\operatorname{diag}(2, 8, 18)`:

    >>> import torch
    >>> from torch import nn
    >>> from lossgeom.curvature import hessian_operator
    >>> model = nn.Linear(3, 1, bias=False).double()
    >>> x = torch.diag(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    >>> y = -torch.ones(3, 1, dtype=torch.float64)
    >>> H = hessian_operator(model, nn.MSELoss(reduction="sum"), (x, y))
    >>> H.dense().round(10).tolist()
    [[2.0, 0.0, 0.0], [0.0, 8.0, 0.0], [0.0, 0.0, 18.0]]

    Args:
        model: the network (a ``torch.nn.Module``; batch norm in eval mode).
        loss: the loss module (called for every value and derivative; see :mod:`lossgeom.losses`).
        data: one batch or an iterable of batches (see :mod:`lossgeom.batches`).
        params: the point, a dict naming parameters of the model (the others held
            fixed); ``None``: the model's own trainable parameters.
        output: selects the tensor of outputs from what the model returns (see :mod:`lossgeom.outputs`).
        group: a ``torch.distributed`` process group (``data`` is then this rank's shard;
            see :mod:`lossgeom.distributed`), or ``None`` for one process.
        method: how an HVP is differentiated (see :class:`HessianOperator`).

    Returns:
        The :class:`HessianOperator` at the point.

    Raises:
        TypeError: if ``model`` is not a module, ``loss`` is not a loss module (a loss
            name such as ``"cross_entropy"`` included) or ``data`` is malformed.
        ValueError: if the loss is not finite at the point, the targets are malformed,
            a parameter name is unknown, or ``method`` is unknown.
    """
    return HessianOperator.from_risk(
        EmpiricalRisk(model, loss, data, params=params, group=group, output=output), method=method
    )


__all__ = ["HVP_METHODS", "HessianOperator", "hessian_operator"]

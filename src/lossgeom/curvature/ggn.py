"""The generalised Gauss-Newton matrix ``G = sum_b J_b^T Lambda_b J_b`` as an operator.

``J_b`` is the Jacobian of the outputs on batch ``b`` and ``Lambda_b`` the Hessian of the
loss w.r.t. the outputs (Schraudolph 2002); positive semi-definite for convex losses
(the chapter "Curvature is a spectrum"). It needs a model, so it has only the module
form: :func:`ggn_operator` ``(model, loss, data, *, params=None)``, or
:meth:`GGNOperator.from_risk` of an :class:`lossgeom.risk.EmpiricalRisk`.
"""

from __future__ import annotations

import torch
from torch import nn

from lossgeom.curvature.base import CurvatureOperator, quiet_torch_warnings
from lossgeom.risk import EmpiricalRisk, math_attention
from lossgeom.types import Data, Params


class GGNOperator(CurvatureOperator):
    """The generalised Gauss-Newton ``G = sum_b J_b^T Lambda_b J_b`` (the chapter "Curvature is a spectrum").

    ``GGNOperator(model, loss, data, *, params=None)`` (as :func:`ggn_operator`) or
    :meth:`from_risk` of an :class:`~lossgeom.risk.EmpiricalRisk`.

    ``J_b`` is the Jacobian of the outputs on batch ``b`` w.r.t. the flattened parameters
    and ``Lambda_b`` the Hessian of ``w_b loss`` w.r.t. those outputs: for the
    cross-entropy ``c (diag p - p p^T)`` per example and position (``p`` the softmax over
    axis 1), for the squared error ``2 c I``, with ``c`` the weight of one loss term
    (``1 / #terms`` under mean reduction). A block of ``k`` columns costs one vmapped
    Jacobian-vector product and one vmapped vector-Jacobian product per batch.
    """

    def __init__(
        self, model: nn.Module, loss: nn.Module, data: Data, *, params: Params | None = None, group=None
    ) -> None:
        self._build(EmpiricalRisk(model, loss, data, params=params, group=group))

    @classmethod
    def from_risk(cls, risk: EmpiricalRisk) -> GGNOperator:
        """The GGN ``sum_b J_b^T Lambda_b J_b`` of an :class:`~lossgeom.risk.EmpiricalRisk`.

        Args:
            risk: the empirical risk; the point is ``risk.point``.

        Returns:
            The operator.
        """
        operator = cls.__new__(cls)
        operator._build(risk)
        return operator

    def _build(self, risk: EmpiricalRisk) -> None:
        super().__init__(risk.n, risk.dtype, risk.device)
        self.risk, self.point = risk, risk.point
        self.group = risk.group
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
        return torch.func.vmap(lambda u: vjp_fn(u)[0], out_dims=1)(self._output_metric(out, jm, b))

    def _output_metric(self, out: torch.Tensor, jm: torch.Tensor, b: int) -> torch.Tensor:
        """``Lambda_b`` applied to each of the ``k`` output directions ``jm`` (shape ``(k, *out.shape)``)."""
        return torch.func.vmap(lambda u: self.risk.output_hessian_product(out, u, b))(jm)

    def _matmat(self, m: torch.Tensor) -> torch.Tensor:
        if self._kept is not None:
            return self._batch_product(0, m, self._kept)
        total = torch.zeros_like(m)
        for b in range(self.risk.n_batches):
            total += self._batch_product(b, m)
        return total


def ggn_operator(
    model: nn.Module, loss: nn.Module, data: Data, *, params: Params | None = None, group=None
) -> GGNOperator:
    """The generalised Gauss-Newton matrix ``G = sum_b J_b^T Lambda_b J_b`` as an operator.

    ``J_b = d f(x_b; theta) / d theta`` and ``Lambda_b`` the Hessian of ``w_b loss`` w.r.t.
    the outputs: ``c (diag p - p p^T)`` per position for the cross-entropy, ``2 c I`` for the
    squared error. Cross-entropy outputs may be ``(N, C)`` or ``(N, C, d1, ...)`` (classes on
    axis 1, every position a loss term, as in ``nn.CrossEntropyLoss``).

    Args:
        model: the network (batch norm in eval mode).
        loss: ``nn.CrossEntropyLoss()`` or ``nn.MSELoss()`` (reduction respected).
        data: an ``(x, y)`` pair or an iterable of ``(x, y)`` batches.
        params: the point (``None``: the model's own trainable parameters).
        group: a ``torch.distributed`` process group (``data`` is then this rank's shard;
            see :mod:`lossgeom.distributed`), or ``None`` for one process.

    Returns:
        The :class:`GGNOperator`.

    Raises:
        TypeError: if ``loss`` is not a loss module (a name such as ``"cross_entropy"``
            included), ``model`` is not a module or ``data`` is malformed.
        ValueError: on empty data, a batch-norm model in training mode, misspelt
            parameter names, targets of the wrong shape, or a non-finite loss.
    """
    return GGNOperator(model, loss, data, params=params, group=group)


__all__ = ["GGNOperator", "ggn_operator"]

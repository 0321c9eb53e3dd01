r"""The generalised Gauss-Newton matrix :math:`G = \sum_b J_b^\top \Lambda_b J_b` as an operator.

:math:`J_b` is the Jacobian of the outputs on batch :math:`b` and :math:`\Lambda_b` the
Hessian of the loss w.r.t. the outputs (Schraudolph 2002); positive semi-definite for
convex losses, and the Hessian minus the terms weighted by the loss's output gradient
(Martens 2020). It needs a model, so it has only the module
form: :func:`ggn_operator` ``(model, loss, data, *, params=None)``, or
:meth:`GGNOperator.from_risk` of an :class:`lossgeom.risk.EmpiricalRisk`.
"""

from __future__ import annotations

import torch
from torch import nn

from lossgeom.batches import ModelBatch
from lossgeom.curvature.base import CurvatureOperator, fast_path_agrees, probe_vector, quiet_torch_warnings
from lossgeom.risk import EmpiricalRisk, math_attention
from lossgeom.types import Data, Group, Output, Params


class GGNOperator(CurvatureOperator):
    r"""The generalised Gauss-Newton :math:`G = \sum_b J_b^\top \Lambda_b J_b` (Schraudolph 2002).

    ``GGNOperator(model, loss, data, *, params=None)`` (as :func:`ggn_operator`) or
    :meth:`from_risk` of an :class:`~lossgeom.risk.EmpiricalRisk`.

    :math:`J_b` is the Jacobian of the outputs on batch :math:`b` w.r.t. the flattened
    parameters and :math:`\Lambda_b` the Hessian of :math:`w_b \ell` w.r.t. those outputs:
    for the cross-entropy :math:`c (\operatorname{diag} p - p p^\top)` per example and
    position (:math:`p` the softmax over axis 1), for the squared error :math:`2 c I`,
    with :math:`c` the weight of one loss term (one over the number of terms under mean
    reduction); for any loss module, by autograd of the module itself on the outputs, so
    its options (``ignore_index``, ``weight``, ``label_smoothing``) and subclasses are
    exact by construction. A block of ``k`` columns costs one vmapped
    Jacobian-vector product and one vmapped vector-Jacobian product per batch.

    The forward-mode Jacobian-vector products are used only after they agree with
    reverse mode at set-up (``J v`` both ways on the first batch and a fixed probe vector,
    not counted in ``n_hvp``); otherwise, or if forward mode fails, a ``RuntimeWarning``
    says so and ``jacobian_mode`` is ``"reverse"`` (``J m`` as the derivative of a
    vector-Jacobian product, one column at a time). Torch's forward-mode rule for
    ``nn.Embedding(padding_idx=...)`` differentiates the padding row, which reverse mode,
    and so the gradient, holds fixed.
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
    ) -> None:
        self._build(EmpiricalRisk(model, loss, data, params=params, group=group, output=output))

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
        held = None if risk.source.streamed else list(risk.batches())
        first = held[0] if held else next(iter(risk.batches()))
        #: how ``J m`` is computed: ``"forward"`` (vmapped ``torch.func.jvp``) or ``"reverse"``
        #: (the derivative of a vector-Jacobian product, used where forward mode disagrees)
        self.jacobian_mode = "forward" if self._forward_mode_agrees(first) else "reverse"
        if held is not None and len(held) == 1 and self.jacobian_mode == "forward":
            with math_attention(), quiet_torch_warnings():
                self._kept = (first, torch.func.vjp(lambda v: risk.outputs(v, first), self.point))

    def _forward_mode_agrees(self, first: ModelBatch) -> bool:
        """Compare ``J v`` by forward mode with ``J v`` by reverse mode on the first batch and a probe vector.

        One Jacobian-vector product of each kind at set-up, not counted in ``n_hvp``; a gap
        (or a failure of forward mode) warns and returns ``False``.
        """
        v = probe_vector(self.shape[0], self.dtype, self.device)
        fast, failure = None, None
        with self._product_context():
            try:
                fast = self._forward_jacobian_product(first, v)
            except (RuntimeError, NotImplementedError) as err:
                failure = f"forward mode failed ({type(err).__name__}: {str(err).splitlines()[0]})"
            leaf = self.point.clone().requires_grad_(True)
            with torch.enable_grad():
                out = self.risk.outputs(leaf, first)
                safe = _reverse_jacobian_product(out, leaf, v)
        return fast_path_agrees(fast, safe, f"{type(self).__name__} (forward-mode Jacobian products)", failure)

    def _forward_jacobian_product(self, b: ModelBatch, m: torch.Tensor) -> torch.Tensor:
        """``J_b m_j`` for each column, by vmapped ``torch.func.jvp``: shape ``(k, *outputs)``."""
        risk = self.risk
        return torch.func.vmap(
            lambda v: torch.func.jvp(lambda w: risk.outputs(w, b), (self.point,), (v,))[1], in_dims=1
        )(m)

    def _batch_product(self, b: ModelBatch, m: torch.Tensor, kept: tuple | None = None) -> torch.Tensor:
        risk = self.risk
        if self.jacobian_mode == "reverse":
            leaf = self.point.clone().requires_grad_(True)
            with torch.enable_grad():
                out = risk.outputs(leaf, b)
                metric = self._output_metric(out.detach(), _reverse_jacobian_product(out, leaf, m), b)
                columns = [
                    torch.autograd.grad(out, leaf, u, retain_graph=True, allow_unused=True, materialize_grads=True)[0]
                    for u in metric
                ]
            return torch.stack(columns, dim=1)
        out, vjp_fn = kept if kept is not None else torch.func.vjp(lambda v: risk.outputs(v, b), self.point)
        jm = self._forward_jacobian_product(b, m)
        return torch.func.vmap(lambda u: vjp_fn(u)[0], out_dims=1)(self._output_metric(out.detach(), jm, b))

    def _output_metric(self, out: torch.Tensor, jm: torch.Tensor, b: ModelBatch) -> torch.Tensor:
        """``Lambda_b`` applied to each of the ``k`` output directions ``jm`` (shape ``(k, *out.shape)``)."""
        return self.risk.output_hessian_products(out, jm, b)

    def _matmat(self, m: torch.Tensor) -> torch.Tensor:
        if self._kept is not None:
            return self._batch_product(self._kept[0], m, self._kept[1])
        total = torch.zeros_like(m)
        for b in self.risk.batches():
            total += self._batch_product(b, m)
        return total


def _reverse_jacobian_product(out: torch.Tensor, leaf: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """``J m_j`` for each column of ``m`` by reverse mode only, shape ``(k, *out.shape)``.

    ``J^T u`` is linear in ``u``, so ``J m = d/du <J^T u, m>``: two backward passes per
    column through ``out``'s graph, no forward-mode rule involved.
    """
    u = torch.zeros_like(out, requires_grad=True)
    (vjp,) = torch.autograd.grad(out, leaf, u, create_graph=True, allow_unused=True, materialize_grads=True)
    if not vjp.requires_grad:  # the outputs do not depend on the parameters
        return torch.zeros(m.shape[1], *out.shape, dtype=out.dtype, device=out.device)
    return torch.stack([torch.autograd.grad(vjp, u, m[:, j], retain_graph=True)[0] for j in range(m.shape[1])])


def ggn_operator(
    model: nn.Module,
    loss: nn.Module,
    data: Data,
    *,
    params: Params | None = None,
    group: Group = None,
    output: Output = None,
) -> GGNOperator:
    r"""The generalised Gauss-Newton matrix :math:`G = \sum_b J_b^\top \Lambda_b J_b` as an operator.

    :math:`J_b = \partial f(x_b; \theta) / \partial \theta` and :math:`\Lambda_b` the Hessian
    of :math:`w_b \ell` w.r.t. the outputs: :math:`c (\operatorname{diag} p - p p^\top)` per
    position for the cross-entropy, :math:`2 c I` for the squared error (Schraudolph 2002).
    Cross-entropy outputs may be ``(N, C)`` or ``(N, C, d1, ...)`` (classes on axis 1, every
    position a loss term, as in ``nn.CrossEntropyLoss``).

    For a model linear in its parameters the GGN is the Hessian: :math:`f(x) = w^\top x`
    under the summed squared error gives :math:`G = 2 X^\top X`, here
    :math:`\operatorname{diag}(2, 8, 18)`:

    >>> import torch
    >>> from torch import nn
    >>> from lossgeom.curvature import ggn_operator
    >>> model = nn.Linear(3, 1, bias=False).double()
    >>> x = torch.diag(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    >>> y = -torch.ones(3, 1, dtype=torch.float64)
    >>> G = ggn_operator(model, nn.MSELoss(reduction="sum"), (x, y))
    >>> G.dense().round(10).tolist()
    [[2.0, 0.0, 0.0], [0.0, 8.0, 0.0], [0.0, 0.0, 18.0]]

    Args:
        model: the network (batch norm in eval mode).
        loss: the loss module (called for every value and derivative; see :mod:`lossgeom.losses`).
        data: one batch or an iterable of batches (see :mod:`lossgeom.batches`).
        params: the point (``None``: the model's own trainable parameters).
        output: selects the tensor of outputs from what the model returns (see :mod:`lossgeom.outputs`).
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
    return GGNOperator(model, loss, data, params=params, group=group, output=output)


__all__ = ["GGNOperator", "ggn_operator"]

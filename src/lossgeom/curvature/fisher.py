r"""Fisher matrices as operators: the empirical Fisher and, for the cross-entropy, the true Fisher.

The empirical Fisher :math:`\sum_i a_i \nabla \ell_i \nabla \ell_i^\top` of the per-example
losses (Kunstner et al. 2019) or, for the cross-entropy, the true Fisher
:math:`\mathbb{E}_{y \sim p}[\nabla \log p_y \nabla \log p_y^\top]`, equal to the GGN
(Martens 2020). Both are
matrix-free operators with a GGN product's cost and memory; :func:`fisher_scores` gives the
factor ``F = S^T S`` of score rows for small models. They need a model, so there is only
the module form: :func:`fisher_operator` ``(model, loss, data, *, params=None, kind=...)``
or :meth:`FisherOperator.from_risk`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from lossgeom.curvature.base import fast_path_agrees, probe_vector, quiet_torch_warnings
from lossgeom.curvature.ggn import GGNOperator
from lossgeom.risk import EmpiricalRisk, math_attention
from lossgeom.types import Data, Group, Params

FISHER_KINDS = ("empirical", "true")


def check_kind(kind: str) -> str:
    """Refuse a Fisher ``kind`` other than ``"empirical"`` or ``"true"``.

    Args:
        kind: the Fisher kind to check, one of ``FISHER_KINDS``.

    Returns:
        ``kind`` itself.

    Raises:
        ValueError: on any other value.
    """
    if kind not in FISHER_KINDS:
        raise ValueError(f"kind must be 'empirical' or 'true', got {kind!r}")
    return kind


def _class_last(t: torch.Tensor) -> torch.Tensor:
    """``(N, C, d1, ...) -> (N * d1 * ..., C)``: one row per loss position."""
    if t.ndim == 2:
        return t
    return t.movedim(1, -1).reshape(-1, t.shape[1])


def output_jacobian(
    outputs: Callable[[torch.Tensor], torch.Tensor], point: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """``d outputs / d theta`` as an ``(out.numel(), n)`` tensor (forward mode when n < outputs).

    Forward mode (``torch.func.jacfwd``) is used only if ``J^T u`` from it agrees with one
    vector-Jacobian product (reverse mode) for a fixed probe ``u``; otherwise, or if it
    fails, a ``RuntimeWarning`` says so and the Jacobian is ``torch.func.jacrev``'s.

    Args:
        outputs: the map ``theta -> f(x; theta)`` on the flat parameter vector.
        point: the flat parameter vector ``theta``.
        out: ``outputs(point)`` (its shape fixes the rows).

    Returns:
        The Jacobian, one row per output entry.
    """
    shape = (out.numel(), point.numel())
    with quiet_torch_warnings(), math_attention():
        if point.numel() < out.numel():
            fast, failure = None, None
            try:
                fast = torch.func.jacfwd(outputs)(point).reshape(shape)
            except (RuntimeError, NotImplementedError) as err:
                failure = f"forward mode failed ({type(err).__name__}: {str(err).splitlines()[0]})"
            u = probe_vector(out.numel(), out.dtype, out.device)
            _, vjp_fn = torch.func.vjp(outputs, point)
            (safe,) = vjp_fn(u.reshape(out.shape))
            if fast_path_agrees(None if fast is None else fast.T @ u[:, 0], safe, "output Jacobian (jacfwd)", failure):
                return fast
        return torch.func.jacrev(outputs)(point).reshape(shape)


def fisher_scores(risk: EmpiricalRisk, kind: str) -> torch.Tensor:
    """Rows ``s_r`` with ``F = sum_r s_r s_r^T`` (small models: all rows are stored).

    ``kind="empirical"``: one row per example, ``sqrt(a_i) grad l_i`` (``l_i`` the loss
    module on example ``i`` alone, ``L = sum_i a_i l_i``). ``kind="true"`` (cross-entropy):
    one row per example, position and class, ``sqrt(c p_c) J^T (e_c - p)``.

    Args:
        risk: the empirical risk.
        kind: ``"empirical"`` or ``"true"``.

    Returns:
        The ``(rows, n)`` score matrix ``S``.
    """
    rows = []
    for b in range(risk.n_batches):

        def outputs(v: torch.Tensor, b: int = b) -> torch.Tensor:
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


class FisherOperator(GGNOperator):
    r"""A Fisher matrix as a matrix-free operator: :math:`F m = \sum_b J_b^\top M_b J_b m`.

    ``FisherOperator(model, loss, data, *, params=None, kind="empirical")`` (as
    :func:`fisher_operator`) or :meth:`from_risk` of an :class:`~lossgeom.risk.EmpiricalRisk`.

    ``kind="empirical"``: :math:`F = \sum_i a_i g_i g_i^\top` with :math:`g_i = J_i^\top r_i`
    the gradient of example :math:`i`'s own loss :math:`\ell_i`
    (:math:`r_i = \partial \ell_i / \partial f_i`) and :math:`L = \sum_i a_i \ell_i`
    (:math:`a_i = 1/N` for a mean over :math:`N` examples of equal size), so the output
    metric is :math:`M = \operatorname{blockdiag}(a_i r_i r_i^\top)`. ``kind="true"``
    (cross-entropy only): :math:`F = \sum_{\text{positions}} c\, \mathbb{E}_{y \sim p}[\nabla
    \log p_y \nabla \log p_y^\top]`, the expected outer product under the model's own
    predictive distribution at every position, whose output metric is
    :math:`c (\operatorname{diag} p - p p^\top)`: the GGN's (Martens 2020).

    A block of ``k`` columns costs one vmapped Jacobian-vector product and one vmapped
    vector-Jacobian product per batch, like a GGN product, and the same memory: no score
    matrix (examples x classes x parameters) is stored. :func:`fisher_scores` gives that
    factor for small models.

    Args:
        model: the network.
        loss: ``nn.CrossEntropyLoss()`` or ``nn.MSELoss()``.
        data: an ``(x, y)`` pair or an iterable of batches.
        params: the point (``None``: the model's own trainable parameters).
        group: a ``torch.distributed`` process group (``data`` is then this rank's shard;
            see :mod:`lossgeom.distributed`), or ``None`` for one process.
        kind: ``"empirical"`` or ``"true"``.

    Raises:
        ValueError: on an unknown ``kind``, ``kind="true"`` with the squared error, or
            as :class:`~lossgeom.risk.EmpiricalRisk`.
    """

    def __init__(
        self,
        model: nn.Module,
        loss: nn.Module,
        data: Data,
        *,
        params: Params | None = None,
        group: Group = None,
        kind: str = "empirical",
    ) -> None:
        check_kind(kind)
        self._build_fisher(EmpiricalRisk(model, loss, data, params=params, group=group), kind)

    @classmethod
    def from_risk(cls, risk: EmpiricalRisk, *, kind: str = "empirical") -> FisherOperator:
        """The Fisher of kind ``kind`` of an :class:`~lossgeom.risk.EmpiricalRisk`.

        Args:
            risk: the empirical risk; the point is ``risk.point``.
            kind: ``"empirical"`` or ``"true"`` (cross-entropy only).

        Returns:
            The operator.

        Raises:
            ValueError: on an unknown ``kind``, or ``kind="true"`` for a loss other than
                the cross-entropy.
        """
        check_kind(kind)
        operator = cls.__new__(cls)
        operator._build_fisher(risk, kind)
        return operator

    def _build_fisher(self, risk: EmpiricalRisk, kind: str) -> None:
        if kind == "true" and not isinstance(risk.loss, nn.CrossEntropyLoss):
            raise ValueError(
                "kind='true' is implemented for the cross-entropy; for a Gaussian likelihood "
                "(mse) the true Fisher is proportional to the GGN: use ggn_operator"
            )
        self.kind = kind
        self._residuals: dict[int, torch.Tensor] = {}
        self._build(risk)

    def _example_residuals(self, out: torch.Tensor, b: int) -> torch.Tensor:
        """``r_i = dl_i / df_i`` of batch ``b``, one row per example (kept between products)."""
        if b not in self._residuals:
            risk = self.risk
            with torch.enable_grad():
                out_req = out.detach().clone().requires_grad_(True)
                (dloss,) = torch.autograd.grad(risk.batch_loss(out_req, b), out_req)  # sum_i a_i dl_i/df
            self._residuals[b] = dloss.reshape(out.shape[0], -1) / risk.example_shares(b)[:, None]
        return self._residuals[b]

    def _output_metric(self, out: torch.Tensor, jm: torch.Tensor, b: int) -> torch.Tensor:
        if self.kind == "true":
            return super()._output_metric(out, jm, b)
        residuals = self._example_residuals(out, b)  # (N, E)
        k, n_examples = jm.shape[0], out.shape[0]
        along = (jm.reshape(k, n_examples, -1) * residuals).sum(-1)  # r_i . (J m)_i
        weighted = (self.risk.example_shares(b) * along)[..., None] * residuals
        return weighted.reshape(jm.shape)


def fisher_operator(
    model: nn.Module,
    loss: nn.Module,
    data: Data,
    *,
    params: Params | None = None,
    group: Group = None,
    kind: str = "empirical",
) -> FisherOperator:
    r"""The empirical (``kind="empirical"``) or true (``kind="true"``) Fisher as an operator.

    :math:`F = \sum_i a_i g_i g_i^\top` (empirical, :math:`g_i` the gradient of example
    :math:`i`'s own loss; Kunstner et al. 2019) or
    :math:`\sum_{\text{positions}} c\, \mathbb{E}_{y \sim p}[\nabla \log p_y \nabla \log p_y^\top]`
    (true, cross-entropy; Martens 2020). Matrix-free: a product costs one Jacobian-vector
    and one vector-Jacobian product per batch, as a GGN product does, and nothing of size
    examples x parameters is stored.

    A linear model :math:`f(x) = w^\top x` at :math:`w = 0` with targets :math:`-1` under
    the summed squared error has per-example gradients :math:`g_i = 2 x_i`, so
    :math:`F = 4 X^\top X`, here :math:`\operatorname{diag}(4, 16, 36)`:

    >>> import torch
    >>> from torch import nn
    >>> from lossgeom.curvature import fisher_operator
    >>> model = nn.Linear(3, 1, bias=False).double()
    >>> _ = nn.init.zeros_(model.weight)
    >>> x = torch.diag(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    >>> y = -torch.ones(3, 1, dtype=torch.float64)
    >>> F = fisher_operator(model, nn.MSELoss(reduction="sum"), (x, y))
    >>> F.dense().round(10).tolist()
    [[4.0, 0.0, 0.0], [0.0, 16.0, 0.0], [0.0, 0.0, 36.0]]

    Args:
        model: the network.
        loss: ``nn.CrossEntropyLoss()`` or ``nn.MSELoss()``.
        data: an ``(x, y)`` pair or an iterable of batches.
        params: the point (``None``: the model's own trainable parameters).
        group: a ``torch.distributed`` process group (``data`` is then this rank's shard;
            see :mod:`lossgeom.distributed`), or ``None`` for one process.
        kind: ``"empirical"`` or ``"true"``.

    Returns:
        The :class:`FisherOperator`.

    Raises:
        TypeError: if ``loss`` is not a loss module (a name such as ``"cross_entropy"``
            included).
        ValueError: on an unknown ``kind``, ``kind="true"`` with the squared error, or as
            :class:`~lossgeom.risk.EmpiricalRisk`.
    """
    check_kind(kind)
    return FisherOperator(model, loss, data, params=params, group=group, kind=kind)


__all__ = ["FISHER_KINDS", "FisherOperator", "fisher_operator", "fisher_scores", "output_jacobian"]

r"""Fisher matrices as operators: the empirical Fisher and the true Fisher of a likelihood.

The empirical Fisher :math:`\sum_i a_i \nabla \ell_i \nabla \ell_i^\top` of the per-example
losses (Kunstner et al. 2019) or the true Fisher
:math:`\mathbb{E}_{y \sim p}[\nabla \log p_y \nabla \log p_y^\top]` of a likelihood the
library knows (:func:`lossgeom.losses.likelihood`: the cross-entropy, the Bernoulli and
Gaussian likelihoods, ``nn.NLLLoss`` on log-probabilities), equal to the GGN for the first
three (Martens 2020). Both are
matrix-free operators with a GGN product's cost and memory; :func:`fisher_scores` gives the
factor ``F = S^T S`` of score rows for small models. They need a model, so there is only
the module form: :func:`fisher_operator` ``(model, loss, data, *, params=None, kind=...)``
or :meth:`FisherOperator.from_risk`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from lossgeom.batches import ModelBatch
from lossgeom.curvature.base import fast_path_agrees, probe_vector, quiet_torch_warnings
from lossgeom.curvature.ggn import GGNOperator
from lossgeom.losses import check_likelihood_targets, fisher_output_products, likelihood
from lossgeom.risk import EmpiricalRisk, math_attention
from lossgeom.types import Data, Group, Output, Params

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
    module on example ``i`` alone, ``L = sum_i a_i l_i``). ``kind="true"``: ``M^{1/2} J``
    with ``M`` the Fisher of the likelihood with respect to the outputs
    (:func:`lossgeom.losses.fisher_output_products`), one row per positive eigenvalue of ``M``.

    Args:
        risk: the empirical risk.
        kind: ``"empirical"`` or ``"true"``.

    Returns:
        The ``(rows, n)`` score matrix ``S``.

    Raises:
        ValueError: on an unknown ``kind``, or as :class:`FisherOperator`.
    """
    check_kind(kind)
    law = likelihood(risk.loss, "the true Fisher (kind='true')") if kind == "true" else None
    rows = []
    for batch in risk.batches():

        def outputs(v: torch.Tensor, batch: ModelBatch = batch) -> torch.Tensor:
            return risk.outputs(v, batch)

        with torch.no_grad():
            out = outputs(risk.point)
        jac = output_jacobian(outputs, risk.point, out)  # (out.numel(), n)
        if law is None:
            residuals, shares = _residuals(risk, out, batch)
            jac_examples = jac.reshape(out.shape[0], -1, risk.n)
            rows.append(torch.einsum("ik,ikn->in", residuals, jac_examples) * shares.sqrt()[:, None])
            continue
        check_likelihood_targets(law, risk.loss, out, batch.y)
        if type(risk.loss) is nn.CrossEntropyLoss and not torch.is_floating_point(batch.y):
            rows.append(_softmax_scores(risk, out, batch, jac))
            continue
        eye = torch.eye(out.numel(), dtype=out.dtype, device=out.device).reshape(-1, *out.shape)
        metric = fisher_output_products(law, risk.loss, out, batch.y, eye, batch.weight).reshape(out.numel(), -1)
        values, vectors = torch.linalg.eigh(0.5 * (metric + metric.T))
        keep = values > values.abs().max().clamp_min(1e-300) * out.numel() * torch.finfo(out.dtype).eps
        rows.append((vectors[:, keep] * values[keep].sqrt()).T @ jac)
    return torch.cat(rows).detach()


def _softmax_scores(risk: EmpiricalRisk, out: torch.Tensor, batch: ModelBatch, jac: torch.Tensor) -> torch.Tensor:
    """``sqrt(c p_c) J^T (e_c - p)`` per kept position and class: the cross-entropy's factor in closed form.

    Exact rows (no eigendecomposition of the output metric), so the factor's small singular
    values are resolved to rounding; ``c`` is the weight of one term, zero at ignored positions.
    """
    n_classes = out.shape[1]
    logits = out.movedim(1, -1).reshape(-1, n_classes)  # (positions, C)
    p = torch.softmax(logits, dim=1)
    kept = (batch.y != risk.loss.ignore_index).reshape(-1).to(out.dtype)
    count = float(kept.sum()) if risk.loss.reduction == "mean" else 1.0
    c = kept * (batch.weight / count)
    jac_positions = jac.reshape(*out.shape, risk.n).movedim(1, -2).reshape(-1, n_classes, risk.n)
    eye = torch.eye(n_classes, dtype=out.dtype, device=out.device)
    directions = eye[None, :, :] - p[:, None, :]  # grad_f log p_c = e_c - p
    scores = torch.einsum("pck,pkn->pcn", directions, jac_positions) * (c[:, None] * p).sqrt()[:, :, None]
    return scores[kept.bool()].reshape(-1, risk.n)


def _residuals(risk: EmpiricalRisk, out: torch.Tensor, batch: ModelBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """``(r_i, a_i)``: ``dl_i / df_i`` per example (one row each) and the example's share of the risk.

    From one gradient of the weighted batch loss, ``sum_i a_i dl_i / df``, divided by
    ``a_i``; an example with no term of the loss (every target ignored) has ``r_i = 0``.
    """
    shares = risk.example_shares(batch)
    with torch.enable_grad():
        out_req = out.detach().clone().requires_grad_(True)
        (dloss,) = torch.autograd.grad(risk.batch_loss(out_req, batch), out_req)
    safe = torch.where(shares > 0, shares, torch.ones_like(shares))
    residuals = dloss.reshape(out.shape[0], -1) / safe[:, None]
    return torch.where((shares > 0)[:, None], residuals, torch.zeros_like(residuals)), shares


class FisherOperator(GGNOperator):
    r"""A Fisher matrix as a matrix-free operator: :math:`F m = \sum_b J_b^\top M_b J_b m`.

    ``FisherOperator(model, loss, data, *, params=None, kind="empirical")`` (as
    :func:`fisher_operator`) or :meth:`from_risk` of an :class:`~lossgeom.risk.EmpiricalRisk`.

    ``kind="empirical"``: :math:`F = \sum_i a_i g_i g_i^\top` with :math:`g_i = J_i^\top r_i`
    the gradient of example :math:`i`'s own loss :math:`\ell_i`
    (:math:`r_i = \partial \ell_i / \partial f_i`) and :math:`L = \sum_i a_i \ell_i`
    (:math:`a_i = 1/N` for a mean over :math:`N` examples of equal size), so the output
    metric is :math:`M = \operatorname{blockdiag}(a_i r_i r_i^\top)`. ``kind="true"``
    (a likelihood the library knows, see :func:`lossgeom.losses.likelihood`):
    :math:`F = \sum_{\text{positions}} c\, \mathbb{E}_{y \sim p}[\nabla \log p_y \nabla
    \log p_y^\top]`, the expected outer product under the model's own predictive
    distribution at every kept position; for the cross-entropy its output metric is
    :math:`c (\operatorname{diag} p - p p^\top)`, the GGN's (Martens 2020).

    A block of ``k`` columns costs one vmapped Jacobian-vector product and one vmapped
    vector-Jacobian product per batch, like a GGN product, and the same memory: no score
    matrix (examples x classes x parameters) is stored. :func:`fisher_scores` gives that
    factor for small models.

    Args:
        model: the network.
        loss: the loss module (called for every value and derivative; see :mod:`lossgeom.losses`).
        data: one batch or an iterable of batches (see :mod:`lossgeom.batches`).
        params: the point (``None``: the model's own trainable parameters).
        group: a ``torch.distributed`` process group (``data`` is then this rank's shard;
            see :mod:`lossgeom.distributed`), or ``None`` for one process.
        kind: ``"empirical"`` or ``"true"``.

    Raises:
        ValueError: on an unknown ``kind``, ``kind="true"`` for a loss without a likelihood
            the library knows (named), or as :class:`~lossgeom.risk.EmpiricalRisk`.
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
        kind: str = "empirical",
    ) -> None:
        check_kind(kind)
        self._build_fisher(EmpiricalRisk(model, loss, data, params=params, group=group, output=output), kind)

    @classmethod
    def from_risk(cls, risk: EmpiricalRisk, *, kind: str = "empirical") -> FisherOperator:
        """The Fisher of kind ``kind`` of an :class:`~lossgeom.risk.EmpiricalRisk`.

        Args:
            risk: the empirical risk; the point is ``risk.point``.
            kind: ``"empirical"`` or ``"true"`` (a loss with a likelihood).

        Returns:
            The operator.

        Raises:
            ValueError: on an unknown ``kind``, or ``kind="true"`` for a loss without a
                likelihood the library knows.
        """
        check_kind(kind)
        operator = cls.__new__(cls)
        operator._build_fisher(risk, kind)
        return operator

    def _build_fisher(self, risk: EmpiricalRisk, kind: str) -> None:
        self.kind = kind
        #: the likelihood of ``kind="true"`` (see :func:`lossgeom.losses.likelihood`), else ``None``
        self.likelihood = likelihood(risk.loss, "the true Fisher (kind='true')") if kind == "true" else None
        self._residuals: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        if kind == "empirical":
            risk.example_shares(next(iter(risk.batches())))  # refuses a loss with no per-example shares
        else:
            for batch in risk.batches():
                with torch.no_grad():
                    out = risk.outputs(risk.point, batch)
                check_likelihood_targets(self.likelihood, risk.loss, out, batch.y)
                if risk.source.streamed:
                    break
        self._build(risk)

    def _example_residuals(self, out: torch.Tensor, b: ModelBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """``(r_i, a_i)`` of a batch (kept between products for data held in memory)."""
        if self.risk.source.streamed:
            return _residuals(self.risk, out, b)
        if b.index not in self._residuals:
            self._residuals[b.index] = _residuals(self.risk, out, b)
        return self._residuals[b.index]

    def _output_metric(self, out: torch.Tensor, jm: torch.Tensor, b: ModelBatch) -> torch.Tensor:
        if self.kind == "true":
            return fisher_output_products(self.likelihood, self.risk.loss, out, b.y, jm, b.weight)
        residuals, shares = self._example_residuals(out, b)  # (N, E), (N,)
        k, n_examples = jm.shape[0], out.shape[0]
        along = (jm.reshape(k, n_examples, -1) * residuals).sum(-1)  # r_i . (J m)_i
        weighted = (shares * along)[..., None] * residuals
        return weighted.reshape(jm.shape)


def fisher_operator(
    model: nn.Module,
    loss: nn.Module,
    data: Data,
    *,
    params: Params | None = None,
    group: Group = None,
    output: Output = None,
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
        loss: the loss module (called for every value and derivative; see :mod:`lossgeom.losses`).
        data: one batch or an iterable of batches (see :mod:`lossgeom.batches`).
        params: the point (``None``: the model's own trainable parameters).
        output: selects the tensor of outputs from what the model returns (see :mod:`lossgeom.outputs`).
        group: a ``torch.distributed`` process group (``data`` is then this rank's shard;
            see :mod:`lossgeom.distributed`), or ``None`` for one process.
        kind: ``"empirical"`` or ``"true"``.

    Returns:
        The :class:`FisherOperator`.

    Raises:
        TypeError: if ``loss`` is not a loss module (a name such as ``"cross_entropy"``
            included).
        ValueError: on an unknown ``kind``, ``kind="true"`` for a loss without a known likelihood, or as
            :class:`~lossgeom.risk.EmpiricalRisk`.
    """
    check_kind(kind)
    return FisherOperator(model, loss, data, params=params, group=group, output=output, kind=kind)


__all__ = ["FISHER_KINDS", "FisherOperator", "fisher_operator", "fisher_scores", "output_jacobian"]

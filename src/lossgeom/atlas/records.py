"""Where an atlas measurement was taken: the point, the Fisher there, and block traces.

:class:`PointRecord` holds the loss and gradient norm at a point and, where the
Fisher-Riemannian row is measured, its :class:`FisherRecord` (the Fisher's rank at the
row's cut :data:`~lossgeom.atlas.measures.FISHER_RANK_THRESHOLD`, the eigenvalues on either
side, the Hessian's part on the Fisher's kernel and the row's value at each of
:data:`~lossgeom.atlas.measures.FISHER_CUTS`). :func:`feature_norm_change` and
:func:`hessian_block_trace` explain individual cells of the table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from lossgeom import flatness
from lossgeom.atlas.measures import FISHER_CUTS, FISHER_RANK_THRESHOLD
from lossgeom.curvature import HessianOperator
from lossgeom.formatting import fmt
from lossgeom.symmetries.core import ROUNDING_FLOOR, Symmetry
from lossgeom.types import Data, Group, Params


def _below_decade(change: float) -> str:
    """``"< 1e-12"`` for 6.8e-13: a change within tolerance is reported by its order.

    Its leading digits belong to the machine's rounding (another CPU changes them), so
    only the decade above it is shown.
    """
    if change == 0:
        return "0"
    return f"< 1e{math.floor(math.log10(change)) + 1}"


@dataclass(frozen=True)
class FisherRecord:
    """The Fisher at a point, as the Fisher-Riemannian row sees it.

    Attributes:
        threshold: the row's rank cut (:data:`~lossgeom.atlas.measures.FISHER_RANK_THRESHOLD`), relative to the
            Fisher's largest eigenvalue.
        rank: the number of Fisher eigenvalues above ``threshold`` times the largest (the
            dimension of the range the row maximises over).
        n_parameters: the number of parameters (the Fisher's size).
        kept: the smallest kept eigenvalue over the largest.
        dropped: the largest dropped eigenvalue over the largest (0 if none is dropped).
            Where ``kept / dropped`` is many decades, any cut between gives the same rank;
            where it is near 1 the spectrum runs through the cut, and the rank is the cut's.
        kernel_leakage: ``|H N|_2 / |H|_2`` for an orthonormal basis ``N`` of the dropped
            eigenvectors: the Hessian's part on the Fisher's kernel. Where it is zero the row
            is invariant under every invertible linear symmetry; where it is not, only under
            those whose Jacobian is orthogonal (permutations, translations).
        cuts: ``(cut, rank, value)`` of the Fisher-Riemannian sharpness at each cut of
            :data:`~lossgeom.atlas.measures.FISHER_CUTS`.
    """

    threshold: float
    rank: int
    n_parameters: int
    kept: float
    dropped: float
    kernel_leakage: float
    cuts: tuple[tuple[float, int, float], ...]

    @property
    def gap(self) -> float:
        """``kept / dropped``: how many-fold the spectrum drops across the cut (inf if nothing is dropped)."""
        return self.kept / self.dropped if self.dropped > 0 else math.inf

    def dropped_text(self) -> str:
        """``dropped`` with 2 digits, or ``"< 1e-13"`` at float64 rounding level (its digits are the CPU's).

        Returns:
            ``"< 1e-13"`` when ``dropped`` is below :data:`ROUNDING_FLOOR`, else ``fmt(dropped, 2)``.
        """
        return f"< {fmt(ROUNDING_FLOOR)}" if self.dropped < ROUNDING_FLOOR else fmt(self.dropped, 2)

    def gap_text(self) -> str:
        """``gap`` with 2 digits, or ``"more than 2.2e+06"`` when the largest dropped eigenvalue is rounding.

        The bound ``"more than ..."`` is ``kept`` over the rounding floor.

        Returns:
            ``"more than {kept / ROUNDING_FLOOR}"`` when ``dropped`` is below :data:`ROUNDING_FLOOR`,
            else ``fmt(gap, 2)``.
        """
        if self.dropped < ROUNDING_FLOOR:
            return f"more than {fmt(self.kept / ROUNDING_FLOOR, 2)}"
        return fmt(self.gap, 2)

    def value(self, cut: float | None = None) -> float:
        """The Fisher-Riemannian sharpness at ``cut``.

        ``cut`` is one of :data:`~lossgeom.atlas.measures.FISHER_CUTS`; the default is the row's.

        Args:
            cut: the rank cut, one of the recorded ``cuts``; ``None`` means ``threshold``.

        Returns:
            The recorded value ``lambda_max(R^T H R)`` at ``cut``.

        Raises:
            ValueError: if ``cut`` is not one of the recorded cuts.
        """
        cut = self.threshold if cut is None else cut
        for at, _, value in self.cuts:
            if at == cut:
                return value
        raise ValueError(f"cut must be one of {[c for c, _, _ in self.cuts]}, got {cut}")

    def rank_at(self, cut: float) -> int:
        """The Fisher's rank at ``cut`` (one of :data:`~lossgeom.atlas.measures.FISHER_CUTS`).

        Args:
            cut: the rank cut, one of the recorded ``cuts``.

        Returns:
            The number of Fisher eigenvalues above ``cut`` times the largest.

        Raises:
            ValueError: if ``cut`` is not one of the recorded cuts.
        """
        for at, rank, _ in self.cuts:
            if at == cut:
                return rank
        raise ValueError(f"cut must be one of {[c for c, _, _ in self.cuts]}, got {cut}")


def fisher_record(hessian: np.ndarray, fisher: np.ndarray) -> FisherRecord:
    """The :class:`FisherRecord` of a dense Hessian and Fisher (one eigendecomposition of the Fisher).

    The value at each cut is ``lambda_max(R^T H R)`` with ``R = U_+ diag(phi_+)^(-1/2)`` over
    the Fisher eigenvalues ``phi`` above the cut, as in
    :func:`lossgeom.flatness.riemannian.fisher_riemannian_sharpness_from_matrices` (the unit tests check that
    they agree).

    Args:
        hessian: the dense Hessian ``H``, an ``(n, n)`` array.
        fisher: the dense Fisher ``F``, an ``(n, n)`` array of the same size.

    Returns:
        The :class:`FisherRecord` at the cut :data:`~lossgeom.atlas.measures.FISHER_RANK_THRESHOLD`,
        with the value and rank at each of :data:`~lossgeom.atlas.measures.FISHER_CUTS`.

    Raises:
        ValueError: if the matrices are not square of one size, or the Fisher has no
            positive eigenvalue.
    """
    H, F = np.asarray(hessian, dtype=np.float64), np.asarray(fisher, dtype=np.float64)
    if H.ndim != 2 or H.shape[0] != H.shape[1] or H.shape != F.shape:
        raise ValueError(f"hessian and fisher must be square matrices of one size, got {H.shape} and {F.shape}")
    phi, U = np.linalg.eigh(F)
    top = phi[-1]
    if not top > 0:
        raise ValueError("fisher must have a positive eigenvalue")
    cuts = []
    for cut in FISHER_CUTS:
        keep = phi > cut * top
        R = U[:, keep] / np.sqrt(phi[keep])
        cuts.append((cut, int(keep.sum()), float(np.linalg.eigvalsh(R.T @ H @ R)[-1])))
    keep = phi > FISHER_RANK_THRESHOLD * top
    kernel = U[:, ~keep]
    h_norm = float(np.abs(np.linalg.eigvalsh(H)).max())
    leakage = float(np.linalg.norm(H @ kernel, 2) / h_norm) if kernel.size and h_norm > 0 else 0.0
    dropped = float(phi[~keep].max() / top) if (~keep).any() else 0.0
    return FisherRecord(
        FISHER_RANK_THRESHOLD,
        int(keep.sum()),
        H.shape[0],
        float(phi[keep].min() / top),
        max(dropped, 0.0),
        leakage,
        tuple(cuts),
    )


@dataclass(frozen=True)
class PointRecord:
    """Where a measurement was taken: the loss, the gradient norm, and the Fisher as the row sees it.

    The Fisher-Riemannian verdicts depend on stationarity (at a critical point whose
    Fisher kernel is made of symmetry directions the Hessian vanishes on that kernel), so
    the atlas records how far from one each point is.

    Attributes:
        loss: the mean loss on the data.
        gradient_norm: the Euclidean norm of its gradient (in the point's own coordinates,
            so a rescaling changes it while keeping the loss).
        fisher: the :class:`FisherRecord`, where the Fisher-Riemannian row is measured.
    """

    loss: float
    gradient_norm: float
    fisher: FisherRecord | None = None

    def text(self) -> str:
        """``"loss 0.0181, gradient norm 0.0529"`` (3 significant digits).

        Returns:
            The loss and gradient norm, each with 3 significant digits.
        """
        return f"loss {fmt(self.loss, 3)}, gradient norm {fmt(self.gradient_norm, 3)}"


def _point_record(point: flatness.LossPoint, with_fisher: bool) -> PointRecord:
    value, gradient = point.value_and_gradient(point.flat())
    fisher = None
    if with_fisher:
        try:
            fisher = fisher_record(point.hessian(), point.fisher())
        except flatness.loss_point.NotApplicable:
            fisher = None
    return PointRecord(float(value), float(gradient.norm()), fisher)


def feature_norm_change(
    model: nn.Module,
    loss: nn.Module,
    data: Data,
    *,
    params: Params | None = None,
    group: Group = None,
    symmetry: Symmetry,
    output: Callable[[object], torch.Tensor] | None = None,
) -> float:
    r"""The largest relative change of a classifier-feature norm :math:`\lVert [h_i; 1] \rVert` under ``symmetry``.

    The last-layer proxies (:math:`\kappa_{\rm exact}`, :math:`B_{\rm raw}`, :math:`B_{\rm quot}`)
    read the classifier :math:`[W\ b]` and its features :math:`[h; 1]`
    (:meth:`lossgeom.flatness.loss_point.LossPoint.classifier`); a transformation that leaves
    every :math:`\lVert [h_i; 1] \rVert` unchanged (a permutation of the classifier's inputs, a
    rescaling of units the classifier does not read) changes them only through :math:`W`.

    Args:
        model: the network.
        loss: the loss module.
        data: the data, an ``(x, y)`` pair or an iterable of batches (as :class:`~lossgeom.flatness.LossPoint`).
        params: the point (``None``: the model's own trainable parameters).
        group: must be ``None`` (the features of every example are read on one process).
        symmetry: the transformation applied to the parameters.
        output: selects the tensor of outputs from what ``model`` returns (as in
            :class:`~lossgeom.flatness.LossPoint`).

    Returns:
        :math:`\max_i \bigl| \lVert h'_i \rVert - \lVert h_i \rVert \bigr| / \lVert h_i \rVert` over the
        examples, :math:`h'` the features after ``symmetry``.

    Raises:
        TypeError: if ``symmetry`` is not a lossgeom :class:`~lossgeom.symmetries.core.Symmetry`.
        ValueError: if ``group`` is not ``None``.
        NotApplicable: if the model has no softmax classifier under ``loss``.
    """
    if not isinstance(symmetry, Symmetry):
        raise TypeError(f"symmetry must be a lossgeom Symmetry, got {type(symmetry).__name__}")
    if group is not None:
        raise ValueError("group: feature_norm_change reads every example on one process; pass group=None")
    base = flatness.LossPoint(model, loss, data, params=params, output=output)
    moved = flatness.LossPoint(model, loss, data, params=symmetry(base.params), output=output)
    before, after = base.classifier()[1].norm(dim=1), moved.classifier()[1].norm(dim=1)
    # a zero feature vector (bias-free classifier) that stays zero has not changed; one that moves changes infinitely
    tiny = torch.finfo(before.dtype).tiny
    change = torch.where(before > 0, (after - before).abs() / before.clamp_min(tiny), 0.0)
    change = torch.where((before == 0) & (after != 0), torch.inf, change)
    return float(change.max())


def hessian_block_trace(point: flatness.LossPoint, names: str | Sequence[str]) -> float:
    """``sum_i H_ii`` over the coordinates of the parameters ``names`` (one HVP per coordinate).

    Under a rescaling ``theta -> D theta`` that multiplies these parameters by ``c`` and
    keeps the loss, ``H -> D^-1 H D^-1``: the trace moves by exactly
    ``(1/c^2 - 1) * hessian_block_trace(point, names)``.

    Args:
        point: the loss point whose Hessian is used.
        names: one parameter name or a list of them.

    Returns:
        The trace of the Hessian's diagonal block over those parameters' coordinates.

    Raises:
        ValueError: if ``names`` is empty.
    """
    names = [names] if isinstance(names, str) else list(names)
    if not names:
        raise ValueError("names must list at least one parameter of the model")
    index = np.concatenate([point.block_indices(name) for name in names])
    operator = HessianOperator.from_closure(point.loss_fn, point.params, method="reverse-over-reverse")
    columns = torch.eye(operator.shape[0], dtype=operator.dtype, device=operator.device)[:, torch.as_tensor(index)]
    block = operator.matmat(columns).detach().cpu().numpy()
    return float(block[index, np.arange(len(index))].sum())

r"""Geodesic sharpness (da Silva, Dangel & Oore 2025): the worst loss increase over a geodesic ball of the quotient.

The attention of one head reads its query and key weights only through the product
:math:`G H^\top` (and its value and output weights only through another such product), so
:math:`(G, H) \mapsto (G A^{-1}, H A^\top)`, :math:`A \in GL(h)`, keeps the function
(``dasilva2025hide``, Definition 3.1 and Example A.1). With torch's row convention
(``q = x W_q^T + b_q``, head ``j`` owning rows ``j d:(j+1) d`` of each block of
``in_proj_weight``) and the bias appended to its weight as in the paper's Example A.1:

- query/key pair: :math:`G = [W_q^j\; b_q^j]^\top`, :math:`H = [W_k^j\; b_k^j]^\top`, both
  :math:`(E + 1) \times d`, scores :math:`\tilde x G H^\top \tilde x^\top` with
  :math:`\tilde x = [x\; 1]`;
- value/output pair: :math:`G = [W_v^j\; b_v^j]^\top` and :math:`H` the head's columns of
  ``out_proj.weight`` (:math:`E \times d`).

:func:`lossgeom.symmetries.attention_head_gauge` is this action (its ``qk`` is :math:`A^{-1}`
here). The paper's two gauge-invariant metrics on a pair (its Eqs. 9 and 10), with
:math:`P = G^\top G` and :math:`Q = H^\top H` (plus ``damping`` times the identity, its
relaxation of Appendix H.2):

- ``metric="inv"``: :math:`\langle \eta, \zeta \rangle = \operatorname{tr}(P^{-1}\eta_G^\top
  \zeta_G) + \operatorname{tr}(Q^{-1} \eta_H^\top \zeta_H)`;
- ``metric="mix"``: :math:`\langle \eta, \zeta \rangle = \operatorname{tr}(Q\, \eta_G^\top
  \zeta_G) + \operatorname{tr}(P\, \eta_H^\top \zeta_H)`.

Every other parameter carries the adaptive (element-wise) metric
:math:`\langle \eta, \zeta \rangle = \sum_i \eta_i \zeta_i / T_i^2` with ASAM's
:math:`T = |w| + \eta` on weights and :math:`T = 1` on the others (the rule of
:func:`lossgeom.flatness.adaptive_sharpness`), as the paper's Appendix C.1 prescribes;
``metric="adaptive"`` puts every parameter, attention included, in that metric.

Geodesic sharpness (the paper's Eq. 4) is
:math:`\max_{\xi \in \mathcal H_\theta,\ \lVert \xi \rVert_\theta \le \rho} L(\gamma_\xi(1)) - L(\theta)`
over horizontal vectors :math:`\xi` (metric-orthogonal to the gauge orbit), with the geodesic
to second order (its Eq. 5), :math:`\gamma_\xi(1) \approx \theta + \xi - \tfrac12
\Gamma_\theta(\xi, \xi)`, and the Christoffel terms of its Eqs. 11 and 12, derived again here
from the Euler-Lagrange equations of the energy:

- ``inv``: :math:`\Gamma(\xi, \xi)_G = -\xi_G P^{-1}(\xi_G^\top G + G^\top \xi_G) + G P^{-1}
  \xi_G^\top \xi_G` (and the same in :math:`H, Q`);
- ``mix``: :math:`\Gamma(\xi, \xi)_G = \xi_G (\xi_H^\top H + H^\top \xi_H) Q^{-1} - G\,
  \xi_H^\top \xi_H\, Q^{-1}` (and :math:`G \leftrightarrow H`, :math:`P \leftrightarrow Q`);
- element-wise: :math:`\Gamma(\xi, \xi)_i = -\operatorname{sign}(w_i)\, \xi_i^2 / T_i` on
  weights, 0 elsewhere.

The horizontal projection subtracts the vertical part :math:`(-G X, H X^\top)`:
:math:`X^\top = Z` solves the Sylvester equation :math:`A Z + Z A = P H^\top \xi_H - \xi_G^\top
G Q` with :math:`A = P Q` for ``inv``, and :math:`X = \tfrac12(\xi_H^\top H Q^{-1} - P^{-1}
G^\top \xi_G)` for ``mix`` (the paper's :math:`\Lambda^{\rm mix}`).

The maximum is sought as SAM and ASAM seek theirs, by normalised projected gradient ascent
on :math:`\xi`: from :math:`\xi = 0`, each of ``steps`` steps moves by :math:`\rho` along the
horizontal Riemannian gradient of :math:`\xi \mapsto L(\gamma_\xi(1))` (the Euclidean
gradient raised by the metric at :math:`\theta`, then projected horizontally) and scales
back onto the ball; the value is the largest loss increase met at the ``steps`` iterates, a
lower bound on the maximum. The first step is the first-order solution
:math:`\xi = \rho\, \operatorname{grad} L / \lVert \operatorname{grad} L \rVert_\theta`; with
``metric="adaptive"``, ``order=1`` (the straight line :math:`\theta + \xi`, the Christoffel
term dropped) and ``steps=1`` the value is exactly ASAM's
:func:`~lossgeom.flatness.adaptive_sharpness` (the paper's Appendix F).

The gauge maps each pair by :math:`G \mapsto G A^{-1}`, :math:`H \mapsto H A^\top`, a linear
isometry of either metric that also maps the horizontal space, the ball, the Riemannian
gradient and the truncated geodesic :math:`\theta + \xi - \tfrac12 \Gamma(\xi, \xi)` to
themselves (the Christoffel terms above are equivariant), so the value computed here is
invariant under the attention gauge up to rounding, at either order, not only to the order
of the geodesic's truncation; the element-wise metric is not (it is ASAM's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from scipy.linalg import solve_sylvester
from torch import nn

from lossgeom._validation import as_real, positive, positive_int
from lossgeom.flatness.at_point import _asam_scale, _point
from lossgeom.flatness.loss_point import LossPoint, NotApplicable
from lossgeom.types import Data, Group, Output, Params

__all__ = ["geodesic_sharpness"]

#: The metrics of :func:`geodesic_sharpness`: the paper's Eqs. 9 and 10 on attention heads, or ASAM's on all.
METRICS = ("inv", "mix", "adaptive")


@dataclass
class _Pair:
    """One ``(G, H)`` pair of an attention head: its flat indices and the Gram matrices at the point."""

    name: str
    g_index: torch.Tensor
    h_index: torch.Tensor
    G: torch.Tensor
    H: torch.Tensor
    P_inv: torch.Tensor
    Q_inv: torch.Tensor
    P: torch.Tensor
    Q: torch.Tensor


def _gram(name: str, M: torch.Tensor, damping: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(M^T M + damping I, its inverse)``, refusing a rank-deficient ``M`` (the metric would be singular)."""
    P = M.T @ M + damping * torch.eye(M.shape[1], dtype=M.dtype, device=M.device)
    eig = torch.linalg.eigvalsh(P)
    if not float(eig[0]) > 1e-12 * float(eig[-1].clamp_min(1e-300)):
        raise NotApplicable(
            f"the quotient metric needs {name} of full column rank (its Gram matrix has smallest eigenvalue "
            f"{float(eig[0]):.3g}); pass damping > 0 (the relaxation G^T G + damping I of da Silva et al.)"
        )
    return P, torch.linalg.inv(P)


def _attention_modules(model: nn.Module) -> list[tuple[str, nn.MultiheadAttention]]:
    return [(name, module) for name, module in model.named_modules() if isinstance(module, nn.MultiheadAttention)]


def _augmented(w_in: torch.Tensor, b_in: torch.Tensor | None, part: int, head: int, d: int) -> torch.Tensor:
    """The flat indices of ``[W^j b^j]^T`` (``(E + 1) x d``, or ``E x d`` without bias) of one block of ``in_proj``."""
    E = w_in.shape[1]
    rows = slice(part * E + head * d, part * E + (head + 1) * d)
    block = w_in[rows].T  # (E, d): the head's weight, transposed
    return block if b_in is None else torch.cat([block, b_in[rows][None, :]], dim=0)


def _head_pairs(point: LossPoint, model: nn.Module, damping: float) -> list[_Pair]:
    """The query/key and value/output pairs of every head of every ``nn.MultiheadAttention`` of ``model``."""
    theta = point.flat()
    pairs: list[_Pair] = []
    for prefix, mha in _attention_modules(model):
        at = f"{prefix}." if prefix else ""
        where = f"nn.MultiheadAttention {prefix or '(the model)'}"
        if mha.bias_k is not None or mha.bias_v is not None:
            raise NotApplicable(f"{where} has bias_k / bias_v, which the attention gauge does not transform")
        if not mha._qkv_same_embed_dim or mha.in_proj_weight is None:
            raise NotApplicable(f"{where} has separate query, key and value weights (kdim or vdim != embed_dim)")
        names = [f"{at}in_proj_weight", f"{at}out_proj.weight"]
        names += [f"{at}in_proj_bias"] if mha.in_proj_bias is not None else []
        missing = [n for n in names if n not in point.params]
        if missing:
            raise NotApplicable(
                f"{where}: {missing} are not trainable parameters of their own (frozen, shared or parametrised), "
                "so the attention gauge is not a symmetry of the trainable parameters"
            )
        E, heads, d = mha.embed_dim, mha.num_heads, mha.head_dim
        index = {n: torch.as_tensor(point.block_indices(n), device=theta.device) for n in names}
        w_in = index[f"{at}in_proj_weight"].reshape(3 * E, E)
        b_in = index.get(f"{at}in_proj_bias")
        w_out = index[f"{at}out_proj.weight"].reshape(E, E)
        for head in range(heads):
            for kind, g_index, h_index in (
                ("query/key", _augmented(w_in, b_in, 0, head, d), _augmented(w_in, b_in, 1, head, d)),
                ("value/output", _augmented(w_in, b_in, 2, head, d), w_out[:, head * d : (head + 1) * d]),
            ):
                label = f"{where} head {head} {kind}"
                G, H = theta[g_index], theta[h_index]
                P, P_inv = _gram(f"the {label} weight G", G, damping)
                Q, Q_inv = _gram(f"the {label} weight H", H, damping)
                pairs.append(_Pair(label, g_index, h_index, G, H, P_inv, Q_inv, P, Q))
    return pairs


class _Geometry:
    """The metric at the point, its horizontal projection and its truncated geodesics, on flat float64 vectors."""

    def __init__(self, point: LossPoint, model: nn.Module, metric: str, eta: float, damping: float) -> None:
        self.theta, self.metric = point.flat(), metric
        self.pairs = [] if metric == "adaptive" else _head_pairs(point, model, damping)
        paired = torch.zeros(self.theta.numel(), dtype=torch.bool, device=self.theta.device)
        for pair in self.pairs:
            paired[pair.g_index.reshape(-1)] = True
            paired[pair.h_index.reshape(-1)] = True
        self.free = torch.nonzero(~paired).reshape(-1)
        scale = _asam_scale(point, eta).to(self.theta.device)
        weight = torch.cat(
            [torch.full((p.numel(),), "weight" in name, dtype=torch.bool) for name, p in point.params.items()]
        ).to(self.theta.device)
        self.T = scale[self.free]
        w = self.theta[self.free]
        # the element-wise metric 1 / T_i^2 with T_i = |w_i| + eta has Gamma^i_ii = -sign(w_i) / T_i on weights
        curve = torch.where(self.T > 0, torch.sign(w) / self.T.clamp_min(1e-300), torch.zeros_like(w))
        self.curve = torch.where(weight[self.free], curve, torch.zeros_like(w))

    def _blocks(self, xi: torch.Tensor, pair: _Pair) -> tuple[torch.Tensor, torch.Tensor]:
        return xi[pair.g_index], xi[pair.h_index]

    def norm(self, xi: torch.Tensor) -> float:
        """``||xi||_theta``, the metric norm at the point."""
        free = xi[self.free]
        total = torch.where(self.T > 0, free / self.T.clamp_min(1e-300), torch.zeros_like(free)).square().sum()
        for pair in self.pairs:
            xg, xh = self._blocks(xi, pair)
            if self.metric == "inv":
                total = total + ((xg @ pair.P_inv) * xg).sum() + ((xh @ pair.Q_inv) * xh).sum()
            else:
                total = total + ((xg @ pair.Q) * xg).sum() + ((xh @ pair.P) * xh).sum()
        return math.sqrt(max(float(total), 0.0))

    def raised(self, grad: torch.Tensor) -> torch.Tensor:
        """The metric's inverse applied to a Euclidean gradient (the total space's Riemannian gradient)."""
        out = torch.zeros_like(grad)
        out[self.free] = self.T.square() * grad[self.free]
        for pair in self.pairs:
            dg, dh = self._blocks(grad, pair)
            if self.metric == "inv":
                out[pair.g_index], out[pair.h_index] = dg @ pair.P, dh @ pair.Q
            else:
                out[pair.g_index], out[pair.h_index] = dg @ pair.Q_inv, dh @ pair.P_inv
        return out

    def horizontal(self, xi: torch.Tensor) -> torch.Tensor:
        """The metric-orthogonal projection of ``xi`` onto the horizontal space (orthogonal to every gauge orbit)."""
        out = xi.clone()
        for pair in self.pairs:
            xg, xh = self._blocks(xi, pair)
            G, H = pair.G, pair.H
            if self.metric == "inv":
                A = pair.P @ pair.Q
                B = pair.P @ H.T @ xh - xg.T @ G @ pair.Q
                Z = solve_sylvester(A.cpu().numpy(), A.cpu().numpy(), B.cpu().numpy())
                X = torch.as_tensor(Z, dtype=xi.dtype, device=xi.device).T
            else:
                X = 0.5 * (xh.T @ H @ pair.Q_inv - pair.P_inv @ G.T @ xg)
            out[pair.g_index], out[pair.h_index] = xg + G @ X, xh - H @ X.T
        return out

    def christoffel(self, xi: torch.Tensor) -> torch.Tensor:
        """``Gamma_theta(xi, xi)``, differentiable in ``xi`` (geodesic: ``theta + xi - Gamma / 2`` to second order)."""
        out = torch.zeros_like(xi).index_put((self.free,), -self.curve * xi[self.free].square(), accumulate=True)
        for pair in self.pairs:
            xg, xh = self._blocks(xi, pair)
            G, H = pair.G, pair.H
            if self.metric == "inv":
                gamma_g = -xg @ pair.P_inv @ (xg.T @ G + G.T @ xg) + G @ pair.P_inv @ (xg.T @ xg)
                gamma_h = -xh @ pair.Q_inv @ (xh.T @ H + H.T @ xh) + H @ pair.Q_inv @ (xh.T @ xh)
            else:
                gamma_g = xg @ (xh.T @ H + H.T @ xh) @ pair.Q_inv - G @ (xh.T @ xh) @ pair.Q_inv
                gamma_h = xh @ (xg.T @ G + G.T @ xg) @ pair.P_inv - H @ (xg.T @ xg) @ pair.P_inv
            out = out.index_put((pair.g_index.reshape(-1),), gamma_g.reshape(-1), accumulate=True)
            out = out.index_put((pair.h_index.reshape(-1),), gamma_h.reshape(-1), accumulate=True)
        return out

    def geodesic(self, xi: torch.Tensor, order: int) -> torch.Tensor:
        """``gamma_xi(1)`` to first (``theta + xi``) or second (``- Gamma(xi, xi) / 2``) order."""
        moved = self.theta + xi
        return moved - 0.5 * self.christoffel(xi) if order == 2 else moved


def _loss_along(
    point: LossPoint, geometry: _Geometry, xi: torch.Tensor, order: int, gradient: bool
) -> tuple[float, torch.Tensor | None]:
    """``L(gamma_xi(1))`` and, if asked, its gradient in ``xi`` (float64, flat)."""
    if not gradient:
        with torch.no_grad():
            return float(point.loss_fn(point.unflatten(geometry.geodesic(xi, order)))), None
    leaf = xi.detach().clone().requires_grad_(True)
    value = point.loss_fn(point.unflatten(geometry.geodesic(leaf, order)))
    (grad,) = torch.autograd.grad(value, leaf)
    return float(value.detach()), grad.detach()


def _geodesic_sharpness_at(
    point: LossPoint,
    *,
    rho: float = 0.5,
    steps: int = 5,
    order: int = 2,
    metric: str = "inv",
    eta: float = 0.01,
    damping: float = 0.0,
) -> float:
    """Geodesic sharpness at a stored point (the form :func:`lossgeom.flatness.measure_at` can register)."""
    rho, steps = positive("rho", rho), positive_int("steps", steps)
    if isinstance(order, bool) or not isinstance(order, int) or order not in (1, 2):
        raise ValueError(f"order must be 1 (straight lines) or 2 (geodesics to second order), got {order!r}")
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    eta, damping = as_real("eta", eta), as_real("damping", damping)
    if eta < 0:
        raise ValueError(f"eta must be finite and >= 0, got {eta}")
    if damping < 0:
        raise ValueError(f"damping must be finite and >= 0, got {damping}")
    geometry = _Geometry(point, point.model, metric, eta, damping)
    base, grad = point.value_and_gradient(geometry.theta)
    xi = torch.zeros_like(geometry.theta)
    best: float | None = None
    for step in range(steps):
        direction = geometry.horizontal(geometry.raised(grad))
        size = geometry.norm(direction)
        if not size > 0.0:
            break
        xi = xi + (rho / size) * direction
        length = geometry.norm(xi)
        if length > rho:
            xi = xi * (rho / length)
        value, grad = _loss_along(point, geometry, xi, order, gradient=step < steps - 1)
        best = value - base if best is None else max(best, value - base)
    return 0.0 if best is None else best


def geodesic_sharpness(
    model: nn.Module,
    loss: nn.Module,
    data: Data,
    *,
    params: Params | None = None,
    group: Group = None,
    output: Output = None,
    rho: float = 0.5,
    steps: int = 5,
    order: int = 2,
    metric: str = "inv",
    eta: float = 0.01,
    damping: float = 0.0,
) -> float:
    r"""Geodesic sharpness (da Silva, Dangel & Oore 2025): the worst loss increase over a geodesic ball of the quotient.

    :math:`\max_{\xi \in \mathcal H_\theta,\ \lVert \xi \rVert_\theta \le \rho}
    L(\theta + \xi - \tfrac12 \Gamma_\theta(\xi, \xi)) - L(\theta)`: the quotient of every
    ``nn.MultiheadAttention`` head's query/key and value/output pairs by their
    :math:`GL(d)` gauges, in the paper's metric ``"inv"`` (its Eq. 9) or ``"mix"`` (Eq. 10),
    and ASAM's element-wise metric on every other parameter; horizontal vectors
    :math:`\xi` only, the geodesic to second order (``order=2``) or the straight line
    (``order=1``). The maximum is sought by ``steps`` steps of normalised projected
    gradient ascent from :math:`\xi = 0`, each of length :math:`\rho` in the metric, and the
    value is the largest increase met (a lower bound on the maximum). See the module's
    docstring for the formulas. The value is invariant under
    :func:`lossgeom.symmetries.attention_head_gauge` up to rounding (the gauge is an
    isometry that maps the ball, the horizontal space and the truncated geodesics onto
    themselves), where :func:`~lossgeom.flatness.adaptive_sharpness` is not.

    With ``metric="adaptive"``, ``order=1`` and ``steps=1`` it is ASAM's adaptive sharpness
    (the paper's Appendix F). A linear model has no attention:

    >>> import torch
    >>> from torch import nn
    >>> from lossgeom.flatness import adaptive_sharpness, geodesic_sharpness
    >>> _ = torch.manual_seed(0)
    >>> model = nn.Linear(3, 2, dtype=torch.float64)
    >>> x, y = torch.randn(8, 3, dtype=torch.float64), torch.randint(0, 2, (8,))
    >>> first = geodesic_sharpness(model, nn.CrossEntropyLoss(), (x, y), metric="adaptive", order=1, steps=1)
    >>> abs(first - adaptive_sharpness(model, nn.CrossEntropyLoss(), (x, y))) < 1e-12
    True

    Args:
        model: the network (a ``torch.nn.Module``); its ``nn.MultiheadAttention`` layers
            need packed projections (``in_proj_weight``) and no ``bias_k`` / ``bias_v``.
        loss: the loss module, mean reduction (called for every value and derivative; see :mod:`lossgeom.losses`).
        data: one batch or an iterable of batches (see :mod:`lossgeom.batches`), taken as one batch.
        params: the point (``None``: the model's own trainable parameters).
        group: must be ``None`` (every example on one process).
        output: selects the tensor of outputs from what ``model`` returns (see :class:`LossPoint`).
        rho: the radius of the geodesic ball, in the metric (positive).
        steps: the number of ascent steps (a positive integer; 1 is the first-order solution).
        order: 2 (the geodesic to second order, with the Christoffel term) or 1 (the straight
            line :math:`\theta + \xi`).
        metric: ``"inv"`` or ``"mix"`` (the paper's quotient metrics on attention heads,
            ASAM's elsewhere) or ``"adaptive"`` (ASAM's element-wise metric everywhere).
        eta: the offset of ASAM's normalisation :math:`|w| + \eta` in the element-wise
            metric (finite, :math:`\ge 0`).
        damping: added to every head's Gram matrices :math:`G^\top G` and :math:`H^\top H`
            (the paper's relaxation; finite, :math:`\ge 0`; 0 keeps the metric exactly invariant).

    Returns:
        the largest :math:`L(\gamma_\xi(1)) - L(\theta)` over the ascent's iterates, a float
        (0.0 where the Riemannian gradient vanishes).

    Raises:
        ValueError: if ``group`` is not None, ``rho`` is not positive, ``steps`` is below 1,
            ``order`` is not 1 or 2, ``metric`` is unknown, or ``eta`` or ``damping`` is
            negative or not finite.
        TypeError: if ``rho``, ``eta`` or ``damping`` is not a real number or ``steps`` not an int.
        NotApplicable: for an attention layer the gauge does not act on as stated (separate
            projections, ``bias_k`` / ``bias_v``, frozen or shared projection weights), or
            a head's weight of less than full column rank with ``damping=0``.
    """
    point = _point("geodesic_sharpness", model, loss, data, params, group, output)
    return _geodesic_sharpness_at(point, rho=rho, steps=steps, order=order, metric=metric, eta=eta, damping=damping)

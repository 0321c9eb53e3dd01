r"""Changes of coordinates and of logit scale, to test whether a measure depends on them.

A :class:`CoordinateChange` :math:`\theta = \phi(\psi)` (:func:`nonlinear_shear`,
:func:`elementwise_sinh`) and :class:`Reparametrised`, a model evaluated at
:math:`\phi(\psi)`, whose Hessians and Fishers come from autograd through :math:`\phi`, read a
model in other coordinates (Dinh et al. 2017). :func:`closure_scale_to_loss` rescales a
bias-free last layer so that two interpolants can be compared at one training loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from scipy.optimize import brentq
from torch import nn

from lossgeom._validation import finite_tensor, positive, positive_int
from lossgeom.types import Params


def closure_scale_to_loss(
    loss_fn: Callable[[dict[str, torch.Tensor]], torch.Tensor], params: Params, name: str, target: float
) -> dict[str, torch.Tensor]:
    r"""``params`` with ``params[name]`` times the :math:`t > 0` that brings the closure ``loss_fn`` to ``target``.

    For a bias-free last layer ``name`` this multiplies every logit by :math:`t`: the predicted
    classes (and so every accuracy) are kept while the cross-entropy moves monotonically,
    which lets two interpolants be compared at the same training loss. ``t`` is found by
    ``scipy.optimize.brentq`` on ``log t`` in ``[-20, 20]``.

    Args:
        loss_fn: the loss as a function of a parameter dict, ``loss_fn(params) -> scalar tensor``.
        params: the parameter dict at which to start.
        name: the parameter to rescale (for a logit scale, a bias-free last layer's weight).
        target: the loss to reach (positive).

    Returns:
        a new dict equal to ``params`` except ``params[name] * t``, with ``loss_fn`` equal to ``target``.

    Raises:
        ValueError: if ``name`` is not a parameter or no ``t`` in ``[e^-20, e^20]`` reaches
            ``target``.
    """
    if name not in params:
        raise ValueError(f"name must be one of the parameters {sorted(params)}, got {name!r}")
    target = positive("target", target)

    def scaled(log_t: float) -> dict[str, torch.Tensor]:
        return {**params, name: params[name] * math.exp(log_t)}

    gap = lambda log_t: float(loss_fn(scaled(log_t))) - target
    if gap(-20.0) * gap(20.0) > 0:
        raise ValueError(f"no scale of {name!r} in [e^-20, e^20] brings the loss to target {target}")
    return scaled(brentq(gap, -20.0, 20.0, xtol=1e-12))


@dataclass(frozen=True)
class CoordinateChange:
    """A smooth invertible change of coordinates ``theta = phi(psi)`` on flat parameter vectors.

    Attributes:
        name: what the map is.
        forward: ``phi``, a differentiable torch function of a 1-D tensor (autograd takes its
            Jacobian and second derivatives).
        inverse: ``phi^(-1)``, so that a point ``theta`` can be read in the new coordinates.
    """

    name: str
    forward: Callable[[torch.Tensor], torch.Tensor]
    inverse: Callable[[torch.Tensor], torch.Tensor]

    def jacobian(self, psi: torch.Tensor) -> torch.Tensor:
        """``J = d phi / d psi`` at ``psi`` by autograd, shape ``(n, n)``.

        Args:
            psi: a finite 1-D tensor ``(n,)``, the point in the new coordinates.

        Returns:
            the Jacobian ``J_ij = d theta_i / d psi_j``, shape ``(n, n)``.
        """
        psi = finite_tensor("psi", psi)
        return torch.autograd.functional.jacobian(self.forward, psi)


def _lower_shear_matrix(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(int(seed))
    return torch.randn(n, n, generator=gen, dtype=torch.float64).tril(-1) / math.sqrt(n)


def nonlinear_shear(n: int, strength: float, seed: int = 0) -> CoordinateChange:
    """``theta = psi + t tanh(P psi)`` with ``P`` strictly lower triangular (entries ``N(0, 1/n)``).

    Smooth and nonlinear, with Jacobian ``I + t diag(sech^2(P psi)) P``: unit lower
    triangular, so never singular (``det J = 1``) and not diagonal. The inverse is exact by
    forward substitution, ``psi_i = theta_i - t tanh(sum_{j<i} P_ij psi_j)``.

    Args:
        n: the number of coordinates (a positive integer).
        strength: ``t``, the size of the nonlinear term (positive).
        seed: the seed of ``P``.

    Returns:
        the :class:`CoordinateChange` on vectors of shape ``(n,)`` (its inverse raises
        ``ValueError`` for another shape).
    """
    n, t = positive_int("n", n), positive("strength", strength)
    P = _lower_shear_matrix(n, seed)

    def forward(psi: torch.Tensor) -> torch.Tensor:
        return psi + t * torch.tanh(P @ psi)

    def inverse(theta: torch.Tensor) -> torch.Tensor:
        theta = finite_tensor("theta", theta).to(torch.float64)
        if theta.shape != (n,):
            raise ValueError(f"theta must have shape ({n},), got {tuple(theta.shape)}")
        psi = torch.zeros_like(theta)
        for i in range(n):
            psi[i] = theta[i] - t * torch.tanh(P[i, :i] @ psi[:i])
        return psi

    return CoordinateChange(
        f"nonlinear shear psi + {t:g} tanh(P psi), P strictly lower triangular (seed {seed})", forward, inverse
    )


def elementwise_sinh() -> CoordinateChange:
    """``theta_i = sinh(psi_i)``: smooth, nonlinear, with the diagonal Jacobian ``diag(cosh psi)``.

    Returns:
        the :class:`CoordinateChange` with ``forward = sinh`` and ``inverse = asinh``, elementwise.
    """
    return CoordinateChange(
        "theta = sinh(psi), elementwise", torch.sinh, lambda theta: torch.asinh(finite_tensor("theta", theta))
    )


class Reparametrised(nn.Module):
    """``model`` read in other coordinates: one parameter ``"psi"`` with ``theta = phi(psi)``.

    ``theta`` is the flat vector of ``model``'s parameters in ``named_parameters`` order
    (:func:`lossgeom.parameters.flatten_params`), and ``forward(x)`` evaluates ``model`` at
    ``phi(psi)`` with ``torch.func.functional_call``: the same family of functions in new
    coordinates. Hessians and Fishers of this module come from autograd through ``phi``
    (its Jacobian and second derivatives), not from a transformation law, so they test one.
    The wrapped model is not registered as a submodule: ``"psi"`` is the only parameter.

    Args:
        model: the network (its own parameters are only read for names and shapes).
        change: the :class:`CoordinateChange`.
        theta: the point to start from (a parameter dict of ``model``); ``psi`` is set to
            ``change.inverse(flat theta)``. Defaults to the model's own parameters.
    """

    def __init__(
        self, model: nn.Module, change: CoordinateChange, theta: Mapping[str, torch.Tensor] | None = None
    ) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(change, CoordinateChange):
            raise TypeError(f"change must be a CoordinateChange, got {type(change).__name__}")
        own = {k: v.detach() for k, v in model.named_parameters()}
        theta = own if theta is None else dict(theta)
        if set(theta) != set(own) or any(theta[k].shape != own[k].shape for k in own):
            raise ValueError(f"theta must hold the model's parameters {sorted(own)} with their shapes")
        self._wrapped = (model,)  # a tuple: not a registered submodule
        self._shapes = {k: own[k].shape for k in own}
        self.change = change
        flat = torch.cat([theta[k].detach().reshape(-1) for k in own]).to(torch.float64)
        self.psi = nn.Parameter(change.inverse(flat).detach().clone())

    @property
    def model(self) -> nn.Module:
        """The wrapped model, read at ``theta = phi(psi)`` (its own parameters are not changed)."""
        return self._wrapped[0]

    def theta(self, psi: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The original parameters ``phi(psi)`` as a dict of ``model`` (default: at ``self.psi``).

        Args:
            psi: a flat vector in the new coordinates; None for ``self.psi``.

        Returns:
            a dict with ``model``'s parameter names and shapes holding ``theta = phi(psi)``
            (differentiable in ``psi``).
        """
        flat = self.change.forward(self.psi if psi is None else psi)
        out, start = {}, 0
        for name, shape in self._shapes.items():
            size = math.prod(shape)
            out[name] = flat[start : start + size].reshape(shape)
            start += size
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``model`` evaluated at ``theta = phi(psi)`` (``torch.func.functional_call``).

        Args:
            x: the model's input.

        Returns:
            the model's output at ``phi(self.psi)``.
        """
        return torch.func.functional_call(self.model, self.theta(), (x,))

r"""Curvature of a loss: operators, spectra, traces and dense references.

The curvature of a loss :math:`L(\theta)` is read through three matrices over the
flattened parameters (the Hessian, the generalised Gauss-Newton and the Fisher) and
their spectra. This package is
organised by concept:

- ``lossgeom.parameters``: parameters as one vector (:func:`flatten_params`),
  name, dtype and device checks;
- ``lossgeom.risk``: the empirical risk of a ``torch.nn.Module``, a loss
  module and data (tensors or batches, averaged correctly over batches of unequal size);
- ``lossgeom.curvature.base``: :class:`CurvatureOperator`, torch-native operators with
  batched products, a ``.to_scipy()`` view and a product count;
- ``lossgeom.curvature.hessian``, ``.ggn``, ``.fisher``: the Hessian ``H``, the
  generalised Gauss-Newton ``G = J^T Lambda J`` and the empirical and true Fisher, one
  operator per module; ``lossgeom.curvature.factory``: :func:`curvature_operator` (any of
  them by name) and :func:`as_operator` (any square matrix as an operator);
- ``lossgeom.curvature.references``: dense references for small models and the
  Taylor-remainder check of a gradient and an HVP;
- ``lossgeom.curvature.spectra``: extreme eigenpairs (Lanczos), power iteration,
  spectral densities (stochastic Lanczos quadrature) and spectrum summaries;
- ``lossgeom.curvature.lanczos``: plain Lanczos with partial reorthogonalisation, stopped
  by an eigenvalue error bound, the fewest products for a tolerance (``top_eigenpairs``' default);
- ``lossgeom.curvature.traces``: Hutchinson and Hutch++ trace estimates with
  calibrated standard errors;
- ``lossgeom.curvature.nullspace``: zero eigenvalues against a threshold and the
  directions symmetries and data predict for them;
- ``lossgeom.curvature.sharpness``: :func:`~lossgeom.curvature.sharpness.lambda_max` at a point and
  along a training run.

One calling convention. Everything that acts on a model takes
``(model, loss, data, *, params=None, ...)``: a ``torch.nn.Module``, a loss module
(``nn.CrossEntropyLoss()``/``nn.MSELoss()``; a name such as ``"cross_entropy"`` is
refused) and an ``(x, y)`` pair or an iterable of batches, all on one
:class:`~lossgeom.risk.EmpiricalRisk`. The closure form, for a loss ``loss_fn(params)``
of a parameter dict, is named as such: :class:`HessianOperator` ``(loss_fn, params)``,
:func:`closure_gradient` and :func:`closure_hessian`. For your own model:

>>> import torch
>>> from torch import nn
>>> from lossgeom import curvature
>>> _ = torch.manual_seed(0)
>>> model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).to(torch.float32)
>>> x, y = torch.randn(32, 4, dtype=torch.float32), torch.randint(0, 3, (32,))
>>> H = curvature.hessian_operator(model, nn.CrossEntropyLoss(), (x, y))
>>> H.shape, H.dtype
((67, 67), torch.float32)
>>> top = curvature.top_eigenpairs(H, k=2, tol=1e-6)
>>> bool(top.values[0] >= top.values[1] > 0)
True
>>> G = curvature.ggn_operator(model, nn.CrossEntropyLoss(), [(x[:20], y[:20]), (x[20:], y[20:])])
>>> (G @ torch.ones(67, 2)).dtype
torch.float32
"""

from lossgeom.curvature.base import CurvatureOperator
from lossgeom.curvature.factory import curvature_operator
from lossgeom.curvature.fisher import FisherOperator, fisher_operator
from lossgeom.curvature.ggn import GGNOperator, ggn_operator
from lossgeom.curvature.hessian import HessianOperator, hessian_operator
from lossgeom.curvature.nullspace import (
    count_near_zero,
    data_blind_directions,
)
from lossgeom.curvature.references import (
    closure_gradient,
    closure_hessian,
    dense_fisher,
    dense_ggn,
    dense_hessian,
)
from lossgeom.curvature.sharpness import closure_lambda_max, closure_sharpness_during_training, lambda_max
from lossgeom.curvature.spectra import (
    spectral_density,
    spectrum_summary,
    top_eigenpairs,
)
from lossgeom.curvature.traces import hutchinson_trace, hutchpp_trace

__all__ = [
    "CurvatureOperator",
    "FisherOperator",
    "GGNOperator",
    "HessianOperator",
    "closure_gradient",
    "closure_hessian",
    "count_near_zero",
    "curvature_operator",
    "data_blind_directions",
    "dense_fisher",
    "dense_ggn",
    "dense_hessian",
    "fisher_operator",
    "ggn_operator",
    "hessian_operator",
    "hutchinson_trace",
    "hutchpp_trace",
    "closure_lambda_max",
    "lambda_max",
    "closure_sharpness_during_training",
    "spectral_density",
    "spectrum_summary",
    "top_eigenpairs",
]

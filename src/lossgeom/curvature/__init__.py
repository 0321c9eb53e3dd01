"""Curvature of a loss: operators, spectra, traces and dense references.

The chapter "Curvature is a spectrum" reads the curvature of a loss ``L(theta)`` through
three matrices over the flattened parameters and their spectra. This package is
organised by concept:

- ``lossgeom.parameters``: parameters as one vector (:func:`flatten_params`),
  name, dtype and device checks;
- ``lossgeom.risk``: the empirical risk of a ``torch.nn.Module``, a loss
  module and data (tensors or batches, averaged correctly over batches of unequal size);
- ``lossgeom.curvature.operators``: the Hessian ``H``, the generalised Gauss-Newton
  ``G = J^T Lambda J`` and the empirical and true Fisher as torch-native operators with
  batched products, a ``.to_scipy()`` view and a product count;
- ``lossgeom.curvature.references``: dense references for small models and the
  Taylor-remainder check of a gradient and an HVP;
- ``lossgeom.curvature.spectra``: extreme eigenpairs (Lanczos), power iteration,
  spectral densities (stochastic Lanczos quadrature) and spectrum summaries;
- ``lossgeom.curvature.traces``: Hutchinson and Hutch++ trace estimates with
  calibrated standard errors;
- ``lossgeom.curvature.nullspace``: zero eigenvalues against a threshold and the
  directions symmetries and data predict for them;
- ``lossgeom.curvature.sharpness``: ``lambda_max`` at a point and along a training run
  (the chapter "Step size meets curvature").

Two ways in. The explicit form the chapters use: a closure ``loss_fn(params)`` and a
parameter dict (``hessian_operator(loss_fn, params)``), or ``(model, params, x, y, loss)``
for the GGN and Fisher. The module-first form for your own model:

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
from lossgeom.curvature.nullspace import (
    count_near_zero,
    data_blind_directions,
    relative_magnitudes,
    relu_rescaling_generators,
    relu_rescaling_tangents,
    softmax_shift_tangents,
)
from lossgeom.curvature.operators import (
    CountingView,
    CurvatureOperator,
    FisherOperator,
    GGNOperator,
    HessianOperator,
    as_operator,
    curvature_operator,
    fisher_operator,
    ggn_operator,
    hessian_operator,
)
from lossgeom.curvature.references import (
    LossFn,
    dense_fisher,
    dense_ggn,
    dense_gradient,
    dense_hessian,
    relative_operator_difference,
    taylor_remainders,
)
from lossgeom.curvature.sharpness import SharpnessRun, sharpness, sharpness_during_training
from lossgeom.curvature.spectra import (
    EigenResult,
    SpectralDensity,
    SpectrumSummary,
    dense_spectral_density,
    gaussian_broadening,
    power_iteration,
    spectral_density,
    spectrum_summary,
    top_eigenpairs,
)
from lossgeom.curvature.traces import TraceEstimate, hutchinson_trace, hutchpp_trace
from lossgeom.parameters import (
    Params,
    check_parameter_names,
    flatten_params,
    model_parameters,
    parameter_dtype,
)
from lossgeom.risk import EmpiricalRisk

__all__ = [
    "CountingView",
    "CurvatureOperator",
    "EigenResult",
    "EmpiricalRisk",
    "FisherOperator",
    "GGNOperator",
    "HessianOperator",
    "LossFn",
    "Params",
    "SharpnessRun",
    "SpectralDensity",
    "SpectrumSummary",
    "TraceEstimate",
    "as_operator",
    "check_parameter_names",
    "count_near_zero",
    "curvature_operator",
    "data_blind_directions",
    "dense_fisher",
    "dense_ggn",
    "dense_gradient",
    "dense_hessian",
    "dense_spectral_density",
    "fisher_operator",
    "flatten_params",
    "gaussian_broadening",
    "ggn_operator",
    "hessian_operator",
    "hutchinson_trace",
    "hutchpp_trace",
    "model_parameters",
    "parameter_dtype",
    "power_iteration",
    "relative_magnitudes",
    "relative_operator_difference",
    "relu_rescaling_generators",
    "relu_rescaling_tangents",
    "sharpness",
    "sharpness_during_training",
    "softmax_shift_tangents",
    "spectral_density",
    "spectrum_summary",
    "taylor_remainders",
    "top_eigenpairs",
]

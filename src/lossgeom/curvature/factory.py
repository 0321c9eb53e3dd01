"""Any curvature matrix by name, and any square matrix as a counting operator.

:func:`curvature_operator` builds the Hessian, the GGN or a Fisher of a model's
empirical risk by name (``MATRICES``); :func:`as_operator` turns what the spectral tools
of :mod:`lossgeom.curvature.spectra` and :mod:`lossgeom.curvature.traces` take (an
operator, an array, a scipy ``LinearOperator``, a curvlinops operator, or a model with
``loss=`` and ``data=``) into a :class:`~lossgeom.curvature.base.CountingView`.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.sparse.linalg import LinearOperator, aslinearoperator
from torch import nn

from lossgeom.curvature.base import (
    CountingView,
    CurvatureOperator,
    OperatorLike,
    _DenseOperator,
    _ScipyOperator,
    symmetric_matrix,
)
from lossgeom.curvature.fisher import FisherOperator
from lossgeom.curvature.ggn import GGNOperator
from lossgeom.curvature.hessian import HessianOperator
from lossgeom.risk import EmpiricalRisk
from lossgeom.types import Data, Group, Output, Params

#: The curvature matrices :func:`curvature_operator` builds, by name.
MATRICES = ("hessian", "ggn", "empirical_fisher", "true_fisher")


def curvature_operator(
    model: nn.Module,
    loss: nn.Module,
    data: Data,
    *,
    params: Params | None = None,
    group: Group = None,
    output: Output = None,
    matrix: str = "hessian",
    method: str = "auto",
) -> CurvatureOperator:
    """The operator of the curvature matrix ``matrix`` of a model's empirical risk.

    ``"hessian"`` (``H``, :func:`~lossgeom.curvature.hessian.hessian_operator`), ``"ggn"``
    (``G = J^T Lambda J``), ``"empirical_fisher"`` or ``"true_fisher"`` (see
    :class:`~lossgeom.curvature.fisher.FisherOperator`), all on one
    :class:`~lossgeom.risk.EmpiricalRisk`.

    Args:
        model: the network.
        loss: the loss module (called for every value and derivative; see :mod:`lossgeom.losses`).
        data: one batch or an iterable of batches (see :mod:`lossgeom.batches`).
        params: the point (``None``: the model's own trainable parameters).
        output: selects the tensor of outputs from what the model returns (see :mod:`lossgeom.outputs`).
        group: a ``torch.distributed`` process group (``data`` is then this rank's shard;
            see :mod:`lossgeom.distributed`), or ``None`` for one process.
        matrix: one of ``MATRICES``.
        method: how a Hessian product is differentiated (Hessian only).

    Returns:
        The operator.

    Raises:
        ValueError: on an unknown ``matrix``, or as the operator built.
    """
    if matrix not in MATRICES:
        raise ValueError(f"matrix must be one of {list(MATRICES)}, got {matrix!r}")
    risk = EmpiricalRisk(model, loss, data, params=params, group=group, output=output)
    if matrix == "hessian":
        return HessianOperator.from_risk(risk, method=method)
    if matrix == "ggn":
        return GGNOperator.from_risk(risk)
    return FisherOperator.from_risk(risk, kind=matrix.split("_")[0])


def _stored_matrix(operator: OperatorLike, symmetric: bool) -> torch.Tensor:
    """A stored matrix (array, tensor or nested lists) as a square finite tensor, symmetric if asked."""
    matrix_t = (
        torch.as_tensor(np.asarray(operator, dtype=np.float64))
        if not isinstance(operator, torch.Tensor)
        else operator.detach()
    )
    if not torch.is_floating_point(matrix_t):
        matrix_t = matrix_t.to(torch.float64)
    if matrix_t.ndim != 2 or matrix_t.shape[0] != matrix_t.shape[1]:
        raise ValueError(f"operator must be square, got shape {tuple(matrix_t.shape)}")
    if not torch.isfinite(matrix_t).all():
        raise ValueError("operator must contain only finite values")
    if symmetric:
        symmetric_matrix(matrix_t)
    return matrix_t


def as_operator(operator: OperatorLike, *, symmetric: bool = True) -> CountingView:
    """Any square matrix as a counting torch-native operator.

    Takes a :class:`CurvatureOperator`, a NumPy array or torch tensor (checked to be
    symmetric when ``symmetric``), a scipy ``LinearOperator`` or an object with
    ``to_scipy()`` (curvlinops). Operators are assumed symmetric; only stored matrices can
    be checked without extra products. A model is refused: its curvature matrix is built
    by :func:`lossgeom.curvature.hessian.hessian_operator` or :func:`curvature_operator`.

    Args:
        operator: the matrix, in any of the forms above.
        symmetric: whether to check a stored matrix for symmetry.

    Returns:
        A :class:`~lossgeom.curvature.base.CountingView` that counts this caller's products.

    Raises:
        TypeError: if ``operator`` is a model or none of the forms above.
        ValueError: if the matrix is not square (or not symmetric, or not finite).
    """
    if isinstance(operator, nn.Module):
        raise TypeError(
            f"operator is a model ({type(operator).__name__}), not a matrix: build its curvature operator first, "
            "e.g. hessian_operator(model, loss, data) or curvature_operator(model, loss, data, matrix='ggn')"
        )
    if isinstance(operator, CountingView):
        operator = operator.operator
    if isinstance(operator, CurvatureOperator):
        return CountingView(operator)
    if isinstance(operator, (np.ndarray, torch.Tensor)) or (
        isinstance(operator, (list, tuple)) and len(operator) and isinstance(operator[0], (list, tuple))
    ):
        return CountingView(_DenseOperator(_stored_matrix(operator, symmetric)))
    if hasattr(operator, "to_scipy") and not isinstance(operator, LinearOperator):
        operator = operator.to_scipy()
    try:
        linear = aslinearoperator(operator)
    except TypeError:
        raise TypeError(
            "operator must be a curvature operator, an array, a tensor or a scipy LinearOperator, "
            f"got {type(operator).__name__}"
        ) from None
    if linear.shape[0] != linear.shape[1]:
        raise ValueError(f"operator must be square, got shape {linear.shape}")
    return CountingView(_ScipyOperator(linear))


__all__ = ["MATRICES", "as_operator", "curvature_operator"]

"""Shared fixtures: float64 everywhere, and the comparison helper used by every test."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from curvature_cases import digits_case  # noqa: F401  (a shared parametrised fixture of the curvature tests)

torch.set_default_dtype(torch.float64)


def assert_close(actual, expected, rtol: float = 1e-12, atol: float = 1e-12) -> None:
    """Compare two arrays/tensors/scalars in float64 with a stated tolerance."""
    a = actual.detach().numpy() if isinstance(actual, torch.Tensor) else np.asarray(actual, dtype=np.float64)
    e = expected.detach().numpy() if isinstance(expected, torch.Tensor) else np.asarray(expected, dtype=np.float64)
    np.testing.assert_allclose(a, e, rtol=rtol, atol=atol)


@pytest.fixture
def close():
    return assert_close

"""Tests of lossgeom.curvature.references beyond the operators' own comparisons."""

from __future__ import annotations

import numpy as np
import pytest

from lossgeom import curvature as cv

from conftest import assert_close
from curvature_cases import DIGITS_CASES, digits_setup


def test_relative_operator_difference():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 5))
    probes = rng.standard_normal((5, 3))
    assert cv.references.relative_operator_difference(a, a.copy(), probes) == 0.0
    b = a + 1e-3 * np.eye(5)
    expected = np.abs(1e-3 * probes).max() / np.abs(a @ probes).max()
    assert_close(cv.references.relative_operator_difference(a, b, probes), expected, rtol=1e-12, atol=0)
    assert cv.references.relative_operator_difference(a, b, probes[:, 0]) > 0
    with pytest.raises(ValueError, match="must have 5 rows"):
        cv.references.relative_operator_difference(a, b, np.ones((4, 2)))
    with pytest.raises(ValueError, match="no scale"):
        cv.references.relative_operator_difference(np.zeros((5, 5)), b, probes)


def test_closure_and_module_references_agree_and_are_distinct_functions():
    model, params, x, y, loss_fn, ce = digits_setup(DIGITS_CASES[1])
    assert_close(cv.closure_hessian(loss_fn, params), cv.dense_hessian(model, ce, (x, y)), rtol=1e-12, atol=1e-14)
    assert_close(
        cv.closure_gradient(loss_fn, params), cv.references.dense_gradient(model, ce, (x, y)), rtol=1e-12, atol=1e-15
    )
    with pytest.raises(TypeError, match="got an nn.Module"):
        cv.closure_hessian(model, params)
    with pytest.raises(TypeError, match="positional"):
        cv.closure_gradient(loss_fn, params, (x, y))

"""Mirrors lossgeom/_validation.py: every checker names the argument and what was expected."""

import math

import numpy as np
import pytest
import torch

from lossgeom._validation import as_real, finite_array, finite_tensor, positive, positive_int


def test_scalars_pass_through_as_python_numbers():
    assert as_real("x", np.float32(0.5)) == 0.5 and type(as_real("x", 2)) is float
    assert positive("lr", torch.tensor(0.1, dtype=torch.float64)) == pytest.approx(0.1, rel=1e-15)
    assert positive_int("k", np.int64(3)) == 3


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: as_real("radius", "1"), TypeError, "radius must be a real number, got str"),
        (lambda: as_real("radius", math.nan), ValueError, "radius must be finite"),
        (lambda: positive("lr", 0.0), ValueError, "lr must be > 0, got 0.0"),
        (lambda: positive("lr", -math.inf), ValueError, "lr must be finite"),
        (lambda: positive_int("n_probes", 2.0), TypeError, "n_probes must be an int, got float"),
        (lambda: positive_int("n_probes", True), TypeError, "n_probes must be an int, got bool"),
        (lambda: positive_int("n_probes", 0), ValueError, "n_probes must be >= 1, got 0"),
    ],
)
def test_scalar_checkers_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_array_checkers_name_the_argument_and_the_expected_shape():
    assert finite_array("grid", [0, 1, 2], ndim=1).dtype == np.float64
    with pytest.raises(ValueError, match=r"grid must have 1 dimension\(s\), got shape \(2, 2\)"):
        finite_array("grid", np.eye(2), ndim=1)
    with pytest.raises(ValueError, match=r"grid must have shape \(3,\), got \(2,\)"):
        finite_array("grid", [0.0, 1.0], shape=(3,))
    with pytest.raises(ValueError, match="grid must contain only finite values"):
        finite_array("grid", [0.0, math.inf])
    with pytest.raises(TypeError, match="grid must be array-like of real numbers"):
        finite_array("grid", ["a", "b"])
    assert finite_tensor("x", np.ones(2)).dtype == torch.float64
    with pytest.raises(ValueError, match="x must contain only finite values"):
        finite_tensor("x", [math.nan])

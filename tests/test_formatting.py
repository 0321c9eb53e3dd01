"""Mirrors lossgeom/formatting.py: portable digits, storage rounding and rounding-level reports."""

import math

import numpy as np
import pytest
import torch

from lossgeom.formatting import Plain, fmt, round_sig, rounding_level


@pytest.mark.parametrize(
    "value, sig, text",
    [
        (2.0, 6, "2"),
        (1 / 3, 4, "0.3333"),
        (np.float32(0.1), 3, "0.1"),
        (torch.tensor(2.5, dtype=torch.float64), 6, "2.5"),
        (np.int64(7), 6, "7"),
        (True, 6, "True"),
        (float("nan"), 6, "nan"),
        ("text", 6, "text"),
    ],
)
def test_fmt_prints_significant_digits_of_any_scalar(value, sig, text):
    assert fmt(value, sig) == text


def test_round_sig_stores_exactly_the_digits_fmt_prints():
    rng = np.random.default_rng(0)
    for value in rng.standard_normal(200) * 10.0 ** rng.integers(-12, 12, 200):
        for sig in (1, 3, 6):
            assert repr(round_sig(value, sig)) == repr(float(fmt(value, sig)))
    assert round_sig(None) is None and round_sig("a") == "a" and round_sig(np.int32(4)) == 4


def test_round_sig_refuses_bad_input():
    with pytest.raises(ValueError, match="sig must be an int >= 1"):
        round_sig(1.0, 0)
    with pytest.raises(ValueError, match="cannot round a non-finite value"):
        round_sig(math.inf)
    with pytest.raises(TypeError, match="value must be a real number, got list"):
        round_sig([1.0])


def test_rounding_level_reports_the_order_and_refuses_real_measurements():
    report = rounding_level(torch.tensor(-3e-16), floor=1e-13)
    assert isinstance(report, Plain) and repr(report) == "below 1e-13 (rounding level)"
    with pytest.raises(ValueError, match="is not rounding level"):
        rounding_level(2e-13)
    with pytest.raises(ValueError, match="floor must be a finite number > 0"):
        rounding_level(0.0, floor=0.0)
    with pytest.raises(ValueError, match="value must be finite"):
        rounding_level(math.nan)

"""Raw and normalised margins (claim P11): scaling by s > 0 keeps labels and the normalised margin."""

import numpy as np
import pytest

from lossgeom_book import margins

from conftest import assert_close


def test_raw_margin_is_top_minus_runner_up():
    scores = np.array([[1.0, 3.0, 2.5], [0.0, -1.0, 4.0]])
    assert_close(margins.raw_margin(scores), [0.5, 4.0], rtol=0, atol=0)


@pytest.mark.parametrize("s", [0.3, 3.0, 10.0])
def test_scaling_multiplies_the_raw_margin_and_keeps_the_normalised_one(s):
    scores = np.random.default_rng(0).normal(size=(20, 5))
    assert_close(margins.raw_margin(s * scores), s * margins.raw_margin(scores), rtol=1e-14)
    assert_close(margins.normalised_margin(s * scores), margins.normalised_margin(scores), rtol=1e-14)


def test_normalised_margin_by_hand():
    z = np.array([[3.0, 4.0]])
    assert_close(margins.normalised_margin(z), [1.0 / 5.0], rtol=1e-15)


def test_negative_scale_changes_the_normalised_margin():
    z = np.array([[1.0, 2.0, 4.0]])
    assert margins.normalised_margin(-z)[0] != pytest.approx(margins.normalised_margin(z)[0])


def test_bad_scores_are_refused():
    with pytest.raises(ValueError, match="at least two classes"):
        margins.raw_margin(np.ones((3, 1)))
    with pytest.raises(ValueError, match="scores must have 2 dimension"):
        margins.raw_margin(np.ones(3))
    with pytest.raises(ValueError, match="all-zero row"):
        margins.normalised_margin(np.zeros((2, 3)))

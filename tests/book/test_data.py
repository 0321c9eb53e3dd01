"""The bundled digits split: shapes, disjointness, determinism, errors."""

import numpy as np
import pytest
import torch

from lossgeom_book.data import digits


def test_split_is_seeded_disjoint_and_scaled():
    a, b = digits(100, 50, seed=3), digits(100, 50, seed=3)
    assert torch.equal(a.x_train, b.x_train) and a.x_train.dtype == torch.float64
    assert a.x_train.shape == (100, 64) and a.x_test.shape == (50, 64)
    assert 0.0 <= float(a.x_train.min()) and float(a.x_train.max()) <= 1.0
    assert not torch.equal(digits(100, 50, seed=4).x_train, a.x_train)


def test_a_full_split_uses_every_image_once():
    """Train and test together are a permutation of the dataset: no image is in both."""
    from sklearn.datasets import load_digits

    split = digits(1000, 797, seed=3)
    rows = torch.cat([split.x_train, split.x_test]).numpy()
    everything = load_digits().data / 16.0
    assert rows.shape == everything.shape
    as_sorted = lambda a: a[np.lexsort(a.T[::-1])]
    assert np.array_equal(as_sorted(rows), as_sorted(everything))


def test_class_subset_is_relabelled():
    s = digits(50, 20, seed=0, classes=(3, 8))
    assert set(s.y_train.tolist()) <= {0, 1} and set(s.y_train.tolist()) == {0, 1}


def test_bad_requests_are_named():
    with pytest.raises(ValueError, match="n_train \\+ n_test must be <= 1797"):
        digits(1500, 500)
    with pytest.raises(ValueError, match="classes must be >= 2 distinct digits"):
        digits(10, 10, classes=(3, 3))
    with pytest.raises(ValueError, match="n_train must be >= 1"):
        digits(0, 10)

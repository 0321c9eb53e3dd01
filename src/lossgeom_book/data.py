"""Real data that ships with a package: scikit-learn's bundled 8x8 digits.

Nothing is downloaded: ``sklearn.datasets.load_digits`` reads 1,797 handwritten digit
images (8x8, 16 grey levels, 10 classes) from the scikit-learn installation. Chapters
in Parts II and III train small networks on them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lossgeom_book.checks import positive_int


@dataclass(frozen=True)
class Split:
    """Train and test tensors (float64 inputs, int64 labels) and how they were made."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    description: str


def digits(n_train: int = 1000, n_test: int = 500, seed: int = 0, classes: tuple[int, ...] | None = None) -> Split:
    """A seeded train/test split of sklearn's digits, pixels scaled to [0, 1].

    Args:
        n_train: number of training examples (drawn without replacement).
        n_test: number of test examples, disjoint from the training ones.
        seed: seed of the ``numpy.random.default_rng`` permutation.
        classes: keep only these digit classes (relabelled 0..k-1 in the given order);
            all ten by default.

    Raises:
        ValueError: if the split asks for more examples than there are, or ``classes``
            is not a tuple of distinct digits 0-9 with at least two entries.
    """
    from sklearn.datasets import load_digits

    n_train = positive_int("n_train", n_train)
    n_test = positive_int("n_test", n_test)
    bunch = load_digits()
    x, y = bunch.data.astype(np.float64) / 16.0, bunch.target.astype(np.int64)
    if classes is not None:
        classes = tuple(int(c) for c in classes)
        if len(set(classes)) != len(classes) or len(classes) < 2 or not all(0 <= c <= 9 for c in classes):
            raise ValueError(f"classes must be >= 2 distinct digits in 0..9, got {classes}")
        keep = np.isin(y, classes)
        x, y = x[keep], np.array([classes.index(v) for v in y[keep]], dtype=np.int64)
    if n_train + n_test > len(y):
        raise ValueError(f"n_train + n_test must be <= {len(y)} available examples, got {n_train + n_test}")
    order = np.random.default_rng(seed).permutation(len(y))
    train, test = order[:n_train], order[n_train : n_train + n_test]
    desc = (
        f"sklearn digits (8x8, pixels/16), classes {classes if classes is not None else 'all 10'}, "
        f"{n_train} train / {n_test} test, permutation seed {seed}"
    )
    return Split(
        torch.from_numpy(x[train]),
        torch.from_numpy(y[train]),
        torch.from_numpy(x[test]),
        torch.from_numpy(y[test]),
        desc,
    )

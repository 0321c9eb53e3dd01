"""Classification margins, raw and normalised (claim P11, ``ch01_object_and_metric``).

For a score vector z the raw margin is the top score minus the runner-up,
z_(1) - z_(2). Multiplying every score by s > 0 keeps every predicted label and
multiplies the raw margin by s; dividing by the Euclidean norm of z removes the scale:
the normalised margin (z_(1) - z_(2)) / norm(z) is unchanged for every s > 0. Which
normalisation is right is a modelling decision that must be declared before it is
compared with test error (Neyshabur et al. 2017).
"""

from __future__ import annotations

import numpy as np

from lossgeom_book.checks import finite_array


def _scores(scores) -> np.ndarray:
    z = finite_array("scores", scores, ndim=2)
    if z.shape[1] < 2:
        raise ValueError(f"scores must have at least two classes (shape (n, K), K >= 2), got {z.shape}")
    return z


def raw_margin(scores) -> np.ndarray:
    """Top score minus runner-up for each row of ``scores`` (shape (n, K), K >= 2)."""
    top_two = np.sort(_scores(scores), axis=1)[:, -2:]
    return top_two[:, 1] - top_two[:, 0]


def normalised_margin(scores) -> np.ndarray:
    """:func:`raw_margin` divided by the Euclidean norm of each score vector.

    Invariant under scores -> s * scores for every s > 0; rows of all zeros are refused.
    """
    z = _scores(scores)
    norms = np.linalg.norm(z, axis=1)
    if np.any(norms == 0):
        raise ValueError("scores must not contain an all-zero row (its normalised margin is undefined)")
    return raw_margin(z) / norms

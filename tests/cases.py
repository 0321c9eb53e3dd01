"""Seeded case dicts shared by the tests, with readable ids."""

PRODUCT_POINTS = [
    {"id": "balanced", "a": 1.0, "b": 1.0, "x": 1.0, "y": 1.0},
    {"id": "c=10", "a": 10.0, "b": 0.1, "x": 1.0, "y": 1.0},
    {"id": "c=0.25", "a": 0.25, "b": 4.0, "x": 1.0, "y": 1.0},
    {"id": "origin", "a": 0.0, "b": 0.0, "x": 1.0, "y": 1.0},
    {"id": "off-orbit", "a": 0.7, "b": -1.3, "x": 2.0, "y": 0.5},
    {"id": "negative", "a": -2.0, "b": -0.5, "x": -1.5, "y": 1.5},
]
SCALES = [0.1, 0.5, 1.0, 3.0, 10.0, 100.0]


def ids(cases):
    return [c["id"] for c in cases]


#: Seeded softmax classifiers ``W`` (K x d, with a nonzero mean row), features ``h`` and a
#: shift ``v``, built by :func:`make_classifier`; shared by the softmax and flatness tests.
CLASSIFIER_CASES = [
    {"id": "K2-d1", "K": 2, "d": 1, "n": 3, "scale": 1.0, "seed": 0},
    {"id": "K3-d4", "K": 3, "d": 4, "n": 5, "scale": 1.0, "seed": 1},
    {"id": "K10-d6-large", "K": 10, "d": 6, "n": 7, "scale": 3.0, "seed": 2},
    {"id": "K5-d2-small", "K": 5, "d": 2, "n": 4, "scale": 0.1, "seed": 3},
]


def make_classifier(case):
    """``(W, h, v)`` of a :data:`CLASSIFIER_CASES` entry, float64, seeded."""
    import torch

    gen = torch.Generator().manual_seed(case["seed"])
    W = case["scale"] * torch.randn(case["K"], case["d"], generator=gen, dtype=torch.float64)
    W = W + torch.randn(1, case["d"], generator=gen, dtype=torch.float64)  # a nonzero mean row
    h = torch.randn(case["n"], case["d"], generator=gen, dtype=torch.float64)
    v = torch.randn(case["d"], generator=gen, dtype=torch.float64)
    return W, h, v

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

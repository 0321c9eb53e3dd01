"""Tests of lossgeom_book.dynamics.edge_of_stability_summary on hand-made runs."""

from __future__ import annotations

import numpy as np
import pytest

from lossgeom_book.dynamics import edge_of_stability_summary

from conftest import assert_close


def test_summary_of_a_hand_made_run():
    steps = np.array([0, 10, 20, 25, 30, 35])
    sharpness = np.array([0.5, 1.0, 1.9, 2.1, 2.3, 1.9])  # eta = 1: edge at 2
    losses = np.array(
        [
            1.0,
            0.9,
            0.8,
            0.7,
            0.6,
            0.5,
            0.4,
            0.3,
            0.3,
            0.3,
            0.3,
            0.3,
            0.3,
            0.3,
            0.3,
            0.3,
            0.3,
            0.3,
            0.3,
            0.3,
            0.3,
            0.35,
            0.2,
            0.25,
            0.1,
            0.2,
            0.05,
            0.04,
            0.03,
            0.02,
            0.01,
            0.011,
            0.009,
            0.008,
            0.007,
            0.006,
        ]
    )
    s = edge_of_stability_summary(steps, sharpness, losses, 1.0, late_from=20)
    late = np.array([1.9, 2.1, 2.3, 1.9]) / 2
    assert s.n_late == 4 and s.late_from == 20 and s.learning_rate == 1.0
    assert_close(
        [s.median_ratio, s.min_ratio, s.max_ratio], [np.median(late), late.min(), late.max()], rtol=1e-15, atol=0
    )
    rises = np.diff(losses[20:]) > 0
    assert s.loss_rose_late and s.late_rise_fraction == rises.mean() == 4 / 15
    assert (s.loss_start, s.loss_late_start, s.loss_end) == (1.0, 0.3, 0.006)
    assert (s.start_step, s.start_ratio) == (0, 0.25)
    assert s.rose is True and s.can_show_rise


def test_a_run_that_starts_above_the_edge_cannot_show_a_rise():
    steps = np.array([0, 10, 20, 30])
    sharpness = np.array([3.8, 2.6, 2.3, 2.2])  # eta = 1: starts at 1.9 x 2/eta, falls to the edge
    s = edge_of_stability_summary(steps, sharpness, np.linspace(1.0, 0.1, 31), 1.0, late_from=20)
    assert s.start_ratio == 1.9 and s.rose is False and not s.can_show_rise
    rising = edge_of_stability_summary(steps, [1.0, 2.6, 2.3, 2.2], np.ones(31), 1.0, late_from=20)
    assert rising.rose is True and rising.can_show_rise


def test_no_measurement_before_the_late_phase_gives_no_rise():
    s = edge_of_stability_summary([20, 25, 30], [1.0, 2.0, 3.0], np.ones(31), 1.0, late_from=20)
    assert s.start_step == 20 and s.rose is None and not s.can_show_rise
    unsorted = edge_of_stability_summary([30, 0, 20], [3.0, 1.0, 2.0], np.ones(31), 1.0, 20)
    assert (unsorted.start_step, unsorted.start_ratio, unsorted.rose) == (0, 0.5, True)


def test_monotone_loss_has_no_late_rise_and_ratio_scales_with_eta():
    steps = np.arange(0, 50, 5)
    sharpness = np.linspace(1.0, 3.0, steps.size)
    losses = np.geomspace(1.0, 1e-3, 50)
    a = edge_of_stability_summary(steps, sharpness, losses, 0.5, 25)
    b = edge_of_stability_summary(steps, sharpness, losses, 1.0, 25)
    assert not a.loss_rose_late and a.late_rise_fraction == 0.0
    assert_close(b.median_ratio, 2 * a.median_ratio, rtol=1e-15, atol=0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"sharpness": [1.0, 2.0]}, "same length"),
        ({"learning_rate": 0.0}, "learning_rate must be > 0"),
        ({"late_from": 40}, "late phase from step 40"),
        ({"late_from": -1}, "late_from must be an int >= 0"),
        ({"late_from": 2.5}, "late_from must be an int >= 0"),
        ({"losses": [1.0, np.nan, 0.5] * 10}, "losses must contain only finite values"),
    ],
)
def test_errors(kwargs, match):
    arguments = {
        "measured_at": [0, 10, 20],
        "sharpness": [1.0, 2.0, 3.0],
        "losses": np.ones(30),
        "learning_rate": 1.0,
        "late_from": 10,
    } | kwargs
    with pytest.raises(ValueError, match=match):
        edge_of_stability_summary(**arguments)

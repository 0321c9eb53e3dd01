"""Portable number handling: rounding for storage, rounding-level reports, glue."""

import json

import numpy as np
import pytest
import torch

from lossgeom.formatting import fmt, round_sig, rounding_level
from lossgeom_book.display import glue_value
from lossgeom_book.ledger import Ledger, id_order


@pytest.mark.parametrize(
    "value, sig",
    [
        (0.032190034652589225, 4),
        (1.0041876778036087, 6),
        (-9922.6177485394, 3),
        (2.1628560631224114e-16, 2),
        (123456789.0, 5),
    ],
)
def test_round_sig_stores_exactly_the_printed_digits(value, sig):
    rounded = round_sig(value, sig)
    assert rounded == float(fmt(value, sig))  # the stored float is exactly the printed decimal
    assert fmt(rounded, sig) == fmt(value, sig)
    assert abs(rounded - value) <= 0.5 * 10 ** (np.floor(np.log10(abs(value))) - sig + 1) * (1 + 1e-12)


def test_round_sig_converts_scalars_and_keeps_exact_values():
    assert round_sig(torch.tensor(2 / 3), 3) == 0.667 and round_sig(np.float64(1 / 3), 2) == 0.33
    assert round_sig(np.int64(7)) == 7 and isinstance(round_sig(np.int64(7)), int)
    assert round_sig("1/3") == "1/3" and round_sig(True) is True


def test_round_sig_rejects_bad_input():
    with pytest.raises(ValueError, match="sig must be an int >= 1"):
        round_sig(1.0, 0)
    with pytest.raises(ValueError, match="non-finite"):
        round_sig(float("inf"))
    with pytest.raises(TypeError, match="real number"):
        round_sig([1.0])


def test_rounding_level_reports_order_not_digits():
    assert str(rounding_level(7.1e-16)) == str(rounding_level(6.9e-16)) == "below 1e-13 (rounding level)"
    assert str(rounding_level(torch.tensor(-3e-15), floor=1e-14)) == "below 1e-14 (rounding level)"
    with pytest.raises(ValueError, match="not rounding level"):
        rounding_level(2e-13)
    with pytest.raises(ValueError, match="floor must be"):
        rounding_level(0.0, floor=0.0)


def test_glue_value_stores_the_rounded_number(monkeypatch):
    glued = {}
    from lossgeom_book import display

    monkeypatch.setattr(display, "glue", lambda name, value, display=True: glued.__setitem__(name, value))
    assert glue_value("x", 0.032190034652589225, 4) is None  # nothing displayed after a trailing call
    assert repr(glued["x"]) == "0.03219"
    glue_value("s", "a sentence")
    assert repr(glued["s"]) == "a sentence"
    with pytest.raises(ValueError, match="name must be"):
        glue_value("", 1.0)


def test_ledger_json_holds_what_the_table_shows():
    led = Ledger("demo", sig=4)
    led.add("M1", "noise", {"at (1,1)": 1.0000500012345e-4, "ratio": 50.00254987250637})
    led.add("M2", "a finer row", 1.0041876778036087, sig=8)
    led.add("M3", "rounding-level", rounding_level(2.16e-16))
    rows = led.to_json()["ledger"]
    assert rows[0]["computed"] == {"at (1,1)": 0.0001, "ratio": 50.0}
    assert rows[1]["computed"] == 1.0041877 and rows[2]["computed"] == "below 1e-13 (rounding level)"
    text = json.dumps(led.to_json())
    assert "50.0025" not in text and "1.00418767" not in text
    table = led.to_markdown()
    assert "| 1.0041877 |" in table and "ratio: 50 |" in table


def test_ledger_rows_come_in_id_order_with_maths_and_details():
    import sympy as sp

    led = Ledger("demo")
    led.add("P11", "a margin", 1.5)
    led.add(
        "P3",
        "eigenvalue $c^2 + c^{-2}$ at $\\|w\\| = 1$ | one_two",
        sp.Interval.open(0, 2),
        details={"bound": 0.123456789, "factor": 1 - sp.Symbol("eta") * sp.Symbol("lambda")},
    )
    led.add("P9", "plain", "a*b_c")
    rows = led.to_json()["ledger"]
    assert [r["id"] for r in rows] == ["P3", "P9", "P11"]
    assert sorted(["T1", "Q7", "M2", "P11", "X1", "S3", "P9"], key=id_order) == [
        "P9",
        "P11",
        "M2",
        "S3",
        "Q7",
        "T1",
        "X1",
    ]
    assert rows[0]["computed"] == "$\\left(0, 2\\right)$" and "details" not in rows[1]
    assert rows[0]["details"] == {"bound": 0.123457, "factor": "$- \\eta \\lambda + 1$"}
    table = led.to_markdown()
    lines = [line for line in table.splitlines() if line.startswith("|")]
    assert table.startswith("::::{container} ledger") and table.rstrip().endswith("::::")
    assert lines[2].startswith("| P3 | eigenvalue $c^2 + c^{-2}$ at $\\Vert w\\Vert  = 1$ \\| one\\_two |")
    assert "| a\\*b\\_c |" in lines[3]  # text outside maths is escaped
    assert ":::{dropdown}" in table and "- **P3**: bound: 0.123457; factor: $- \\eta \\lambda + 1$" in table
    assert "details: bound: 0.123457" in led.to_text()
    with pytest.raises(TypeError, match="details must be a dict"):
        led.add("P1", "x", 1.0, details=[1.0])

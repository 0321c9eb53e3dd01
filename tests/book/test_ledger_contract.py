"""The results ledger and the measurement contract."""

import json

import nbformat
import numpy as np
import pytest

from lossgeom.contract import MeasurementContract
from lossgeom_book.ledger import Ledger, read_ledgers

FIELDS = dict(
    centre="(1, 1)",
    directions="circle",
    normalisation="Euclidean",
    radius="0.1",
    loss="1/2 (ab - 1)^2",
    reduction="single example",
    data="(1, 1)",
    model_mode="n/a",
    resolution="64 angles",
    precision="float64",
)


def test_ledger_renders_table_and_json():
    led = Ledger("demo")
    led.add("P3", "eigenvalue at c=10", np.float64(100.01), reported=100.01)
    led.add("S9", "feature study", {"share": 0.5}, status="holds at our scale", note="MLP on digits")
    bundle = led._repr_mimebundle_()
    rows = bundle["application/json"]["ledger"]
    assert [r["id"] for r in rows] == ["P3", "S9"] and rows[0]["computed"] == 100.01
    assert json.loads(json.dumps(bundle["application/json"])) == bundle["application/json"]
    assert "| P3 |" in bundle["text/markdown"] and "holds at our scale (S9 note) |" in bundle["text/markdown"]
    assert "- **S9 note** (holds at our scale): MLP on digits" in bundle["text/markdown"]
    assert "P3 [holds]" in bundle["text/plain"]


def test_ledger_rejects_bad_rows():
    led = Ledger("demo")
    with pytest.raises(ValueError, match="status must be one of"):
        led.add("P1", "x", 1, status="true")
    with pytest.raises(ValueError, match="needs a note"):
        led.add("P1", "x", 1, status="differs")
    with pytest.raises(ValueError, match="id must look like"):
        led.add("p1", "x", 1)
    with pytest.raises(ValueError, match="must be finite"):
        led.add("P1", "x", float("nan"))
    led.add("P1", "x", 1)
    with pytest.raises(ValueError, match="already in this ledger"):
        led.add("P1", "y", 2)
    with pytest.raises(ValueError, match="ledger is empty"):
        Ledger("empty")._repr_mimebundle_()


def test_read_ledgers_round_trip(tmp_path):
    led = Ledger("demo")
    led.add("M1", "noise", 1.5e-4)
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("led")
    cell.outputs = [nbformat.v4.new_output("display_data", data={"application/json": led.to_json(), "text/plain": "x"})]
    nb.cells = [cell]
    path = tmp_path / "ch99.ipynb"
    nbformat.write(nb, path)
    rows = read_ledgers([path])
    assert rows == [
        {
            "chapter": "ch99",
            "id": "M1",
            "claim": "noise",
            "computed": 1.5e-4,
            "reported": None,
            "status": "holds",
            "note": "",
        }
    ]


def test_contract_caption_lists_every_field():
    caption = MeasurementContract(**FIELDS).caption("Loss on a circle")
    for label in [
        "centre",
        "directions",
        "normalisation",
        "radius",
        "loss",
        "reduction",
        "data",
        "model mode",
        "resolution",
        "precision",
    ]:
        assert f"{label}:" in caption
    assert caption.startswith("Loss on a circle. Contract:")


def test_contract_requires_every_field():
    with pytest.raises(ValueError, match="radius must be stated"):
        MeasurementContract(**{**FIELDS, "radius": " "})
    with pytest.raises(TypeError, match="precision must be a string"):
        MeasurementContract(**{**FIELDS, "precision": 64})
    with pytest.raises(TypeError, match=r"unknown contract field\(s\) \['centr'\]"):
        MeasurementContract(**FIELDS).with_(centr="x")
    assert MeasurementContract(**FIELDS).with_(radius="0.2").radius == "0.2"


def test_markdown_escapes_emphasis_and_pipes():
    from lossgeom_book.ledger import rows_to_markdown

    rows = [
        {
            "id": "S3",
            "claim": "ratio 1 + K*|w_c,r|^2",
            "computed": "-(ab - 1)*(3ab - 1)",
            "reported": None,
            "status": "holds",
            "note": "",
            "chapter": "ch07_x",
        }
    ]
    table = rows_to_markdown(rows, chapter_links=True)
    assert r"1 + K\*\|w\_c,r\|^2" in table
    assert "| -(ab - 1)\\*(3ab - 1) |" in table
    assert "{doc}`ch07_x <../chapters/ch07_x>`" in table
    assert [line for line in table.splitlines() if line.startswith("|")][1] == "|---|---|---|---|---|---|"


def test_glue_figure_requires_a_contract_and_closes_the_figure():
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from lossgeom_book.display import glue_figure

    fig, _ = plt.subplots()
    with pytest.raises(TypeError, match="contract must be a MeasurementContract"):
        glue_figure("demo", fig, {"centre": "x"}, "A figure.")
    with pytest.raises(ValueError, match="summary must be a non-empty sentence"):
        glue_figure("demo", fig, MeasurementContract(**FIELDS), " ")
    glue_figure("demo", fig, MeasurementContract(**FIELDS), "A figure.")
    assert not plt.fignum_exists(fig.number)


def test_contract_markdown_is_one_line_with_every_field_in_order():
    from lossgeom_book.display import contract_markdown

    line = contract_markdown(MeasurementContract(**{**FIELDS, "loss": "1/2 (ab x - y)^2 * w_1"}))
    assert "\n" not in line and line.startswith("*Measurement contract.* **centre** ")
    labels = [part.split("**")[1] for part in line.split(" · ")]
    assert labels == [
        "centre",
        "directions",
        "normalisation",
        "radius",
        "loss",
        "reduction",
        "data",
        "model mode",
        "resolution",
        "precision",
    ]
    assert "1/2 (ab x - y)^2 \\* w\\_1" in line
    with pytest.raises(TypeError, match="contract must be a MeasurementContract"):
        contract_markdown(FIELDS)

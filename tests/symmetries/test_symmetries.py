"""The symmetry audit: valid transforms pass, non-symmetries are caught, bad input is named."""

from dataclasses import replace

import pytest
import torch

from lossgeom.symmetries import Symmetry, audit_symmetry
from lossgeom.symmetries.core import check_forward_reads, discrepancy_text, rounding_floor

from book_extra import from_book

product = from_book("lossgeom_book.product")

PROBE = torch.linspace(-3.0, 3.0, 13)


def top_eigenvalue(p):
    return float(torch.linalg.eigvalsh(torch.tensor(product.hessian(p["a"].item(), p["b"].item())))[-1])


def test_rescaling_is_a_symmetry_and_changes_curvature():
    report = audit_symmetry(
        product.forward,
        product.params(1, 1),
        product.product_rescaling(10.0),
        PROBE,
        tol=1e-12,
        measure=top_eigenvalue,
        measure_name="top eigenvalue",
    )
    assert report.is_symmetry and report.max_output_discrepancy <= 1e-12
    assert report.measure_before == pytest.approx(2.0, rel=1e-14)
    assert report.measure_after == pytest.approx(100.01, rel=1e-12)
    assert report.measure_ratio == pytest.approx(50.005, rel=1e-12)
    assert "largest output discrepancy" in str(report)


def test_a_non_symmetry_is_rejected_with_its_discrepancy():
    stretch = Symmetry("a -> 2a only", lambda p: {"a": 2 * p["a"], "b": p["b"]})
    with pytest.raises(ValueError, match=r"not a symmetry .* discrepancy 3 exceeds tol"):
        audit_symmetry(product.forward, product.params(1, 1), stretch, PROBE, tol=1e-9)
    report = audit_symmetry(
        product.forward, product.params(1, 1), stretch, PROBE, tol=1e-9, measure=top_eigenvalue, require_symmetry=False
    )
    assert not report.is_symmetry and report.max_output_discrepancy == pytest.approx(3.0)
    assert report.measure_before is None  # geometry is not compared for an invalid control


def test_transform_must_keep_parameter_names():
    drop = Symmetry("drops b", lambda p: {"a": p["a"]})
    with pytest.raises(ValueError, match="same parameter names"):
        audit_symmetry(product.forward, product.params(1, 1), drop, PROBE, tol=1e-9)


@pytest.mark.parametrize("c", [0.0, -2.0, float("nan")])
def test_rescaling_needs_positive_finite_c(c):
    with pytest.raises(ValueError, match="c must be"):
        product.product_rescaling(c)


def test_bad_probe_and_tolerance_are_named():
    p, s = product.params(1, 1), product.product_rescaling(2.0)
    with pytest.raises(ValueError, match="tol must be > 0"):
        audit_symmetry(product.forward, p, s, PROBE, tol=0.0)
    with pytest.raises(ValueError, match="probe must contain only finite values"):
        audit_symmetry(product.forward, p, s, torch.tensor([1.0, float("nan")]), tol=1e-9)
    with pytest.raises(ValueError, match="probe must hold at least one input"):
        audit_symmetry(product.forward, p, s, torch.zeros(0), tol=1e-9)
    with pytest.raises(ValueError, match=r"probe must have shape \(n, 3\)"):
        audit_symmetry(product.forward, p, s, torch.zeros(5, 2), tol=1e-9, input_shape=(3,))
    with pytest.raises(TypeError, match="symmetry must be a lossgeom Symmetry"):
        audit_symmetry(product.forward, p, lambda q: q, PROBE, tol=1e-9)


def test_audit_wraps_shape_errors_from_the_model():
    weight = {"w": torch.ones(3, 2)}
    linear = lambda q, x: x @ q["w"].T
    identity = Symmetry("identity", lambda q: dict(q))
    with pytest.raises(ValueError, match=r"forward failed on the probe set of shape \(4, 5\)"):
        audit_symmetry(linear, weight, identity, torch.ones(4, 5), tol=1e-9)


def test_report_prints_rounding_level_discrepancies_by_order_only():

    assert discrepancy_text(5.55e-17) == discrepancy_text(2.2e-16) == "below 1e-13 (rounding level)"
    assert discrepancy_text(0.0123) == "0.012"


# --- regression tests of issue 9: an audit must never certify by accident -----------------


def _snapshot(params):
    return {k: (v.clone(), v._version) for k, v in params.items()}


def _unchanged(params, snapshot):
    return all(torch.equal(params[k], v) and params[k]._version == version for k, (v, version) in snapshot.items())


def test_a_transform_that_rewrites_the_dict_in_place_is_refused_and_the_caller_is_untouched():
    # before the fix: the audit compared the moved dict with itself (ratio 1) and the
    # caller's params came back rescaled
    def rescale_in_place(p):
        p["a"], p["b"] = 10 * p["a"], p["b"] / 10
        return p

    params = product.params(1.0, 1.0)
    snapshot = _snapshot(params)
    with pytest.raises(ValueError, match="modified the parameter dict it was given in place"):
        audit_symmetry(
            product.forward,
            params,
            Symmetry("in-place c = 10", rescale_in_place),
            PROBE,
            tol=1e-12,
            measure=top_eigenvalue,
        )
    assert _unchanged(params, snapshot)


@pytest.mark.parametrize("edit", ["mul_", "data", "setitem"])
def test_a_transform_that_edits_tensors_in_place_is_refused_and_the_caller_is_untouched(edit):
    def rescale_tensors(p):
        if edit == "mul_":
            p["a"].mul_(10.0), p["b"].div_(10.0)
        elif edit == "data":  # bypasses the version counter: caught by the value comparison
            p["a"].data *= 10.0
            p["b"].data /= 10.0
        else:
            p["a"][...], p["b"][...] = 10.0, 0.1
        return {"a": p["a"], "b": p["b"]}

    params = product.params(1.0, 1.0)
    snapshot = _snapshot(params)
    with pytest.raises(ValueError, match=r"edited the tensors \['a', 'b'\] in place"):
        audit_symmetry(
            product.forward,
            params,
            Symmetry("in-place tensors", rescale_tensors),
            PROBE,
            tol=1e-12,
            measure=top_eigenvalue,
        )
    assert _unchanged(params, snapshot)
    with pytest.raises(ValueError, match="in place"):
        Symmetry("in-place tensors", rescale_tensors)(params)
    assert _unchanged(params, snapshot)


def test_a_valid_transform_never_touches_the_callers_tensors():
    params = product.params(3.0, 0.5)
    snapshot = _snapshot(params)
    moved = product.product_rescaling(4.0)(params)
    assert _unchanged(params, snapshot)
    assert float(moved["a"]) == 12.0 and float(moved["b"]) == 0.125
    assert all(moved[k].data_ptr() != params[k].data_ptr() for k in params)


def test_a_forward_that_ignores_its_params_is_refused():
    # before the fix: a forward closing over fixed weights certified any transform
    fixed = product.params(1.0, 1.0)
    ignores = lambda _p, x: product.forward(fixed, x)
    stretch = Symmetry("a -> 2a only", lambda p: {"a": 2 * p["a"], "b": p["b"]})
    for symmetry in (product.product_rescaling(10.0), stretch):
        with pytest.raises(ValueError, match="forward does not depend on its params argument"):
            audit_symmetry(ignores, fixed, symmetry, PROBE, tol=1e-12, measure=top_eigenvalue)
    # the same transform with a forward that reads its params is audited (and the stretch caught)
    assert audit_symmetry(product.forward, fixed, product.product_rescaling(10.0), PROBE, tol=1e-12).is_symmetry
    assert not audit_symmetry(product.forward, fixed, stretch, PROBE, tol=1e-12, require_symmetry=False).is_symmetry


def test_a_forward_that_does_not_read_a_transformed_parameter_is_refused():
    # a misspelt key: the transform moves a parameter the forward never reads
    params = {
        "a": torch.tensor(1.0, dtype=torch.float64),
        "b": torch.tensor(1.0, dtype=torch.float64),
        "c_typo": torch.tensor(2.0, dtype=torch.float64),
    }
    forward = lambda p, x: p["a"] * p["b"] * x
    moves_typo = Symmetry("c_typo -> 3 c_typo", lambda p: {**p, "c_typo": 3 * p["c_typo"]})
    with pytest.raises(ValueError, match=r"forward does not read params\['c_typo'\]"):
        audit_symmetry(forward, params, moves_typo, PROBE, tol=1e-12)
    both = Symmetry("rescale and touch the typo", lambda p: {"a": 2 * p["a"], "b": p["b"] / 2, "c_typo": -p["c_typo"]})
    with pytest.raises(ValueError, match=r"does not read params\['c_typo'\]"):
        audit_symmetry(forward, params, both, PROBE, tol=1e-12)


def test_check_forward_reads_accepts_forwards_that_read_and_names_the_ones_that_do_not():

    params = product.params(0.0, 0.0)  # zero parameters: the perturbation still moves them
    check_forward_reads(product.forward, params, PROBE, ["a", "b"])
    with pytest.raises(ValueError, match=r"does not read params\['b'\]"):
        check_forward_reads(lambda p, x: p["a"] * x, params, PROBE, ["a", "b"])


def test_a_transform_that_changes_dtype_or_shape_is_refused():
    to32 = Symmetry("float32 copy", lambda p: {k: v.float() for k, v in p.items()})
    with pytest.raises(ValueError, match="keep each tensor's shape, dtype and device"):
        to32(product.params(1.0, 1.0))
    grow = Symmetry("adds an axis", lambda p: {k: v[None] for k, v in p.items()})
    with pytest.raises(ValueError, match=r"changed 'a' from \(\) torch.float64"):
        grow(product.params(1.0, 1.0))
    with pytest.raises(TypeError, match=r"params\['a'\] must be a torch.Tensor"):
        product.product_rescaling(2.0)({"a": 1.0, "b": 1.0})


def test_report_text_keeps_its_format_and_prints_measures_at_stated_digits():
    report = audit_symmetry(
        product.forward,
        product.params(1, 1),
        product.product_rescaling(3.0),
        PROBE,
        tol=1e-12,
        measure=top_eigenvalue,
        measure_name="top eigenvalue",
    )
    lines = str(report).splitlines()
    assert lines[0] == "transform: rescaling (a, b) -> (c a, b / c), c = 3"
    assert lines[1] == "probe set: 13 inputs; tolerance 1e-12"
    assert lines[2].startswith("largest output discrepancy: ")
    # c^2 + c^-2 = 9.111..., ratio 4.5555...: six digits by default, four when asked
    assert lines[3] == "top eigenvalue: before 2, after 9.11111, ratio 4.55556"

    assert str(replace(report, sig=4)).splitlines()[3] == "top eigenvalue: before 2, after 9.111, ratio 4.556"


def test_discrepancy_text_and_rounding_floor_by_dtype():

    eps64, eps32 = torch.finfo(torch.float64).eps, torch.finfo(torch.float32).eps
    assert rounding_floor(torch.float64) == 1e-13 and 450 * eps64 < 1e-13 < 4500 * eps64
    assert rounding_floor(torch.float32) == 1e-4 and 450 * eps32 < 1e-4 < 4500 * eps32
    assert discrepancy_text(3e-7, floor=1e-4) == "below 0.0001 (rounding level)"
    assert discrepancy_text(3e-4, floor=1e-4) == "0.0003"
    with pytest.raises(ValueError, match="float32 or float64"):
        rounding_floor(torch.float16)

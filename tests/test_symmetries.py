"""The symmetry audit: valid transforms pass, non-symmetries are caught, bad input is named."""
import pytest
import torch

from lossgeom import product
from lossgeom.symmetries import Symmetry, audit_symmetry, product_rescaling

PROBE = torch.linspace(-3.0, 3.0, 13)


def top_eigenvalue(p):
    return float(torch.linalg.eigvalsh(torch.tensor(product.hessian(p["a"].item(), p["b"].item())))[-1])


def test_rescaling_is_a_symmetry_and_changes_curvature():
    report = audit_symmetry(product.forward, product.params(1, 1), product_rescaling(10.0), PROBE,
                            tol=1e-12, measure=top_eigenvalue, measure_name="top eigenvalue")
    assert report.is_symmetry and report.max_output_discrepancy <= 1e-12
    assert report.measure_before == pytest.approx(2.0, rel=1e-14)
    assert report.measure_after == pytest.approx(100.01, rel=1e-12)
    assert report.measure_ratio == pytest.approx(50.005, rel=1e-12)
    assert "largest output discrepancy" in str(report)


def test_a_non_symmetry_is_rejected_with_its_discrepancy():
    stretch = Symmetry("a -> 2a only", lambda p: {"a": 2 * p["a"], "b": p["b"]})
    with pytest.raises(ValueError, match=r"not a symmetry .* discrepancy 3 exceeds tol"):
        audit_symmetry(product.forward, product.params(1, 1), stretch, PROBE, tol=1e-9)
    report = audit_symmetry(product.forward, product.params(1, 1), stretch, PROBE, tol=1e-9,
                            measure=top_eigenvalue, require_symmetry=False)
    assert not report.is_symmetry and report.max_output_discrepancy == pytest.approx(3.0)
    assert report.measure_before is None  # geometry is not compared for an invalid control


def test_transform_must_keep_parameter_names():
    drop = Symmetry("drops b", lambda p: {"a": p["a"]})
    with pytest.raises(ValueError, match="same parameter names"):
        audit_symmetry(product.forward, product.params(1, 1), drop, PROBE, tol=1e-9)


@pytest.mark.parametrize("c", [0.0, -2.0, float("nan")])
def test_rescaling_needs_positive_finite_c(c):
    with pytest.raises(ValueError, match="c must be"):
        product_rescaling(c)


def test_bad_probe_and_tolerance_are_named():
    p, s = product.params(1, 1), product_rescaling(2.0)
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
    from lossgeom.symmetries import discrepancy_text

    assert discrepancy_text(5.55e-17) == discrepancy_text(2.2e-16) == "below 1e-13 (rounding level)"
    assert discrepancy_text(0.0123) == "0.012"

"""Progress bars of long computations: shown only when asked or on an interactive terminal, never a number changed.

Every long-running entry point takes ``progress``: ``True`` draws a tqdm bar on stderr,
``False`` never, ``None`` only on a terminal outside CI and pytest (so never in a notebook
executed by nbval). For each entry point the tests check that a forced bar reaches stderr,
that the results (values, vectors, product counts) are bit-identical to a run without one,
that the bar counted the computation's own units (its products, cells or symmetries, read
off a recording bar), that the automatic default is silent under pytest, and that a value
other than a bool or None is refused naming ``progress``.
"""

from __future__ import annotations

import io
from dataclasses import fields

import numpy as np
import pytest
import torch
from torch import nn
from tqdm import tqdm

from lossgeom import progress as progress_module
from lossgeom.atlas import atlas
from lossgeom.curvature import hutchinson_trace, hutchpp_trace, spectral_density, top_eigenpairs
from lossgeom.curvature.lanczos import lanczos_eigenpairs
from lossgeom.curvature.spectra import power_iteration
from lossgeom.progress import QUIET_ENVIRONMENT, advance_to, progress_bar, show_progress
from lossgeom.symmetries import audit

RNG = np.random.default_rng(3)
_B = RNG.standard_normal((30, 30))
#: a symmetric test matrix with a spread spectrum (no early Lanczos breakdown)
MATRIX = _B @ _B.T / 30 + np.diag(np.linspace(0.0, 3.0, 30))


class _Recording(tqdm):
    """A tqdm bar that records its label, count and total when it closes."""

    closed: list[tuple[str, int, int | None, bool]] = []

    def close(self) -> None:
        if not getattr(self, "_recorded", False):
            self._recorded = True
            _Recording.closed.append((getattr(self, "desc", None), self.n, self.total, self.disable))
        super().close()


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int | None, bool]]:
    _Recording.closed = []
    monkeypatch.setattr(progress_module, "tqdm", _Recording)
    return _Recording.closed


def _small_model() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6, dtype=torch.float64), nn.ReLU(), nn.Linear(6, 3, dtype=torch.float64))
    x, y = torch.randn(30, 4, dtype=torch.float64), torch.randint(0, 3, (30,))
    return model, x, y


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same(a: object, b: object) -> bool:
    """Bit-identical results: arrays by ``array_equal`` (NaN equal), dataclasses field by field."""
    if hasattr(a, "__dataclass_fields__"):
        return type(a) is type(b) and all(_same(getattr(a, f.name), getattr(b, f.name)) for f in fields(a))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    return a == b


#: entry point label -> (the bar's label, a call taking progress=..., the units the bar must count)
CURVATURE = {
    "arpack": (
        "ARPACK eigenpairs",
        lambda p: top_eigenpairs(MATRIX, k=2, method="arpack", progress=p),
        lambda r: r.n_hvp,
    ),
    "lanczos": (
        "Lanczos eigenpairs",
        lambda p: top_eigenpairs(MATRIX, k=2, tol=1e-8, progress=p),
        lambda r: r.n_hvp,
    ),
    "lanczos_eigenpairs": (
        "Lanczos eigenpairs",
        lambda p: lanczos_eigenpairs(MATRIX, k=1, which="smallest", tol=1e-6, progress=p),
        lambda r: r.n_hvp,
    ),
    "power": ("power iteration", lambda p: power_iteration(MATRIX, tol=1e-6, progress=p), lambda r: r.n_hvp),
    "slq": (
        "spectral density (SLQ)",
        lambda p: spectral_density(MATRIX, np.linspace(-1, 10, 50), n_probes=3, n_lanczos=12, sigma=0.3, progress=p),
        lambda r: r.n_hvp,
    ),
    "hutchinson": ("Hutchinson trace", lambda p: hutchinson_trace(MATRIX, n_probes=12, progress=p), lambda r: r.n_hvp),
    "hutchinson_target": (
        "Hutchinson trace",
        lambda p: hutchinson_trace(MATRIX, n_probes=4, target_rel_se=1e-9, max_probes=17, batch=5, progress=p),
        lambda r: r.n_hvp,
    ),
    "hutchpp": ("Hutch++ trace", lambda p: hutchpp_trace(MATRIX, n_probes=18, progress=p), lambda r: r.n_hvp),
    "hutchpp_wide": ("Hutch++ trace", lambda p: hutchpp_trace(MATRIX, n_probes=120, progress=p), lambda r: r.n_hvp),
}


@pytest.mark.parametrize("name", sorted(CURVATURE))
def test_a_forced_bar_reaches_stderr_and_changes_no_number(name, capsys):
    desc, call, _ = CURVATURE[name]
    quiet = call(False)
    assert capsys.readouterr().err == ""
    shown = call(True)
    err = capsys.readouterr().err
    assert desc in err and "product" in err
    assert _same(quiet, shown)


@pytest.mark.parametrize("name", sorted(CURVATURE))
def test_the_bar_counts_the_products_spent(name, recorded):
    desc, call, units = CURVATURE[name]
    result = call(True)
    ((label, n, total, disabled),) = recorded
    assert (label, disabled) == (desc, False)
    assert n == units(result) > 0
    assert (total is None) == (name == "arpack")  # ARPACK's restarts leave its product count open
    assert total is None or n <= total


def test_the_bar_totals_are_the_known_budgets(recorded):
    spectral_density(MATRIX, np.linspace(-1, 10, 5), n_probes=3, n_lanczos=12, progress=True)
    hutchpp_trace(MATRIX, n_probes=18, progress=True)  # 3 blocks of m = 6
    hutchpp_trace(MATRIX, n_probes=120, progress=True)  # m = 40 > n = 30: the sketch spans R^30
    hutchinson_trace(MATRIX, n_probes=4, target_rel_se=1e-9, max_probes=17, batch=5, progress=True)
    power_iteration(MATRIX, tol=1e-3, max_iter=500, progress=True)
    assert [(n, total) for _, n, total, _ in recorded] == [
        (36, 36),
        (18, 18),
        (110, 110),
        (17, 17),
        (recorded[-1][1], 500),
    ]


@pytest.mark.parametrize("name", sorted(CURVATURE))
def test_the_automatic_bar_is_off_under_pytest(name, capsys, recorded):
    desc, call, _ = CURVATURE[name]
    assert _same(call(None), call(False))
    assert capsys.readouterr().err == ""
    assert recorded and all(disabled for *_, disabled in recorded)


@pytest.mark.parametrize("name", sorted(CURVATURE))
@pytest.mark.parametrize("bad", ["yes", 1, 0, np.bool_(True)])
def test_a_progress_that_is_not_a_bool_or_none_is_refused(name, bad):
    with pytest.raises(TypeError, match=r"progress must be True .*False .*None"):
        CURVATURE[name][1](bad)


def test_the_automatic_rule_shows_a_bar_only_on_a_terminal_outside_ci(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert show_progress(None) is False  # under pytest: PYTEST_CURRENT_TEST is set
    for name in QUIET_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("sys.stderr", Terminal())
    assert show_progress(None) is True
    monkeypatch.setenv("CI", "true")
    assert show_progress(None) is False
    monkeypatch.setenv("CI", "")
    assert show_progress(None) is True
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/test_progress.py::x")
    assert show_progress(None) is False
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    with progress_bar(True, total=1, desc="outer", unit="step"):
        assert show_progress(None) is False  # no nested automatic bar
        assert show_progress(True) is True
    assert show_progress(None) is True
    # a stream that is not a terminal (a Jupyter kernel's, nbval's, a file): no bar
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert show_progress(None) is False
    monkeypatch.setattr("sys.stderr", object())
    assert show_progress(None) is False


def test_advance_to_moves_forward_only(recorded):
    with progress_bar(True, total=10, desc="count", unit="product") as bar:
        advance_to(bar, 4)
        advance_to(bar, 3)
        advance_to(bar, 7)
    assert recorded == [("count", 7, 10, False)]


def test_the_audit_bar_counts_the_audited_symmetries_and_changes_nothing(capsys, recorded):
    model, x, _ = _small_model()
    before = _state(model)

    def squared_norm(m: nn.Module) -> float:
        return sum(float(p.detach().pow(2).sum()) for p in m.parameters())

    quiet = audit(model, squared_norm, x, loss=nn.CrossEntropyLoss(), progress=False)
    automatic = audit(model, squared_norm, x, loss=nn.CrossEntropyLoss())
    assert capsys.readouterr().err == ""
    shown = audit(model, squared_norm, x, loss=nn.CrossEntropyLoss(), progress=True)
    assert "symmetry audit" in capsys.readouterr().err
    assert str(quiet) == str(shown) == str(automatic) and quiet.rows() == shown.rows()
    assert recorded[-1] == ("symmetry audit", len(shown), len(shown), False) and len(shown) == 3
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(TypeError, match="progress"):
        audit(model, squared_norm, x, progress="yes")


def test_the_atlas_bar_counts_the_cells_and_changes_nothing(capsys, recorded):
    model, x, y = _small_model()
    before = _state(model)
    kwargs = dict(probe=x[:10], measures=["sam", "b_raw"], transforms=["layer_rescaling", "softmax_shift"])
    quiet = atlas(model, nn.CrossEntropyLoss(), (x, y), progress=False, **kwargs)
    assert capsys.readouterr().err == ""
    shown = atlas(model, nn.CrossEntropyLoss(), (x, y), progress=True, **kwargs)
    assert "atlas" in capsys.readouterr().err
    assert str(quiet) == str(shown) and quiet.base == shown.base and quiet.cells == shown.cells
    # 2 measures at the model's parameters and under each of the 2 transformations; the audit inside draws none
    assert [r for r in recorded if not r[3]] == [("atlas", 6, 6, False)]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(TypeError, match="progress"):
        atlas(model, nn.CrossEntropyLoss(), (x, y), progress=1, **kwargs)

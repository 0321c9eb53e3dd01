"""Fast paths checked against the safe path; random and batch-dependent forwards refused.

Before: ``nn.Embedding(padding_idx=...)`` made the GGN and Fisher operators and
forward-over-reverse Hessian products 10-18% off and asymmetric (torch's forward-mode rule
differentiates the padding row, reverse mode holds it fixed); a custom ``F.dropout`` in train
mode gave Hessians differing by 117%; ``BatchNorm1d(track_running_stats=False)`` in eval mode
gave a Hessian that depends on the batching. The references here are dense float64 matrices
built with reverse-mode ``torch.autograd.grad`` alone, one row at a time.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from lossgeom import curvature as cv
from lossgeom.curvature.fisher import fisher_scores
from lossgeom.models import loss_closure
from lossgeom.parameters import params_of
from lossgeom.risk import EmpiricalRisk

from conftest import assert_close

F64 = {"dtype": torch.float64}


class PaddedBag(nn.Module):
    """Mean of tanh(embedding) over a padded sequence, then a linear head: ``(N, T) -> (N, C)``."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(6, 3, padding_idx=0, **F64)
        self.head = nn.Linear(3, 4, **F64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.emb(x)).mean(1))


class PaddedTagger(nn.Module):
    """A per-token classifier, ``(N, T) -> (N, C, T)``: more outputs than parameters (jacfwd's case)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(5, 2, padding_idx=4, **F64)
        self.head = nn.Linear(2, 3, **F64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.emb(x))).movedim(-1, 1)


class FunctionalDropout(nn.Module):
    """A custom module calling ``F.dropout(h, p, self.training)``: no ``nn.Dropout`` to detect."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(3, 5, **F64)
        self.outer = nn.Linear(5, 2, **F64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outer(nn.functional.dropout(torch.tanh(self.inner(x)), 0.3, self.training))


def _padded_bag():
    torch.manual_seed(0)
    model = PaddedBag()
    with torch.no_grad():  # a padding row away from zero, so its (non-)derivative matters
        model.emb.weight[0] = torch.randn(3, **F64)
    x = torch.tensor([[1, 2, 0, 0], [3, 4, 5, 0], [0, 1, 1, 2], [5, 5, 0, 0], [2, 0, 0, 0]])
    return model, x, torch.tensor([0, 1, 2, 3, 1])


def _padded_tagger():
    torch.manual_seed(1)
    model = PaddedTagger()
    with torch.no_grad():
        model.emb.weight[4] = torch.randn(2, **F64)
    x = torch.tensor([[0, 1, 2, 4, 4], [3, 3, 4, 4, 4], [1, 0, 2, 3, 4], [2, 2, 2, 2, 1]])
    return model, x, torch.randint(0, 3, (4, 5), generator=torch.Generator().manual_seed(2))


def _functional(model: nn.Module):
    """``(theta, outputs(theta, x))`` on the flat parameter vector, through reverse-mode-safe ``functional_call``."""
    names = [name for name, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    theta = torch.cat([p.detach().reshape(-1) for _, p in model.named_parameters()])

    def outputs(vector: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        pieces = torch.split(vector, [int(np.prod(s)) for s in shapes])
        params = {name: piece.reshape(shape) for name, piece, shape in zip(names, pieces, shapes, strict=True)}
        return torch.func.functional_call(model, params, (x,))

    return theta, outputs


def _rows(vector: torch.Tensor, leaf: torch.Tensor) -> torch.Tensor:
    """``d vector / d leaf`` by one reverse-mode pass per entry of ``vector``."""
    rows = [torch.autograd.grad(entry, leaf, retain_graph=True)[0].reshape(-1) for entry in vector.reshape(-1)]
    return torch.stack(rows)


def _dense_references(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """Hessian, GGN, empirical and true Fisher of the mean cross-entropy, reverse mode only."""
    theta, outputs = _functional(model)
    loss = nn.CrossEntropyLoss()
    leaf = theta.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(loss(outputs(leaf, x), y), leaf, create_graph=True)
    hessian = _rows(grad, leaf)
    out = outputs(leaf, x)
    jac = _rows(out, leaf)  # (outputs, n)
    z = out.detach().clone().requires_grad_(True)
    (dz,) = torch.autograd.grad(loss(z, y), z, create_graph=True)
    lam = _rows(dz, z)  # the loss's Hessian w.r.t. the outputs
    ggn = jac.T @ lam @ jac
    scores = []
    for i in range(x.shape[0]):
        (g,) = torch.autograd.grad(loss(outputs(leaf, x[i : i + 1]), y[i : i + 1]), leaf)
        scores.append(g)
    scores = torch.stack(scores)  # L = (1/N) sum_i l_i for equal-size examples
    empirical = scores.T @ scores / x.shape[0]
    return {"hessian": hessian, "ggn": ggn, "empirical": empirical, "true": ggn}


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in (*model.named_parameters(), *model.named_buffers())}


def _assert_unchanged(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = _state(model)
    assert after.keys() == before.keys()
    assert all(torch.equal(after[name], before[name]) for name in before)


def _assert_matches(actual: np.ndarray, expected: torch.Tensor) -> None:
    scale = float(expected.abs().max())
    assert_close(actual, expected, rtol=0, atol=1e-10 * scale)


def test_embedding_with_padding_matches_reverse_mode_references():
    model, x, y = _padded_bag()
    before = _state(model)
    ref = _dense_references(model, x, y)
    # the defect is real: the padding row's reverse-mode derivative is held at zero
    assert float(ref["hessian"][:3].abs().max()) == 0 and float(ref["ggn"][:, :3].abs().max()) == 0
    loss, data = nn.CrossEntropyLoss(), (x, y)
    with pytest.warns(RuntimeWarning, match=r"HessianOperator\(method='forward-over-reverse'\).*relative"):
        hessian = cv.hessian_operator(model, loss, data, method="forward-over-reverse")
    assert hessian.mode == "reverse-over-reverse" and hessian.n_hvp == 0  # the set-up check is not counted
    _assert_matches(hessian.dense(), ref["hessian"])
    assert hessian.n_hvp == hessian.shape[0]
    with pytest.warns(
        RuntimeWarning, match=r"GGNOperator \(forward-mode Jacobian products\).*reverse mode is used instead"
    ):
        ggn = cv.ggn_operator(model, loss, data)
    assert ggn.jacobian_mode == "reverse" and ggn.n_hvp == 0
    _assert_matches(ggn.dense(), ref["ggn"])
    for kind in ("empirical", "true"):
        with pytest.warns(RuntimeWarning, match=r"FisherOperator"):
            fisher = cv.fisher_operator(model, loss, data, kind=kind)
        assert fisher.jacobian_mode == "reverse"
        _assert_matches(fisher.dense(), ref[kind])
    with pytest.warns(RuntimeWarning):  # several batches: each product goes through the reverse path
        split = cv.ggn_operator(model, loss, [(x[:2], y[:2]), (x[2:], y[2:])])
    block = torch.randn(split.shape[0], 3, generator=torch.Generator().manual_seed(3))
    assert_close(split @ block, ref["ggn"] @ block, rtol=0, atol=1e-10 * float(ref["ggn"].abs().max()))
    _assert_unchanged(model, before)


def test_dense_references_check_their_forward_mode_jacobian():
    model, x, y = _padded_tagger()
    before = _state(model)
    n = sum(p.numel() for p in model.parameters())
    assert n < model(x).numel()  # output_jacobian would take jacfwd
    theta, outputs = _functional(model)
    loss = nn.CrossEntropyLoss()
    leaf = theta.clone().requires_grad_(True)
    out = outputs(leaf, x)
    jac = _rows(out, leaf)
    z = out.detach().clone().requires_grad_(True)
    (dz,) = torch.autograd.grad(loss(z, y), z, create_graph=True)
    expected = jac.T @ _rows(dz, z) @ jac
    with pytest.warns(RuntimeWarning, match=r"output Jacobian \(jacfwd\)"):
        dense = cv.dense_ggn(model, loss, (x, y))
    _assert_matches(dense.numpy(), expected)
    _assert_matches(cv.dense_fisher(model, loss, (x, y), kind="true").numpy(), expected)  # reverse mode already
    with pytest.warns(RuntimeWarning, match=r"output Jacobian \(jacfwd\)"):
        scores = fisher_scores(EmpiricalRisk(model, loss, (x, y)), "true")
    _assert_matches((scores.T @ scores).numpy(), expected)
    with pytest.warns(RuntimeWarning, match="FisherOperator"):
        operator = cv.fisher_operator(model, loss, (x, y), kind="true")
    _assert_matches(operator.dense(), expected)
    _assert_unchanged(model, before)


def test_a_fast_path_that_agrees_is_kept_silently():
    torch.manual_seed(4)
    model = nn.Sequential(nn.Embedding(6, 3, **F64), nn.Flatten(), nn.Linear(12, 3, **F64))  # no padding_idx
    x, y = torch.tensor([[1, 2, 0, 0], [3, 4, 5, 0], [0, 1, 1, 2]]), torch.tensor([0, 1, 2])
    ref = _dense_references(model, x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        hessian = cv.hessian_operator(model, nn.CrossEntropyLoss(), (x, y), method="forward-over-reverse")
        ggn = cv.ggn_operator(model, nn.CrossEntropyLoss(), (x, y))
        fisher = cv.fisher_operator(model, nn.CrossEntropyLoss(), (x, y))
    assert hessian.mode == "forward-over-reverse" and hessian.batched_columns
    assert ggn.jacobian_mode == "forward" and fisher.jacobian_mode == "forward"
    assert hessian.n_hvp == ggn.n_hvp == fisher.n_hvp == 0
    _assert_matches(hessian.dense(), ref["hessian"])
    _assert_matches(ggn.dense(), ref["ggn"])
    _assert_matches(fisher.dense(), ref["empirical"])


def test_a_failing_forward_mode_falls_back_at_set_up():
    # torch's forward-mode rule for mse_loss's double backward writes into a ZeroTensor
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(3, 4, **F64), nn.Tanh(), nn.Linear(4, 2, **F64))
    x, y = torch.randn(6, 3, **F64), torch.randn(6, 2, **F64)
    params = params_of(model)
    with pytest.warns(RuntimeWarning, match="forward mode failed.*ZeroTensor"):
        op = cv.HessianOperator.from_closure(
            loss_closure(model, nn.MSELoss(), (x, y)), params, method="forward-over-reverse"
        )
    assert op.mode == "reverse-over-reverse" and op.keeps_graph
    theta, outputs = _functional(model)
    leaf = theta.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(nn.functional.mse_loss(outputs(leaf, x), y), leaf, create_graph=True)
    _assert_matches(op.dense(), _rows(grad, leaf))


@pytest.mark.parametrize("build", ["hessian", "ggn", "fisher", "risk"])
def test_functional_dropout_in_train_mode_is_refused(build):
    torch.manual_seed(6)
    model = FunctionalDropout().train()
    x, y = torch.randn(8, 3, **F64), torch.randint(0, 2, (8,))
    before = _state(model)
    make = {
        "hessian": cv.hessian_operator,
        "ggn": cv.ggn_operator,
        "fisher": cv.fisher_operator,
        "risk": EmpiricalRisk,
    }[build]
    with pytest.raises(ValueError, match=r"model is not a fixed function.*differs.*F\.dropout.*model\.eval\(\)"):
        make(model, nn.CrossEntropyLoss(), (x, y))
    _assert_unchanged(model, before)
    model.eval()  # the same module in eval mode is a fixed function
    ref = _dense_references(model, x, y)
    _assert_matches(cv.hessian_operator(model, nn.CrossEntropyLoss(), (x, y)).dense(), ref["hessian"])


def test_a_random_closure_is_refused():
    torch.manual_seed(7)
    model = FunctionalDropout().train()
    x, y = torch.randn(8, 3, **F64), torch.randint(0, 2, (8,))
    # no nn.Dropout for check_model to see: loss_closure's own probe refuses it when built
    with pytest.raises(ValueError, match=r"not a fixed function of its parameters.*F\.dropout"):
        loss_closure(model, nn.CrossEntropyLoss(), (x, y))
    own = {name: p.detach() for name, p in model.named_parameters()}

    def closure(params):  # the same random loss written by hand: refused by the closure form
        return nn.functional.cross_entropy(torch.func.functional_call(model, params, (x,)), y)

    with pytest.raises(ValueError, match=r"loss_fn is not a fixed function of params.*F\.dropout"):
        cv.HessianOperator.from_closure(closure, own)
    noisy_data = {"w": torch.ones(3, **F64)}
    with pytest.raises(ValueError, match="loss_fn is not a fixed function"):
        cv.HessianOperator.from_closure(lambda p: (p["w"] * torch.randn(3, **F64)).sum() ** 2, noisy_data)


def test_random_augmentation_inside_forward_is_refused_by_name():
    class Jitter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(3, 2, **F64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x + 0.1 * torch.randn_like(x))

    x, y = torch.randn(5, 3, **F64), torch.randn(5, 2, **F64)
    with pytest.raises(ValueError, match="model is not a fixed function.*random augmentation in the data"):
        cv.ggn_operator(Jitter().eval(), nn.MSELoss(), (x, y))


def test_batch_norm_without_running_statistics_is_refused_in_eval_mode():
    torch.manual_seed(8)
    model = nn.Sequential(
        nn.Linear(3, 4, **F64), nn.BatchNorm1d(4, track_running_stats=False, **F64), nn.Tanh(), nn.Linear(4, 2, **F64)
    ).eval()
    x, y = torch.randn(8, 3, **F64), torch.randint(0, 2, (8,))
    before = _state(model)
    # the defect: in eval mode it still uses batch statistics, so the batching changes the risk
    with torch.no_grad():
        whole = nn.functional.cross_entropy(model(x), y)
        halves = (
            nn.functional.cross_entropy(model(x[:4]), y[:4]) + nn.functional.cross_entropy(model(x[4:]), y[4:])
        ) / 2
    assert abs(float(whole - halves)) > 1e-3
    expected = r"batch norm without running statistics \(track_running_stats=False\).*submodule '1' \(BatchNorm1d\)"
    for make in (cv.hessian_operator, cv.ggn_operator, cv.lambda_max):
        with pytest.raises(ValueError, match=expected):
            make(model, nn.CrossEntropyLoss(), (x, y))
    with pytest.raises(ValueError, match=expected):
        loss_closure(model, nn.CrossEntropyLoss(), (x, y))
    _assert_unchanged(model, before)
    # with running statistics, eval mode is a fixed function of each example
    tracked = nn.Sequential(nn.Linear(3, 4, **F64), nn.BatchNorm1d(4, **F64), nn.Tanh(), nn.Linear(4, 2, **F64)).eval()
    ref = _dense_references(tracked, x, y)
    _assert_matches(cv.hessian_operator(tracked, nn.CrossEntropyLoss(), (x, y)).dense(), ref["hessian"])


def test_the_probe_is_bit_for_bit_on_the_cpu_and_to_rounding_elsewhere():
    from lossgeom.risk import _agree

    a = torch.tensor([1.0, -2.0, 3.0], **F64)
    rounding = a + torch.tensor([0.0, 0.0, 4 * torch.finfo(torch.float64).eps], **F64)
    assert _agree(a, a.clone(), exact=True) and not _agree(a, rounding, exact=True)
    assert _agree(a, rounding, exact=False)  # an accelerator's atomic additions may reorder sums
    assert not _agree(a, a + torch.tensor([0.0, 1e-9, 0.0], **F64), exact=False)

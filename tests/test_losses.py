"""The loss module is the definition: options, subclasses, likelihoods and batch forms, against dense references.

Every reference here is independent of the operators: the loss is torch's own loss module on
all the data concatenated into one batch, differentiated twice by
``torch.autograd.functional.hessian`` (or per example, for the empirical Fisher). The models
are ones the rest of the suite does not use (a bilinear scorer, a keyword-input module, an
embedding bag classifier).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Subset, TensorDataset

import lossgeom.curvature as cv
from lossgeom.batches import DataSource
from lossgeom.losses import CausalLMLoss, likelihood, term_counts
from lossgeom.risk import EmpiricalRisk

from conftest import assert_close

N, D, C = 11, 4, 3


class Bilinear(nn.Module):
    """``scores = (x W1) * (x W2)`` then a linear read-out: a model the suite did not use."""

    def __init__(self, classes: int = C) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(D, 5), nn.Linear(D, 5)
        self.out = nn.Linear(5, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.a(x)) * self.b(x))


class KeywordModel(nn.Module):
    """Called as ``model(features=..., scale=...)``, returning a dict with ``logits``."""

    def __init__(self) -> None:
        super().__init__()
        self.body = Bilinear()

    def forward(self, features: torch.Tensor, scale: torch.Tensor) -> dict:
        return {"logits": self.body(features) * scale[:, None], "aux": features.sum()}


def _data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, generator=g, dtype=torch.float64)
    y = torch.randint(0, C, (N,), generator=g)
    return x, y


def _model(seed: int = 0, classes: int = C) -> nn.Module:
    torch.manual_seed(seed)
    return Bilinear(classes).double()


def _dense(model: nn.Module, loss: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The Hessian of ``loss(model(x), y)`` on one batch by ``torch.autograd.functional.hessian``."""
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def f(v: torch.Tensor) -> torch.Tensor:
        parts, i = {}, 0
        for name, shape in zip(names, shapes, strict=True):
            parts[name] = v[i : i + shape.numel()].reshape(shape)
            i += shape.numel()
        return loss(torch.func.functional_call(model, parts, (x,)), y)

    return torch.autograd.functional.hessian(f, flat)


def _state(model: nn.Module) -> list[torch.Tensor]:
    return [t.detach().clone() for t in (*model.parameters(), *model.buffers())]


def _split(x: torch.Tensor, y: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x[:3], y[:3]), (x[3:4], y[3:4]), (x[4:], y[4:])]


@pytest.mark.parametrize(
    "loss",
    [
        nn.CrossEntropyLoss(ignore_index=1),
        nn.CrossEntropyLoss(weight=torch.tensor([0.5, 2.0, 1.25], dtype=torch.float64)),
        nn.CrossEntropyLoss(weight=torch.tensor([0.5, 2.0, 1.25], dtype=torch.float64), ignore_index=0),
        nn.CrossEntropyLoss(label_smoothing=0.2),
        nn.CrossEntropyLoss(reduction="sum", ignore_index=2),
        nn.NLLLoss(ignore_index=1),
    ],
    ids=["ignore", "weight", "weight+ignore", "smoothing", "sum+ignore", "nll"],
)
def test_every_option_of_the_loss_module_is_exact_over_uneven_batches(loss):
    model, (x, y) = _model(1), _data(1)
    if isinstance(loss, nn.NLLLoss):
        model = nn.Sequential(model, nn.LogSoftmax(dim=1))
    before = _state(model)
    reference = _dense(model, loss, x, y)  # torch's own loss on one big batch
    for data in ((x, y), _split(x, y)):
        assert_close(torch.as_tensor(cv.hessian_operator(model, loss, data).dense()), reference, rtol=1e-10, atol=1e-13)
        assert_close(cv.dense_hessian(model, loss, data), reference, rtol=1e-10, atol=1e-13)
        assert_close(float(EmpiricalRisk(model, loss, data).value()), float(loss(model(x), y)), rtol=1e-13, atol=0)
    assert all(torch.equal(a, b) for a, b in zip(before, _state(model), strict=True))


def test_ignored_targets_give_the_curvature_of_the_kept_examples_for_every_matrix():
    model, (x, y) = _model(2), _data(2)
    ignoring, plain = nn.CrossEntropyLoss(ignore_index=0), nn.CrossEntropyLoss()
    kept = y != 0
    assert 0 < int(kept.sum()) < N
    for build in (cv.ggn_operator, cv.hessian_operator):
        assert_close(
            torch.as_tensor(build(model, ignoring, _split(x, y)).dense()),
            torch.as_tensor(build(model, plain, (x[kept], y[kept])).dense()),
            rtol=1e-10,
            atol=1e-14,
        )
    for kind in ("empirical", "true"):
        ours = cv.fisher_operator(model, ignoring, _split(x, y), kind=kind).dense()
        assert_close(
            torch.as_tensor(ours), cv.dense_fisher(model, plain, (x[kept], y[kept]), kind=kind), rtol=1e-10, atol=1e-14
        )


def test_a_subclass_of_a_loss_module_is_called_not_reimplemented():
    class Doubled(nn.CrossEntropyLoss):
        def forward(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(out, y)

    class Cubed(nn.MSELoss):  # a loss whose output Hessian is not 2 I
        def forward(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return ((out - y) ** 4).mean()

    model, (x, y) = _model(3), _data(3)
    doubled = cv.hessian_operator(model, Doubled(), _split(x, y)).dense()
    assert_close(torch.as_tensor(doubled), 2 * _dense(model, nn.CrossEntropyLoss(), x, y), rtol=1e-10, atol=1e-13)
    targets = torch.randn(N, C, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    ggn = cv.ggn_operator(model, Cubed(), (x, targets)).dense()
    out = model(x).detach()
    lam = torch.autograd.functional.hessian(lambda o: Cubed()(o.reshape(out.shape), targets), out.reshape(-1))
    jac = torch.autograd.functional.jacobian(
        lambda v: torch.func.functional_call(model, _unflatten(model, v), (x,)).reshape(-1), _flat(model)
    )
    assert_close(torch.as_tensor(ggn), jac.T @ lam @ jac, rtol=1e-10, atol=1e-13)
    with pytest.raises(ValueError, match="Doubled overrides the forward of CrossEntropyLoss"):
        cv.fisher_operator(model, Doubled(), (x, y), kind="true")


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _unflatten(model: nn.Module, v: torch.Tensor) -> dict:
    parts, i = {}, 0
    for name, p in model.named_parameters():
        parts[name] = v[i : i + p.numel()].reshape(p.shape)
        i += p.numel()
    return parts


def test_likelihoods_the_library_knows_and_the_ones_it_refuses_by_name():
    model, (x, y) = _model(5, classes=2), _data(5)
    bits = torch.rand(N, 2, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    bce = nn.BCEWithLogitsLoss()
    assert likelihood(bce, "x") == "canonical"
    # the Bernoulli Fisher on logits is sigma (1 - sigma): the GGN's
    assert_close(
        torch.as_tensor(cv.fisher_operator(model, bce, (x, bits), kind="true").dense()),
        torch.as_tensor(cv.ggn_operator(model, bce, (x, bits)).dense()),
        rtol=1e-12,
        atol=1e-15,
    )
    # NLL on log-probabilities: the categorical Fisher, equal to the cross-entropy's on the logits
    logits = _model(7)
    log_probs = nn.Sequential(logits, nn.LogSoftmax(dim=1))
    y3 = y.clamp(max=C - 1)
    assert_close(
        torch.as_tensor(cv.fisher_operator(log_probs, nn.NLLLoss(), (x, y3), kind="true").dense()),
        torch.as_tensor(cv.fisher_operator(logits, nn.CrossEntropyLoss(), (x, y3), kind="true").dense()),
        rtol=1e-10,
        atol=1e-14,
    )
    with pytest.raises(ValueError, match="log-probabilities"):
        cv.fisher_operator(logits, nn.NLLLoss(), (x, y3), kind="true")  # raw scores are not log-probabilities
    for loss, option in (
        (nn.BCEWithLogitsLoss(pos_weight=torch.ones(2, dtype=torch.float64)), "pos_weight"),
        (nn.CrossEntropyLoss(label_smoothing=0.1), "label_smoothing"),
    ):
        target = bits if isinstance(loss, nn.BCEWithLogitsLoss) else y.clamp(max=1)
        with pytest.raises(ValueError, match=f"{option}=...\\) is not a negative log-likelihood"):
            cv.fisher_operator(model, loss, (x, target), kind="true")
    with pytest.raises(ValueError, match="the loss HuberLoss is not one the library knows"):
        cv.fisher_operator(model, nn.HuberLoss(), (x, bits), kind="true")


def test_a_loss_the_library_does_not_know_is_weighted_only_where_no_weighting_is_needed():
    class Custom(nn.Module):  # no family, no reduction attribute
        def forward(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return (out.logsumexp(dim=1) - out.gather(1, y[:, None])[:, 0]).mean()

    model, (x, y) = _model(8), _data(8)
    one = cv.hessian_operator(model, Custom(), (x, y)).dense()
    assert_close(torch.as_tensor(one), _dense(model, nn.CrossEntropyLoss(), x, y), rtol=1e-10, atol=1e-13)
    with pytest.raises(ValueError, match="term_counts\\(out, y\\)"):
        cv.hessian_operator(model, Custom(), _split(x, y))
    with pytest.raises(ValueError, match="needs each example's share of the loss"):
        cv.fisher_operator(model, Custom(), (x, y))

    class Counted(Custom):
        def term_counts(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.ones(out.shape[0], dtype=torch.float64)

    split = cv.hessian_operator(model, Counted(), _split(x, y)).dense()
    assert_close(torch.as_tensor(split), torch.as_tensor(one), rtol=1e-10, atol=1e-13)


def test_dict_batches_keyword_inputs_and_selected_outputs():
    torch.manual_seed(9)
    model = KeywordModel().double()
    x, y = _data(9)
    scale = torch.linspace(0.5, 1.5, N, dtype=torch.float64)
    ce = nn.CrossEntropyLoss()
    whole = cv.hessian_operator(model, ce, {"features": x, "scale": scale, "labels": y}).dense()
    pairs = [({"features": x[:4], "scale": scale[:4]}, y[:4]), ({"features": x[4:], "scale": scale[4:]}, y[4:])]
    dicts = [{"features": f["features"], "scale": f["scale"], "labels": t} for f, t in pairs]
    for data in (pairs, dicts):
        assert_close(
            torch.as_tensor(cv.hessian_operator(model, ce, data).dense()),
            torch.as_tensor(whole),
            rtol=1e-10,
            atol=1e-14,
        )
    ggn = cv.ggn_operator(model, ce, dicts).dense()
    fisher = cv.fisher_operator(model, ce, dicts, kind="true").dense()
    assert_close(torch.as_tensor(ggn), torch.as_tensor(fisher), rtol=1e-12, atol=1e-15)
    with pytest.raises(TypeError, match="without the targets under 'labels'"):
        cv.hessian_operator(model, ce, {"features": x, "scale": scale, "target": y})
    with pytest.raises(TypeError, match="output must select one tensor"):
        EmpiricalRisk(model, ce, dicts, output=lambda out: out["aux"].item())


def test_streamed_data_are_read_afresh_and_never_kept():
    model, (x, y) = _model(10), _data(10)
    ce = nn.CrossEntropyLoss()
    dataset = Subset(TensorDataset(x, y), [9, 2, 7, 0, 4, 1, 10, 3])  # a non-contiguous dataset
    loader = DataLoader(dataset, batch_size=3, shuffle=False)
    held = [(x[idx], y[idx]) for idx in (torch.tensor([9, 2, 7]), torch.tensor([0, 4, 1]), torch.tensor([10, 3]))]
    streamed = cv.hessian_operator(model, ce, loader)
    assert_close(
        torch.as_tensor(streamed.dense()),
        torch.as_tensor(cv.hessian_operator(model, ce, held).dense()),
        rtol=1e-12,
        atol=1e-15,
    )
    risk = EmpiricalRisk(model, ce, loader)
    assert risk.source.streamed and not risk._held and risk.n_batches == 3
    for build in (cv.ggn_operator, cv.fisher_operator):
        assert_close(
            torch.as_tensor(build(model, ce, loader).dense()),
            torch.as_tensor(build(model, ce, held).dense()),
            rtol=1e-12,
            atol=1e-15,
        )
    with pytest.raises(TypeError, match="one-shot iterator"):
        cv.hessian_operator(model, ce, (batch for batch in held))
    shuffled = DataLoader(dataset, batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="different first batch when read again"):
        cv.hessian_operator(model, ce, shuffled)


def test_batches_move_to_the_parameters_device_and_keep_their_form():
    x, y = _data(11)
    cpu = torch.device("cpu")
    (batch,) = list(DataSource([({"features": x, "scale": y.double()}, y)], cpu))
    assert batch.args == () and set(batch.kwargs) == {"features", "scale"} and batch.n_examples == N
    assert all(t.device == cpu for _, t in batch.tensors()) and batch.y.device == cpu


def test_term_counts_follow_torch_for_every_family():
    g = torch.Generator().manual_seed(12)
    out = torch.randn(4, 3, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (4, 5), generator=g)
    y[0] = -100
    counts = term_counts(nn.CrossEntropyLoss(), out, y)
    assert counts.tolist() == [0.0, 5.0, 5.0, 5.0]
    weight = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    weighted = term_counts(nn.CrossEntropyLoss(weight=weight), out, y)
    summed = nn.CrossEntropyLoss(weight=weight, reduction="sum")(out, y)
    assert_close(summed / weighted.sum(), nn.CrossEntropyLoss(weight=weight)(out, y), rtol=1e-14, atol=0)
    assert term_counts(nn.MSELoss(), out, out).tolist() == [15.0] * 4
    assert term_counts(nn.KLDivLoss(reduction="batchmean"), out, out).tolist() == [1.0] * 4
    with pytest.raises(ValueError, match="it would broadcast"):
        term_counts(nn.MSELoss(), out, out[:, :1])
    logits, labels = torch.zeros(2, 4, 3, dtype=torch.float64), torch.tensor([[1, 2, -100, 0], [5, 1, 1, 1]])
    assert CausalLMLoss().term_counts(logits, labels.clamp(max=2)).tolist() == [2.0, 3.0]


def test_curvature_entry_points_read_a_selected_output_or_refuse_naming_output():
    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = _model(13)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = self.body(x)
            return out, out.detach() * 0

    model, (x, y) = Pair(), _data(13)
    ce = nn.CrossEntropyLoss()
    reference = cv.dense_hessian(model.body, ce, (x, y))
    first = {"output": lambda out: out[0]}
    assert_close(
        torch.as_tensor(cv.hessian_operator(model, ce, (x, y), **first).dense()), reference, rtol=1e-12, atol=0
    )
    assert_close(cv.dense_hessian(model, ce, (x, y), **first), reference, rtol=0, atol=0)
    assert_close(
        torch.as_tensor(cv.ggn_operator(model, ce, (x, y), **first).dense()),
        cv.dense_ggn(model.body, ce, (x, y)),
        rtol=1e-12,
        atol=1e-15,
    )
    assert cv.lambda_max(model, ce, (x, y), **first) == pytest.approx(
        float(torch.linalg.eigvalsh(reference)[-1]), rel=1e-8
    )
    for entry in (cv.hessian_operator, cv.ggn_operator, cv.fisher_operator, cv.dense_hessian, cv.lambda_max):
        with pytest.raises(TypeError, match="pass output="):
            entry(model, ce, (x, y))


def test_the_dense_hessian_of_a_group_norm_model_is_taken_column_by_column_where_batching_fails():
    torch.manual_seed(14)
    model = nn.Sequential(nn.Linear(D, 6), nn.GroupNorm(2, 6), nn.Tanh(), nn.Linear(6, C)).double()
    x, y = _data(14)
    ce = nn.CrossEntropyLoss()
    assert_close(cv.dense_hessian(model, ce, _split(x, y)), _dense(model, ce, x, y), rtol=1e-10, atol=1e-13)

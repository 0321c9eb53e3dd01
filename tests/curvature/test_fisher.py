"""Tests of the Fisher factors: dense_fisher_factor (F = S^T S, cross-entropy) and fisher_scores."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from lossgeom.curvature.fisher import FisherOperator, fisher_scores
from lossgeom.curvature.references import dense_fisher, dense_fisher_factor, dense_ggn
from lossgeom.risk import EmpiricalRisk

from conftest import assert_close


def _classifier(hidden: int | None, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    if hidden is None:
        return nn.Linear(3, 4).double()
    return nn.Sequential(nn.Linear(3, hidden), nn.Tanh(), nn.Linear(hidden, 4)).double()


def test_factor_reproduces_the_true_fisher_and_the_ggn():
    model = _classifier(5)
    x = torch.randn(9, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 4, (9,), generator=torch.Generator().manual_seed(2))
    S = dense_fisher_factor(model, nn.CrossEntropyLoss(), (x, y))
    assert S.shape == (9 * 4, sum(p.numel() for p in model.parameters()))
    ggn = dense_ggn(model, nn.CrossEntropyLoss(), (x, y))
    fisher = dense_fisher(model, nn.CrossEntropyLoss(), (x, y), kind="true")
    scale = float(ggn.abs().max())
    assert_close(S.T @ S, ggn, rtol=0, atol=1e-13 * scale)
    assert_close(S.T @ S, fisher, rtol=0, atol=1e-13 * scale)


def test_singular_values_resolve_exact_zeros_below_the_eigensolver_floor():
    # a linear softmax classifier on inputs spanning R^(d+1) has exactly d + 1 = 4 null
    # directions (the common shifts of the rows and of the bias)
    model = _classifier(None)
    x = torch.randn(40, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    y = torch.randint(0, 4, (40,), generator=torch.Generator().manual_seed(4))
    S = dense_fisher_factor(model, nn.CrossEntropyLoss(), (x, y)).numpy()
    sigma = np.linalg.svd(S, compute_uv=False)
    from_factor = np.sort((sigma / sigma[0]) ** 2)
    eigs = np.linalg.eigvalsh(S.T @ S)
    assert_close(from_factor[::-1][:8], eigs[::-1][:8] / eigs[-1], rtol=1e-10, atol=0)
    assert np.all(from_factor[:4] < 1e-28) and from_factor[4] > 1e-6


def test_factor_refuses_other_losses():
    model = _classifier(5)
    x, y = torch.zeros(2, 3, dtype=torch.float64), torch.zeros(2, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="the loss L1Loss is not one the library knows"):
        dense_fisher_factor(model, nn.L1Loss(), (x, y))
    with pytest.raises(ValueError, match=r"CrossEntropyLoss\(weight=...\) is not a negative log-likelihood"):
        dense_fisher_factor(model, nn.CrossEntropyLoss(weight=torch.ones(4, dtype=torch.float64)), (x, y.argmax(1)))


def test_fisher_scores_are_a_factor_of_the_empirical_fisher():
    model = _classifier(4)
    x = torch.randn(9, 3, generator=torch.Generator().manual_seed(3))
    y = torch.randint(0, 3, (9,), generator=torch.Generator().manual_seed(4))
    risk = EmpiricalRisk(model, nn.CrossEntropyLoss(), (x, y))
    scores = fisher_scores(risk, "empirical")
    assert scores.shape == (9, risk.n)
    assert_close(scores.T @ scores, dense_fisher(model, nn.CrossEntropyLoss(), (x, y)), rtol=1e-11, atol=1e-14)


def test_the_fisher_operators_are_matrix_free_and_agree_with_their_score_factor():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(5, 7, dtype=torch.float64), torch.nn.Tanh(), torch.nn.Linear(7, 4, dtype=torch.float64)
    )
    x, y = torch.randn(30, 5, dtype=torch.float64), torch.randint(0, 4, (30,))
    loss = torch.nn.CrossEntropyLoss()
    risk = EmpiricalRisk(model, loss, [(x[:13], y[:13]), (x[13:], y[13:])])
    for kind in ("empirical", "true"):
        operator = FisherOperator.from_risk(risk, kind=kind)
        stored = [v for v in vars(operator).values() if isinstance(v, torch.Tensor)]
        assert all(t.numel() <= risk.n for t in stored), "a product must not need a stored score matrix"
        scores = fisher_scores(risk, kind)
        v = torch.randn(risk.n, 3, dtype=torch.float64)
        assert torch.allclose(operator @ v, scores.T @ (scores @ v), rtol=1e-12, atol=1e-14)
        assert operator.n_hvp == 3

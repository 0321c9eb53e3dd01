"""Every entry point on the models researchers train, against independent dense references.

For each architecture (batch norm and dropout in eval mode, a residual block, tied weights,
a frozen layer, an embedding model, a transformer encoder layer, a convolution) and each
loss, the module-form entry points either match a dense float64 reference built here from
``torch.autograd.functional`` alone (to 1e-10) or, for models they cannot serve (tuple
outputs, layers left in training mode), raise a clear error; and the model's parameters
and buffers are bit-identical afterwards.
"""

from __future__ import annotations

import pytest
import torch
from architecture_cases import ARCHITECTURES, F64, LOSSES, Pair, inputs_for, reference_hessian, state_of, targets_for
from torch import nn

from lossgeom import curvature
from lossgeom.models import loss_closure


@pytest.mark.parametrize("loss_name", list(LOSSES))
@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_every_entry_point_matches_an_independent_reference_and_leaves_the_model_unchanged(name, loss_name):
    make, kind = ARCHITECTURES[name]
    torch.manual_seed(0)
    model, loss = make(), LOSSES[loss_name]()
    gen = torch.Generator().manual_seed(1)
    x, y = inputs_for(kind, 9, gen), targets_for(loss, 9, gen)
    before = state_of(model)
    reference = reference_hessian(model, loss, x, y)
    scale = float(reference.abs().max())
    dense = curvature.dense_hessian(model, loss, (x, y))
    assert torch.allclose(dense, reference, rtol=0, atol=1e-10 * scale)
    operator = curvature.hessian_operator(model, loss, [(x[:4], y[:4]), (x[4:], y[4:])])  # unequal batches
    v = torch.randn(reference.shape[0], 2, generator=gen, **F64)
    assert torch.allclose(operator @ v, reference @ v, rtol=0, atol=1e-10 * scale * float(v.abs().max()))
    expected = float(torch.linalg.eigvalsh(reference)[-1])
    assert curvature.lambda_max(model, loss, (x, y), tol=1e-12) == pytest.approx(expected, rel=1e-9, abs=1e-10 * scale)
    closure = loss_closure(model, loss, (x, y))
    trainable = {k: p.detach() for k, p in model.named_parameters() if p.requires_grad}
    assert torch.allclose(curvature.closure_hessian(closure, trainable), reference, rtol=0, atol=1e-10 * scale)
    after = state_of(model)
    assert all(torch.equal(before[k], after[k]) for k in before), "parameters or buffers changed"


def test_models_the_entry_points_cannot_serve_are_refused_by_each():
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randn(6, 4, generator=gen, **F64), torch.randint(0, 3, (6,), generator=gen)
    loss = nn.CrossEntropyLoss()
    training = nn.Sequential(nn.Linear(4, 5, **F64), nn.Dropout(0.3), nn.Linear(5, 3, **F64))  # train mode
    for entry in (curvature.dense_hessian, curvature.hessian_operator, curvature.lambda_max, loss_closure):
        with pytest.raises(ValueError, match=r"dropout \(p = 0.3\) in training mode"):
            entry(training, loss, (x, y))
        with pytest.raises(TypeError, match="returns a tuple"):
            result = entry(Pair(), loss, (x, y))
            result(dict(Pair().named_parameters())) if callable(result) else result.dense()
        with pytest.raises(TypeError, match="loss must be"):
            entry(Pair(), "cross_entropy", (x, y))

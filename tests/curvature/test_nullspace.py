"""Tests of the zero-eigenvalue tools of lossgeom.curvature.nullspace.

Each predicted null direction is recomputed another way: the rescaling tangents as the
derivative of the finite transform in lossgeom.symmetries, the data-blind directions as
the kernel of the centred output Jacobian from autograd, the Hessian identities against
a dense autograd Hessian.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from small_models import mlp
from torch import nn

from lossgeom import curvature as cv
from lossgeom.models import loss_closure
from lossgeom.parameters import flatten_params, params_of
from lossgeom.symmetries import relu_neuron_rescaling
from lossgeom.training import indexed_loss, sgd, train

from book_extra import from_book
from conftest import assert_close

digits = from_book("lossgeom_book.data", "digits")

# torch.func registers its forward-mode decompositions with torch.jit.script on first
# use and warns that jit is deprecated; the warning is about torch, not about lossgeom.
pytestmark = pytest.mark.filterwarnings("ignore:.*torch.jit.script.*:DeprecationWarning")

NETWORK_CASES = [
    {"id": "digits-relu-8", "n": 60, "width": 8, "seed": 0, "steps": 30},
    {"id": "digits-relu-5", "n": 40, "width": 5, "seed": 3, "steps": 0},
]


def _network(case):
    split = digits(case["n"], 10, seed=case["seed"])
    x = split.x_train
    model = mlp([x.shape[1], case["width"], 10], activation="relu", seed=case["seed"])
    params = params_of(model)
    if case["steps"]:
        params = train(
            indexed_loss(model, nn.CrossEntropyLoss(), (x, split.y_train)), params, sgd(0.5), case["steps"]
        ).params
    return model, params, x, split.y_train


@pytest.fixture(params=NETWORK_CASES, ids=[c["id"] for c in NETWORK_CASES])
def network(request):
    return _network(request.param)


# --- tangents of the symmetries ---------------------------------------------------------


def test_rescaling_tangents_are_the_derivative_of_the_finite_rescaling(network):
    _, params, _, _ = network
    width = params["0.weight"].shape[0]
    tangents = cv.nullspace.relu_rescaling_tangents(params, "0", "2")
    assert tangents.shape == (sum(p.numel() for p in params.values()), width)
    for j in range(width):

        def moved(c, j=j):
            scales = torch.ones(width) + (c - 1) * torch.eye(width)[j]
            return flatten_params(relu_neuron_rescaling("0", "2", scales)(params))[0]

        derivative = torch.func.jvp(moved, (torch.tensor(1.0),), (torch.tensor(1.0),))[1]
        assert_close(tangents[:, j], derivative, rtol=1e-14, atol=1e-15)


def test_generators_times_parameters_are_the_tangents(network):
    _, params, _, _ = network
    generators = cv.nullspace.relu_rescaling_generators(params, "0", "2")
    flat = flatten_params(params)[0].numpy()
    assert set(np.unique(generators)) <= {-1.0, 0.0, 1.0}
    assert_close(generators * flat[:, None], cv.nullspace.relu_rescaling_tangents(params, "0", "2"), rtol=0, atol=0)


def test_gradient_is_orthogonal_and_hessian_identity_holds(network):
    model, params, x, y = network
    loss_fn = loss_closure(model, nn.CrossEntropyLoss(), (x, y))
    gradient = cv.closure_gradient(loss_fn, params).numpy()
    hessian = cv.closure_hessian(loss_fn, params).numpy()
    rescale = cv.nullspace.relu_rescaling_tangents(params, "0", "2")
    shift = cv.nullspace.softmax_shift_tangents(params, "0", "2")
    assert np.abs(gradient @ np.hstack([rescale, shift])).max() <= 1e-13 * np.linalg.norm(gradient)
    # translations: null everywhere; scalings: H t = -A grad L
    assert np.abs(hessian @ shift).max() <= 1e-13 * np.abs(hessian).max()
    generators = cv.nullspace.relu_rescaling_generators(params, "0", "2")
    assert_close(
        hessian @ rescale, -generators * gradient[:, None], rtol=0, atol=1e-12 * np.abs(hessian @ rescale).max()
    )


def test_shift_tangents_leave_the_loss_unchanged_along_a_finite_shift(network):
    model, params, x, y = network
    loss_fn = loss_closure(model, nn.CrossEntropyLoss(), (x, y))
    flat, unflatten = flatten_params(params)
    shift = cv.nullspace.softmax_shift_tangents(params, "0", "2")
    assert shift.shape[1] == params["0.weight"].shape[0] + 1
    coefficients = np.random.default_rng(0).standard_normal(shift.shape[1]) * 3.0
    moved = unflatten(flat + torch.from_numpy(shift @ coefficients))
    assert abs(float(loss_fn(moved) - loss_fn(params))) <= 1e-12


# --- data-blind directions --------------------------------------------------------------


def _centred_output_jacobian(model, params, x):
    flat, unflatten = flatten_params(params)
    jac = torch.func.jacrev(lambda v: torch.func.functional_call(model, unflatten(v), (x,)))(flat)
    jac = jac.reshape(x.shape[0], -1, flat.numel()).numpy()
    return jac - jac.mean(axis=1, keepdims=True)  # (N, K, n), all-ones component removed


def test_data_blind_directions_are_the_first_layer_kernel_of_the_centred_jacobian(network):
    model, params, x, _ = network
    blind = cv.data_blind_directions(params, x, "0", "2")
    first_layer = params["0.weight"].numel() + params["0.bias"].numel()
    assert blind.shape[1] > 0  # digits have pixels no image uses: the checks below are not vacuous
    assert_close(blind.T @ blind, np.eye(blind.shape[1]), rtol=0, atol=1e-12)
    assert np.all(blind[first_layer:] == 0)
    centred = _centred_output_jacobian(model, params, x).reshape(-1, blind.shape[0])
    assert np.abs(centred @ blind).max() <= 1e-12 * np.abs(centred).max()
    # the dimension: kernel of the centred Jacobian restricted to the first layer
    sing = np.linalg.svd(centred[:, :first_layer], compute_uv=False)
    expected = first_layer - int(np.sum(sing > 1e-10 * sing[0]))
    assert blind.shape[1] == expected


def test_single_unit_directions_change_no_logit_and_lie_in_the_full_set(network):
    model, params, x, _ = network
    within = cv.data_blind_directions(params, x, "0", "2", within_units=True)
    blind = cv.data_blind_directions(params, x, "0", "2")
    flat, unflatten = flatten_params(params)
    assert within.shape[1] > 0  # a unit sees fewer examples than its 65 inputs: a kernel exists
    for column in within.T:
        _, jv = torch.func.jvp(
            lambda v: torch.func.functional_call(model, unflatten(v), (x,)), (flat,), (torch.from_numpy(column),)
        )
        assert float(jv.abs().max()) <= 1e-12
    projection = blind @ (blind.T @ within)
    assert_close(projection, within, rtol=0, atol=1e-10)


def test_a_pixel_seen_by_one_image_gives_blind_directions():
    # 3 images, one pixel used only by the first: 6 units x 1 pixel map into the 9 centred
    # logit directions of one image, but through only 6 columns, so the pixel alone gives
    # none; a width larger than K - 1 = 9 must give at least width - 9 of them.
    torch.manual_seed(0)
    x = torch.rand(3, 4)
    x[1:, 3] = 0.0
    model = mlp([4, 12, 10], seed=2)
    params = params_of(model)
    params["0.bias"] = params["0.bias"].abs() + 5.0  # every unit active on every image
    blind = cv.data_blind_directions(params, x, "0", "2")
    assert blind.shape[1] >= 12 - 9
    hessian = cv.dense_hessian(model, nn.CrossEntropyLoss(), (x, torch.tensor([0, 1, 2])), params=params).numpy()
    # the GGN sees them as zeros; the Hessian generally does not (non-zero residuals)
    ggn = cv.dense_ggn(model, nn.CrossEntropyLoss(), (x, torch.tensor([0, 1, 2])), params=params).numpy()
    assert np.abs(ggn @ blind).max() <= 1e-12 * np.abs(ggn).max()
    assert np.abs(hessian @ blind).max() >= 1e-8 * np.abs(hessian).max()


def test_at_zero_residual_the_hessian_annihilates_every_predicted_direction(network):
    model, params, x, _ = network
    with torch.no_grad():
        own = torch.softmax(torch.func.functional_call(model, params, (x,)), dim=1)
    loss_fn = loss_closure(model, nn.CrossEntropyLoss(), (x, own))
    assert float(cv.closure_gradient(loss_fn, params).norm()) <= 1e-14
    hessian = cv.closure_hessian(loss_fn, params).numpy()
    predicted = np.hstack(
        [
            cv.nullspace.relu_rescaling_tangents(params, "0", "2"),
            cv.nullspace.softmax_shift_tangents(params, "0", "2"),
            cv.data_blind_directions(params, x, "0", "2"),
        ]
    )
    basis = np.linalg.qr(predicted)[0]
    assert np.abs(hessian @ basis).max() <= 1e-12 * np.abs(hessian).max()
    counts = cv.count_near_zero(np.linalg.eigvalsh(hessian), [1e-13])
    assert counts[0] >= np.linalg.matrix_rank(predicted)


# --- counting ---------------------------------------------------------------------------


def test_count_near_zero_and_relative_magnitudes():
    eigenvalues = np.array([-2.0, 1e-18, -1e-15, 3e-10, 1.0, 0.5])
    assert_close(
        cv.nullspace.relative_magnitudes(eigenvalues), [5e-19, 5e-16, 1.5e-10, 0.25, 0.5, 1.0], rtol=1e-15, atol=0
    )
    counts = cv.count_near_zero(eigenvalues, [1e-18, 5e-16, 1e-12, 0.3, 1.0])
    assert counts.tolist() == [1, 2, 2, 4, 6]


def test_counting_errors():
    with pytest.raises(ValueError, match="rel_thresholds must be > 0"):
        cv.count_near_zero([1.0, 2.0], [0.0])
    with pytest.raises(ValueError, match="not all zero"):
        cv.nullspace.relative_magnitudes([0.0, 0.0])
    with pytest.raises(ValueError, match="eigenvalues must have 1 dimension"):
        cv.count_near_zero(np.eye(2), [1e-3])


def test_tangent_errors():
    model = mlp([4, 3, 2], seed=0)
    params = params_of(model)
    with pytest.raises(ValueError, match="missing"):
        cv.nullspace.relu_rescaling_tangents(params, "1", "2")
    bad = dict(params)
    bad["2.weight"] = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="inconsistent shapes"):
        cv.nullspace.softmax_shift_tangents(bad, "0", "2")
    with pytest.raises(TypeError, match="non-empty dict"):
        cv.nullspace.relu_rescaling_generators({}, "0", "2")
    with pytest.raises(ValueError, match=r"x must have shape \(N, 4\)"):
        cv.data_blind_directions(params, torch.zeros(5, 3), "0", "2")
    with pytest.raises(ValueError, match="tol must be > 0"):
        cv.data_blind_directions(params, torch.zeros(5, 4), "0", "2", tol=0.0)

"""The module-first measures of lossgeom.flatness (the atlas rows), each recomputed another way."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from lossgeom import curvature, flatness, symmetries
from lossgeom.flatness import LossPoint
from lossgeom.flatness.loss_point import NotApplicable

F64 = dict(dtype=torch.float64)


def classifier(bias_last: bool = True, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 5, **F64), nn.ReLU(), nn.Linear(5, 4, bias=bias_last, **F64))


def classification_data(n: int = 24, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, generator=gen, **F64), torch.randint(0, 4, (n,), generator=gen)


@pytest.fixture
def point() -> LossPoint:
    return LossPoint(classifier(), nn.CrossEntropyLoss(), classification_data())


def regression():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(3, 4, bias=False, **F64), nn.ReLU(), nn.Linear(4, 1, bias=False, **F64))
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(15, 3, generator=gen, **F64)
    return model, x, torch.randn(15, 1, generator=gen, **F64)


def reference_hessian(point: LossPoint) -> np.ndarray:
    """The dense Hessian by torch.func.hessian (curvature.closure_hessian), independent of LossPoint.hessian."""
    return curvature.closure_hessian(point.loss_fn, point.params).numpy()


def test_dense_hessian_and_fisher_match_the_curvature_references(point):
    H = reference_hessian(point)
    assert np.abs(point.hessian() - H).max() <= 1e-10 * np.abs(H).max()
    x, y = point.data
    F = curvature.dense_fisher(point.model, nn.CrossEntropyLoss(), (x, y), params=point.params, kind="true").numpy()
    assert np.abs(point.fisher() - F).max() <= 1e-10 * np.abs(F).max()


def test_fisher_of_the_square_loss_is_the_gaussian_one_by_hand():
    model, x, y = regression()
    point = LossPoint(model, nn.MSELoss(), (x, y))
    flat = point.flat()
    J = torch.func.jacrev(lambda v: point.outputs(point.unflatten(v)))(flat).reshape(x.shape[0], -1)
    # nn.MSELoss = (1/N) sum (f - y)^2: a Gaussian of variance 1/2, Fisher 2 J^T J / N
    assert np.allclose(point.fisher(), (2 * J.T @ J / x.shape[0]).numpy(), rtol=0, atol=1e-12)


def test_lambda_max_and_trace_against_the_spectrum(point):
    eigenvalues = np.linalg.eigvalsh(reference_hessian(point))
    assert flatness.measure_at(point, curvature.lambda_max, tol=1e-12) == pytest.approx(eigenvalues[-1], rel=1e-9)
    assert flatness.measure_at(point, flatness.hessian_trace, method="exact") == pytest.approx(
        eigenvalues.sum(), rel=1e-10
    )
    estimate = curvature.hutchpp_trace(
        curvature.HessianOperator.from_closure(point.loss_fn, point.params), n_probes=48, seed=0
    )
    assert flatness.measure_at(point, flatness.hessian_trace, n_probes=48) == pytest.approx(
        estimate.estimate, rel=1e-12
    )


def test_wolkowicz_styan_from_the_eigenvalues_and_above_lambda_max(point):
    eigenvalues = np.linalg.eigvalsh(reference_hessian(point))
    m = eigenvalues.mean()
    s = math.sqrt(max((eigenvalues**2).mean() - m * m, 0.0))
    bound = flatness.measure_at(point, flatness.model_wolkowicz_styan_bound)
    assert bound == pytest.approx(m + s * math.sqrt(eigenvalues.size - 1), rel=1e-10)
    assert bound >= eigenvalues[-1]


def test_sam_sharpness_by_hand_and_its_first_order_limit(point):
    flat = point.flat()
    g = curvature.closure_gradient(point.loss_fn, point.params)
    rho = 0.05
    moved = point.unflatten(flat + rho * g / g.norm())
    expected = float(point.loss_fn(moved)) - point.value()
    assert flatness.measure_at(point, flatness.sam_sharpness, rho=rho) == pytest.approx(expected, rel=1e-12)
    tiny = 1e-6  # L(theta + rho g/|g|) - L = rho |g| + O(rho^2)
    assert flatness.measure_at(point, flatness.sam_sharpness, rho=tiny) == pytest.approx(
        tiny * float(g.norm()), rel=1e-4
    )


def test_adaptive_sharpness_by_hand_and_its_rescaling_invariance_without_eta_and_biases():
    model = nn.Sequential(nn.Linear(3, 5, bias=False, **F64), nn.ReLU(), nn.Linear(5, 4, bias=False, **F64))
    point = LossPoint(model, nn.CrossEntropyLoss(), classification_data())
    flat = point.flat()
    g = curvature.closure_gradient(point.loss_fn, point.params)
    T = flat.abs() + 0.01
    step = 0.5 * T**2 * g / (T * g).norm()
    expected = float(point.loss_fn(point.unflatten(flat + step))) - point.value()
    assert flatness.measure_at(point, flatness.adaptive_sharpness) == pytest.approx(expected, rel=1e-12)
    scales = torch.tensor([0.5, 2.0, 3.0, 0.25, 1.5], **F64)
    moved = symmetries.relu_neuron_rescaling("0", "2", scales)(point.params)
    other = LossPoint(model, nn.CrossEntropyLoss(), point.data, params=moved)
    assert flatness.measure_at(other, flatness.adaptive_sharpness, eta=0.0) == pytest.approx(
        flatness.measure_at(point, flatness.adaptive_sharpness, eta=0.0), rel=1e-10
    )
    assert flatness.measure_at(other, flatness.adaptive_sharpness) != pytest.approx(
        flatness.measure_at(point, flatness.adaptive_sharpness), rel=1e-6
    )


def test_keskar_sharpness_small_box_is_the_linear_maximum(point):
    flat = point.flat()
    g = curvature.closure_gradient(point.loss_fn, point.params)
    eps = 1e-7  # the maximum of the linearised loss over the box sits at a corner
    linear = float((g.abs() * eps * (flat.abs() + 1)).sum())
    expected = 100 * linear / (1 + point.value())
    assert flatness.measure_at(point, flatness.keskar_sharpness, epsilon=eps) == pytest.approx(expected, rel=1e-4)
    assert flatness.measure_at(point, flatness.keskar_sharpness) > 0


def test_fisher_rao_norm_matches_the_empirical_fisher_and_liangs_identity():
    model = nn.Sequential(nn.Linear(3, 5, bias=False, **F64), nn.ReLU(), nn.Linear(5, 4, bias=False, **F64))
    x, y = classification_data()
    point = LossPoint(model, nn.CrossEntropyLoss(), (x, y))
    flat = point.flat()
    F = curvature.dense_fisher(model, nn.CrossEntropyLoss(), (x, y), params=point.params, kind="empirical")
    value = flatness.measure_at(point, flatness.fisher_rao_norm)
    assert value == pytest.approx(float(flat @ F @ flat) ** 0.5, rel=1e-10)
    # Liang et al.: for a bias-free ReLU net with L = 2 layers, <theta, grad f> = 2 f, so
    # <theta, grad l_i> = 2 <p_i - e_{y_i}, f_i>
    with torch.no_grad():
        f = model(x)
        residual = torch.softmax(f, 1) - nn.functional.one_hot(y, 4)
        identity = (2 * (residual * f).sum(1)).pow(2).mean().sqrt()
    assert value == pytest.approx(float(identity), rel=1e-10)


def test_relative_flatness_of_a_bias_free_last_layer_is_kappa_exact():
    point = LossPoint(classifier(bias_last=False), nn.CrossEntropyLoss(), classification_data())
    assert flatness.measure_at(point, flatness.relative_flatness, layer="2") == pytest.approx(
        flatness.measure_at(point, flatness.classifier_kappa_exact), rel=1e-10
    )


def test_relative_flatness_is_kept_by_rescaling_its_rows(point):
    scales = torch.tensor([0.5, 2.0, 3.0, 0.25, 1.5], **F64)
    moved = symmetries.relu_neuron_rescaling("0", "2", scales)(point.params)
    other = LossPoint(point.model, point.loss, point.data, params=moved)
    assert flatness.measure_at(other, flatness.relative_flatness) == pytest.approx(
        flatness.measure_at(point, flatness.relative_flatness), rel=1e-10
    )
    with pytest.raises(ValueError, match="no weight matrix"):
        flatness.measure_at(point, flatness.relative_flatness, layer="1")


def test_softmax_proxies_read_the_classifier_with_its_bias_as_a_column(point):
    W = torch.cat([point.params["2.weight"], point.params["2.bias"][:, None]], dim=1)
    x, _ = point.data
    with torch.no_grad():
        h = torch.relu(point.model[0](x))
    h = torch.cat([h, torch.ones(h.shape[0], 1, **F64)], dim=1)
    p = torch.softmax(h @ W.T, dim=1)
    P = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    by_hand = (h.pow(2).sum(1) * torch.einsum("kd,ikl,ld->i", W, P, W)).mean()  # |h_i|^2 tr(W^T P(p_i) W)
    assert flatness.measure_at(point, flatness.classifier_kappa_exact) == pytest.approx(float(by_hand), rel=1e-10)
    assert flatness.measure_at(point, flatness.classifier_b_raw) == pytest.approx(
        float(flatness.b_raw(W, h)), rel=1e-12
    )
    assert flatness.measure_at(point, flatness.classifier_b_quot) == pytest.approx(
        float(flatness.b_quot(W, h)), rel=1e-12
    )
    with pytest.raises(NotApplicable, match="softmax cross-entropy"):
        flatness.classifier_b_raw(*regression()[:1], nn.MSELoss(), regression()[1:])


def test_quotient_flatness_of_the_module_is_twice_the_chapters_autograd_value():
    model, x, y = regression()
    a, W = flatness.relu_quotient.two_layer_weights(model)
    expected = 2 * flatness.relu_quotient.quotient_flatness_autograd(a, W, x, y[:, 0])
    assert flatness.model_quotient_flatness(model, nn.MSELoss(), (x, y)) == pytest.approx(expected, rel=1e-9)
    with pytest.raises(NotApplicable, match="square loss"):
        flatness.model_quotient_flatness(classifier(), nn.CrossEntropyLoss(), classification_data())
    deeper = nn.Sequential(
        nn.Linear(3, 4, bias=False, **F64),
        nn.ReLU(),
        nn.Linear(4, 4, bias=False, **F64),
        nn.ReLU(),
        nn.Linear(4, 1, bias=False, **F64),
    )
    with pytest.raises(NotApplicable, match="two-layer"):
        flatness.model_quotient_flatness(deeper, nn.MSELoss(), (x, y))


def test_riemannian_sharpness_against_the_matrix_functions(point):
    H = reference_hessian(point)
    x, y = point.data
    F = curvature.dense_fisher(point.model, nn.CrossEntropyLoss(), (x, y), params=point.params, kind="true").numpy()
    assert flatness.measure_at(point, flatness.riemannian_sharpness) == pytest.approx(
        flatness.fisher_riemannian_sharpness_from_matrices(H, F).value, rel=1e-8
    )
    seen = np.diag(F) > 0
    expected = flatness.diagonal_fisher_sharpness_from_matrices(H[np.ix_(seen, seen)], np.diag(F)[seen])
    assert flatness.measure_at(point, flatness.riemannian_sharpness, fisher="diagonal") == pytest.approx(
        expected, rel=1e-10
    )
    with pytest.raises(ValueError, match="'true' or 'diagonal'"):
        flatness.measure_at(point, flatness.riemannian_sharpness, fisher="empirical")


def test_diagonal_fisher_sharpness_is_kept_by_a_diagonal_rescaling(point):
    moved = symmetries.relu_neuron_rescaling("0", "2", torch.tensor([0.5, 2.0, 3.0, 0.25, 1.5], **F64))(point.params)
    other = LossPoint(point.model, point.loss, point.data, params=moved)
    assert flatness.measure_at(other, flatness.riemannian_sharpness, fisher="diagonal") == pytest.approx(
        flatness.measure_at(point, flatness.riemannian_sharpness, fisher="diagonal"), rel=1e-9
    )


def test_batches_give_the_same_point_as_the_concatenated_data(point):
    x, y = point.data
    batched = LossPoint(point.model, nn.CrossEntropyLoss(), [(x[:10], y[:10]), (x[10:], y[10:])])
    assert batched.value() == pytest.approx(point.value(), rel=1e-14)
    assert flatness.measure_at(batched, flatness.sam_sharpness) == pytest.approx(
        flatness.measure_at(point, flatness.sam_sharpness), rel=1e-12
    )


def test_float32_models_are_measured_in_their_dtype():
    torch.manual_seed(0)
    F32 = dict(dtype=torch.float32)
    model = nn.Sequential(nn.Linear(3, 5, **F32), nn.ReLU(), nn.Linear(5, 4, **F32))
    x, y = classification_data()
    point = LossPoint(model, nn.CrossEntropyLoss(), (x, y))
    assert point.x.dtype == torch.float32 and point.outputs(point.params).dtype == torch.float32
    model64 = classifier()
    model64.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    reference = LossPoint(model64, nn.CrossEntropyLoss(), (x, y))
    for measure in (
        curvature.lambda_max,
        flatness.fisher_rao_norm,
        flatness.model_wolkowicz_styan_bound,
        flatness.riemannian_sharpness,
    ):
        assert flatness.measure_at(point, measure) == pytest.approx(flatness.measure_at(reference, measure), rel=1e-3)


@pytest.mark.parametrize(
    "loss, match, error",
    [
        (nn.CrossEntropyLoss(reduction="sum"), "reduction='mean'", ValueError),
        (nn.NLLLoss(), "nn.NLLLoss reads log-probabilities", NotApplicable),
        ("cross_entropy", "loss module", TypeError),
    ],
)
def test_bad_losses_are_refused(loss, match, error):
    """A sum or a loss name at the point; NLL on logits (not log-probabilities) where its Fisher is needed."""
    with pytest.raises(error, match=match):
        flatness.riemannian_sharpness(classifier(), loss, classification_data())


def test_bad_data_and_arguments_are_refused(point):
    x, y = classification_data()
    with pytest.raises(TypeError, match="an \\(x, y\\) pair, a dict batch with 'labels'.*got one tensor"):
        LossPoint(classifier(), nn.CrossEntropyLoss(), x)
    with pytest.raises(ValueError, match="one target per example"):
        LossPoint(classifier(), nn.CrossEntropyLoss(), (x, y[:5]))
    with pytest.raises(ValueError, match="broadcast"):
        LossPoint(regression()[0], nn.MSELoss(), (regression()[1], regression()[2][:, 0]))
    with pytest.raises(ValueError, match="model failed on the data \\(24 examples\\)"):
        LossPoint(classifier(), nn.CrossEntropyLoss(), (torch.randn(24, 7, **F64), y))
    with pytest.raises(TypeError, match="point must be a LossPoint"):
        flatness.measure_at(classifier(), flatness.sam_sharpness)
    with pytest.raises(TypeError, match=r"\['params'\] belong to the point"):
        flatness.measure_at(point, flatness.sam_sharpness, params=point.params)
    with pytest.raises(TypeError, match="measure must be a callable"):
        flatness.measure_at(point, "sam_sharpness")
    with pytest.raises(ValueError, match="parameter names"):
        LossPoint(classifier(), nn.CrossEntropyLoss(), (x, y), params={"0.weight": torch.zeros(5, 3, **F64)})
    with pytest.raises(NotApplicable, match="max_dense=44 .*method='hutchpp'"):
        flatness.measure_at(
            LossPoint(classifier(), nn.CrossEntropyLoss(), (x, y), max_dense=10), flatness.hessian_trace, method="exact"
        )
    with pytest.raises(ValueError, match="'hutchpp' or 'exact'"):
        flatness.measure_at(point, flatness.hessian_trace, method="dense")
    with pytest.raises(ValueError, match="rho must be > 0"):
        flatness.measure_at(point, flatness.sam_sharpness, rho=0.0)


def test_frozen_parameters_are_not_coordinates_anywhere():
    """One rule for the package: curvature is taken in the trainable parameters only."""
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(30, 4, generator=gen, dtype=torch.float64), torch.randint(0, 3, (30,), generator=gen)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 5, dtype=torch.float64), torch.nn.Tanh(), torch.nn.Linear(5, 3, dtype=torch.float64)
    )
    model[0].requires_grad_(False)
    loss = torch.nn.CrossEntropyLoss()
    trainable = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
    dense = curvature.dense_hessian(model, loss, (x, y))
    assert dense.shape == (18, 18)  # the last layer's 15 weights and 3 biases
    expected = float(torch.linalg.eigvalsh(dense)[-1])
    point = flatness.LossPoint(model, loss, (x, y))
    assert flatness.measure_at(point, curvature.lambda_max, tol=1e-12) == pytest.approx(expected, rel=1e-10)
    assert curvature.lambda_max(model, loss, (x, y), tol=1e-12) == pytest.approx(expected, rel=1e-10)
    assert set(flatness.LossPoint(model, loss, (x, y)).params) == set(trainable)


def test_ragged_batches_and_a_k_output_quotient_flatness_are_refused_naming_the_argument():
    from lossgeom.flatness import quotient_flatness

    class MeanPool(nn.Module):  # takes sequences of any length
        def __init__(self):
            super().__init__()
            self.embed, self.out = nn.Embedding(5, 3, dtype=torch.float64), nn.Linear(3, 2, dtype=torch.float64)

        def forward(self, tokens):
            return self.out(self.embed(tokens).mean(1))

    batches = [
        (torch.randint(0, 5, (3, 4)), torch.randint(0, 2, (3,))),
        (torch.randint(0, 5, (3, 6)), torch.randint(0, 2, (3,))),
    ]
    for measure in (flatness.sam_sharpness, flatness.LossPoint):
        with pytest.raises(
            ValueError, match=r"data: the batches' x have different shapes per example \[\(4,\), \(6,\)\]"
        ):
            measure(MeanPool(), nn.CrossEntropyLoss(), batches)
    a, W = torch.randn(5, 2, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    x, y = torch.randn(8, 3, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"quotient_flatness needs a one-output network \(a of shape \(5,\)\)"):
        quotient_flatness(a, W, x, y)


MODEL_FIRST = [
    (flatness.hessian_trace, {"method": "exact"}),
    (flatness.hessian_trace, {"n_probes": 30, "seed": 3}),
    (flatness.keskar_sharpness, {"max_iter": 5}),
    (flatness.sam_sharpness, {"rho": 0.1}),
    (flatness.adaptive_sharpness, {"eta": 0.0}),
    (flatness.fisher_rao_norm, {}),
    (flatness.relative_flatness, {"layer": "2"}),
    (flatness.classifier_kappa_exact, {}),
    (flatness.classifier_b_raw, {}),
    (flatness.classifier_b_quot, {}),
    (flatness.riemannian_sharpness, {"fisher": "diagonal"}),
    (flatness.model_wolkowicz_styan_bound, {}),
]


@pytest.mark.parametrize(
    "measure, options", MODEL_FIRST, ids=[f"{m.__name__}-{'-'.join(o) or 'default'}" for m, o in MODEL_FIRST]
)
def test_the_model_first_form_at_params_equals_the_stored_point(measure, options):
    """``f(model, loss, data, params=q)`` is ``measure_at(LossPoint(..., params=q), f)``, and the model is untouched."""
    model, data = classifier(), classification_data()
    scales = torch.tensor([0.5, 2.0, 3.0, 0.25, 1.5], **F64)
    own = {k: v.detach().clone() for k, v in model.named_parameters()}
    moved = symmetries.relu_neuron_rescaling("0", "2", scales)(own)
    value = measure(model, nn.CrossEntropyLoss(), data, params=moved, **options)
    stored = flatness.measure_at(LossPoint(model, nn.CrossEntropyLoss(), data, params=moved), measure, **options)
    assert value == pytest.approx(stored, rel=1e-9)
    assert all(torch.equal(p, own[k]) for k, p in model.named_parameters())


def test_model_quotient_flatness_at_params_equals_the_stored_point():
    model, x, y = regression()
    moved = {k: 2.0 * v.detach() for k, v in model.named_parameters()}
    value = flatness.model_quotient_flatness(model, nn.MSELoss(), (x, y), params=moved)
    stored = flatness.measure_at(LossPoint(model, nn.MSELoss(), (x, y), params=moved), flatness.model_quotient_flatness)
    assert value == pytest.approx(stored, rel=1e-12)


def test_hessian_trace_is_matrix_free_by_default_and_exact_on_request():
    model, data = classifier(), classification_data()
    exact = float(np.trace(curvature.dense_hessian(model, nn.CrossEntropyLoss(), data).numpy()))
    assert flatness.hessian_trace(model, nn.CrossEntropyLoss(), data, method="exact") == pytest.approx(exact, rel=1e-12)
    estimate = curvature.hutchpp_trace(curvature.hessian_operator(model, nn.CrossEntropyLoss(), data), seed=0)
    assert flatness.hessian_trace(model, nn.CrossEntropyLoss(), data) == estimate.estimate
    with pytest.raises(NotApplicable, match=r"above max_dense = 10; pass max_dense=44 .*method='hutchpp'"):
        flatness.hessian_trace(model, nn.CrossEntropyLoss(), data, method="exact", max_dense=10)


@pytest.mark.parametrize("measure", [m for m, _ in MODEL_FIRST[2:]] + [flatness.model_quotient_flatness])
def test_a_process_group_is_refused_where_every_example_is_needed(measure):
    with pytest.raises(ValueError, match=f"group: {measure.__name__} needs every example on one process"):
        measure(classifier(), nn.CrossEntropyLoss(), classification_data(), group=object())


def test_measure_at_calls_a_measure_of_your_own_on_a_copy_at_the_point(point):
    moved = {k: 2.0 * v for k, v in point.params.items()}
    other = LossPoint(point.model, point.loss, point.data, params=moved)

    def squared_norm(model, loss, data, *, power=2):
        return sum(float(p.detach().abs().pow(power).sum()) for p in model.parameters())

    assert flatness.measure_at(other, squared_norm, power=2) == pytest.approx(
        4.0 * flatness.measure_at(point, squared_norm), rel=1e-14
    )


def test_the_matrix_forms_refuse_a_model_naming_the_model_first_measure():
    with pytest.raises(TypeError, match=r"hessian must be a matrix.*riemannian_sharpness\(model, loss, data\)"):
        flatness.fisher_riemannian_sharpness_from_matrices(classifier(), nn.CrossEntropyLoss())
    with pytest.raises(TypeError, match='riemannian_sharpness\\(model, loss, data, fisher="diagonal"\\)'):
        flatness.diagonal_fisher_sharpness_from_matrices(classifier(), torch.ones(3))

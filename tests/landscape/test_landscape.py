"""The slice toolkit (Chapter 10): direction schemes, the slice evaluator, planes, paths."""

import math

import numpy as np
import pytest
import torch
from scipy import stats
from small_models import mlp

from lossgeom import landscape as ls
from lossgeom.curvature import closure_hessian
from lossgeom.models import loss_closure
from lossgeom.parameters import flatten_params, params_of
from lossgeom.symmetries import Symmetry, relu_neuron_rescaling
from lossgeom.training import adam

from book_extra import from_book
from conftest import assert_close

hs = from_book("lossgeom_book.hidden_saddles")

CONTRACT = dict(centre_name="test centre", loss="test loss", reduction="mean", data="synthetic", model_mode="eval")


@pytest.fixture(scope="module")
def network():
    """A small ReLU MLP on seeded synthetic data: model, params, loss, forward, probe."""
    torch.manual_seed(0)
    x = torch.randn(30, 5, dtype=torch.float64)
    y = torch.randint(0, 3, (30,))
    model = mlp([5, 4, 3], seed=0)
    forward = lambda p, inputs: torch.func.functional_call(model, p, (inputs,))
    return model, params_of(model), loss_closure(model, torch.nn.CrossEntropyLoss(), (x, y)), forward, x


def quadratic_setup(n=6, seed=0):
    """L(theta) = 1/2 theta^T H theta with a seeded symmetric H of known spectrum."""
    rng = np.random.default_rng(seed)
    Q = np.linalg.qr(rng.standard_normal((n, n)))[0]
    spectrum = np.linspace(-2.0, 3.0, n)
    H = (Q * spectrum) @ Q.T
    loss = lambda p: 0.5 * p["theta"] @ (torch.from_numpy(H) @ p["theta"])
    return H, spectrum, loss, {"theta": torch.zeros(n)}


def as_directions(d1, d2, name="theta"):
    return ls.directions.Directions(
        {name: torch.as_tensor(d1, dtype=torch.float64)},
        {name: torch.as_tensor(d2, dtype=torch.float64)},
        "given",
        "none",
    )


# --- direction schemes -----------------------------------------------------------------


def test_gaussian_directions_shapes_seeds_and_unit_norm(network):
    _, params, *_ = network
    d = ls.gaussian_directions(params, 3)
    assert set(d.first) == set(params) and all(d.first[k].shape == params[k].shape for k in params)
    for direction in (d.first, d.second):
        assert flatten_params(direction)[0].norm().item() == pytest.approx(1.0, rel=1e-14)
    again, other = ls.gaussian_directions(params, 3), ls.gaussian_directions(params, 4)
    assert all(torch.equal(d.first[k], again.first[k]) for k in params)
    assert not torch.equal(flatten_params(d.first)[0], flatten_params(other.first)[0])
    assert "seed 3" in d.scheme
    with pytest.raises(TypeError, match="seed must be an int"):
        ls.gaussian_directions(params, 1.5)


def test_filter_normalisation_matches_each_row_and_zeroes_biases(network):
    _, params, *_ = network
    d = ls.filter_normalised_directions(params, 1)
    for key, p in params.items():
        if p.ndim == 1:
            assert torch.count_nonzero(d.first[key]) == 0
        else:
            assert_close(d.first[key].norm(dim=1), p.norm(dim=1), rtol=1e-13)
    # another way: Li et al.'s loop, d_row * ||w_row|| / ||d_row|| on the same Gaussian draw
    gen = torch.Generator().manual_seed(1)
    raw = {k: torch.randn(p.shape, generator=gen, dtype=torch.float64) for k, p in params.items()}
    w = params["0.weight"]
    expected = torch.stack([raw["0.weight"][i] * w[i].norm() / raw["0.weight"][i].norm() for i in range(w.shape[0])])
    assert_close(d.first["0.weight"], expected, rtol=1e-14)
    copied = ls.filter_normalised_directions(params, 1, one_dimensional="copy")
    assert torch.equal(copied.first["0.bias"], params["0.bias"])
    with pytest.raises(ValueError, match="one_dimensional must be 'zero' or 'copy'"):
        ls.filter_normalised_directions(params, 1, one_dimensional="drop")


def test_neuron_normalisation_matches_incoming_and_outgoing_norms(network):
    _, params, *_ = network
    d = ls.neuron_normalised_directions(params, 2, "0", "2")
    incoming_d = torch.cat([d.first["0.weight"], d.first["0.bias"][:, None]], 1).norm(dim=1)
    incoming_p = torch.cat([params["0.weight"], params["0.bias"][:, None]], 1).norm(dim=1)
    assert_close(incoming_d, incoming_p, rtol=1e-13)
    assert_close(d.first["2.weight"].norm(dim=0), params["2.weight"].norm(dim=0), rtol=1e-13)
    assert d.first["2.bias"].norm().item() == pytest.approx(params["2.bias"].norm().item(), rel=1e-13)
    with pytest.raises(ValueError, match=r"needs params \['1.weight'\]"):
        ls.neuron_normalised_directions(params, 2, "1", "2")
    with pytest.raises(ValueError, match="must be \\(h, d\\)"):
        ls.neuron_normalised_directions(params, 2, "2", "0")


def test_hessian_directions_are_the_extreme_eigenvectors():
    H, spectrum, loss, origin = quadratic_setup()
    d = ls.closure_hessian_directions(loss, origin)
    assert_close(d.details["eigenvalues"], [spectrum[-1], spectrum[0]], rtol=1e-9)
    for vec, lam in ((d.first["theta"], spectrum[-1]), (d.second["theta"], spectrum[0])):
        assert_close(H @ vec.numpy(), lam * vec.numpy(), atol=1e-8)
        assert vec.norm().item() == pytest.approx(1.0, rel=1e-12)
    top_two = ls.closure_hessian_directions(loss, origin, ("largest", "largest"))
    assert_close(top_two.details["eigenvalues"], spectrum[::-1][:2], rtol=1e-9)
    scaled = ls.closure_hessian_directions(loss, origin, normalisation="curvature")
    P = ls.closure_projected_hessian(loss, origin, scaled)
    assert_close(P, np.diag([1.0, -1.0]), atol=1e-8)
    with pytest.raises(ValueError, match="which must be a pair"):
        ls.closure_hessian_directions(loss, origin, ("largest", "middle"))
    with pytest.raises(ValueError, match="normalisation must be 'unit' or 'curvature'"):
        ls.closure_hessian_directions(loss, origin, normalisation="filter")


def test_trajectory_pca_recovers_the_plane_of_planar_iterates():
    rng = np.random.default_rng(0)
    basis = np.linalg.qr(rng.standard_normal((8, 2)))[0]
    coords = rng.standard_normal((12, 2)) * [3.0, 1.0]
    centre = rng.standard_normal(8)
    iterates = [{"w": torch.from_numpy(centre + basis @ c)} for c in coords] + [{"w": torch.from_numpy(centre)}]
    d = ls.trajectory_directions(iterates)
    D = torch.stack([d.first["w"], d.second["w"]], 1).numpy()
    assert_close(D @ D.T, basis @ basis.T, atol=1e-12)  # same plane
    assert sum(d.details["explained_variance"]) == pytest.approx(1.0, rel=1e-12)
    recovered = ls.slices.plane_coordinates(iterates[:-1], iterates[-1], d)
    assert_close(np.linalg.norm(recovered, axis=1), np.linalg.norm(coords, axis=1), rtol=1e-10)
    with pytest.raises(ValueError, match="at least 3 parameter dicts"):
        ls.trajectory_directions(iterates[:2])
    with pytest.raises(ValueError, match="same names and shapes"):
        ls.trajectory_directions(iterates + [{"w": torch.zeros(3)}])


def test_transported_directions_are_the_jacobian_image(network):
    _, params, *_ = network
    sym = relu_neuron_rescaling("0", "2", [0.5, 2.0, 3.0, 0.25])
    base = ls.gaussian_directions(params, 0)
    moved = ls.transported_directions(base, sym, params)
    # the rescaling is linear: J d = T(theta + d) - T(theta)
    shifted = sym({k: params[k] + base.first[k] for k in params})
    expected = {k: shifted[k] - sym(params)[k] for k in params}
    assert_close(flatten_params(moved.first)[0], flatten_params(expected)[0], atol=1e-13)
    with pytest.raises(TypeError, match="symmetry must be a lossgeom Symmetry"):
        ls.transported_directions(base, lambda p: p, params)


# --- the slice evaluator and its contract ------------------------------------------------


def test_slice_values_match_the_quadratic_and_carry_the_contract():
    H, _, loss, origin = quadratic_setup()
    d1, d2 = np.eye(6)[0] + 0.3 * np.eye(6)[2], np.eye(6)[1]
    piece = ls.closure_evaluate_slice(loss, origin, as_directions(d1, d2), 0.5, 5, **CONTRACT)
    assert piece.values.shape == (5, 5) and piece.axis.shape == (5,)
    S, T = np.meshgrid(piece.axis, piece.axis, indexing="xy")
    points = S[..., None] * d1 + T[..., None] * d2
    assert_close(piece.values, 0.5 * np.einsum("ijk,kl,ijl->ij", points, H, points), atol=1e-14)
    assert piece.centre_value == 0.0
    contract = piece.contract
    assert contract.centre == "test centre" and contract.directions == "given" and contract.normalisation == "none"
    assert contract.radius.startswith("0.5") and contract.resolution == "5 x 5 grid"
    assert contract.precision.startswith("float64") and contract.data == "synthetic"
    assert "Contract:" in contract.caption("A slice.")


def test_slice_rejects_bad_directions_and_radius():
    _, _, loss, origin = quadratic_setup()
    good = as_directions(np.eye(6)[0], np.eye(6)[1])
    with pytest.raises(ValueError, match=r"directions.first\['theta'\] must have shape \(6,\)"):
        ls.closure_evaluate_slice(loss, origin, as_directions(np.ones(5), np.eye(6)[1]), 1.0, 5, **CONTRACT)
    with pytest.raises(ValueError, match="directions.second is the zero direction"):
        ls.closure_evaluate_slice(loss, origin, as_directions(np.eye(6)[0], np.zeros(6)), 1.0, 5, **CONTRACT)
    with pytest.raises(ValueError, match="linearly independent"):
        ls.closure_evaluate_slice(loss, origin, as_directions(np.eye(6)[0], 2 * np.eye(6)[0]), 1.0, 5, **CONTRACT)
    with pytest.raises(ValueError, match="must have the parameter names"):
        ls.closure_evaluate_slice(loss, origin, as_directions(np.eye(6)[0], np.eye(6)[1], name="w"), 1.0, 5, **CONTRACT)
    with pytest.raises(ValueError, match="must contain only finite values"):
        ls.closure_evaluate_slice(loss, origin, as_directions(np.full(6, np.nan), np.eye(6)[1]), 1.0, 5, **CONTRACT)
    for radius in (0.0, -1.0):
        with pytest.raises(ValueError, match="radius must be > 0"):
            ls.closure_evaluate_slice(loss, origin, good, radius, 5, **CONTRACT)
    with pytest.raises(ValueError, match="resolution must be >= 2"):
        ls.closure_evaluate_slice(loss, origin, good, 1.0, 1, **CONTRACT)
    single = ls.directions.Directions(
        {"theta": torch.eye(6)[0].float()}, {"theta": torch.eye(6)[1].float()}, "given", "none"
    )
    with pytest.raises(TypeError, match=r"has dtype torch.float32 but the parameter has torch.float64"):
        ls.closure_evaluate_slice(loss, origin, single, 1.0, 5, **CONTRACT)
    with pytest.raises(TypeError, match="centre tensors must share one floating dtype"):
        ls.closure_evaluate_slice(
            loss,
            {"theta": torch.zeros(6, dtype=torch.int64)},
            ls.directions.Directions(
                {"theta": torch.eye(6, dtype=torch.int64)[0]},
                {"theta": torch.eye(6, dtype=torch.int64)[1]},
                "given",
                "none",
            ),
            1.0,
            5,
            **CONTRACT,
        )
    with pytest.raises(TypeError, match="directions must be a lossgeom.landscape.Directions"):
        ls.closure_evaluate_slice(loss, origin, (np.eye(6)[0], np.eye(6)[1]), 1.0, 5, **CONTRACT)


def test_rays_sharpness_and_lowest_point():
    origin = quadratic_setup()[3]
    bowl = lambda p: (p["theta"] ** 2).sum()
    bump = lambda p: torch.cos(3 * p["theta"][0]) + p["theta"][1] ** 2
    dirs = as_directions(np.eye(6)[0], np.eye(6)[1])
    assert ls.closure_evaluate_slice(bowl, origin, dirs, 1.0, 7, **CONTRACT).rises_along_rays()
    falls = ls.closure_evaluate_slice(bump, origin, dirs, 2.0, 9, **CONTRACT)
    assert not falls.rises_along_rays() and falls.lowest_increase < 0
    bowl_slice = ls.closure_evaluate_slice(bowl, origin, dirs, 1.0, 3, **CONTRACT)
    assert bowl_slice.sharpness == pytest.approx(4 / 3, rel=1e-14)  # mean of s^2 + t^2 on {-1, 0, 1}^2
    with pytest.raises(ValueError, match="odd resolution"):
        ls.closure_evaluate_slice(bowl, origin, dirs, 1.0, 4, **CONTRACT).rises_along_rays()


# --- invariance under per-neuron ReLU rescaling --------------------------------------------


@pytest.mark.parametrize(
    "scheme,invariant",
    [
        (lambda p: ls.neuron_normalised_directions(p, 0, "0", "2"), True),
        (lambda p: ls.gaussian_directions(p, 0), False),
        (lambda p: ls.filter_normalised_directions(p, 0), False),
    ],
    ids=["neuron-normalised", "raw", "filter-normalised"],
)
def test_audit_measures_which_schemes_survive_a_per_neuron_rescaling(network, scheme, invariant):
    _, params, loss, forward, x = network
    sym = relu_neuron_rescaling("0", "2", [0.25, 3.0, 1.5, 0.5])
    audit = ls.closure_audit_slice_scheme(
        loss, forward, params, sym, x, scheme, radius=0.5, resolution=5, tol=1e-10, **CONTRACT
    )
    assert audit.function_check.is_symmetry
    if invariant:
        assert audit.max_slice_discrepancy < 1e-12
        assert audit.function_check.measure_after == pytest.approx(audit.function_check.measure_before, rel=1e-10)
    else:
        assert audit.max_slice_discrepancy > 1e-2


def test_filter_normalisation_survives_a_uniform_rescaling_and_transport_always_does(network):
    _, params, loss, forward, x = network
    uniform = relu_neuron_rescaling("0", "2", [4.0] * 4)
    rule = lambda p: ls.filter_normalised_directions(p, 0)
    audit = ls.closure_audit_slice_scheme(
        loss, forward, params, uniform, x, rule, radius=0.5, resolution=5, tol=1e-10, **CONTRACT
    )
    assert audit.max_slice_discrepancy < 1e-12
    sym = relu_neuron_rescaling("0", "2", [0.25, 3.0, 1.5, 0.5])
    base = ls.gaussian_directions(params, 0)
    transported = ls.closure_audit_slice_scheme(
        loss,
        forward,
        params,
        sym,
        x,
        lambda p: base,
        radius=0.5,
        resolution=5,
        tol=1e-10,
        scheme_after=lambda p: ls.transported_directions(base, sym, params),
        **CONTRACT,
    )
    assert transported.max_slice_discrepancy < 1e-12


def test_audit_refuses_a_transform_that_changes_the_function(network):
    _, params, loss, forward, x = network
    not_a_symmetry = Symmetry("double the output layer", lambda p: {**p, "2.weight": 2 * p["2.weight"]})
    with pytest.raises(ValueError, match="is not a symmetry of the model"):
        ls.closure_audit_slice_scheme(
            loss,
            forward,
            params,
            not_a_symmetry,
            x,
            lambda p: ls.gaussian_directions(p, 0),
            radius=0.5,
            resolution=3,
            tol=1e-10,
            **CONTRACT,
        )


# --- what a random plane shows ------------------------------------------------------------


@pytest.mark.parametrize("n,lam,mu", [(3, 1.0, 1.0), (10, 1.0, 0.25), (30, 2.0, 8.0), (100, 1.0, 8.757)])
def test_saddle_probability_equals_the_f_distribution_tail(n, lam, mu):
    # another way: mu a^T W^-1 a > lambda with a ~ N(0, I_2), W ~ Wishart_2(n - 1, I) is
    # F(2, n - 2) > lambda (n - 2) / (2 mu)
    expected = stats.f.sf(lam * (n - 2) / (2 * mu), 2, n - 2)
    assert hs.saddle_visibility_probability(n, lam, -mu) == pytest.approx(expected, rel=1e-10)


def test_saddle_probability_matches_sampled_planes_and_edge_cases():
    n, mu = 12, 1.5
    p = hs.saddle_visibility_probability(n, 1.0, -mu)
    H = np.diag(np.r_[-mu, np.ones(n - 1)])
    sampled = hs.shows_negative_curvature(hs.random_plane_hessians(H, 20_000, seed=5)).mean()
    assert abs(sampled - p) <= 4 * math.sqrt(p * (1 - p) / 20_000)
    assert hs.saddle_visibility_probability(2, 1.0, -0.1) == 1.0
    with pytest.raises(ValueError, match="n must be >= 2"):
        hs.saddle_visibility_probability(1, 1.0, -1.0)
    with pytest.raises(ValueError, match="positive_eigenvalue must be > 0"):
        hs.saddle_visibility_probability(5, 0.0, -1.0)
    with pytest.raises(ValueError, match="negative_eigenvalue must be < 0"):
        hs.saddle_visibility_probability(5, 1.0, 0.5)


def test_random_plane_hessians_matrix_and_eigenvalue_forms():
    H, spectrum, *_ = quadratic_setup()
    projected = hs.random_plane_hessians(H, 4, seed=7)
    G = np.random.default_rng(7).standard_normal((4, 6, 2))
    assert_close(projected, np.stack([g.T @ H @ g for g in G]), atol=1e-12)
    in_eigenbasis = hs.random_plane_hessians(spectrum, 4, seed=7)
    assert_close(in_eigenbasis, np.stack([g.T @ np.diag(spectrum) @ g for g in G]), atol=1e-12)
    # both forms sample the same law: compare the fraction showing negative curvature
    many = [hs.shows_negative_curvature(hs.random_plane_hessians(h, 20_000, seed=1)).mean() for h in (H, spectrum)]
    assert abs(many[0] - many[1]) < 0.02
    with pytest.raises(ValueError, match="hessian must be symmetric"):
        hs.random_plane_hessians(np.triu(np.ones((3, 3))), 2, 0)
    with pytest.raises(ValueError, match="square"):
        hs.random_plane_hessians(np.ones((3, 2)), 2, 0)


def test_shows_negative_curvature_reads_the_sign_of_the_2x2():
    mats = np.array([np.diag([1.0, -1.0]), np.diag([1.0, 2.0]), np.diag([-1.0, -2.0]), [[1.0, 2.0], [2.0, 1.0]]])
    assert hs.shows_negative_curvature(mats).tolist() == [True, False, True, True]
    with pytest.raises(ValueError, match=r"shape \(2, 2\)"):
        hs.shows_negative_curvature(np.eye(3))


def test_projected_hessian_is_d_transpose_h_d(network):
    _, params, loss, *_ = network
    d = ls.gaussian_directions(params, 9)
    H = closure_hessian(loss, params).numpy()
    D = np.stack([flatten_params(d.first)[0].numpy(), flatten_params(d.second)[0].numpy()], 1)
    assert_close(ls.closure_projected_hessian(loss, params, d), D.T @ H @ D, atol=1e-12)


# --- paths between parameter points ------------------------------------------------------------


def test_interpolation_and_barrier_of_a_double_well():
    double_well = lambda p: (p["x"] ** 2 - 1).pow(2).sum()
    alphas = np.linspace(0, 1, 11)
    path = ls.interpolate({"loss": double_well}, {"x": torch.tensor([-1.0])}, {"x": torch.tensor([1.0])}, alphas)
    assert_close(path["loss"], (((2 * alphas - 1) ** 2 - 1) ** 2), atol=1e-14)
    assert ls.loss_barrier(alphas, path["loss"]) == pytest.approx(1.0, rel=1e-14)
    assert ls.loss_barrier(alphas, 1 - alphas) == 0.0
    with pytest.raises(ValueError, match="alphas must increase from 0 to 1"):
        ls.loss_barrier(alphas[::-1], path["loss"])
    with pytest.raises(ValueError, match="same parameter names and shapes"):
        ls.interpolate({"loss": double_well}, {"x": torch.zeros(1)}, {"x": torch.zeros(2)}, alphas)


def test_bezier_curve_endpoints_and_training_lowers_the_path():
    ring = lambda p: (p["w"].pow(2).sum() - 1).pow(2)
    start, end = {"w": torch.tensor([1.0, 0.0])}, {"w": torch.tensor([0.0, 1.0])}
    control = {"w": torch.tensor([2.0, 3.0])}
    assert torch.equal(ls.bezier_point(start, control, end, 0.0)["w"], start["w"])
    assert torch.equal(ls.bezier_point(start, control, end, 1.0)["w"], end["w"])
    assert_close(ls.bezier_point(start, control, end, 0.5)["w"], [1.25, 1.75], atol=1e-15)
    run = ls.closure_fit_bezier_curve(ring, start, end, adam(0.05), steps=200, points_per_step=4, seed=0)
    ts = np.linspace(0, 1, 21)
    curve = max(float(ring(ls.bezier_point(start, run.params, end, t))) for t in ts)
    line = max(float(ring(ls.paths.linear_point(start, end, t))) for t in ts)
    assert line == pytest.approx(0.25, rel=1e-12) and curve < line / 4
    with pytest.raises(ValueError, match="needs the curve positions t"):
        ls.paths.closure_bezier_curve_loss(ring, start, end)(control)


def test_slice_evaluates_in_the_centre_dtype_and_records_it():
    seen = []
    bowl = lambda p: seen.append(p["w"].dtype) or (p["w"] ** 2).sum()
    centre = {"w": torch.zeros(3, dtype=torch.float32)}
    dirs = ls.directions.Directions(
        {"w": torch.eye(3, dtype=torch.float32)[0]}, {"w": torch.eye(3, dtype=torch.float32)[1]}, "given", "none"
    )
    piece = ls.closure_evaluate_slice(bowl, centre, dirs, 1.0, 3, **CONTRACT)
    assert set(seen) == {torch.float32} and piece.contract.precision.startswith("float32")
    assert piece.values[0, 0] == pytest.approx(2.0, rel=1e-6)


def test_audit_of_a_flat_slice_says_the_relative_discrepancy_is_undefined(network):
    _, params, _, forward, x = network
    sym = relu_neuron_rescaling("0", "2", [0.25, 3.0, 1.5, 0.5])

    def constant(p):
        return sum(v.sum() for v in p.values()) * 0.0

    with pytest.raises(ValueError, match="the slice before the symmetry is flat"):
        ls.closure_audit_slice_scheme(
            constant,
            forward,
            params,
            sym,
            x,
            lambda p: ls.gaussian_directions(p, 0),
            radius=0.5,
            resolution=3,
            tol=1e-10,
            **CONTRACT,
        )

"""Zero eigenvalues and what predicts them: symmetries and data (Sagun et al. 2017; Kunin et al. 2021).

A Hessian eigenvalue counts as zero only against a threshold: :func:`relative_magnitudes`
and :func:`count_near_zero` give the count as a function of it. Symmetries predict zeros
at a critical point: :func:`relu_rescaling_tangents` (one per hidden ReLU unit) and
:func:`softmax_shift_tangents` (the common-row shift of the classifier); the data predict
more: :func:`data_blind_directions` (first-layer directions no training input reaches).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from numpy.typing import ArrayLike

from lossgeom._validation import finite_array, finite_tensor, positive
from lossgeom.parameters import Params, flatten_params


def relative_magnitudes(eigenvalues: ArrayLike) -> np.ndarray:
    """``|lambda_i| / max_j |lambda_j|``, sorted ascending (smallest magnitude first).

    Args:
        eigenvalues: a one-dimensional array-like of finite eigenvalues.

    Returns:
        The sorted relative magnitudes, a float array in ``[0, 1]`` ending with 1.

    Raises:
        TypeError: if ``eigenvalues`` is not array-like of real numbers.
        ValueError: if the eigenvalues are not one-dimensional, not finite, empty or all zero.
    """
    ev = finite_array("eigenvalues", eigenvalues, ndim=1)
    if ev.size == 0 or not np.abs(ev).max() > 0:
        raise ValueError("eigenvalues must be non-empty and not all zero")
    return np.sort(np.abs(ev)) / np.abs(ev).max()


def count_near_zero(eigenvalues: ArrayLike, rel_thresholds: ArrayLike) -> np.ndarray:
    """How many eigenvalues have ``|lambda| <= tau * max|lambda|``, for each ``tau``.

    A count of "zero" eigenvalues needs such a threshold; reported as a function of
    ``tau`` rather than at one value, the count shows where it is robust.

    Args:
        eigenvalues: a one-dimensional array-like of finite eigenvalues.
        rel_thresholds: the thresholds ``tau`` (a number or an array of them), each > 0.

    Returns:
        An integer array of the shape of ``rel_thresholds``: the count for each ``tau``.

    Raises:
        TypeError: if an argument is not array-like of real numbers.
        ValueError: if a threshold is not > 0 or not finite, or the eigenvalues are not
            one-dimensional, not finite, empty or all zero.
    """
    rel = relative_magnitudes(eigenvalues)
    taus = finite_array("rel_thresholds", rel_thresholds)
    if np.any(taus <= 0):
        raise ValueError("rel_thresholds must be > 0")
    return np.searchsorted(rel, taus, side="right")


def _two_layer(params: Params, layer_in: str, layer_out: str) -> tuple[str, str, str, str]:
    """Validate a two-layer network's parameter names and shapes; return the four names."""
    if not isinstance(params, Mapping) or not params:
        raise TypeError("params must be a non-empty dict of name -> tensor")
    names = tuple(f"{layer}.{kind}" for layer in (layer_in, layer_out) for kind in ("weight", "bias"))
    missing = [n for n in names if n not in params]
    if missing:
        raise ValueError(f"params must hold {list(names)} (a two-layer network with biases); missing {missing}")
    w_in, b_in, w_out, b_out = (params[n] for n in names)
    width = w_in.shape[0]
    if (
        w_in.ndim != 2
        or b_in.shape != (width,)
        or w_out.ndim != 2
        or w_out.shape[1] != width
        or b_out.shape != (w_out.shape[0],)
    ):
        raise ValueError(
            f"inconsistent shapes: {names[0]} {tuple(w_in.shape)}, {names[1]} "
            f"{tuple(b_in.shape)}, {names[2]} {tuple(w_out.shape)}, {names[3]} "
            f"{tuple(b_out.shape)}"
        )
    return names


def _flat_direction(params: Params, pieces: Mapping[str, torch.Tensor]) -> np.ndarray:
    """A flattened parameter vector that is ``pieces`` on their names and zero elsewhere."""
    full = {name: torch.zeros_like(p) for name, p in params.items()}
    full.update(pieces)
    return flatten_params(full)[0].numpy()


def relu_rescaling_generators(params: Params, layer_in: str, layer_out: str) -> np.ndarray:
    """The diagonal generators ``A_j`` of the per-unit ReLU rescalings, one column per unit.

    Rescaling unit ``j`` by ``c`` multiplies its incoming weights and bias by ``c`` and its
    outgoing weights by ``1/c``; its tangent at ``c = 1`` is ``t_j = A_j theta`` with
    ``A_j = +1`` on the incoming entries, ``-1`` on the outgoing ones and 0 elsewhere.
    Column ``j`` holds that diagonal, flattened like :func:`flatten_params`.

    Args:
        params: the network, with ``f"{layer_in}.weight"``/``.bias`` and
            ``f"{layer_out}.weight"``/``.bias``.
        layer_in: the name prefix of the hidden (first) layer.
        layer_out: the name prefix of the output layer.

    Returns:
        An ``(n, width)`` array of entries ``+1``, ``-1`` and 0, one column per hidden unit.

    Raises:
        TypeError: if ``params`` is not a non-empty dict.
        ValueError: on missing parameter names or inconsistent shapes.
    """
    w_in, b_in, w_out, _ = _two_layer(params, layer_in, layer_out)
    columns = []
    for j in range(params[w_in].shape[0]):
        pieces = {name: torch.zeros_like(params[name]) for name in (w_in, b_in, w_out)}
        pieces[w_in][j], pieces[b_in][j], pieces[w_out][:, j] = 1.0, 1.0, -1.0
        columns.append(_flat_direction(params, pieces))
    return np.stack(columns, axis=1)


def relu_rescaling_tangents(params: Params, layer_in: str, layer_out: str) -> np.ndarray:
    """Tangents ``t_j = A_j theta`` of the per-unit ReLU rescalings, one column per hidden unit.

    Since ``relu(c z) = c relu(z)`` for ``c > 0`` the loss is constant along each
    rescaling orbit, so ``grad L . t_j = 0`` everywhere and, differentiating once more,
    ``H t_j = -A_j grad L``: a Hessian null vector only at a critical point (Kunin et
    al. 2021; :func:`lossgeom.symmetries.relu_neuron_rescaling` is the finite transform).

    Args:
        params: the network, with ``f"{layer_in}.weight"``/``.bias`` and
            ``f"{layer_out}.weight"``/``.bias``.
        layer_in: the name prefix of the hidden (first) layer.
        layer_out: the name prefix of the output layer.

    Returns:
        An ``(n, width)`` array, column ``j`` the tangent ``t_j`` (flattened like
        :func:`lossgeom.parameters.flatten_params`).

    Raises:
        TypeError: if ``params`` is not a non-empty dict.
        ValueError: on missing parameter names or inconsistent shapes.
    """
    flat = flatten_params(params)[0].numpy()
    return relu_rescaling_generators(params, layer_in, layer_out) * flat[:, None]


def softmax_shift_tangents(params: Params, layer_in: str, layer_out: str) -> np.ndarray:
    """Tangents of the softmax shift ``W2 -> W2 + 1 v^T``, ``b2 -> b2 + s 1``: ``width + 1`` columns.

    Softmax only sees differences of logits, so adding the same vector to every row of
    the output weights (and the same number to every output bias) leaves the loss
    unchanged. The tangents are constant (a translation), so they are Hessian null
    vectors at every point (Kunin et al. 2021). Columns ``0..width-1``
    shift column ``i`` of every row by one; the last column shifts the bias.

    Args:
        params: the network, with ``f"{layer_in}.weight"``/``.bias`` and
            ``f"{layer_out}.weight"``/``.bias``.
        layer_in: the name prefix of the hidden (first) layer.
        layer_out: the name prefix of the output (softmax) layer.

    Returns:
        An ``(n, width + 1)`` array of the tangents, flattened like
        :func:`lossgeom.parameters.flatten_params` (zero outside the output layer).

    Raises:
        TypeError: if ``params`` is not a non-empty dict.
        ValueError: on missing parameter names or inconsistent shapes.
    """
    _, _, w_out, b_out = _two_layer(params, layer_in, layer_out)
    k, width = params[w_out].shape
    columns = []
    for i in range(width):
        shift = torch.zeros(k, width, dtype=params[w_out].dtype)
        shift[:, i] = 1.0
        columns.append(_flat_direction(params, {w_out: shift}))
    columns.append(_flat_direction(params, {b_out: torch.ones(k, dtype=params[b_out].dtype)}))
    return np.stack(columns, axis=1)


def data_blind_directions(
    params: Params,
    x: torch.Tensor,
    layer_in: str,
    layer_out: str,
    *,
    within_units: bool = False,
    tol: float = 1e-10,
) -> np.ndarray:
    """First-layer directions of a two-layer ReLU network that no training output registers.

    For ``f(x) = W2 relu(W1 x + b1) + b2`` a first-layer change ``(dW1, db1)`` moves the
    logits of example ``i`` by ``W2 D_i (dW1 x_i + db1)`` to first order, ``D_i`` the 0/1
    activation pattern of ``x_i``. Softmax ignores multiples of the all-ones vector, so the
    change is invisible on the data iff ``P W2 D_i (dW1 x_i + db1) = 0`` for every ``i``,
    ``P = I - 11^T / K``. Such directions are exact null vectors of the Gauss-Newton matrix
    wherever the softmax probabilities are positive, and of the Hessian where the residuals
    vanish too. They come from the data (pixels seen by few images, units whose active
    inputs are rank-deficient), not from a symmetry of the model (Sagun et al. 2017).

    Args:
        params: the network, with ``f"{layer_in}.weight"``/``.bias`` and
            ``f"{layer_out}.weight"``/``.bias``.
        x: the training inputs, shape ``(N, d)``.
        layer_in: the name prefix of the first (ReLU) layer.
        layer_out: the name prefix of the output layer.
        within_units: if True, return only directions that move one unit's weights with
            ``dW1_j x_i + db1_j = 0`` on every example where unit ``j`` is active (the rank
            deficit of that unit's active inputs); these change no logit at all.
        tol: singular values below ``tol`` times the largest count as zero.

    Returns:
        An ``(n, k)`` array whose columns are an orthonormal basis of those directions,
        flattened like :func:`flatten_params` (zero outside the first layer).

    Raises:
        TypeError: if ``params`` is not a non-empty dict, or ``x`` is not array-like.
        ValueError: on inconsistent parameter names or shapes, or ``x`` of the wrong width.
    """
    w_in, b_in, w_out, _ = _two_layer(params, layer_in, layer_out)
    x = finite_tensor("x", x)
    width, d = params[w_in].shape
    if x.ndim != 2 or x.shape[1] != d:
        raise ValueError(f"x must have shape (N, {d}) for {w_in} of shape {(width, d)}, got {tuple(x.shape)}")
    tol = positive("tol", tol)
    with torch.no_grad():
        active = ((x @ params[w_in].T + params[b_in]) > 0).numpy().astype(np.float64)
    inputs = np.concatenate([x.numpy(), np.ones((x.shape[0], 1))], axis=1)  # (N, d + 1)

    def kernel(matrix: np.ndarray) -> np.ndarray:
        if matrix.shape[0] == 0:
            return np.eye(matrix.shape[1])
        r = np.linalg.qr(matrix, mode="r") if matrix.shape[0] > matrix.shape[1] else matrix
        _, sing, vt = np.linalg.svd(r)
        sing = np.concatenate([sing, np.zeros(vt.shape[0] - sing.size)])
        return vt[sing <= tol * max(sing.max(), 1e-300)].T

    def embed(blocks: np.ndarray) -> np.ndarray:  # (width, d + 1, k) -> (n, k)
        columns = []
        for c in range(blocks.shape[2]):
            pieces = {w_in: torch.from_numpy(blocks[:, :d, c].copy()), b_in: torch.from_numpy(blocks[:, d, c].copy())}
            columns.append(_flat_direction(params, pieces))
        return np.stack(columns, axis=1) if columns else np.zeros((flatten_params(params)[0].numel(), 0))

    if within_units:
        blocks = []
        for j in range(width):
            null = kernel(inputs[active[:, j] > 0])
            for c in range(null.shape[1]):
                block = np.zeros((width, d + 1))
                block[j] = null[:, c]
                blocks.append(block)
        return embed(np.stack(blocks, axis=2) if blocks else np.zeros((width, d + 1, 0)))
    k = params[w_out].shape[0]
    centred = (np.eye(k) - 1.0 / k) @ params[w_out].numpy()  # P W2, (K, width)
    jacobian = np.einsum("kj,ij,ia->ikja", centred, active, inputs).reshape(-1, width * (d + 1))
    null = kernel(jacobian)
    return embed(null.reshape(width, d + 1, -1))

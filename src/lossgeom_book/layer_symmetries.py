"""Function-preserving moves of whole model states (parameters and buffers), Chapter 13.

The symmetries of :mod:`lossgeom_book.architectures`' models act on ``state_dict()``, so
the eval-mode BatchNorm scale invariance is exact (the running statistics move along):
:func:`bn_scale` (``W -> c W``, ``mu -> c mu``, ``var -> c^2 (var + eps) - eps``),
:func:`affine_rescale` (a BN or LN affine times ``c``, its readers' input columns over
``c``), :func:`relu_rescale`, :func:`channel_permutation`, :func:`attention_gauge` (per
head ``W_Q A, W_K A^-T, W_V B, B^-1 W_O``) and :func:`head_permutation`.
:func:`transformed` applies one to an eval-mode copy of a model, :func:`output_gap`
compares the two; :func:`resnet_symmetries` draws the ResNet's moves, and the tangent
helpers (:func:`attention_gauge_tangents`, :func:`resnet_scale_tangents`),
:func:`curvature_along` and :func:`train_mode_alignment` measure what they do to the
Hessian and the gradient. The chapter's registry-independent reference: the library's
registry (:func:`lossgeom.symmetries.find_symmetries`) is what a researcher would call.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

State = dict[str, torch.Tensor]
StateMap = Callable[[Mapping[str, torch.Tensor]], State]


# --------------------------------------------------------------------------- state symmetries


def transformed(model: nn.Module, transform: StateMap) -> nn.Module:
    """An eval-mode copy of ``model`` whose state (parameters and buffers) is ``transform(state)``."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    twin = copy.deepcopy(model).eval()
    twin.load_state_dict(transform(state))
    return twin


def output_gap(model: nn.Module, other: nn.Module, x: torch.Tensor) -> float:
    """``max |f(x) - g(x)| / max |f(x)|`` of two eval-mode models on ``x``."""
    with torch.no_grad():
        a, b = model.eval()(x), other.eval()(x)
    return float((a - b).abs().max() / a.abs().max())


def _in_columns(t: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Divide the input columns (axis 1) of a Linear or Conv weight by ``scale``."""
    return t / scale.reshape((1, -1) + (1,) * (t.ndim - 2))


def bn_scale(conv: str, bn: str, c: torch.Tensor, eps: float = 1e-5) -> StateMap:
    """``W -> c W`` on the channels of ``conv`` that feed ``bn``, with ``mu -> c mu`` and
    ``var -> c^2 (var + eps) - eps``: exact in eval mode, since
    ``(c z - c mu) / sqrt(c^2 (var + eps)) = (z - mu) / sqrt(var + eps)``."""

    def apply(s):
        s = dict(s)
        s[f"{conv}.weight"] = s[f"{conv}.weight"] * c.reshape(-1, *[1] * (s[f"{conv}.weight"].ndim - 1))
        s[f"{bn}.running_mean"] = s[f"{bn}.running_mean"] * c
        s[f"{bn}.running_var"] = c**2 * (s[f"{bn}.running_var"] + eps) - eps
        return s

    return apply


def affine_rescale(norms: Sequence[str], readers: Sequence[str], c: torch.Tensor) -> StateMap:
    """``(gamma, beta) -> c (gamma, beta)`` for each norm in ``norms`` (their outputs are summed),
    the input columns of each layer in ``readers`` (a module name, or a weight's own name
    such as ``"...self_attn.in_proj_weight"``) divided by ``c``. Exact through a ReLU
    (``c > 0``) or directly into a linear map; the norms' ``eps`` is untouched."""

    def apply(s):
        s = dict(s)
        for n in norms:
            s[f"{n}.weight"], s[f"{n}.bias"] = s[f"{n}.weight"] * c, s[f"{n}.bias"] * c
        for r in readers:
            key = r if r.endswith("weight") else f"{r}.weight"
            s[key] = _in_columns(s[key], c)
        return s

    return apply


def channel_permutation(
    producers: Sequence[str], norms: Sequence[str], readers: Sequence[str], perm: torch.Tensor
) -> StateMap:
    """Permute channels: rows of each producer's weight, every entry of each BatchNorm
    (affine and running statistics), input columns of each reader."""

    def apply(s):
        s = dict(s)
        for n in producers:
            s[f"{n}.weight"] = s[f"{n}.weight"][perm]
        for n in norms:
            for key in ("weight", "bias", "running_mean", "running_var"):
                s[f"{n}.{key}"] = s[f"{n}.{key}"][perm]
        for r in readers:
            s[f"{r}.weight"] = s[f"{r}.weight"][:, perm]
        return s

    return apply


def _head_rows(d: int, h: int, head: int, part: int) -> slice:
    dk = d // h
    return slice(part * d + head * dk, part * d + (head + 1) * dk)


def attention_gauge(
    attn: str, d_model: int, n_heads: int, A: Sequence[torch.Tensor], B: Sequence[torch.Tensor]
) -> StateMap:
    """Per head ``(W_Q, W_K) -> (W_Q A, W_K A^-T)`` and ``(W_V, W_O) -> (W_V B, B^-1 W_O)``.

    ``W_Q = in_proj_weight[q rows]^T`` in torch's layout (queries ``x W_Q + b_Q``), so the
    rows change as ``A^T W``, the biases along with them; ``out_proj.weight``'s columns of
    the head change as ``W B^-T``. Exact: ``q A (k A^-T)^T = q k^T``.
    """

    def apply(s):
        s = dict(s)
        w, b = s[f"{attn}.in_proj_weight"].clone(), s[f"{attn}.in_proj_bias"].clone()
        out = s[f"{attn}.out_proj.weight"].clone()
        for i in range(n_heads):
            Ainv = torch.linalg.inv(A[i])
            for part, M in ((0, A[i].T), (1, Ainv), (2, B[i].T)):
                rows = _head_rows(d_model, n_heads, i, part)
                w[rows], b[rows] = M @ w[rows], M @ b[rows]
            cols = _head_rows(d_model, n_heads, i, 0)
            out[:, cols] = out[:, cols] @ torch.linalg.inv(B[i]).T
        s[f"{attn}.in_proj_weight"], s[f"{attn}.in_proj_bias"] = w, b
        s[f"{attn}.out_proj.weight"] = out
        return s

    return apply


def relu_rescale(producer: str, reader: str, c: torch.Tensor) -> StateMap:
    """Rows of ``producer`` (weight and bias) times ``c > 0``, input columns of ``reader`` over ``c``:
    ``relu(c z) = c relu(z)`` (the FFN's hidden units)."""

    def apply(s):
        s = dict(s)
        s[f"{producer}.weight"] = s[f"{producer}.weight"] * c[:, None]
        s[f"{producer}.bias"] = s[f"{producer}.bias"] * c
        s[f"{reader}.weight"] = _in_columns(s[f"{reader}.weight"], c)
        return s

    return apply


def head_permutation(attn: str, d_model: int, n_heads: int, order: Sequence[int]) -> StateMap:
    """Reorder the heads: their q, k, v rows (and biases) and their ``out_proj`` columns."""
    dk = d_model // n_heads
    idx = torch.cat([torch.arange(h * dk, (h + 1) * dk) for h in order])

    def apply(s):
        s = dict(s)
        w, b = s[f"{attn}.in_proj_weight"], s[f"{attn}.in_proj_bias"]
        rows = torch.cat([idx + part * d_model for part in range(3)])
        s[f"{attn}.in_proj_weight"], s[f"{attn}.in_proj_bias"] = w[rows], b[rows]
        s[f"{attn}.out_proj.weight"] = s[f"{attn}.out_proj.weight"][:, idx]
        return s

    return apply


def attention_gauge_tangents(model: nn.Module, attn: str, d_model: int, n_heads: int) -> torch.Tensor:
    """The tangents of :func:`attention_gauge` at ``A = B = I``: ``(n_params, h (d_k^2 + d_v^2))``.

    Columns are ``d theta / d X_ij`` for ``A_i = I + X`` (then ``B_i``), by forward-mode
    differentiation, rows in the order of ``model.named_parameters()``.
    """
    names = [k for k, _ in model.named_parameters()]
    base = {k: v.detach() for k, v in model.state_dict().items()}
    dk = d_model // n_heads
    eye = torch.eye(dk, dtype=torch.float64)

    def flat(z):
        X = z.reshape(2, n_heads, dk, dk)
        new = attention_gauge(attn, d_model, n_heads, list(eye + X[0]), list(eye + X[1]))(base)
        return torch.cat([new[k].reshape(-1) for k in names])

    return torch.func.jacfwd(flat)(torch.zeros(2 * n_heads * dk * dk, dtype=torch.float64))


# --------------------------------------------------------------------------- the ResNet's symmetries


def resnet_symmetries(model: nn.Module, size: float = 3.0, seed: int = 0) -> dict[str, StateMap]:
    """The function-preserving transforms of a :class:`DigitsResNet`, sizes drawn with ``seed``.

    Scales are ``exp(u log size)``, ``u`` uniform in ``[-1, 1]``, one per channel.
    """
    w, g = model.width, torch.Generator().manual_seed(seed)
    draw = lambda n: torch.exp((2 * torch.rand(n, generator=g, dtype=torch.float64) - 1) * np.log(size))
    bn_pairs = [
        ("conv", "bn", w),
        ("block1.conv1", "block1.bn1", w),
        ("block1.conv2", "block1.bn2", w),
        ("block2.conv1", "block2.bn1", 2 * w),
        ("block2.conv2", "block2.bn2", 2 * w),
        ("block2.shortcut.0", "block2.shortcut.1", 2 * w),
    ]
    scales = [bn_scale(c, b, draw(n)) for c, b, n in bn_pairs]
    return {
        "BN scale (all 6 BN layers)": lambda s: _chain(scales, s),
        "BN affine through ReLU (block hidden units)": lambda s: _chain(
            [
                affine_rescale(["block1.bn1"], ["block1.conv2"], draw(w)),
                affine_rescale(["block2.bn1"], ["block2.conv2"], draw(2 * w)),
            ],
            s,
        ),
        "residual-stream rescaling": lambda s: _chain(
            [
                affine_rescale(["bn", "block1.bn2"], ["block1.conv1", "block2.conv1", "block2.shortcut.0"], draw(w)),
                affine_rescale(["block2.bn2", "block2.shortcut.1"], ["fc"], draw(2 * w)),
            ],
            s,
        ),
        "block hidden-unit permutation": channel_permutation(
            ["block2.conv1"], ["block2.bn1"], ["block2.conv2"], torch.randperm(2 * w, generator=g)
        ),
    }


def _chain(maps: Sequence[StateMap], s: Mapping[str, torch.Tensor]) -> State:
    s = dict(s)
    for m in maps:
        s = m(s)
    return s


def resnet_scale_tangents(model: nn.Module) -> torch.Tensor:
    """Tangents of the ResNet's continuous moves at the identity: ``(n_params, 15 w)``.

    One column per log-scale: the 9w BN scales (``d W = W`` on a channel's rows), the 3w BN
    affine rescalings inside the blocks and the 3w residual-stream rescalings, by
    forward-mode differentiation of the transforms (parameters only, in
    ``named_parameters()`` order). Its rank is the dimension of the continuous symmetry
    group these moves generate at this point.
    """
    w, names = model.width, [k for k, _ in model.named_parameters()]
    base = {k: v.detach() for k, v in model.state_dict().items()}
    convs = [
        ("conv", "bn", w),
        ("block1.conv1", "block1.bn1", w),
        ("block1.conv2", "block1.bn2", w),
        ("block2.conv1", "block2.bn1", 2 * w),
        ("block2.conv2", "block2.bn2", 2 * w),
        ("block2.shortcut.0", "block2.shortcut.1", 2 * w),
    ]
    affine = [
        (["block1.bn1"], ["block1.conv2"], w),
        (["block2.bn1"], ["block2.conv2"], 2 * w),
        (["bn", "block1.bn2"], ["block1.conv1", "block2.conv1", "block2.shortcut.0"], w),
        (["block2.bn2", "block2.shortcut.1"], ["fc"], 2 * w),
    ]

    def flat(z):
        maps, k = [], 0
        for c, b, n in convs:
            maps.append(bn_scale(c, b, torch.exp(z[k : k + n])))
            k += n
        for norms, readers, n in affine:
            maps.append(affine_rescale(norms, readers, torch.exp(z[k : k + n])))
            k += n
        new = _chain(maps, base)
        return torch.cat([new[k].reshape(-1) for k in names])

    return torch.func.jacfwd(flat)(torch.zeros(15 * w, dtype=torch.float64))


def curvature_along(model: nn.Module, data: tuple, direction: Mapping[str, torch.Tensor]) -> float:
    """``v^T H v / |v|^2`` of the mean cross-entropy (eval mode) along ``v`` (a parameter dict)."""
    x, y = data
    params = {k: v.detach() for k, v in model.named_parameters()}
    v = {k: direction.get(k, torch.zeros_like(p)) for k, p in params.items()}
    loss = lambda q: nn.functional.cross_entropy(torch.func.functional_call(model.eval(), q, (x,)), y)
    _, hv = torch.func.jvp(torch.func.grad(loss), (params,), (v,))
    return float(sum((hv[k] * v[k]).sum() for k in v) / sum((t**2).sum() for t in v.values()))


def train_mode_alignment(model: nn.Module, data: tuple, eps: float | None = None) -> dict[str, float]:
    """``<grad_W L, W> / (|grad_W L| |W|)`` for every weight that feeds a BatchNorm, in train mode.

    The loss is the cross-entropy with batch statistics on ``data`` (running statistics
    untouched); ``eps`` replaces every BatchNorm's ``eps`` when given (``0``: the exact
    scale invariance). Keys are the weights' names.
    """
    twin = copy.deepcopy(model).train()
    for m in twin.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.track_running_stats = False
            m.eps = m.eps if eps is None else float(eps)
    params = {k: v.detach() for k, v in twin.named_parameters()}
    loss = lambda q: nn.functional.cross_entropy(torch.func.functional_call(twin, q, (data[0],)), data[1])
    g = torch.func.grad(loss)(params)
    fed = [k for k in params if k.endswith("weight") and params[k].ndim > 1 and not k.startswith(("fc", "out"))]
    return {k: float((g[k] * params[k]).sum() / (g[k].norm() * params[k].norm())) for k in fed}

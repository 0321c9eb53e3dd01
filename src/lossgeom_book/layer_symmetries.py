"""What Chapter 13 measures about the symmetries of a BatchNorm ResNet and a transformer.

The transforms themselves are the library's (:mod:`lossgeom.symmetries`:
:func:`~lossgeom.symmetries.batchnorm_scale_invariance` with the running statistics moved
along, :func:`~lossgeom.symmetries.relu_neuron_rescaling` of a BN affine through its ReLU,
:func:`~lossgeom.symmetries.batchnorm_channel_permutation`,
:func:`~lossgeom.symmetries.layernorm_rescaling`,
:func:`~lossgeom.symmetries.attention_head_gauge`, :func:`~lossgeom.symmetries.head_permutation`).
This module keeps what is the book's own:

- :func:`residual_stream_rescaling`, the one transform the chapter needs that the
  library's registry lists as not audited (a residual stream's channels are read by the
  skip connections as well as the next layer);
- :func:`batchnorm_parameter_rescaling`, the eval-mode batch-norm scale move that keeps the
  running statistics fixed (parameters only), whose tangents the chapter counts;
- :func:`resnet_symmetries`, the chapter's draws of the :class:`~lossgeom_book.architectures.DigitsResNet`'s moves;
- :func:`symmetry_tangents` (forward-mode tangents of a family of symmetries at the
  identity) and the two families the chapter counts (:func:`resnet_scale_tangents`,
  :func:`attention_gauge_tangents`);
- :func:`curvature_along`, :func:`train_mode_alignment` and :func:`eval_mode_alignment`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
import torch.autograd.forward_ad as fwAD
from torch import nn

from lossgeom import symmetries
from lossgeom.formatting import fmt
from lossgeom.parameters import params_of
from lossgeom.symmetries import Symmetry

#: The DigitsResNet's (producer, batch norm, width in units of ``model.width``) pairs.
RESNET_BN = (
    ("conv", "bn", 1),
    ("block1.conv1", "block1.bn1", 1),
    ("block1.conv2", "block1.bn2", 1),
    ("block2.conv1", "block2.bn1", 2),
    ("block2.conv2", "block2.bn2", 2),
    ("block2.shortcut.0", "block2.shortcut.1", 2),
)
#: The BN affines inside its blocks that pass a ReLU, as (batch norm, reader, width / model.width).
RESNET_AFFINE = (("block1.bn1", "block1.conv2", 1), ("block2.bn1", "block2.conv2", 2))
#: The two residual streams, as (the norms summed into it, the layers reading it, width / model.width).
RESNET_STREAMS = (
    (("bn", "block1.bn2"), ("block1.conv1", "block2.conv1", "block2.shortcut.0"), 1),
    (("block2.bn2", "block2.shortcut.1"), ("fc",), 2),
)


def residual_stream_rescaling(norms: Sequence[str], readers: Sequence[str], scales) -> Symmetry:
    """Rescale a residual stream channel by channel: every norm summed into it times ``c``, its readers over ``c``.

    The stream is ``relu(sum of the norms' outputs)``; with each norm's ``(gamma, beta)``
    times ``c_j > 0`` it becomes ``c_j`` times itself (``relu(c z) = c relu(z)``), and every
    layer reading it (input channel ``j`` of its weight divided by ``c_j``) sees the old
    values. The norms' statistics and ``eps`` are untouched, so it is exact.

    Args:
        norms: name prefixes of the batch norms whose outputs are summed into the stream.
        readers: name prefixes of the Linear/Conv layers that read it.
        scales: one positive factor per channel.

    Returns:
        A :class:`~lossgeom.symmetries.Symmetry` on the parameter dict.
    """
    c = torch.as_tensor(scales, dtype=torch.float64)
    if c.ndim != 1 or not bool((c > 0).all()):
        raise ValueError("scales must be a 1-D sequence of positive factors, one per channel")

    def transform(params):
        out = dict(params)
        for n in norms:
            out[f"{n}.weight"], out[f"{n}.bias"] = params[f"{n}.weight"] * c, params[f"{n}.bias"] * c
        for r in readers:
            w = params[f"{r}.weight"]
            out[f"{r}.weight"] = w / c.reshape((1, -1) + (1,) * (w.ndim - 2))
        return out

    return Symmetry(
        f"residual-stream rescaling {', '.join(norms)} -> {', '.join(readers)} ({c.numel()} channels, "
        f"c in [{fmt(float(c.min()), 4)}, {fmt(float(c.max()), 4)}])",
        transform,
    )


def batchnorm_parameter_rescaling(layer: str, norm: str, scales, *, eps: float) -> Symmetry:
    """An eval-mode batch norm's scale move on parameters only, its running statistics fixed.

    With ``s = sqrt(var + eps)`` the channel computes ``gamma (z - mu) / s + beta``. Row
    ``j`` of ``f"{layer}.weight"`` (and its bias, if any) times ``c_j > 0``,
    ``gamma_j -> gamma_j / c_j`` and ``beta_j -> beta_j - gamma_j mu_j (1 - 1/c_j) / s_j``
    give ``(gamma / c)(c z - mu) / s + beta' = gamma (z - mu) / s + beta``: the eval-mode
    function is unchanged with ``mu`` and ``var`` untouched, ``eps`` included. Unlike
    :func:`lossgeom.symmetries.batchnorm_scale_invariance` (which moves the statistics and
    leaves ``gamma, beta`` alone) it is a symmetry of the loss as a function of the
    parameters alone, so its tangents are directions in which that loss is constant.

    Args:
        layer: name prefix of the Linear/Conv layer read only by the batch norm.
        norm: name prefix of the batch norm (eval mode, with running statistics and an affine).
        scales: one positive factor per channel.
        eps: the batch norm's ``eps``.

    Returns:
        A :class:`~lossgeom.symmetries.Symmetry` that reads (and does not change) the
        running statistics: call it on ``lossgeom.parameters.params_of(model, buffers=True)`` or use ``.applied``.
    """
    c = torch.as_tensor(scales, dtype=torch.float64)
    if c.ndim != 1 or not bool((c > 0).all()):
        raise ValueError("scales must be a 1-D sequence of positive factors, one per channel")
    if not float(eps) >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    mean, var = f"{norm}.running_mean", f"{norm}.running_var"

    def transform(params):
        out = dict(params)
        w = params[f"{layer}.weight"]
        out[f"{layer}.weight"] = w * c.reshape((-1,) + (1,) * (w.ndim - 1))
        if f"{layer}.bias" in params:
            out[f"{layer}.bias"] = params[f"{layer}.bias"] * c
        gamma, s = params[f"{norm}.weight"], torch.sqrt(params[var] + float(eps))
        out[f"{norm}.weight"] = gamma / c
        out[f"{norm}.bias"] = params[f"{norm}.bias"] - gamma * params[mean] * (1 - 1 / c) / s
        return out

    return Symmetry(
        f"batch-norm scale {layer} -> {norm}, statistics fixed ({c.numel()} channels, "
        f"c in [{fmt(float(c.min()), 4)}, {fmt(float(c.max()), 4)}])",
        transform,
        buffers=(mean, var),
    )


def _bn_eps(model: nn.Module, name: str) -> float:
    return float(model.get_submodule(name).eps)


def resnet_moves(
    model: nn.Module, scales: Callable[[int], torch.Tensor], *, statistics: str = "moved"
) -> dict[str, list[Symmetry]]:
    """The DigitsResNet's continuous moves, by kind, each factor vector drawn by ``scales(n)``.

    ``statistics="moved"``: the BN scale is the library's
    :func:`~lossgeom.symmetries.batchnorm_scale_invariance` (running statistics moved along,
    ``gamma, beta`` kept); ``"fixed"``: :func:`batchnorm_parameter_rescaling` (statistics
    kept, ``gamma, beta`` moved). The other moves act on parameters only either way.
    """
    if statistics not in ("moved", "fixed"):
        raise ValueError(f"statistics must be 'moved' or 'fixed', got {statistics!r}")
    bn_move = symmetries.batchnorm_scale_invariance if statistics == "moved" else batchnorm_parameter_rescaling
    w = model.width
    return {
        "BN scale": [bn_move(a, b, scales(k * w), eps=_bn_eps(model, b)) for a, b, k in RESNET_BN],
        "BN affine": [
            symmetries.relu_neuron_rescaling(b, r, scales(k * w), units_last=False) for b, r, k in RESNET_AFFINE
        ],
        "residual stream": [residual_stream_rescaling(n, r, scales(k * w)) for n, r, k in RESNET_STREAMS],
    }


def resnet_symmetries(model: nn.Module, size: float = 3.0, seed: int = 0) -> dict[str, Symmetry]:
    """The function-preserving moves of a :class:`DigitsResNet`, sizes drawn with ``seed``.

    Scales are ``exp(u log size)``, ``u`` uniform in ``[-1, 1]``, one per channel; the
    permutation is of ``block2``'s hidden channels.
    """
    g = torch.Generator().manual_seed(seed)
    draw = lambda n: torch.exp((2 * torch.rand(n, generator=g, dtype=torch.float64) - 1) * np.log(size))
    moves = resnet_moves(model, draw)
    perm = torch.randperm(2 * model.width, generator=g)
    names = {
        "BN scale": "BN scale (all 6 BN layers)",
        "BN affine": "BN affine through ReLU (block hidden units)",
        "residual stream": "residual-stream rescaling",
    }
    out = {names[k]: symmetries.compose(v, names[k]) for k, v in moves.items()}
    out["block hidden-unit permutation"] = symmetries.batchnorm_channel_permutation(
        "block2.conv1", "block2.bn1", "block2.conv2", perm, units_last=False
    )
    return out


def symmetry_tangents(
    model: nn.Module, parts: Sequence[tuple[int, Callable[[torch.Tensor], Symmetry]]]
) -> torch.Tensor:
    """``d theta / d z`` at ``z = 0`` of families of symmetries ``z_k -> family_k(z_k)``: ``(n_params, sum dim_k)``.

    Each part is ``(dim_k, family_k)`` with ``family_k(0)`` the identity; at the identity the
    tangent of their composition is the sum of theirs, so column ``j`` is the
    forward-mode derivative of the parameters moved by its own family alone (in the order
    of ``model.named_parameters()``, buffers left out), one dual pass per column.
    """
    names = [k for k, _ in model.named_parameters()]
    state = params_of(model, buffers=True)
    columns = []
    for dim, family in parts:
        for j in range(dim):
            with fwAD.dual_level():
                z = fwAD.make_dual(torch.zeros(dim, dtype=torch.float64), torch.eye(dim, dtype=torch.float64)[j])
                moved = family(z)(state)
                tangents = [fwAD.unpack_dual(moved[k]).tangent for k in names]
            columns.append(
                torch.cat(
                    [
                        torch.zeros(state[k].numel(), dtype=state[k].dtype) if t is None else t.reshape(-1)
                        for k, t in zip(names, tangents)
                    ]
                )
            )
    return torch.stack(columns, dim=1)


def resnet_scale_tangents(model: nn.Module, *, statistics: str = "fixed") -> torch.Tensor:
    """Tangents in parameter space of the ResNet's continuous moves at the identity: ``(n_params, 15 w)``.

    One column per log-scale: the 9w BN scales, the 3w BN-affine rescalings inside the
    blocks and the 3w residual-stream rescalings (:func:`resnet_moves` with ``statistics``,
    one symmetry at a time); buffers are left out. With ``statistics="fixed"`` every
    column is the tangent of a symmetry of the eval-mode loss as a function of the
    parameters, and the rank is the dimension of the group these moves generate at this
    point; with ``"moved"`` the BN-scale columns are only the parameter part of a move that
    also changes the running statistics (``W`` alone along its rows).
    """
    parts = []
    for i, (n, _) in enumerate(_resnet_widths(model)):
        parts.append((n, lambda z, i=i: _nth_move(model, i, torch.exp(z), statistics)))
    return symmetry_tangents(model, parts)


def _resnet_widths(model: nn.Module) -> list[tuple[int, str]]:
    w = model.width
    return [
        (k * w, kind)
        for kind, table in (("bn", RESNET_BN), ("affine", RESNET_AFFINE), ("stream", RESNET_STREAMS))
        for *_, k in table
    ]


def _nth_move(model: nn.Module, i: int, scales: torch.Tensor, statistics: str) -> Symmetry:
    """The ``i``-th continuous move of :func:`resnet_moves` (in its order) with the factors ``scales``."""
    sizes = [n for n, _ in _resnet_widths(model)]
    filled = [scales if j == i else torch.ones(n, dtype=torch.float64) for j, n in enumerate(sizes)]
    it = iter(filled)
    moves = resnet_moves(model, lambda n: next(it), statistics=statistics)
    return [s for group in moves.values() for s in group][i]


def attention_gauge_tangents(model: nn.Module, attn: str, n_heads: int) -> torch.Tensor:
    """Tangents of every head's gauge at ``A = B = I``: ``(n_params, h (d_k^2 + d_v^2))``.

    Columns are ``d theta / d X_ij`` for ``A_i = I + X`` (every head, then ``B_i``) of
    :func:`lossgeom.symmetries.attention_head_gauge`.
    """
    d = model.get_submodule(attn).head_dim
    eye = torch.eye(d, dtype=torch.float64)

    def gauge(i, which, z):
        X = z.reshape(d, d)
        A, B = (eye + X, eye) if which == 0 else (eye, eye + X)
        return symmetries.attention_head_gauge(attn, i, n_heads, A, B)

    return symmetry_tangents(
        model, [(d * d, lambda z, i=i, w=w: gauge(i, w, z)) for w in (0, 1) for i in range(n_heads)]
    )


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
    return _alignment(twin, data)


def eval_mode_alignment(model: nn.Module, data: tuple) -> dict[str, float]:
    """``<grad_W L, W> / (|grad_W L| |W|)`` for every weight that feeds a BatchNorm, in eval mode.

    The loss is the cross-entropy with the running statistics held fixed (buffers, not
    parameters). ``L(cW)`` then differs from ``L(W)``: the eval-mode invariance needs the
    statistics moved along, so nothing makes this cosine zero. Keys are the weights' names.
    """
    return _alignment(copy.deepcopy(model).eval(), data)


def _alignment(twin: nn.Module, data: tuple) -> dict[str, float]:
    params = {k: v.detach() for k, v in twin.named_parameters()}
    loss = lambda q: nn.functional.cross_entropy(torch.func.functional_call(twin, q, (data[0],)), data[1])
    g = torch.func.grad(loss)(params)
    fed = [k for k in params if k.endswith("weight") and params[k].ndim > 1 and not k.startswith(("fc", "out"))]
    return {k: float((g[k] * params[k]).sum() / (g[k].norm() * params[k].norm())) for k in fed}

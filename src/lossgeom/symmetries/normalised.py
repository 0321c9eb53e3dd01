"""Symmetries of normalisation layers: batch norm in eval mode and layer norm feeding linear maps.

Each builder returns a :class:`~lossgeom.symmetries.core.Symmetry` on the dict of a
model's parameters (and, for batch norm, buffers:
``lossgeom.parameters.params_of(model, buffers=True)``):

- :func:`batchnorm_scale_invariance`: a Linear/Conv layer read only by a batch norm in
  eval mode, its rows times ``c_j > 0`` and the batch norm's running statistics moved
  along (``mean -> c mean``, ``var -> c^2 (var + eps) - eps``), so that
  ``sqrt(var' + eps) = c sqrt(var + eps)`` and the eval-mode function is unchanged;
- :func:`batchnorm_channel_permutation`: the channels of Conv -> BatchNorm -> activation
  -> Conv relabelled (producer rows, the batch norm's weight, bias and running
  statistics, reader columns);
- :func:`layernorm_rescaling`: a layer norm's ``(weight, bias)`` times ``c`` (per
  feature) and the weight of every linear map reading it divided by ``c``, exact for
  any ``eps`` (the normalisation itself is untouched); also through a ReLU.

The rescaling of a batch norm's affine parameters through a following ReLU is
:func:`~lossgeom.symmetries.layers.relu_neuron_rescaling` with the batch norm as the
first layer. The registry's searches for these places (``_batchnorm_symmetries``,
``_layernorm_symmetries``) are called by :func:`~lossgeom.symmetries.registry.find_symmetries`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch
from numpy.typing import ArrayLike
from torch import nn

from lossgeom.formatting import fmt
from lossgeom.symmetries.core import Symmetry
from lossgeom.symmetries.graph import (
    _CONVS,
    _consumers,
    _describe,
    _layout_problem,
    _log_uniform,
    _module,
    _tied,
    _unit_path,
)
from lossgeom.symmetries.layers import _along, relu_neuron_rescaling, unit_permutation
from lossgeom.types import Params

_BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def _positive_scales(scales: ArrayLike) -> torch.Tensor:
    scales = torch.as_tensor(scales, dtype=torch.float64)
    if scales.ndim != 1 or scales.numel() == 0:
        raise ValueError(f"scales must be a non-empty 1-D sequence (one per channel), got shape {tuple(scales.shape)}")
    if not torch.isfinite(scales).all() or not (scales > 0).all():
        raise ValueError("scales must be finite and > 0")
    return scales


def _need(kind: str, params: Params, keys: Iterable[str]) -> None:
    missing = sorted(set(keys) - set(params))
    if missing:
        raise ValueError(f"{kind} needs {missing} in the dict it is given")


def batchnorm_scale_invariance(layer: str, norm: str, scales: ArrayLike, *, eps: float) -> Symmetry:
    """Scale the channels of a layer read by an eval-mode batch norm, moving its running statistics along.

    Row ``j`` of ``f"{layer}.weight"`` and entry ``j`` of its bias (if present) are
    multiplied by ``c_j > 0``, ``running_mean_j -> c_j running_mean_j`` and
    ``running_var_j -> c_j^2 (running_var_j + eps) - eps``. Then
    ``(c z - c mean) / sqrt(var' + eps) = (z - mean) / sqrt(var + eps)``: the batch norm's
    eval-mode output, and every output of the model, is unchanged (its weight and bias
    are not touched). The symmetry acts on buffers: call it on
    ``lossgeom.parameters.params_of(model, buffers=True)`` or use
    :meth:`~lossgeom.symmetries.core.Symmetry.applied`.

    Args:
        layer: name prefix of the Linear or Conv layer whose only reader is the batch norm.
        norm: name prefix of the batch norm (``BatchNorm1d/2d/3d`` with running statistics).
        scales: one positive factor per channel.
        eps: the batch norm's ``eps``.

    Returns:
        A :class:`~lossgeom.symmetries.core.Symmetry` whose ``buffers`` name the running statistics.

    Raises:
        ValueError: if ``scales`` is not positive and finite, or ``eps`` is negative; and,
            conservatively, if a running variance would turn negative (``c_j < 1`` on a
            channel with ``running_var_j < eps``: the eval-mode function would stay exact,
            but the buffer would no longer be a valid variance).
    """
    c = _positive_scales(scales)
    if not float(eps) >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    eps = float(eps)
    weight, bias = f"{layer}.weight", f"{layer}.bias"
    mean, var = f"{norm}.running_mean", f"{norm}.running_var"

    def transform(params: Params) -> dict[str, torch.Tensor]:
        _need("batchnorm_scale_invariance", params, (weight, mean, var))
        if params[weight].shape[0] != c.numel() or params[mean].shape != (c.numel(),):
            raise ValueError(
                f"{c.numel()} scales, but {weight} has {params[weight].shape[0]} rows and {mean} "
                f"{tuple(params[mean].shape)} entries; they must agree"
            )
        scale = c.to(dtype=params[weight].dtype, device=params[weight].device)
        out = dict(params)
        out[weight] = params[weight] * _along(scale, params[weight].ndim, 0)
        if bias in params:
            out[bias] = params[bias] * scale
        out[mean] = params[mean] * scale
        out[var] = scale**2 * (params[var] + eps) - eps
        if not (out[var] >= 0).all():
            raise ValueError(
                f"batch-norm scale invariance of {layer} -> {norm}: refused conservatively, a running variance "
                "would become negative (a channel with running_var below its eps and a factor c < 1). Torch's "
                "eval-mode batch norm would still compute the same function (it divides by sqrt(var' + eps) = "
                "c sqrt(var + eps) > 0), but a negative running variance is not a valid batch-norm state"
            )
        return out

    return Symmetry(
        f"batch-norm scale invariance {layer} -> {norm} ({c.numel()} channels, c in "
        f"[{fmt(float(c.min()), 4)}, {fmt(float(c.max()), 4)}], running statistics moved along)",
        transform,
        buffers=(mean, var),
    )


def batchnorm_channel_permutation(
    layer: str, norm: str, reader: str, permutation: ArrayLike, *, units_last: bool
) -> Symmetry:
    """Relabel the channels of ``layer -> norm -> (element-wise) -> reader``.

    :func:`~lossgeom.symmetries.layers.unit_permutation` of ``layer -> reader`` with the
    batch norm's weight, bias, ``running_mean`` and ``running_var`` permuted the same way.

    Args:
        layer: name prefix of the Linear/Conv layer feeding the batch norm.
        norm: name prefix of the batch norm.
        reader: name prefix of the layer reading the (activated) channels.
        permutation: a permutation of ``0..width-1``.
        units_last: as in :func:`~lossgeom.symmetries.layers.unit_permutation` (matters with a Flatten).

    Returns:
        A :class:`~lossgeom.symmetries.core.Symmetry` whose ``buffers`` name the running statistics.
    """
    base = unit_permutation(layer, reader, permutation, units_last=units_last)
    perm = torch.as_tensor(permutation).to(torch.long)
    own = [f"{norm}.weight", f"{norm}.bias"]
    stats = (f"{norm}.running_mean", f"{norm}.running_var")

    def transform(params: Params) -> dict[str, torch.Tensor]:
        out = base.transform(params)
        for key in [*own, *stats]:
            if key in params:
                out[key] = params[key][perm.to(params[key].device)]
        return out

    return Symmetry(
        f"permutation {layer} -> {reader} (through {norm}, {perm.numel()} channels)", transform, buffers=stats
    )


def layernorm_rescaling(norm: str, readers: Sequence[str], scales: ArrayLike) -> Symmetry:
    """A layer norm's ``(weight, bias)`` times ``c`` (per feature), the weights reading it divided by ``c``.

    ``W (c * (gamma * n + beta)) / c = W (gamma * n + beta)`` for the normalised input
    ``n``, so every output is kept, for any ``eps`` (the normalisation is untouched). Each
    reader is a weight whose columns are the layer norm's features (a Linear weight, or
    the packed ``in_proj_weight`` of an attention layer: queries, keys and values alike);
    its bias is untouched. With a ReLU or LeakyReLU between them, the same (``c > 0``).

    Args:
        norm: name prefix of the ``nn.LayerNorm`` (over one trailing axis, with a weight).
        readers: the full names of the weights that read its output (``"fc.weight"``).
        scales: one positive factor per feature.

    Returns:
        A :class:`~lossgeom.symmetries.core.Symmetry` on the parameter dict.

    Raises:
        ValueError: if ``readers`` is empty or ``scales`` is not positive and finite.
    """
    c = _positive_scales(scales)
    readers = [readers] if isinstance(readers, str) else list(readers)
    if not readers:
        raise ValueError("readers must name at least one weight that reads the layer norm")
    weight, bias = f"{norm}.weight", f"{norm}.bias"

    def transform(params: Params) -> dict[str, torch.Tensor]:
        _need("layernorm_rescaling", params, (weight, *readers))
        scale = c.to(dtype=params[weight].dtype, device=params[weight].device)
        out = dict(params)
        out[weight] = params[weight] * scale
        if bias in params:
            out[bias] = params[bias] * scale
        for key in readers:
            if params[key].ndim != 2 or params[key].shape[1] != c.numel():
                raise ValueError(f"{key} must have {c.numel()} columns (the features of {norm})")
            out[key] = params[key] / scale
        return out

    return Symmetry(
        f"layer-norm rescaling {norm} -> {', '.join(r.removesuffix('.weight') for r in readers)} "
        f"({c.numel()} features, c in [{fmt(float(c.min()), 4)}, {fmt(float(c.max()), 4)}])",
        transform,
    )


def _producer(model: nn.Module, bn_node: torch.fx.Node) -> torch.fx.Node | None:
    """The Linear/Conv node whose output only the batch norm reads, else None."""
    source = bn_node.args[0] if bn_node.args else None
    if not isinstance(source, torch.fx.Node) or not isinstance(_module(model, source), (nn.Linear, *_CONVS)):
        return None
    return source if _consumers(source) == [bn_node] else None


def _batchnorm_refusal(bn: nn.Module, name: str, counts: Mapping[str, int]) -> str:
    if counts.get(name, 0) > 1:
        return f"batch norm {name!r} is called more than once"
    if bn.training:
        return f"batch norm {name!r} is in training mode (it normalises with the batch's statistics); call model.eval()"
    if not bn.track_running_stats or bn.running_mean is None or bn.running_var is None:
        return (
            f"batch norm {name!r} keeps no running statistics (track_running_stats=False), so in eval mode it "
            "normalises with the batch's statistics"
        )
    return ""


def _batchnorm_symmetries(
    model: nn.Module,
    bn_node: torch.fx.Node,
    names: Params,
    counts: Mapping[str, int],
    rescale: float,
    generator: torch.Generator,
    found: list[Symmetry],
    skipped: list[str],
) -> None:
    """The scale invariance, affine rescaling and channel permutation at the batch norm ``bn_node``."""
    bn, name = _module(model, bn_node), bn_node.target
    refusal = _batchnorm_refusal(bn, name, counts)
    if refusal:
        skipped.append(f"symmetries of {_describe(bn_node, bn)}: {refusal} (not audited)")
        return
    producer = _producer(model, bn_node)
    layer = _module(model, producer) if producer is not None else None
    if layer is None or counts.get(producer.target, 0) > 1 or f"{producer.target}.weight" not in names:
        skipped.append(
            f"symmetries of {_describe(bn_node, bn)}: it does not read one Linear or Conv layer alone (called once, "
            "with plain parameters), so its channels are not audited"
        )
        return
    tied = _tied(model, producer.target, name)
    if tied:
        skipped.append(f"symmetries of {_describe(bn_node, bn)}: {tied}")
        return
    width, pair = bn.num_features, f"{producer.target} -> {name}"
    scales = _log_uniform(width, rescale, generator)
    var = bn.running_var.detach().double().cpu()
    if bool((scales**2 * (var + bn.eps) - bn.eps < 0).any()):
        skipped.append(
            f"batch-norm scale invariance {pair}: refused conservatively, a drawn factor would make a running "
            "variance negative (c^2 (var + eps) < eps); the eval-mode function would stay exact, but a negative "
            "running variance is not a valid batch-norm state (not audited)"
        )
    else:
        found.append(batchnorm_scale_invariance(producer.target, name, scales, eps=bn.eps))
    _batchnorm_readers(model, bn_node, bn, layer, producer.target, names, counts, rescale, generator, found, skipped)


def _batchnorm_readers(
    model: nn.Module,
    bn_node: torch.fx.Node,
    bn: nn.Module,
    layer: nn.Module,
    producer: str,
    names: Params,
    counts: Mapping[str, int],
    rescale: float,
    generator: torch.Generator,
    found: list[Symmetry],
    skipped: list[str],
) -> None:
    """The affine rescaling through a ReLU and the channel permutation between the batch norm and its reader."""
    name, width = bn_node.target, bn.num_features
    conv = isinstance(layer, _CONVS)
    reader, homogeneous, activation, flattened, reason = _unit_path(model, bn_node, conv=conv)
    if reader is None:
        if not reason.startswith("its output is the model"):
            skipped.append(f"channels of {name!r} (after {producer!r}): {reason}")
        return
    target = reader.target
    problem = _layout_problem(layer, producer, _module(model, reader), target, flattened)
    if not problem and (counts.get(target, 0) > 1 or f"{target}.weight" not in names):
        problem = f"layer {target!r} is called more than once or its weight is shared"
    problem = problem or _tied(model, producer, name, target) or ""
    if problem:
        skipped.append(f"channels {name} -> {target}: {problem}")
        return
    pair = f"{name} -> {target}"
    if not homogeneous:
        skipped.append(f"rescaling {pair}: the activation ({activation}) is not positively homogeneous")
    elif not bn.affine:
        skipped.append(f"rescaling {pair}: {name!r} has no affine weight and bias (affine=False) to rescale")
    else:
        kind = "LeakyReLU" if "leaky" in activation.lower() else ("ReLU" if activation != "identity" else "identity")
        scales = _log_uniform(width, rescale, generator)
        moved = relu_neuron_rescaling(name, target, scales, units_last=not conv, activation=kind)
        found.append(
            Symmetry(
                f"{kind} rescaling {pair} (batch-norm affine, {width} channels, c in [1/{fmt(rescale)}, "
                f"{fmt(rescale)}])",
                moved.transform,
            )
        )
    if width < 2 or (conv and layer.groups != 1):
        skipped.append(f"permutation {producer} -> {target}: one channel, or a grouped convolution")
        return
    perm = torch.randperm(width, generator=generator)
    found.append(batchnorm_channel_permutation(producer, name, target, perm, units_last=not conv))


def _layernorm_symmetries(
    model: nn.Module,
    ln_node: torch.fx.Node,
    names: Params,
    counts: Mapping[str, int],
    rescale: float,
    generator: torch.Generator,
    found: list[Symmetry],
    skipped: list[str],
) -> None:
    """The rescaling of the layer norm ``ln_node``'s affine parameters against the linear maps reading it."""
    ln, name = _module(model, ln_node), ln_node.target
    where = f"layer-norm rescaling of {name!r}"
    if not ln.elementwise_affine or ln.weight is None:
        skipped.append(f"{where}: it has no affine weight (elementwise_affine=False)")
        return
    if len(ln.normalized_shape) != 1 or f"{name}.weight" not in names or counts.get(name, 0) > 1:
        skipped.append(f"{where}: it normalises more than one axis, is called twice or its weight is shared")
        return
    users = _consumers(ln_node)
    modules = [_module(model, user) for user in users]
    if users and all(isinstance(m, nn.Linear) and user.args[0] is ln_node for m, user in zip(modules, users)):
        readers = [user.target for user in users]
    else:
        reader, homogeneous, activation, flattened, reason = _unit_path(model, ln_node, conv=False)
        if reader is None or not isinstance(_module(model, reader), nn.Linear) or flattened:
            skipped.append(f"{where}: {reason or 'its reader is not a Linear layer reading its features'}")
            return
        if not homogeneous:
            skipped.append(
                f"{where}: the activation ({activation}) between it and {reader.target!r} is not positively homogeneous"
            )
            return
        readers = [reader.target]
    bad = [r for r in readers if counts.get(r, 0) > 1 or f"{r}.weight" not in names]
    tied = _tied(model, name, *readers)
    if bad or tied:
        skipped.append(f"{where}: {tied or f'{bad} are called twice or their weights are shared'}")
        return
    scales = _log_uniform(ln.normalized_shape[0], rescale, generator)
    found.append(layernorm_rescaling(name, [f"{r}.weight" for r in readers], scales))

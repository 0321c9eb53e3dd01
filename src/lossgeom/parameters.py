"""Parameters as one vector: flattening, names, dtype and device.

A curvature matrix of a loss ``L(theta)`` acts on the flattened parameter vector
``theta = concat(vec(p_1), ..., vec(p_m))``, the tensors of a parameter dict in its
insertion order (every curvature operator is built on it).
Row ``i`` of a Hessian therefore belongs to the parameter whose slice of ``theta``
holds ``i``; :func:`flatten_params` returns the vector and the inverse map.

A parameter dict meant for a model must name parameters of that model: a misspelt or
extra name would otherwise add rows the loss does not depend on (zero curvature) or
hold a real weight fixed. :func:`check_parameter_names` refuses such dicts, and
:func:`parameter_dtype` requires one floating dtype and one device, so that every
operator computes in the model's own precision.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping

import torch
from torch import nn

from lossgeom._validation import finite_tensor
from lossgeom.types import Params

Unflatten = Callable[[torch.Tensor], dict[str, torch.Tensor]]


def parameter_dtype(params: Params, argument: str = "params") -> tuple[torch.dtype, torch.device]:
    """The one floating dtype and device shared by every tensor of ``params``.

    Args:
        params: a non-empty dict of name -> floating-point tensor.
        argument: the name of the argument, used in error messages.

    Returns:
        ``(dtype, device)`` shared by every tensor of ``params``.

    Raises:
        TypeError: if ``params`` is not a dict of tensors.
        ValueError: if it is empty, or its tensors are not all floating point, or mix
            dtypes or devices.
    """
    if not isinstance(params, Mapping):
        raise TypeError(f"{argument} must be a non-empty dict of name -> tensor, got {type(params).__name__}")
    if not params:
        raise ValueError(f"{argument} must be a non-empty dict of name -> tensor, got an empty one")
    kinds = {}
    for name, value in params.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{argument}[{name!r}] must be a torch.Tensor, got {type(value).__name__}")
        if not torch.is_floating_point(value):
            raise ValueError(f"{argument}[{name!r}] must be a floating-point tensor, got {value.dtype}")
        kinds.setdefault((value.dtype, value.device), name)
    if len(kinds) > 1:
        found = ", ".join(f"{name!r} is {dtype} on {device}" for (dtype, device), name in kinds.items())
        raise ValueError(f"{argument} must hold one dtype on one device, got {found}; convert them with .to()")
    return next(iter(kinds))


def flatten_params(params: Params) -> tuple[torch.Tensor, Unflatten]:
    """Concatenate a parameter dict into one vector; return it and the inverse map.

    ``theta = concat(vec(params[k]) for k in params)`` in the dict's insertion order, so
    the rows of every curvature matrix follow that order. The vector keeps the tensors'
    dtype and device (one of each is required).

    Args:
        params: a non-empty dict of name -> finite floating-point tensor, one dtype and device.

    Returns:
        ``(theta, unflatten)``: the flat vector ``theta`` and the function mapping a vector of
        the same length back to a dict of tensors of the parameters' names and shapes.

    Raises:
        TypeError: if ``params`` is not a dict of tensors.
        ValueError: if it is empty, on non-finite entries, or on mixed dtypes or devices.
    """
    parameter_dtype(params)
    names = list(params)
    tensors = [finite_tensor(f"params[{name!r}]", params[name]) for name in names]
    shapes = [t.shape for t in tensors]
    sizes = [t.numel() for t in tensors]
    flat = torch.cat([t.reshape(-1) for t in tensors])

    def unflatten(vector: torch.Tensor) -> dict[str, torch.Tensor]:
        pieces = torch.split(vector, sizes)
        return {n: p.reshape(s) for n, p, s in zip(names, pieces, shapes)}

    return flat, unflatten


def check_parameter_names(
    model: nn.Module, names: Iterable[str], argument: str = "params", allow_buffers: bool = False
) -> None:
    """Refuse names that are not parameters (or, if allowed, buffers) of ``model``, and wrong shapes.

    A misspelt key in a dict passed to ``torch.func.functional_call`` is ignored by
    torch: the real weight is then held at its stored value and the misspelt key gets
    zero curvature rows. A tensor of the wrong but broadcastable shape (a bias of shape
    ``(1,)`` for one of shape ``(5,)``) runs and measures another model. This check turns
    both into errors: unknown names with the closest real names, and (when ``names`` is a
    dict of tensors) every shape that differs from the model's.

    Args:
        model: the model whose parameter (and buffer) names are allowed.
        names: the names to check, or a parameter dict (then its tensors' shapes are checked too).
        argument: the name of the argument, used in the error message.
        allow_buffers: whether names of the model's buffers are also allowed.

    Raises:
        ValueError: naming every unknown key and the closest parameter names, or every
            tensor whose shape is not the model's.
    """
    known = [name for name, _ in model.named_parameters()]
    if allow_buffers:
        known += [name for name, _ in model.named_buffers()]
    known_set = set(known)
    unknown = [name for name in names if name not in known_set]
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, known, n=1)
            hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ValueError(
            f"{argument} has names that are not parameters of the model: {', '.join(hints)}; "
            f"the model's parameters are {[n for n, _ in model.named_parameters()]}"
        )
    if isinstance(names, Mapping):
        shapes = {name: tuple(t.shape) for name, t in model.named_parameters()}
        if allow_buffers:
            shapes.update({name: tuple(t.shape) for name, t in model.named_buffers()})
        wrong = [
            f"{argument}[{name!r}] has shape {tuple(value.shape)}, the model's has {shapes[name]}"
            for name, value in names.items()
            if hasattr(value, "shape") and tuple(value.shape) != shapes[name]
        ]
        if wrong:
            raise ValueError("; ".join(wrong) + " (a broadcastable shape would silently measure another model)")


def params_of(
    model: nn.Module, *, buffers: bool = False, trainable_only: bool = False, copy: bool = True
) -> dict[str, torch.Tensor]:
    """The model's parameters (and, on request, buffers) as a dict of detached tensors.

    The functional form of a model's state: ``torch.func.functional_call(model, params, args)``
    runs the model at it, and every curvature operator, symmetry and training loop takes it.

    Args:
        model: the model whose ``named_parameters()`` are read.
        buffers: also take ``named_buffers()`` (after the parameters), what a symmetry that
            moves batch-norm statistics acts on.
        trainable_only: take only the parameters with ``requires_grad``.
        copy: return copies (``p.detach().clone()``, the default) rather than detached
            views of the model's own storage.

    Returns:
        ``{name: tensor}`` in the model's order, in its own dtype and device.

    Raises:
        TypeError: if ``model`` is not an ``nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad or not trainable_only]
    if buffers:
        named += list(model.named_buffers())
    return {name: (t.detach().clone() if copy else t.detach()) for name, t in named}

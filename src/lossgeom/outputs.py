"""The outputs of a model, as models give them: one rule for every model-first function.

A tensor is the output; otherwise ``output``, a callable, selects the tensor from what the
model returns (``output=lambda out: out[0]`` for a tuple, ``output=lambda out: out["scores"]``
for a dict); without it, a tensor attribute or key ``logits`` (a HuggingFace
``ModelOutput``, a dict ``{"logits": ...}``) is read; anything else is a ``TypeError`` naming
``output=``. ``_output_model`` (private) applies the rule to a model: a view of it, with the
same parameters, buffers and names, whose forward returns the selected tensor.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import torch
from torch import nn


def _selected_output(out: object, output: Callable[[object], torch.Tensor] | None, model: nn.Module) -> torch.Tensor:
    """The tensor of outputs in ``out`` (what ``model`` returned), by the rule of this module."""
    tensors = (torch.Tensor, torch.fx.Proxy)  # a Proxy while torch.fx traces the model
    if output is not None:
        selected = output(out)
        if isinstance(selected, tensors):
            return selected
        raise TypeError(
            f"output must select one tensor from what model {type(model).__name__} returns "
            f"({type(out).__name__}), got {type(selected).__name__}"
        )
    if isinstance(out, tensors):
        return out
    logits = out.get("logits") if isinstance(out, Mapping) else getattr(out, "logits", None)
    if isinstance(logits, tensors):
        return logits
    raise TypeError(
        f"model {type(model).__name__} returns a {type(out).__name__}, not one tensor of outputs, and no tensor "
        "'logits' in it: pass output=, a callable that selects the tensor the loss reads (e.g. "
        "output=lambda out: out[0] or output=lambda out: out['scores'])"
    )


def _output_model(
    model: nn.Module, output: Callable[[object], torch.Tensor] | None, sample: object = None
) -> nn.Module:
    """``model``, or a view of it whose forward returns the tensor selected by ``output`` (the rule above).

    The view is an instance of a subclass of ``type(model)`` (same name) sharing the model's
    submodules, parameters and buffers, so parameter names, ``torch.func.functional_call``
    and ``torch.fx`` tracing are those of the model; it is never needed, and ``model``
    itself is returned, when ``output`` is None and ``sample`` (an output of the model)
    is a tensor.

    Raises:
        TypeError: if ``output`` is neither None nor callable.
    """
    if output is not None and not callable(output):
        raise TypeError(
            f"output must be None or a callable selecting the tensor of outputs from what the model "
            f"returns (e.g. lambda out: out[0]), got {type(output).__name__}"
        )
    if not isinstance(model, nn.Module) or (output is None and isinstance(sample, torch.Tensor)):
        return model  # a non-module is refused by the caller's own check, naming model
    base = type(model)

    @functools.wraps(base.forward)  # torch.fx reads the arguments of the wrapped forward
    def forward(self: nn.Module, *args: object, **kwargs: object) -> torch.Tensor:
        return _selected_output(base.forward(self, *args, **kwargs), output, self)

    view_class = type(base.__name__, (base,), {"forward": forward, "__qualname__": base.__qualname__})
    view_class.__module__ = base.__module__
    view = view_class.__new__(view_class)
    vars(view).update(vars(model))  # shares the submodules, parameters and buffers (and their names)
    return view


__all__: list[str] = []

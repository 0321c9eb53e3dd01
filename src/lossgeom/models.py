"""The functional form of any model: its loss as a closure, and its accuracy.

:func:`loss_closure` turns a model, a loss module and data into the functional form the
rest of the package uses: a function ``loss_fn(params) -> scalar`` of a dict of parameter
tensors (through ``torch.func.functional_call``; :func:`lossgeom.parameters.params_of`
reads that dict off a model), so curvature, symmetry audits and training loops all work
on explicit inputs. ``loss_fn`` refuses parameter names the model does not have (torch
would silently ignore them) and targets that would broadcast. :func:`accuracy` is the
classification accuracy at a parameter dict.

The outputs of a model, as models give them (one rule for every model-first function
that takes ``output=``): a tensor is the output; otherwise ``output``, a callable, selects
the tensor from what the model returns (``output=lambda out: out[0]`` for a tuple,
``output=lambda out: out["scores"]`` for a dict); without it, a tensor attribute or key
``logits`` (a HuggingFace ``ModelOutput``, a dict ``{"logits": ...}``) is read; anything
else is a ``TypeError`` naming ``output=``. ``_output_model`` (private) applies the rule to a
model: a view of it, with the same parameters, buffers and names, whose forward returns
the selected tensor.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import torch
from torch import nn

from lossgeom._validation import model_inputs
from lossgeom.parameters import check_parameter_names
from lossgeom.risk import as_batches, check_model, check_targets, loss_module, math_attention, tensor_output
from lossgeom.types import Batch, Data, Params


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


def loss_closure(model: nn.Module, loss: nn.Module, data: Batch) -> Callable[[Params], torch.Tensor]:
    """Return ``loss_fn(params)``: ``loss(model(x; params), y)`` on the pair ``data = (x, y)``.

    The functional form of a model's empirical risk, ``params -> loss(f(x; params), y)``,
    computed by ``torch.func.functional_call`` with the loss module's own reduction and
    options. ``loss`` is an ``nn.CrossEntropyLoss`` (y holds class indices, of the
    outputs' shape without the class axis 1, or class probabilities) or an ``nn.MSELoss``
    (y holds targets of exactly the output's shape). The model must be in eval mode if it
    has batch norm. ``params`` may hold a subset of the model's parameters and buffers (the
    others keep their stored values).

    Args:
        model: the model, called through ``torch.func.functional_call``.
        loss: the loss module, ``nn.CrossEntropyLoss()`` or ``nn.MSELoss()``.
        data: the pair ``(x, y)``: inputs, finite, with the examples along axis 0 (at least
            one), and targets with as many examples.

    Returns:
        ``loss_fn(params) -> scalar``, the loss of ``model`` with ``params`` on ``(x, y)``.

    Raises:
        TypeError: if ``model`` is not an ``nn.Module``, ``loss`` is not a supported loss
            module (a name such as ``"mse"`` is refused) or ``data`` is not a pair of tensors.
        ValueError: at construction, on empty or mismatched data or batch norm in
            training mode; when ``loss_fn`` is called, on a name in ``params`` that is not a
            parameter or buffer of the model (a misspelt name would otherwise be ignored by
            torch) or targets of the wrong shape (which would broadcast).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    criterion = loss_module(loss)
    x, y = _pair(data)
    if x.shape[0] == 0:
        raise ValueError("data's inputs must hold at least one example")
    if y.ndim == 0 or y.shape[0] != x.shape[0]:
        raise ValueError(
            f"data's inputs and targets must hold the same number of examples, got {x.shape[0]} and "
            f"{y.shape[0] if y.ndim else 'a scalar target'}"
        )
    check_model(model)
    fn = criterion

    checked: set[tuple[torch.Size, torch.Size]] = set()
    layouts: set[tuple] = set()  # the (name, shape) layouts of params already checked

    def loss_fn(params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        layout = tuple((name, tuple(value.shape)) for name, value in params.items())
        if layout not in layouts:
            check_parameter_names(model, params, allow_buffers=True)
            layouts.add(layout)
        with math_attention():
            out = tensor_output(torch.func.functional_call(model, dict(params), (x,)), model)
        if (out.shape, y.shape) not in checked:
            check_targets(criterion, out, y)
            checked.add((out.shape, y.shape))
        return fn(out, y)

    return loss_fn


def _pair(data: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """``data`` checked to be one ``(x, y)`` pair of tensors, ``x`` finite."""
    if not (isinstance(data, (tuple, list)) and len(data) == 2):
        raise TypeError(f"data must be one (x, y) pair of tensors, got {type(data).__name__}")
    x, y = data
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"data's targets must be a tensor, got {type(y).__name__}")
    return model_inputs("x", x), y


def accuracy(model: nn.Module, data: Data, *, params: Params | None = None) -> float:
    """Classification accuracy: the fraction of examples whose largest output is the label.

    ``mean_i [argmax_k f(x_i; params)_k = y_i]`` over every example of ``data``, the class
    axis being the last; computed without gradients through ``torch.func.functional_call``,
    so the model's own parameters are not touched.

    Args:
        model: the classifier, an ``nn.Module`` whose outputs are ``(n, K)`` scores.
        data: one ``(x, y)`` pair or an iterable of such batches; ``y`` holds class indices.
        params: the point, a dict of parameter tensors (default: the model's own parameters).

    Returns:
        The accuracy, a float in ``[0, 1]``.

    Raises:
        TypeError: if ``model`` is not an ``nn.Module``.
        ValueError: if a batch's outputs and labels disagree in number or there are no examples.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    point = dict(model.named_parameters()) if params is None else dict(params)
    correct, total = 0, 0
    with torch.no_grad():
        for x, y in as_batches(data):
            predicted = torch.func.functional_call(model, point, (x,)).argmax(-1)
            if predicted.shape != y.shape:
                raise ValueError(f"labels of shape {tuple(y.shape)} do not match predictions {tuple(predicted.shape)}")
            correct += int((predicted == y).sum())
            total += y.numel()
    if total == 0:
        raise ValueError("data must hold at least one example")
    return correct / total

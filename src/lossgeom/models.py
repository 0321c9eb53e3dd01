"""The functional form of any model: its loss as a closure, and its accuracy.

:func:`loss_closure` turns a model, a loss module and data into the functional form the
rest of the package uses: a function ``loss_fn(params) -> scalar`` of a dict of parameter
tensors (through ``torch.func.functional_call``; :func:`lossgeom.parameters.params_of`
reads that dict off a model), so curvature, symmetry audits and training loops all work
on explicit inputs. ``loss_fn`` refuses parameter names the model does not have (torch
would silently ignore them) and targets that would broadcast. :func:`accuracy` is the
classification accuracy at a parameter dict.
The outputs a model returns are read by the rule of :mod:`lossgeom.outputs`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

from lossgeom._validation import model_inputs
from lossgeom.batches import DataSource
from lossgeom.losses import check_loss, term_counts
from lossgeom.outputs import _selected_output
from lossgeom.parameters import check_parameter_names
from lossgeom.risk import _agree, check_model, math_attention
from lossgeom.types import Batch, Data, Params


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
        loss: the loss module, called as ``loss(outputs, y)`` (see :mod:`lossgeom.losses`).
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
    criterion = check_loss(loss)
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
            out = _selected_output(torch.func.functional_call(model, dict(params), (x,)), None, model)
        if (out.shape, y.shape) not in checked:
            term_counts(criterion, out, y)
            checked.add((out.shape, y.shape))
        return fn(out, y)

    _check_fixed(loss_fn, model)
    return loss_fn


def _check_fixed(loss_fn: Callable[[Params], torch.Tensor], model: nn.Module) -> None:
    """The determinism probe of :class:`lossgeom.risk.EmpiricalRisk` for a closure: two evaluations agree.

    Bit for bit on the CPU (or under deterministic algorithms), else to the risk's
    ``1e3`` rounding units, by the same comparison.
    """
    own = {name: p.detach() for name, p in model.named_parameters()}
    with torch.no_grad():
        first, second = loss_fn(own), loss_fn(own)
    exact = first.device.type == "cpu" or torch.are_deterministic_algorithms_enabled()
    if bool(torch.isfinite(first)) and not _agree(first, second, exact):
        raise ValueError(
            f"model is not a fixed function of its parameters: the loss on data, evaluated twice, was "
            f"{first.item()!r} and {second.item()!r}. Likely causes: dropout in training mode (an nn.Dropout, or "
            "F.dropout(h, p, self.training) in a custom forward: call model.eval()) or other random operations "
            "in forward"
        )


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
        device = next(iter(point.values())).device if point else torch.device("cpu")
        for batch in DataSource(data, device):
            y = batch.y
            out = torch.func.functional_call(model, point, batch.args, batch.kwargs)
            predicted = _selected_output(out, None, model).argmax(-1)
            if predicted.shape != y.shape:
                raise ValueError(f"labels of shape {tuple(y.shape)} do not match predictions {tuple(predicted.shape)}")
            correct += int((predicted == y).sum())
            total += y.numel()
    if total == 0:
        raise ValueError("data must hold at least one example")
    return correct / total

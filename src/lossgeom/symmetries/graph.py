"""Reading a module's computation graph (``torch.fx``) for the symmetry registry.

The registry (:mod:`lossgeom.symmetries.registry`) walks the graph from each Linear or
Conv layer to the layer that reads its units: ``_unit_path`` follows the output
through unit-wise operations (element-wise activations, Dropout in eval mode, Identity,
pooling after a Conv, one Flatten) and says why when it cannot. The helpers here name the
operations of a node (``_consumers``, ``_module``, ``_flatten_start``,
``_softmax_dim``, ``_describe``) and trace a model (``_traced``).
"""

from __future__ import annotations

import math
import operator

import torch
from torch import nn

_HOMOGENEOUS = (nn.ReLU, nn.LeakyReLU)
_ELEMENTWISE = (
    nn.Tanh,
    nn.Sigmoid,
    nn.GELU,
    nn.SiLU,
    nn.ELU,
    nn.SELU,
    nn.CELU,
    nn.Softplus,
    nn.Mish,
    nn.Hardtanh,
    nn.ReLU6,
    nn.Softsign,
    nn.Tanhshrink,
    nn.Hardswish,
    nn.Hardsigmoid,
    nn.LogSigmoid,
    nn.Hardshrink,
    nn.Softshrink,
)
_POOLS = (
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.MaxPool3d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AvgPool3d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d,
    nn.AdaptiveMaxPool3d,
)
_DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
_NORMS = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm, nn.RMSNorm)
_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_F = nn.functional
_HOMOGENEOUS_FUNCTIONS = {torch.relu: "relu", _F.relu: "relu", _F.leaky_relu: "leaky_relu"}
_ELEMENTWISE_FUNCTIONS = {
    torch.tanh: "tanh",
    _F.tanh: "tanh",
    torch.sigmoid: "sigmoid",
    _F.sigmoid: "sigmoid",
    _F.gelu: "gelu",
    _F.silu: "silu",
    _F.elu: "elu",
    _F.softplus: "softplus",
}
_HOMOGENEOUS_METHODS = ("relu",)
_ELEMENTWISE_METHODS = ("tanh", "sigmoid")
_SOFTMAX_MODULES = (nn.Softmax, nn.LogSoftmax)
_SOFTMAX_FUNCTIONS = (torch.softmax, torch.log_softmax, _F.softmax, _F.log_softmax)
_SHAPE_READS = ("size", "dim")
_OUTPUT = "its output is the model's output"
_SCALE_INVARIANT_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)
_UNSUPPORTED = (nn.RNNBase, nn.TransformerDecoderLayer, nn.TransformerDecoder, nn.Transformer, nn.PReLU)
#: The tail of the error message when a model cannot be traced.
_HAND_WRITTEN = "pass hand-written symmetries instead"


def _consumers(node: torch.fx.Node) -> list[torch.fx.Node]:
    """Users of a graph node that consume its values (shape reads such as ``x.size(0)`` do not)."""
    users = []
    for user in node.users:
        if user.op == "call_method" and user.target in _SHAPE_READS:
            continue
        if user.op == "call_function" and user.target is getattr and len(user.args) > 1 and user.args[1] == "shape":
            continue
        users.append(user)
    return users


def _module(model: nn.Module, node: torch.fx.Node) -> nn.Module | None:
    return model.get_submodule(node.target) if node.op == "call_module" else None


def _flatten_start(node: torch.fx.Node, module: nn.Module | None) -> int | None:
    """The start dim of a flatten-like node (Flatten, torch.flatten, x.flatten, x.view(n, -1)), else None."""
    if isinstance(module, nn.Flatten):
        return module.start_dim if module.end_dim == -1 else None
    if node.op == "call_function" and node.target is torch.flatten:
        start = node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)
        end = node.args[2] if len(node.args) > 2 else node.kwargs.get("end_dim", -1)
        return start if end == -1 else None
    if node.op == "call_method" and node.target == "flatten":
        start = node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)
        end = node.args[2] if len(node.args) > 2 else node.kwargs.get("end_dim", -1)
        return start if end == -1 else None
    if node.op == "call_method" and node.target in ("view", "reshape") and len(node.args) == 3 and node.args[2] == -1:
        batch = node.args[1]
        reads_batch = (
            getattr(batch, "op", None) == "call_method"
            and batch.target == "size"
            and batch.args[0] is node.args[0]
            and len(batch.args) > 1
            and batch.args[1] == 0
        )
        return 1 if reads_batch else None
    return None


def _describe(node: torch.fx.Node, module: nn.Module | None) -> str:
    if module is not None:
        return f"{type(module).__name__} {node.target!r}"
    target = getattr(node.target, "__name__", node.target)
    return f"{node.op} {target!r}" if node.op != "output" else "the model's output"


def _softmax_dim(node: torch.fx.Node, module: nn.Module | None) -> int | None:
    if isinstance(module, _SOFTMAX_MODULES):
        return module.dim
    if node.op == "call_function" and node.target in _SOFTMAX_FUNCTIONS:
        return node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if node.op == "call_method" and node.target in ("softmax", "log_softmax"):
        return node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    return None


def _refusal(user: torch.fx.Node, module: nn.Module | None, conv: bool, flattened: bool) -> str | None:
    """Why the units cannot pass through ``user`` on their way to a reader (None if nothing stops them here)."""
    if user.op == "output":
        return _OUTPUT
    if _softmax_dim(user, module) is not None:
        finals = _consumers(user)
        if len(finals) == 1 and finals[0].op == "output":
            return _OUTPUT
        return f"{_describe(user, module)} mixes the units"
    if isinstance(module, _NORMS):
        return (
            f"the units pass through {_describe(user, module)}: a normalisation layer mixes units (or undoes "
            "their scale), so neither their rescaling nor their permutation is reported (the normalisation "
            "layer's own symmetries are looked for separately)"
        )
    if _is_sum(user):
        return (
            f"the units pass through {_describe(user, module)}, a residual sum: they are a residual block's output "
            "units, read by the skip connection as well as the next layer, so their rescaling and permutation "
            "are not audited"
        )
    if isinstance(module, _DROPOUTS) and module.training and module.p > 0:
        return f"{_describe(user, module)} is in training mode (random); call model.eval() before the audit"
    if isinstance(module, _POOLS) and (not conv or flattened):
        return f"{_describe(user, module)} pools across units"
    start = _flatten_start(user, module)
    if start is not None and (start != 1 or flattened):
        return f"{_describe(user, module)} flattens more than the feature axes"
    return None


def _activation(user: torch.fx.Node, module: nn.Module | None) -> tuple[str, bool] | None:
    """``(name, positively homogeneous)`` of an element-wise activation node, else None."""
    if isinstance(module, _HOMOGENEOUS):
        return type(module).__name__, True
    if isinstance(module, _ELEMENTWISE):
        return type(module).__name__, False
    if user.op == "call_function" and user.target in _HOMOGENEOUS_FUNCTIONS:
        return _HOMOGENEOUS_FUNCTIONS[user.target], True
    if user.op == "call_function" and user.target in _ELEMENTWISE_FUNCTIONS:
        return _ELEMENTWISE_FUNCTIONS[user.target], False
    if user.op == "call_method" and user.target in _HOMOGENEOUS_METHODS + _ELEMENTWISE_METHODS:
        return user.target, user.target in _HOMOGENEOUS_METHODS
    return None


_SUMS = (operator.add, operator.iadd, torch.add)


def _is_sum(node: torch.fx.Node) -> bool:
    """Whether ``node`` adds two tensors (a residual connection's sum)."""
    if node.op == "call_function" and node.target in _SUMS:
        return sum(isinstance(arg, torch.fx.Node) for arg in node.args) > 1
    return node.op == "call_method" and node.target in ("add", "add_", "__add__")


def _unit_path(
    model: nn.Module, node: torch.fx.Node, conv: bool | None = None
) -> tuple[torch.fx.Node | None, bool, str, bool, str]:
    """Follow a layer's output to the next Linear/Conv layer through unit-wise operations.

    ``conv`` says whether the units are channels (default: whether ``node`` is a Conv layer).
    Returns ``(reader_node, homogeneous, activation, units_last_flatten, reason)``;
    ``reader_node`` is None and ``reason`` says why when the path is not recognised.
    """
    conv = isinstance(_module(model, node), _CONVS) if conv is None else conv
    homogeneous, activations, flattened = True, [], False
    current = node
    while True:
        users = _consumers(current)
        if not users:
            return None, False, "", False, "its output is not used"
        if len(users) > 1:
            return (
                None,
                False,
                "",
                False,
                (
                    f"its output feeds {len(users)} operations (a residual connection: a residual block's output "
                    "units, read by the skip connection as well as the next layer), so its units are not identified"
                    if any(_is_sum(u) for u in users)
                    else f"its output feeds {len(users)} operations (a residual connection or "
                    "a second branch), so its units are not identified"
                ),
            )
        user = users[0]
        module = _module(model, user)
        reason = _refusal(user, module, conv, flattened)
        if reason is not None:
            return None, False, "", False, reason
        if isinstance(module, (nn.Linear, *_CONVS)):
            return user, homogeneous, ", ".join(activations) or "identity", flattened, ""
        activation = _activation(user, module)
        if activation is not None:
            activations.append(activation[0])
            homogeneous = homogeneous and activation[1]
        elif _flatten_start(user, module) is not None:
            flattened = True
        elif not isinstance(module, (*_DROPOUTS, nn.Identity, *_POOLS)):
            return (
                None,
                False,
                "",
                False,
                (
                    f"the units pass through {_describe(user, module)}, which the registry "
                    "does not know to act unit by unit"
                ),
            )
        current = user


def _traced(
    model: nn.Module, hint: str = _HAND_WRITTEN
) -> tuple[list[torch.fx.Node], dict[str, int], dict[str, nn.Parameter]]:
    """``(nodes, calls per module name, named parameters)`` of ``model``'s ``torch.fx`` graph.

    Raises:
        TypeError: if ``model`` is not an ``nn.Module``.
        ValueError: if ``torch.fx`` cannot trace it (the message ends with ``hint``).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    try:
        graph = torch.fx.symbolic_trace(model).graph
    except Exception as err:  # torch.fx raises many kinds of errors on untraceable code
        raise ValueError(
            f"cannot trace {type(model).__name__} with torch.fx ({type(err).__name__}: {err}); " + hint
        ) from err
    nodes = list(graph.nodes)
    counts: dict[str, int] = {}
    for node in nodes:
        if node.op == "call_module":
            counts[node.target] = counts.get(node.target, 0) + 1
    return nodes, counts, dict(model.named_parameters())


def _log_uniform(width: int, rescale: float, generator: torch.Generator) -> torch.Tensor:
    u = torch.rand(width, generator=generator, dtype=torch.float64)
    return torch.exp((2 * u - 1) * math.log(rescale))


def _layout_problem(layer: nn.Module, name: str, target: nn.Module, reader: str, flattened: bool) -> str:
    """Why ``reader``'s input layout does not match ``layer``'s units ("" when it does)."""
    width = layer.out_features if isinstance(layer, nn.Linear) else layer.out_channels
    conv = isinstance(layer, _CONVS)
    if isinstance(target, _CONVS):
        if not conv or flattened or type(target) is not type(layer):
            return f"{type(layer).__name__} {name!r} feeds {type(target).__name__} {reader!r} without a matching layout"
        if target.groups != 1:
            return f"{reader!r} is a grouped convolution"
        if target.in_channels != width:
            return f"{reader!r} reads {target.in_channels} channels, not {width}"
        return ""
    if conv and not flattened:
        return f"Linear {reader!r} reads a Conv output without a Flatten"
    if not (target.in_features == width or (flattened and target.in_features % width == 0)):
        return f"{reader!r} reads {target.in_features} features, not a multiple of {width}"
    return ""


def _tied(model: nn.Module, *modules: str) -> str | None:
    """Why the parameters of ``modules`` cannot be transformed alone: one is shared (tied) with another layer."""
    owners: dict[int, list[str]] = {}
    for full, p in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(full)
    for names in owners.values():
        layers = {n.rsplit(".", 1)[0] if "." in n else "" for n in names}
        if len(names) > 1 and layers & set(modules):
            return (
                f"{' and '.join(repr(n) for n in names)} are one shared (tied) tensor, so these units are not audited"
            )
    return None

"""The symmetry registry: the symmetries of an ``nn.Module`` found in its graph.

:func:`find_symmetries` reads a model's computation graph (``torch.fx``, through
:mod:`lossgeom.symmetries.graph`) and finds the symmetries it can identify safely, so no
transform has to be written by hand:

- the per-unit positive rescaling of ReLU and LeakyReLU hidden units (or channels)
  between two Linear or two Conv layers (``relu(c z) = c relu(z)`` for ``c > 0``);
- the permutation of hidden units or channels between two such layers (through any
  element-wise activation);
- the softmax common-row shift of a final Linear layer that feeds a softmax cross-entropy
  (or a final softmax / log-softmax).

:func:`find_layer_rescalings` and :func:`find_normalisation_rescalings` find the
one-factor rescalings of the symmetry audit atlas, and :func:`classifier_layer` names a
model's final Linear layer. Each search returns a :class:`FoundSymmetries`, with the
places it refused and why.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from lossgeom._validation import positive
from lossgeom.formatting import fmt
from lossgeom.symmetries.attention import _ATTENTION_MODULES, _attention_symmetries
from lossgeom.symmetries.core import Symmetry
from lossgeom.symmetries.decoder_search import DECODER_KINDS, _decoder_search
from lossgeom.symmetries.graph import (
    _CONVS,
    _OUTPUT,
    _SCALE_INVARIANT_NORMS,
    _UNSUPPORTED,
    _consumers,
    _describe,
    _layout_problem,
    _log_uniform,
    _module,
    _softmax_dim,
    _tied,
    _traced,
    _unit_path,
)
from lossgeom.symmetries.layers import (
    layer_rescaling,
    normalisation_rescaling,
    relu_neuron_rescaling,
    softmax_row_shift,
    unit_permutation,
)
from lossgeom.symmetries.normalised import _BATCHNORMS, _batchnorm_symmetries, _layernorm_symmetries
from lossgeom.types import Params


@dataclass(frozen=True)
class FoundSymmetries:
    """What :func:`find_symmetries` found in a model, and what it refused and why.

    Attributes:
        symmetries: one :class:`Symmetry` per safely identified symmetry, each acting on
            the dict of ``model.named_parameters()``.
        skipped: one sentence per place where a symmetry might live but cannot be
            identified safely (and is therefore not reported).
        sampling: how the sizes were drawn (range, shift size, seed).
    """

    symmetries: tuple[Symmetry, ...]
    skipped: tuple[str, ...]
    sampling: str

    def __iter__(self) -> Iterator[Symmetry]:
        return iter(self.symmetries)

    def __len__(self) -> int:
        return len(self.symmetries)

    def by_kind(self) -> dict[str, list[Symmetry]]:
        """The symmetries grouped by kind (a name of :data:`KINDS`), kinds in order of first appearance.

        Returns:
            ``{kind: [symmetry, ...]}``; ``symmetries.compose(group, kind)`` applies a whole group.

        Raises:
            ValueError: if a symmetry's name starts with no known kind (a hand-made result).
        """
        groups: dict[str, list[Symmetry]] = {}
        for symmetry in self.symmetries:
            kind = next((k for k in KINDS if symmetry.name.startswith(k)), None)
            if kind is None:
                raise ValueError(f"symmetry {symmetry.name!r} is of no kind the registry reports ({', '.join(KINDS)})")
            groups.setdefault(kind, []).append(symmetry)
        return groups


#: The kinds of symmetry the registry reports, as the names of its symmetries begin.
KINDS = (
    "batch-norm scale invariance",
    "layer-norm rescaling",
    "attention gauge",
    "head permutation",
    "softmax row shift",
    "LeakyReLU rescaling",
    "ReLU rescaling",
    "identity rescaling",
    *DECODER_KINDS,
    "permutation",
)


def _loss_is_softmax_cross_entropy(loss: nn.Module | None) -> bool:
    if loss is None:
        return False
    if isinstance(loss, str):
        raise TypeError(
            f"loss must be a torch loss module or None, got the string {loss!r}: pass nn.CrossEntropyLoss() "
            "or nn.MSELoss() (loss names are no longer accepted)"
        )
    if isinstance(loss, nn.Module):
        # the loss reads the logits only through the softmax: every option keeps that, but a
        # subclass that overrides forward may read them otherwise
        return isinstance(loss, nn.CrossEntropyLoss) and type(loss).forward is nn.CrossEntropyLoss.forward
    raise TypeError(f"loss must be a torch.nn loss module or None, got {type(loss).__name__}")


#: The tail of the error message when the registry cannot trace a model.
_REGISTRY_HINT = (
    "the registry needs a forward without data-dependent control flow: audit hand-written "
    "symmetries with audit(..., symmetries=[...]) or audit_symmetry"
)


def _draws(seed: int | None, generator: torch.Generator | None) -> tuple[torch.Generator, str]:
    """The generator every size is drawn from, and how it was made (for ``sampling``)."""
    if generator is not None and seed is not None:
        raise ValueError("give seed or generator, not both")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if generator is not None:
        return generator, "the given generator"
    if seed is None:
        seed = 0
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    return torch.Generator().manual_seed(seed), f"seed {seed}"


def _pair_problem(
    model: nn.Module,
    layer: nn.Module,
    name: str,
    reader: torch.fx.Node,
    flattened: bool,
    names: Params,
    counts: Mapping[str, int],
) -> str:
    """Why the units between ``layer`` and ``reader`` are not identified safely ("" when they are)."""
    problem = _layout_problem(layer, name, _module(model, reader), reader.target, flattened)
    keys = (f"{name}.weight", f"{reader.target}.weight") + ((f"{name}.bias",) if layer.bias is not None else ())
    for key in keys:
        if not problem and key not in names:
            problem = f"{key!r} is not a plain parameter of the model (shared or parametrised?)"
    if counts.get(reader.target, 0) > 1:
        problem = f"layer {reader.target!r} is called more than once"
    return problem


def _pair_symmetries(
    layer: nn.Module,
    name: str,
    reader: str,
    homogeneous: bool,
    activation: str,
    rescale: float,
    generator: torch.Generator,
    found: list[Symmetry],
    skipped: list[str],
) -> None:
    """Append the rescaling and permutation of the units ``name -> reader`` to ``found`` (or why not to ``skipped``)."""
    width = layer.out_features if isinstance(layer, nn.Linear) else layer.out_channels
    conv = isinstance(layer, _CONVS)
    pair = f"{name} -> {reader}"
    units_last = not conv
    if homogeneous:
        kind = (
            "LeakyReLU"
            if "LeakyReLU" in activation or "leaky_relu" in activation
            else ("ReLU" if activation != "identity" else "identity")
        )
        scales = _log_uniform(width, rescale, generator)
        symmetry = relu_neuron_rescaling(name, reader, scales, units_last=units_last, activation=kind)
        found.append(
            Symmetry(
                f"{kind} rescaling {pair} ({width} units, c in [1/{fmt(rescale)}, {fmt(rescale)}])", symmetry.transform
            )
        )
    else:
        skipped.append(f"rescaling {pair}: the activation ({activation}) is not positively homogeneous")
        if any(odd in activation.lower() for odd in _ODD_ACTIVATIONS):
            skipped.append(
                f"sign flip {pair}: the activation ({activation}) is odd, so negating a unit's incoming and "
                "outgoing weights keeps the function; the registry does not look for it (not audited)"
            )
    if width < 2:
        skipped.append(f"permutation {pair}: a single unit has no permutation")
    elif conv and layer.groups != 1:
        skipped.append(f"permutation {pair}: {name!r} is a grouped convolution")
    else:
        perm = torch.randperm(width, generator=generator)
        symmetry = unit_permutation(name, reader, perm, units_last=units_last)
        found.append(Symmetry(f"permutation {pair} ({width} units)", symmetry.transform))


#: Odd activations, sigma(-z) = -sigma(z): each hidden unit has a sign-flip symmetry the registry lists as not audited.
_ODD_ACTIVATIONS = ("tanh", "hardtanh", "softsign", "sin")


def _layer_symmetries(
    model: nn.Module,
    node: torch.fx.Node,
    names: Params,
    counts: Mapping[str, int],
    rescale: float,
    generator: torch.Generator,
    found: list[Symmetry],
    skipped: list[str],
) -> None:
    """The symmetries of the units of the layer at ``node`` (if it is a Linear or Conv layer)."""
    layer = _module(model, node)
    if not isinstance(layer, (nn.Linear, *_CONVS)):
        if isinstance(layer, _UNSUPPORTED):
            skipped.append(f"{_describe(node, layer)}: the registry does not find its symmetries")
        return
    name = node.target
    if counts[name] > 1:
        skipped.append(f"layer {name!r} is called more than once: its units are not identified")
        return
    reader, homogeneous, activation, flattened, reason = _unit_path(model, node)
    users = _consumers(node)
    if reader is None and len(users) == 1 and isinstance(_module(model, users[0]), _BATCHNORMS):
        return  # its channels are audited at the batch norm (:func:`_modern_symmetries`)
    if reader is None:
        if reason != _OUTPUT:
            skipped.append(f"hidden units of {name!r}: {reason}")
        return
    problem = _tied(model, name, reader.target) or _pair_problem(model, layer, name, reader, flattened, names, counts)
    if problem:
        skipped.append(f"hidden units {name} -> {reader.target}: {problem}")
        return
    _pair_symmetries(layer, name, reader.target, homogeneous, activation, rescale, generator, found, skipped)


def find_symmetries(
    model: nn.Module,
    *,
    loss: nn.Module | None = None,
    rescale: float = 2.0,
    shift: float = 1.0,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    condition: float = 4.0,
) -> FoundSymmetries:
    r"""The symmetry registry: the symmetries of ``model`` it can identify safely, drawn at stated sizes.

    The model's forward is traced with ``torch.fx`` (an ``nn.Sequential`` or any module
    whose layers are named submodules and whose forward has no data-dependent control
    flow). For each Linear or Conv layer ``A`` whose output reaches exactly one other
    Linear/Conv layer ``B`` through unit-wise operations only (element-wise activations,
    Dropout in eval mode, Identity, pooling after a Conv, one Flatten before a Linear),
    it reports:

    - **ReLU/LeakyReLU rescaling**: if every activation on the way is ReLU or LeakyReLU
      (or there is none), rows of ``A`` (weight and bias) times ``c_j`` and the matching
      columns of ``B`` divided by ``c_j``; ``log c_j`` uniform in ``[-log r, log r]``
      with ``r = rescale``;
    - **unit permutation**: a uniformly random permutation of the units (if ``A`` is not
      a grouped convolution and has more than one unit);

    and, for the layer that produces the model's output:

    - **softmax common-row shift**: if it is a Linear layer and ``loss`` is a softmax
      cross-entropy, or it feeds a final softmax / log-softmax over the last axis:
      ``[W b] -> [W b] + 1 u^T`` with ``u`` a random direction of norm ``shift`` times
      the root-mean-square row norm of ``[W b]``.

    and, drawn after these (so adding them left the sizes above unchanged), the symmetries
    of normalisation and attention layers (:mod:`lossgeom.symmetries.normalised`,
    :mod:`lossgeom.symmetries.attention`):

    - **batch-norm scale invariance** (eval mode, running statistics kept): a Linear/Conv
      layer read only by a BatchNorm, its rows times ``c_j`` and the running statistics
      moved along (``mean -> c mean``, ``var -> c^2 (var + eps) - eps``); refused in
      training mode, without running statistics, or where a variance would turn negative;
    - the **rescaling of the batch norm's affine parameters** through a following ReLU /
      LeakyReLU (named ``"ReLU rescaling bn -> reader (batch-norm affine, ...)"``) and the
      **channel permutation** across Linear/Conv -> BatchNorm -> activation -> Linear/Conv;
      inside a residual block these are the branch's hidden channels; the block's output
      channels (read by the skip connection and the next block) are listed as not audited;
    - **layer-norm rescaling**: a LayerNorm's weight and bias times ``c`` (per feature)
      and the weight of every Linear layer reading it (directly, or through a ReLU)
      divided by ``c``, exact for any ``eps``;
    - in ``nn.MultiheadAttention`` (packed projections, no ``bias_k``/``bias_v`` or
      ``add_zero_attn``) and ``nn.TransformerEncoderLayer`` / ``nn.TransformerEncoder``:
      the **attention gauge** of every head (:func:`~lossgeom.symmetries.attention.attention_head_gauge`,
      ``A`` and ``B`` of condition number ``condition``), the **head permutation**, the
      layer-norm rescalings of a pre-LN layer (``norm1`` against the packed in-projection,
      ``norm2`` against ``linear1``; a post-LN layer's norms feed the residual stream, so
      none is exact there) and the feed-forward hidden units (rescaling with ReLU,
      permutation always).

    LLaMA-style and GPT-2 decoders are recognised by structure, not traced (their norm gains,
    stream rotation, rotary and grouped attention gauges, SwiGLU: :mod:`lossgeom.symmetries.decoder_search`).
    Not found (said so in ``skipped`` where the graph shows them): rescalings through a
    normalisation layer (its own symmetries are reported instead), GroupNorm symmetries,
    recurrent layers, residual streams and block outputs (a unit read twice), shared weights,
    grouped-convolution permutations, PReLU, ConvTranspose layers, the general linear group
    between two layers without activation, and sign flips of odd activations such as tanh.

    A ReLU network with hidden widths 6 and 5 under a softmax cross-entropy has a
    rescaling and a permutation per hidden layer and the common-row shift of its last
    layer. A rescaling multiplies row :math:`j` of the layer before by :math:`c_j` and column
    :math:`j` of the layer after by :math:`1 / c_j`, so the products are exactly 1 and, as
    :math:`\mathrm{relu}(c z) = c\,\mathrm{relu}(z)` for :math:`c > 0`, the outputs are kept:

    >>> import torch
    >>> from torch import nn
    >>> from lossgeom.symmetries import find_symmetries
    >>> _ = torch.manual_seed(0)
    >>> model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3)).double()
    >>> found = find_symmetries(model, loss=nn.CrossEntropyLoss(), seed=0)
    >>> for symmetry in found:
    ...     print(symmetry.name)
    ReLU rescaling 0 -> 2 (6 units, c in [1/2, 2])
    permutation 0 -> 2 (6 units)
    ReLU rescaling 2 -> 4 (5 units, c in [1/2, 2])
    permutation 2 -> 4 (5 units)
    softmax row shift of 4 (|shift| = 1 RMS row)
    >>> params = {name: p.detach() for name, p in model.named_parameters()}
    >>> moved = found.symmetries[0](params)
    >>> c = moved["0.weight"][:, 0] / params["0.weight"][:, 0]
    >>> float((c * moved["2.weight"][0] / params["2.weight"][0] - 1).abs().max()) < 1e-15
    True
    >>> x = torch.randn(8, 4, dtype=torch.float64)
    >>> with torch.no_grad():
    ...     gap = torch.func.functional_call(model, moved, (x,)) - model(x)
    >>> float(gap.abs().max()) < 1e-13
    True

    Args:
        model: the model; its parameters are not read or changed, only its structure.
        loss: ``nn.CrossEntropyLoss()`` if the outputs are
            logits of a softmax cross-entropy (enables the shift of a final Linear);
            ``None`` or another loss module otherwise (a loss name is refused).
        rescale: ``r > 1``; the rescaling factors lie in ``[1 / r, r]``.
        shift: the shift's size relative to the classifier's RMS row norm (> 0).
        seed: seed of the generator that draws every size (default 0).
        generator: a ``torch.Generator`` to draw from instead of ``seed``.
        condition: the condition number (>= 1) of each attention gauge's matrices.

    Returns:
        A :class:`FoundSymmetries`.

    Raises:
        TypeError: if ``model`` is not an ``nn.Module``.
        ValueError: if the model cannot be traced, or on a bad size or seed.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    rescale = positive("rescale", rescale)
    if rescale <= 1:
        raise ValueError(f"rescale must be > 1 (the scales lie in [1/rescale, rescale]), got {rescale}")
    shift = positive("shift", shift)
    condition = positive("condition", condition)
    if condition < 1:
        raise ValueError(f"condition must be >= 1 (the condition number of the attention gauges), got {condition}")
    generator, drawn = _draws(seed, generator)
    cross_entropy = _loss_is_softmax_cross_entropy(loss)
    if (decoder := _decoder_search(model, rescale, condition, generator, drawn)) is not None:
        return FoundSymmetries(*decoder)  # a decoder recognised by its structure (torch.fx cannot trace it)
    nodes, counts, names = _traced(model, _REGISTRY_HINT)
    found: list[Symmetry] = []
    skipped: list[str] = []
    for node in nodes:
        _layer_symmetries(model, node, names, counts, rescale, generator, found, skipped)
    found.extend(_final_shift(model, nodes, names, counts, cross_entropy, loss, shift, generator, skipped))
    gauges = len(found)
    _modern_symmetries(model, nodes, names, counts, rescale, condition, generator, found, skipped)
    gauges = any(s.name.startswith("attention gauge") for s in found[gauges:])
    sampling = (
        f"rescalings log-uniform in [1/{fmt(rescale)}, {fmt(rescale)}], shifts of {fmt(shift)} x the RMS "
        f"row norm"
        + (f", attention gauges Q1 diag(s) Q2 of condition number {fmt(condition)}" if gauges else "")
        + f", drawn with {drawn}"
    )
    return FoundSymmetries(tuple(found), tuple(skipped), sampling)


def _modern_symmetries(
    model: nn.Module,
    nodes: Sequence[torch.fx.Node],
    names: Params,
    counts: Mapping[str, int],
    rescale: float,
    condition: float,
    generator: torch.Generator,
    found: list[Symmetry],
    skipped: list[str],
) -> None:
    """The symmetries of normalisation and attention layers (drawn after the others: their sizes keep their draws)."""
    for node in nodes:
        module = _module(model, node)
        if isinstance(module, _BATCHNORMS):
            _batchnorm_symmetries(model, node, names, counts, rescale, generator, found, skipped)
        elif isinstance(module, nn.LayerNorm):
            _layernorm_symmetries(model, node, names, counts, rescale, generator, found, skipped)
        elif isinstance(module, _ATTENTION_MODULES):
            _attention_symmetries(model, node, names, counts, rescale, condition, generator, found, skipped)


def _final_shift(
    model: nn.Module,
    nodes: Sequence[torch.fx.Node],
    names: Params,
    counts: Mapping[str, int],
    cross_entropy: bool,
    loss: nn.Module | None,
    shift: float,
    generator: torch.Generator,
    skipped: list[str],
) -> list[Symmetry]:
    output = next(node for node in nodes if node.op == "output")
    last = output.args[0]
    if not isinstance(last, torch.fx.Node):
        skipped.append("softmax shift: the model does not return one tensor")
        return []
    last_module = _module(model, last)
    dim = _softmax_dim(last, last_module)
    probabilities = dim is not None
    if probabilities:
        if dim not in (-1, 1):
            skipped.append(f"softmax shift: the final softmax is over dim {dim}, not the class axis of a Linear layer")
            return []
        inputs = [arg for arg in last.args if isinstance(arg, torch.fx.Node)]
        if len(inputs) != 1 or len(_consumers(inputs[0])) != 1:
            skipped.append("softmax shift: the final softmax does not read one Linear layer alone")
            return []
        last = inputs[0]
        last_module = _module(model, last)
    if not isinstance(last_module, nn.Linear):
        if cross_entropy or probabilities:
            skipped.append(f"softmax shift: the logits come from {_describe(last, last_module)}, not a Linear layer")
        return []
    if not (cross_entropy or probabilities):
        skipped.append(
            f"softmax shift of {last.target!r}: not looked for, since loss={loss!r} is not a softmax "
            "cross-entropy (pass loss=nn.CrossEntropyLoss() if the outputs are its logits)"
        )
        return []
    weight, bias = f"{last.target}.weight", f"{last.target}.bias" if last_module.bias is not None else None
    tied = _tied(model, last.target)
    if tied:
        skipped.append(f"softmax shift of {last.target!r}: {tied}")
        return []
    if counts[last.target] > 1 or weight not in names or (bias is not None and bias not in names):
        skipped.append(f"softmax shift of {last.target!r}: its parameters are shared or parametrised")
        return []
    if last_module.out_features < 2:
        skipped.append(f"softmax shift of {last.target!r}: one class has no softmax gauge")
        return []
    W = names[weight].detach().double().cpu()
    rows = torch.cat([W, names[bias].detach().double().cpu()[:, None]], dim=1) if bias is not None else W
    direction = torch.randn(rows.shape[1], generator=generator, dtype=torch.float64)
    size = shift * float(rows.norm()) / rows.shape[0] ** 0.5
    u = direction / direction.norm() * (size if size > 0 else shift)
    beta = float(u[-1]) if bias is not None else 0.0
    v = u[:-1] if bias is not None else u
    symmetry = softmax_row_shift(weight, v, bias=bias, beta=beta, invariant=not probabilities)
    label = f"softmax row shift of {last.target} (|shift| = {fmt(shift)} RMS row)"
    return [Symmetry(label, symmetry.transform, symmetry.invariant, symmetry.invariant_name)]


def find_layer_rescalings(model: nn.Module, c: float) -> FoundSymmetries:
    """Every layer-wise rescaling (:func:`layer_rescaling`, factor ``c``) the graph of ``model`` allows.

    For each Linear or Conv layer whose output reaches exactly one other Linear/Conv
    layer through positively homogeneous operations only (ReLU, LeakyReLU, pooling after
    a Conv, Flatten, Dropout in eval mode, Identity), the same walk as
    :func:`find_symmetries`, with its rule for shared (tied) weights: a pair whose weight is
    one tensor with another layer's is refused; refusals are listed in ``skipped``.

    Args:
        model: the model (traced with ``torch.fx``; its parameters are not changed).
        c: the common factor, > 0.

    Returns:
        A :class:`FoundSymmetries` of :func:`~lossgeom.symmetries.layers.layer_rescaling` s.
    """
    c = positive("c", c)
    nodes, counts, names = _traced(model)
    found, skipped = [], []
    for node in nodes:
        layer = _module(model, node)
        if not isinstance(layer, (nn.Linear, *_CONVS)) or counts[node.target] > 1:
            continue
        reader, homogeneous, activation, _, reason = _unit_path(model, node)
        if reader is None:
            if reason != _OUTPUT:
                skipped.append(f"layer rescaling of {node.target!r}: {reason}")
            continue
        pair = f"{node.target} -> {reader.target}"
        keys = [f"{node.target}.weight", f"{reader.target}.weight"]
        tied = _tied(model, node.target, reader.target)
        if not homogeneous:
            skipped.append(f"layer rescaling {pair}: the activation ({activation}) is not positively homogeneous")
        elif tied:
            skipped.append(f"layer rescaling {pair}: {tied}")
        elif counts.get(reader.target, 0) > 1 or any(key not in names for key in keys):
            skipped.append(f"layer rescaling {pair}: a layer is called twice or its weight is shared")
        else:
            kind = activation.split(",")[0] if activation != "identity" else "identity"
            found.append(layer_rescaling(node.target, reader.target, c, activation=kind))
    return FoundSymmetries(tuple(found), tuple(skipped), f"layer rescalings by c = {fmt(c)}")


def find_normalisation_rescalings(model: nn.Module, c: float) -> FoundSymmetries:
    """Every rescaling of a layer whose output goes straight into a scale-invariant normalisation.

    A Linear or Conv layer whose only consumer is a LayerNorm, GroupNorm or RMSNorm module
    (:func:`normalisation_rescaling`, factor ``c``). BatchNorm is refused: in eval mode it
    normalises with stored statistics, which do not undo a rescaling; so is a layer whose
    weight is shared (tied) with another layer, which the rescaling would move too.

    Args:
        model: the model (traced with ``torch.fx``; its parameters are not changed).
        c: the factor, > 0.

    Returns:
        A :class:`FoundSymmetries` of :func:`~lossgeom.symmetries.layers.normalisation_rescaling` s.
    """
    c = positive("c", c)
    nodes, counts, names = _traced(model)
    found, skipped = [], []
    for node in nodes:
        layer = _module(model, node)
        if not isinstance(layer, (nn.Linear, *_CONVS)) or counts[node.target] > 1:
            continue
        users = _consumers(node)
        norm = _module(model, users[0]) if len(users) == 1 else None
        if isinstance(norm, _SCALE_INVARIANT_NORMS):
            tied = _tied(model, node.target)
            if tied:
                skipped.append(f"rescaling of {node.target!r}: {tied}")
                continue
            if f"{node.target}.weight" not in names:
                skipped.append(f"rescaling of {node.target!r}: its weight is shared or parametrised")
                continue
            found.append(
                normalisation_rescaling(
                    node.target, c, norm=f"{type(norm).__name__} {users[0].target} (eps {fmt(norm.eps, 3)})"
                )
            )
        elif isinstance(norm, nn.modules.batchnorm._NormBase):
            skipped.append(
                f"rescaling of {node.target!r} before {_describe(users[0], norm)}: batch norm in eval "
                "mode normalises with stored statistics, which do not undo a rescaling"
            )
    return FoundSymmetries(tuple(found), tuple(skipped), f"normalisation rescalings by c = {fmt(c)}")


def classifier_layer(model: nn.Module) -> tuple[str, str | None] | None:
    """``(weight, bias)`` names of the Linear layer whose output is the model's output (or its softmax).

    ``bias`` is None for a bias-free classifier; the result is None when the model's
    output is not (a softmax of) one Linear layer's output, or that layer's parameters are
    shared (tied) with another layer.

    Args:
        model: the model (traced with ``torch.fx``).

    Returns:
        ``(weight_name, bias_name_or_None)``, or None.
    """
    nodes, counts, names = _traced(model)
    last = next(node for node in nodes if node.op == "output").args[0]
    if not isinstance(last, torch.fx.Node):
        return None
    if _softmax_dim(last, _module(model, last)) is not None:
        inputs = [arg for arg in last.args if isinstance(arg, torch.fx.Node)]
        if len(inputs) != 1:
            return None
        last = inputs[0]
    module = _module(model, last)
    if not isinstance(module, nn.Linear) or counts[last.target] > 1 or f"{last.target}.weight" not in names:
        return None
    if _tied(model, last.target):
        return None  # a shift of a tied classifier moves the layer it is shared with too
    return f"{last.target}.weight", (f"{last.target}.bias" if module.bias is not None else None)

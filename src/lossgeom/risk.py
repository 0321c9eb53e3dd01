"""The empirical risk of a model: a loss module averaged correctly over batches of data.

The module-first curvature operators take what a
researcher already has: a ``torch.nn.Module`` ``f``, a loss module (``nn.CrossEntropyLoss``
or ``nn.MSELoss``, with its ``reduction``) and data, as one ``(x, y)`` pair of tensors or
an iterable of ``(x, y)`` batches. Their empirical risk is

    L(theta) = sum_b w_b loss(f(x_b; theta), y_b),

with ``w_b = t_b / sum_c t_c`` for ``reduction="mean"`` (``t_b`` the number of loss terms
in batch ``b``, so every term of the data set has weight ``1 / sum_c t_c`` whatever the
batch sizes) and ``w_b = 1`` for ``reduction="sum"``. A loss term is one output entry for
the squared error, and one example (or one position of an ``(N, C, d_1, ...)`` output, the
class axis being axis 1 as in ``nn.CrossEntropyLoss``) for the cross-entropy.

:class:`EmpiricalRisk` checks the inputs once (targets of exactly the right shape, so
nothing broadcasts; class indices in range; the data's dtype and device those of the
parameters; batch norm in eval mode, with running statistics; a forward that is a fixed
function, by a determinism probe: the first batch's loss and gradient evaluated twice
agree bit for bit) and provides the pieces every operator needs: the
outputs of a batch at a flat parameter vector, the weighted batch loss, and the Hessian
of that loss with respect to the outputs (``Lambda`` of the Gauss-Newton matrix).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from lossgeom.distributed import (
    agree_on_errors,
    all_reduce_sum,
    check_group,
    check_same_point,
    check_sampler,
    unwrap_model,
)
from lossgeom.parameters import (
    Params,
    check_parameter_names,
    flatten_params,
    parameter_dtype,
    params_of,
)
from lossgeom.targets import check_class_probabilities, check_targets
from lossgeom.types import Batch, Data, Group, LossFn


@contextlib.contextmanager
def math_attention() -> Iterator[None]:
    """A context in which attention is computed from differentiable composite operations.

    Torch's fused CPU attention kernels have no forward-mode derivative and no double
    backward, so second-order products through ``nn.TransformerEncoderLayer`` need the
    composite (math) kernel of ``scaled_dot_product_attention``; and the fused fast path
    of ``nn.TransformerEncoderLayer`` / ``nn.MultiheadAttention`` in eval mode (taken when
    gradients are off, as inside a Jacobian-vector product) is switched off too, so the
    same attention is computed, with every derivative defined. The previous setting is
    restored on exit.

    Returns:
        A context manager (used as ``with math_attention(): ...``); it yields nothing.
    """
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with sdpa_kernel([SDPBackend.MATH]):
            yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)


def loss_module(loss: object) -> nn.Module:
    """Check that ``loss`` is a supported loss module and return it.

    The risk is ``sum_b w_b loss(f(x_b), y_b)`` for ``loss`` an ``nn.CrossEntropyLoss`` or
    ``nn.MSELoss`` (reduction ``"mean"`` or ``"sum"``); its curvature is implemented for
    exactly these.

    Args:
        loss: the loss module.

    Returns:
        ``loss`` itself.

    Raises:
        TypeError: if ``loss`` is not an ``nn.CrossEntropyLoss`` or ``nn.MSELoss`` instance
            (a name such as ``"cross_entropy"`` is refused: pass ``nn.CrossEntropyLoss()``).
        ValueError: on a reduction other than ``"mean"``/``"sum"``, class weights or
            label smoothing (their curvature is not implemented).
    """
    if isinstance(loss, str):
        raise TypeError(
            f"loss must be a loss module, got the string {loss!r}: pass nn.CrossEntropyLoss() "
            "or nn.MSELoss() (loss names are no longer accepted)"
        )
    if isinstance(loss, Mapping):
        raise TypeError(
            "loss must be a loss module (nn.CrossEntropyLoss() or nn.MSELoss()), got a dict: the "
            "form (model, params, x, y, loss) is gone; pass (model, loss, (x, y), params=params)"
        )
    if not isinstance(loss, (nn.CrossEntropyLoss, nn.MSELoss)):
        raise TypeError(f"loss must be an nn.CrossEntropyLoss() or nn.MSELoss() instance, got {type(loss).__name__}")
    if loss.reduction not in ("mean", "sum"):
        raise ValueError(f"the loss's reduction must be 'mean' or 'sum', got {loss.reduction!r}")
    if isinstance(loss, nn.CrossEntropyLoss):
        if loss.weight is not None:
            raise ValueError(
                "nn.CrossEntropyLoss with class weights is not supported (its mean divides "
                "by the summed weights); use weight=None"
            )
        if loss.label_smoothing != 0:
            raise ValueError("nn.CrossEntropyLoss with label_smoothing is not supported; use label_smoothing=0")
    return loss


def as_batches(data: Data) -> list[Batch]:
    """The data as a list of ``(x, y)`` batches: one pair of tensors, or an iterable of pairs.

    Args:
        data: one ``(x, y)`` pair of tensors or an iterable of ``(x, y)`` batches; each ``y``
            has one entry per example of its ``x`` (axis 0).

    Returns:
        The list of ``(x, y)`` tuples (one element for a single pair).

    Raises:
        TypeError: if an entry is not a pair of tensors.
        ValueError: if there is no batch or a batch is empty or its x and y differ in length.
    """
    if isinstance(data, torch.Tensor):
        raise TypeError("data must be an (x, y) pair of tensors or an iterable of (x, y) batches, got one tensor")
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(t, torch.Tensor) for t in data):
        batches = [tuple(data)]
    else:
        try:
            batches = [tuple(batch) for batch in data]
        except TypeError:
            raise TypeError(
                f"data must be an (x, y) pair of tensors or an iterable of (x, y) batches, got {type(data).__name__}"
            ) from None
    if not batches:
        raise ValueError("data must hold at least one (x, y) batch (empty data)")
    for i, batch in enumerate(batches):
        if len(batch) != 2 or not all(isinstance(t, torch.Tensor) for t in batch):
            raise TypeError(f"batch {i} of data must be an (x, y) pair of tensors")
        x, y = batch
        if x.ndim == 0 or x.shape[0] == 0:
            raise ValueError(f"batch {i}: x must hold at least one example (empty data)")
        if y.ndim == 0 or y.shape[0] != x.shape[0]:
            raise ValueError(
                f"batch {i}: y must be a tensor with one entry per example of x ({x.shape[0]}), "
                f"got shape {tuple(y.shape)}"
            )
    return batches


def _random_in_training(module: nn.Module) -> str | None:
    """Why ``module`` makes the loss depend on its mode (``None`` if it does not)."""
    if not module.training:
        return None
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return "batch norm in training mode (batch statistics, and it overwrites the running statistics)"
    if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
        return f"dropout (p = {module.p}) in training mode (a random mask on every call)"
    if isinstance(module, nn.MultiheadAttention) and module.dropout > 0:
        return f"attention dropout (p = {module.dropout}) in training mode (a random mask on every call)"
    return None


def _batch_dependent(module: nn.Module) -> str | None:
    """Why ``module`` in eval mode makes the loss depend on how the data are batched (``None`` if not)."""
    if (
        isinstance(module, nn.modules.batchnorm._BatchNorm)
        and not module.training
        and module.running_mean is None
        and module.running_var is None
    ):
        return (
            "batch norm without running statistics (track_running_stats=False), which even in eval mode "
            "normalises by each batch's own statistics, so the loss and its curvature depend on how the "
            "data are split into batches"
        )
    return None


def tensor_output(out: object, model: nn.Module) -> torch.Tensor:
    """``out`` if it is one tensor; otherwise a clear error (a loss module needs one tensor of scores).

    Args:
        out: what ``model`` returned.
        model: the model, named in the error.

    Returns:
        ``out``.

    Raises:
        TypeError: if ``out`` is a tuple, list, dict or anything else than a tensor.
    """
    if isinstance(out, torch.Tensor):
        return out
    raise TypeError(
        f"model {type(model).__name__} returns a {type(out).__name__}, not one tensor of outputs: wrap it in a "
        "module whose forward returns the logits the loss reads (e.g. lambda out: out[0] or out['logits'])"
    )


def check_model(model: nn.Module) -> nn.Module:
    """Refuse non-modules and submodules that make the loss other than one fixed function.

    A loss whose curvature is measured must be a fixed function of the parameters. Every
    submodule is checked, not only ``model.training``: batch norm in training mode (it uses
    the batch's statistics and would overwrite the caller's running statistics) and dropout
    with ``p > 0`` in training mode (a new random mask on every call) are refused, naming the
    submodule; ``model.eval()`` (or ``submodule.eval()``) makes the loss fixed. Batch norm
    without running statistics (``track_running_stats=False``) is refused in eval mode too:
    it still normalises by each batch's statistics, so the risk would depend on the batching.
    Randomness no module check can see (``F.dropout`` in a custom ``forward``) is refused by
    :class:`EmpiricalRisk`'s determinism probe.

    Args:
        model: the network to check.

    Returns:
        ``model`` itself.

    Raises:
        TypeError: if ``model`` is not an ``nn.Module``.
        ValueError: if a submodule is batch norm or dropout in training mode, batch norm
            without running statistics, or a parameter or buffer is on the ``meta`` device.
    """
    if not isinstance(model, nn.Module):
        hint = (
            " (for a closure loss_fn(params) -> scalar use the closure form,"
            " e.g. HessianOperator.from_closure(loss_fn, params))"
            if callable(model)
            else ""
        )
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}{hint}")
    on_meta = [name for name, t in (*model.named_parameters(), *model.named_buffers()) if t.device.type == "meta"]
    if on_meta:
        raise ValueError(
            f"model has tensors on the 'meta' device (shapes without values), first {on_meta[0]!r}: "
            "materialise them (model.to_empty(device='cpu') and load the weights) before measuring"
        )
    for name, module in model.named_modules():
        where = f"submodule {name!r} ({type(module).__name__})" if name else f"the model ({type(module).__name__})"
        reason = _random_in_training(module)
        if reason is not None:
            raise ValueError(f"model has {reason} at {where}: call model.eval() so the loss is a fixed function")
        reason = _batch_dependent(module)
        if reason is not None:
            raise ValueError(
                f"model has {reason} at {where}: keep running statistics (track_running_stats=True, "
                "estimated on the data) or use a per-example normalisation (nn.LayerNorm, nn.GroupNorm)"
            )
    return model


class EmpiricalRisk:
    """``L(theta) = sum_b w_b loss(f(x_b; theta), y_b)`` for a model, a loss module and data.

    Args:
        model: the network ``f`` (any ``nn.Module``; batch norm must be in eval mode).
        loss: ``nn.CrossEntropyLoss()`` or ``nn.MSELoss()`` (reduction ``"mean"`` or
            ``"sum"``); a loss name such as ``"cross_entropy"`` is refused.
        data: an ``(x, y)`` pair of tensors or an iterable of ``(x, y)`` batches; the batches
            are kept in a list (each is visited once per product). At set-up the first
            batch's loss and gradient are evaluated twice and must agree (bit for bit on
            the CPU): a random forward is refused.
        params: the point; ``None`` means the model's own trainable parameters. A dict must
            name parameters of the model (a subset is allowed: the others are held fixed)
            and share the model's dtype and device.
        group: a ``torch.distributed`` process group, or ``None`` (one process). With a
            group, ``data`` is this rank's shard; weights, values and every product are
            those of all ranks' shards concatenated (see :mod:`lossgeom.distributed`).
            A ``DistributedDataParallel`` model is measured through its ``.module``.

    Attributes:
        point: the flat parameter vector (see :func:`flatten_params`).
        weights: ``w_b`` per batch; ``term_weights``: the weight ``w_b / t_b`` of one loss
            term of batch ``b`` under mean reduction (1 under sum reduction).
    """

    def __init__(
        self, model: nn.Module, loss: nn.Module, data: Data, *, params: Params | None = None, group: Group = None
    ) -> None:
        self.group = check_group(group)
        error, terms, local_value = None, [], 0.0
        try:
            terms = self._local_setup(model, loss, data, params)
        except (TypeError, ValueError) as err:
            if self.group is None:
                raise
            error = err
        if self.group is not None:
            agree_on_errors(error, self.group)
            check_same_point(self.point, self.names, [t.numel() for t in self._params.values()], self.group)
        total = int(all_reduce_sum(torch.tensor(float(sum(terms)), dtype=torch.float64), self.group))
        mean = self.loss.reduction == "mean"
        self.terms = terms
        #: the number of loss terms of all ranks' data together
        self.total_terms = total
        self.weights = [t / total if mean else 1.0 for t in terms]
        self.term_weights = [1.0 / total if mean else 1.0 for _ in terms]
        with torch.no_grad():
            local_value = sum(float(self.batch_loss(out, b)) for b, out in enumerate(self._outs))
        value = float(all_reduce_sum(torch.tensor(local_value, dtype=torch.float64), self.group))
        if not torch.isfinite(torch.tensor(value)):
            raise ValueError(f"the loss is non-finite ({value}) at params")
        self.first_outputs = self._outs[0] if len(self._outs) == 1 else None
        del self._outs

    def _local_setup(self, model: nn.Module, loss: nn.Module, data: Data, params: Params | None) -> list[int]:
        """This rank's checks of the model, loss, data and point; returns the batches' term counts."""
        if self.group is not None:
            check_sampler(data)
        self.model = check_model(unwrap_model(model))
        self.loss = loss_module(loss)
        self.batches = as_batches(data)
        if params is None:
            params = params_of(self.model, trainable_only=True, copy=False)
            if not params:
                raise ValueError("model has no trainable parameters (none with requires_grad=True)")
            parameter_dtype(params, "the model's parameters")
        else:
            if not isinstance(params, Mapping):
                raise TypeError(f"params must be a dict of name -> tensor, got {type(params).__name__}")
            if not params:
                raise ValueError("params must be a non-empty dict of name -> tensor")
            check_parameter_names(self.model, params)
            dtype, device = parameter_dtype(params)
            model_kinds = {(p.dtype, p.device) for p in self.model.parameters()}
            if model_kinds and (dtype, device) not in model_kinds:
                raise ValueError(
                    f"params are {dtype} on {device} but the model's parameters are "
                    f"{sorted(str(d) for d, _ in model_kinds)}: convert one to the other"
                )
        self.dtype, self.device = parameter_dtype(params)
        flat, self.unflatten = flatten_params(params)
        self.point = flat.detach()
        self.names = list(params)
        self._params = params
        for i, (x, y) in enumerate(self.batches):
            if torch.is_floating_point(x) and x.dtype != self.dtype:
                raise ValueError(
                    f"batch {i}: x is {x.dtype} but the parameters are {self.dtype}: convert x with x.to({self.dtype})"
                )
            if x.device != self.device or y.device != self.device:
                raise ValueError(f"batch {i}: data on {x.device}/{y.device} but the parameters on {self.device}")
            if torch.is_floating_point(x) and not torch.isfinite(x).all():
                raise ValueError(f"batch {i}: x must contain only finite values")
        with torch.no_grad():
            self._outs = [self._first_outputs(b) for b in range(len(self.batches))]
            terms = [
                check_targets(self.loss, out, self.batches[b][1], "y" if len(self.batches) == 1 else f"y of batch {b}")
                for b, out in enumerate(self._outs)
            ]
        self._check_deterministic()
        return terms

    def _loss_and_gradient(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss module's value on batch ``b`` at the point, and its gradient (detached)."""
        leaf = self.point.clone().requires_grad_(True)
        with torch.enable_grad():
            value = self.loss(self.outputs(leaf, b), self.batches[b][1])
            if not value.requires_grad:
                return value.detach(), torch.zeros_like(leaf)
            (grad,) = torch.autograd.grad(value, leaf, allow_unused=True, materialize_grads=True)
        return value.detach(), grad

    def _check_deterministic(self) -> None:
        """The determinism probe: the first batch's loss and gradient, evaluated twice, must agree.

        Bit for bit on the CPU and wherever ``torch.use_deterministic_algorithms(True)`` is
        set; elsewhere to ``1e3`` rounding units (atomic additions on accelerators may sum
        in another order). A non-finite loss is left to the check that names it.
        """
        first, second = self._loss_and_gradient(0), self._loss_and_gradient(0)
        if not all(bool(torch.isfinite(t).all()) for t in first):
            return
        exact = self.device.type == "cpu" or torch.are_deterministic_algorithms_enabled()
        for what, a, b in zip(("loss", "gradient"), first, second, strict=True):
            if not _agree(a, b, exact):
                gap = float((a - b).abs().max()) if a.numel() else 0.0
                raise ValueError(
                    f"model is not a fixed function of its parameters: its {what} on the first batch of "
                    f"data, evaluated twice at the same point, differs (by up to {gap:.3g}). Likely causes: "
                    "dropout in training mode (an nn.Dropout, or F.dropout(h, p, self.training) in a custom "
                    "forward: call model.eval()), other random operations in forward (sampling, stochastic "
                    "depth, noise), or random augmentation in the data; measure a fixed function (eval mode, "
                    "fixed data)"
                )

    @property
    def n_batches(self) -> int:
        """The number of batches the data holds."""
        return len(self.batches)

    @property
    def n(self) -> int:
        """The number of parameters (rows of every curvature matrix)."""
        return self.point.numel()

    def _first_outputs(self, b: int) -> torch.Tensor:
        """The outputs of batch ``b`` at the point, with the model's own errors named by batch."""
        try:
            return self.outputs(self.point, b)
        except (RuntimeError, IndexError) as err:
            shape = tuple(self.batches[b][0].shape)
            raise ValueError(f"model failed on batch {b} of data (x of shape {shape}): {err}") from err

    def outputs(self, vector: torch.Tensor, b: int) -> torch.Tensor:
        """``f(x_b; theta)`` at the flat parameter vector ``theta = vector``.

        Args:
            vector: the flat parameter vector ``theta``, of length :attr:`n`.
            b: the index of the batch.

        Returns:
            The model's outputs on ``x_b``.
        """
        with math_attention():
            out = torch.func.functional_call(self.model, self.unflatten(vector), (self.batches[b][0],))
        return tensor_output(out, self.model)

    def batch_loss(self, out: torch.Tensor, b: int) -> torch.Tensor:
        """``w_b loss(out, y_b)``: the batch's share of the risk, from its outputs.

        Args:
            out: the outputs of batch ``b``.
            b: the index of the batch.

        Returns:
            The scalar ``w_b loss(out, y_b)`` (the summed loss times the weight of one term).
        """
        y = self.batches[b][1]
        if isinstance(self.loss, nn.MSELoss):
            # (out - y)^2 summed, not F.mse_loss: equal values, and torch's forward-mode
            # rule for mse_loss's double backward fails (it writes into a ZeroTensor).
            total = ((out - y) ** 2).sum()
        else:
            total = nn.functional.cross_entropy(out, y, reduction="sum")
        return total * self.term_weights[b]

    def batch_value(self, vector: torch.Tensor, b: int) -> torch.Tensor:
        """``w_b loss(f(x_b; vector), y_b)``.

        Args:
            vector: the flat parameter vector ``theta``.
            b: the index of the batch.

        Returns:
            The scalar batch share of the risk at ``vector``.
        """
        return self.batch_loss(self.outputs(vector, b), b)

    def value(self, vector: torch.Tensor | None = None) -> torch.Tensor:
        """``L(theta)`` summed over batches (at the risk's point by default).

        Args:
            vector: the flat parameter vector ``theta``; ``None`` means :attr:`point`.

        Returns:
            The scalar ``L(theta) = sum_b w_b loss(f(x_b; theta), y_b)`` (over every rank's
            batches with a group; then detached: it is all-reduced).
        """
        vector = self.point if vector is None else vector
        local = sum(self.batch_value(vector, b) for b in range(self.n_batches))
        return local if self.group is None else all_reduce_sum(local, self.group)

    def output_hessian_product(self, out: torch.Tensor, u: torch.Tensor, b: int) -> torch.Tensor:
        """``Lambda_b u``: the Hessian of ``w_b loss(out, y_b)`` w.r.t. the outputs, applied to ``u``.

        Cross-entropy, per position with probabilities ``p = softmax(out)`` over axis 1:
        ``c (diag p - p p^T) u``; squared error: ``2 c u``, with ``c`` the weight of one term.

        Args:
            out: the outputs of batch ``b``.
            u: a tensor of the outputs' shape.
            b: the index of the batch.

        Returns:
            ``Lambda_b u``, of the outputs' shape.
        """
        c = self.term_weights[b]
        if isinstance(self.loss, nn.MSELoss):
            return 2.0 * c * u
        p = torch.softmax(out, dim=1)
        return c * (p * u - p * (p * u).sum(dim=1, keepdim=True))

    def example_shares(self, b: int) -> torch.Tensor:
        """``a_i`` per example of batch ``b``, with ``L = sum_i a_i l_i`` and ``l_i`` the loss of example i alone.

        ``l_i`` is the loss module applied to example ``i`` alone (its mean over the
        example's terms under mean reduction, their sum under sum reduction), so
        ``a_i = t_i w_b / t_b`` (mean) or 1 (sum), ``t_i`` the example's number of terms.

        Args:
            b: the index of the batch.

        Returns:
            A vector of length ``N_b`` (the batch's number of examples) holding ``a_i``, in the
            parameters' dtype and device.
        """
        x = self.batches[b][0]
        per_example = self.terms[b] // x.shape[0]
        share = per_example * self.term_weights[b] if self.loss.reduction == "mean" else 1.0
        return torch.full((x.shape[0],), share, dtype=self.dtype, device=self.device)


def _agree(a: torch.Tensor, b: torch.Tensor, exact: bool) -> bool:
    """``a == b`` bit for bit (``exact``), else to ``1e3`` rounding units of ``max |a|``."""
    if exact or not a.numel():
        return torch.equal(a, b)
    return float((a - b).abs().max()) <= 1e3 * torch.finfo(a.dtype).eps * float(a.abs().max())


def closure_risk_pieces(
    loss_fn: LossFn, params: Params
) -> tuple[torch.Tensor, Callable[[torch.Tensor], dict], Callable[[torch.Tensor], torch.Tensor]]:
    """Validate a closure ``loss_fn(params) -> scalar`` and return ``(point, unflatten, scalar)``.

    ``scalar(vector)`` evaluates ``loss_fn`` at the parameter dict ``unflatten(vector)``.

    Args:
        loss_fn: the closure ``loss_fn(params) -> scalar tensor`` (not an ``nn.Module``).
        params: the point, a non-empty dict of name -> tensor.

    Returns:
        ``(point, unflatten, scalar)``: the detached flat parameter vector, the map from a
        vector back to a parameter dict, and ``scalar(vector) -> 0-d tensor``.

    Raises:
        TypeError: if ``loss_fn`` is an ``nn.Module`` or not callable.
        ValueError: if ``params`` is empty, ``loss_fn`` does not return a finite scalar, or
            two evaluations at ``params`` differ (a random loss; bit for bit on the CPU).
    """
    if isinstance(loss_fn, nn.Module):
        raise TypeError(
            "the closure form takes loss_fn(params) -> scalar tensor, got an nn.Module; for a model "
            "pass a loss module and data, e.g. hessian_operator(model, nn.CrossEntropyLoss(), (x, y)), "
            "or build loss_fn with lossgeom.models.loss_closure(model, nn.CrossEntropyLoss(), (x, y))"
        )
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable as loss_fn(params) -> scalar tensor")
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a non-empty dict of name -> tensor, got {type(params).__name__}")
    if not params:
        raise ValueError("params must be a non-empty dict of name -> tensor")
    flat, unflatten = flatten_params(params)
    flat = flat.detach()

    def scalar(vector: torch.Tensor) -> torch.Tensor:
        with math_attention():
            value = loss_fn(unflatten(vector))
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise ValueError("loss_fn must return a scalar tensor")
        return value.reshape(())

    with torch.no_grad():
        value, again = scalar(flat), scalar(flat)
    if not torch.isfinite(value):
        raise ValueError(f"loss_fn returned a non-finite loss ({value.item()}) at params")
    if not _agree(value, again, flat.device.type == "cpu" or torch.are_deterministic_algorithms_enabled()):
        raise ValueError(
            f"loss_fn is not a fixed function of params: evaluated twice at params it returned {value.item()!r} "
            f"and {again.item()!r}. Likely causes: dropout in training mode (nn.Dropout, or F.dropout(h, p, "
            "self.training) in a custom forward: call model.eval()), other random operations in the forward, "
            "or data sampled or augmented inside loss_fn"
        )
    return flat, unflatten, scalar


__all__: Sequence[str] = [
    "EmpiricalRisk",
    "as_batches",
    "check_class_probabilities",
    "check_model",
    "check_targets",
    "closure_risk_pieces",
    "tensor_output",
    "loss_module",
    "math_attention",
]

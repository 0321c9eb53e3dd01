"""The empirical risk of a model: its loss module, summed over batches exactly as one big batch.

The module-first curvature operators take what a researcher already has: a
``torch.nn.Module`` ``f``, its loss module and its data (see :mod:`lossgeom.batches` for the
batch forms). Their empirical risk is

    L(theta) = sum_b w_b loss(f(x_b; theta), y_b),

the loss module itself evaluated on each batch, with ``w_b = D_b / D`` under
``reduction="mean"`` (``D_b`` the denominator of the module's mean on batch ``b``, ``D`` that
of all the data, so that the sum is torch's mean of one big batch: for ``ignore_index`` the
count of kept targets, see :func:`lossgeom.losses.term_counts`) and ``w_b = 1`` under
``reduction="sum"``.

:class:`EmpiricalRisk` checks the inputs once (targets of exactly the right shape, so
nothing broadcasts; class indices in range; the inputs' dtype that of the parameters;
batch norm in eval mode, with running statistics; a forward that is a fixed function, by
a determinism probe: the first batch's loss and gradient evaluated twice agree bit for
bit) and provides the pieces every operator needs: the outputs of a batch at a flat
parameter vector, the weighted batch loss, and the Hessian of that loss with respect to
the outputs (``Lambda`` of the Gauss-Newton matrix), by autograd of the loss module.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from lossgeom.batches import DataSource, ModelBatch
from lossgeom.distributed import (
    agree_on_errors,
    all_reduce_sum,
    check_group,
    check_same_point,
    check_sampler,
    unwrap_model,
)
from lossgeom.losses import check_loss, is_sum, output_hessian_products, term_counts
from lossgeom.outputs import _selected_output
from lossgeom.parameters import (
    Params,
    check_parameter_names,
    flatten_params,
    parameter_dtype,
    params_of,
)
from lossgeom.types import Data, Group, LossFn, Output


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
        model: the network ``f`` (any ``nn.Module``; batch norm in eval mode, with running
            statistics).
        loss: the loss module, called as ``loss(outputs, targets)`` for every value and
            derivative (see :mod:`lossgeom.losses`); a loss name such as
            ``"cross_entropy"`` is refused.
        data: one batch or an iterable of batches, as :mod:`lossgeom.batches` reads them:
            ``(x, y)`` pairs, dicts with the targets under ``"labels"`` (the model called
            with keyword inputs), lists held in memory or re-iterables (a ``DataLoader``)
            read afresh for every product. At set-up the first batch's loss and gradient
            are evaluated twice and must agree (bit for bit on the CPU): a random forward
            is refused; a streamed first batch read twice must agree too.
        params: the point; ``None`` means the model's own trainable parameters. A dict must
            name parameters of the model (a subset is allowed: the others are held fixed)
            of the model's shapes, dtype and device.
        group: a ``torch.distributed`` process group, or ``None`` (one process). With a
            group, ``data`` is this rank's shard; weights, values and every product are
            those of all ranks' shards concatenated (see :mod:`lossgeom.distributed`).
            A ``DistributedDataParallel`` model is measured through its ``.module``.
        output: selects the tensor of outputs from what the model returns (the rule of
            :mod:`lossgeom.outputs`: a tensor, this callable, or a ``logits`` entry).

    Attributes:
        point: the flat parameter vector (see :func:`flatten_params`).
        weights: ``w_b`` per batch, the factor of the loss module's value on batch ``b``:
            ``D_b / D`` under mean reduction (``D_b`` the batch's denominator, ``D`` that of
            all the data, see :func:`lossgeom.losses.term_counts`), 1 under sum reduction.
        total_terms: ``D``, the denominator of the mean over all ranks' data (``None`` for
            a loss module whose family the library does not know).
    """

    def __init__(
        self,
        model: nn.Module,
        loss: nn.Module,
        data: Data,
        *,
        params: Params | None = None,
        group: Group = None,
        output: Output = None,
    ) -> None:
        self.group = check_group(group)
        error, counts, values = None, [], []
        try:
            counts, values = self._local_setup(model, loss, data, params, output)
        except (TypeError, ValueError) as err:
            if self.group is None:
                raise
            error = err
        if self.group is not None:
            agree_on_errors(error, self.group)
            check_same_point(self.point, self.names, [t.numel() for t in self._params.values()], self.group)
        self.weights = self._batch_weights(counts)
        local = sum((w * v for w, v in zip(self.weights, values, strict=True) if w), 0.0)
        value = float(all_reduce_sum(torch.tensor(local, dtype=torch.float64), self.group))
        if not torch.isfinite(torch.tensor(value)):
            raise ValueError(f"the loss is non-finite ({value}) at params")
        for batch in self._held:
            batch.weight = self.weights[batch.index]

    def _batch_weights(self, counts: list[torch.Tensor | None]) -> list[float]:
        """``w_b`` from each batch's counts: ``D_b / D`` (mean), 1 (sum); refuses what it cannot weight."""
        known = all(c is not None for c in counts)
        local = float(sum(float(c.sum()) for c in counts)) if known else 0.0
        flags = torch.tensor([local, 0.0 if known else 1.0], dtype=torch.float64)
        total, unknown = (float(t) for t in all_reduce_sum(flags, self.group))
        self.total_terms = None if unknown else total
        if is_sum(self.loss):
            return [1.0 if c is None or float(c.sum()) > 0 else 0.0 for c in counts]
        if unknown:
            if len(counts) == 1 and self.group is None:
                return [1.0]
            raise ValueError(
                f"loss {type(self.loss).__name__} is not a loss family the library knows, so it cannot weight "
                "several batches (or ranks) as torch weights one big batch: give the class a method "
                "term_counts(out, y) returning each example's share of the mean's denominator, use "
                "reduction='sum', or pass the data as one batch"
            )
        if total <= 0:
            raise ValueError("every target of data is ignored (the loss's ignore_index, or zero class weights)")
        return [float(c.sum()) / total for c in counts]

    def _local_setup(
        self, model: nn.Module, loss: nn.Module, data: Data, params: Params | None, output: Output
    ) -> tuple[list, list]:
        """This rank's checks of the model, loss, data and point; returns each batch's counts and loss."""
        if self.group is not None:
            check_sampler(data)
        self.model = check_model(unwrap_model(model))
        if output is not None and not callable(output):
            raise TypeError(
                "output must be None or a callable selecting the tensor of outputs from what the model "
                f"returns (e.g. lambda out: out[0]), got {type(output).__name__}"
            )
        self.output = output
        self.loss = check_loss(loss)
        params = self._check_params(params)
        self.dtype, self.device = parameter_dtype(params)
        flat, self.unflatten = flatten_params(params)
        self.point = flat.detach()
        self.names = list(params)
        self._params = params
        self.source = DataSource(data, self.device)
        counts, values, self._held, first = [], [], [], None
        for batch in self.source:
            self._check_inputs(batch)
            with torch.no_grad():
                out = self._first_outputs(batch)
                where = "y" if batch.index == 0 and not self.source.streamed else f"y of batch {batch.index}"
                batch.counts = term_counts(self.loss, out, batch.y, where)
                empty = batch.counts is not None and float(batch.counts.sum()) == 0 and not is_sum(self.loss)
                values.append(0.0 if empty else self._checked_value(out, batch))
            counts.append(batch.counts)
            first = batch if first is None else first
            if not self.source.streamed:
                self._held.append(batch)
        self._counts = counts  # one number per example, for streamed batches read again
        if first is None:
            raise ValueError("data must hold at least one batch (empty data)")
        self.n_batches = len(counts)
        if self.source.streamed:
            again = next(iter(self.source))
            if not again.same_as(first):
                raise ValueError(
                    "data gave a different first batch when read again: the curvature reads the data once per "
                    "product, so it must be a fixed sequence of batches (no shuffling, no random augmentation)"
                )
        self._check_deterministic(first)
        return counts, values

    def _checked_value(self, out: torch.Tensor, batch: ModelBatch) -> float:
        """The loss module's value on a batch at the point, with its own errors named."""
        name = type(self.loss).__name__
        try:
            value = self.loss(out, batch.y)
        except (RuntimeError, ValueError, IndexError, TypeError) as err:
            raise ValueError(
                f"loss {name} failed on the outputs of batch {batch.index} (shape {tuple(out.shape)}) and its "
                f"targets (shape {tuple(batch.y.shape)}): {str(err).splitlines()[0]}"
            ) from err
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise ValueError(
                f"loss {name} must return a scalar tensor, got {getattr(value, 'shape', type(value).__name__)} "
                "(a reduction of 'mean' or 'sum')"
            )
        return float(value)

    def _check_params(self, params: Params | None) -> Params:
        if params is None:
            params = params_of(self.model, trainable_only=True, copy=False)
            if not params:
                raise ValueError("model has no trainable parameters (none with requires_grad=True)")
            parameter_dtype(params, "the model's parameters")
            return params
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
        return params

    def _check_inputs(self, batch: ModelBatch) -> None:
        where = "data" if batch.index == 0 else f"batch {batch.index} of data"
        for name, x in batch.tensors():
            if torch.is_floating_point(x) and x.dtype != self.dtype:
                raise ValueError(
                    f"{where}: {name} is {x.dtype} but the parameters are {self.dtype}: convert it with "
                    f"{name}.to({self.dtype})"
                )
            if torch.is_floating_point(x) and not torch.isfinite(x).all():
                raise ValueError(f"{where}: {name} must contain only finite values")
        if batch.n_examples == 0:
            raise ValueError(f"{where}: the inputs must hold at least one example (empty data)")
        if batch.y.ndim == 0 or batch.y.shape[0] != batch.n_examples:
            raise ValueError(
                f"{where}: the targets must hold one entry per example ({batch.n_examples}), got shape "
                f"{tuple(batch.y.shape)}"
            )

    def batches(self) -> Iterator[ModelBatch]:
        """One pass over the batches that carry a term of the loss, each with its weight ``w_b``.

        Held batches are the same objects on every pass; streamed ones are read afresh,
        and a pass that differs in length from the set-up's is refused.

        Yields:
            :class:`~lossgeom.batches.ModelBatch` objects with ``weight`` and ``counts``.
        """
        if not self.source.streamed:
            yield from (b for b in self._held if b.weight)
            return
        seen = 0
        for batch in self.source:
            seen += 1
            if batch.index < self.n_batches:
                batch.weight, batch.counts = self.weights[batch.index], self._counts[batch.index]
                if batch.weight:
                    yield batch
        if seen != self.n_batches:
            raise ValueError(f"data held {self.n_batches} batches at set-up but {seen} when read again")

    def _loss_and_gradient(self, batch: ModelBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss module's value on ``batch`` at the point, and its gradient (detached)."""
        leaf = self.point.clone().requires_grad_(True)
        with torch.enable_grad():
            value = self.loss(self.outputs(leaf, batch), batch.y)
            if not value.requires_grad:
                return value.detach(), torch.zeros_like(leaf)
            (grad,) = torch.autograd.grad(value, leaf, allow_unused=True, materialize_grads=True)
        return value.detach(), grad

    def _check_deterministic(self, batch: ModelBatch) -> None:
        """The determinism probe: the first batch's loss and gradient, evaluated twice, must agree.

        Bit for bit on the CPU and wherever ``torch.use_deterministic_algorithms(True)`` is
        set; elsewhere to ``1e3`` rounding units (atomic additions on accelerators may sum
        in another order). A non-finite loss is left to the check that names it.
        """
        first, second = self._loss_and_gradient(batch), self._loss_and_gradient(batch)
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
    def n(self) -> int:
        """The number of parameters (rows of every curvature matrix)."""
        return self.point.numel()

    def _first_outputs(self, batch: ModelBatch) -> torch.Tensor:
        """The outputs of ``batch`` at the point, with the model's own errors named by batch."""
        try:
            return self.outputs(self.point, batch)
        except (RuntimeError, IndexError) as err:
            shapes = {name: tuple(t.shape) for name, t in batch.tensors()}
            raise ValueError(f"model failed on batch {batch.index} of data (inputs {shapes}): {err}") from err

    def outputs(self, vector: torch.Tensor, batch: ModelBatch) -> torch.Tensor:
        """``f(x_b; theta)`` at the flat parameter vector ``theta = vector``.

        Args:
            vector: the flat parameter vector ``theta``, of length :attr:`n`.
            batch: the batch (from :meth:`batches`).

        Returns:
            The model's outputs on the batch, selected by the output rule.
        """
        with math_attention():
            out = torch.func.functional_call(self.model, self.unflatten(vector), batch.args, batch.kwargs)
        return _selected_output(out, self.output, self.model)

    def batch_loss(self, out: torch.Tensor, batch: ModelBatch) -> torch.Tensor:
        """``w_b loss(out, y_b)``: the batch's share of the risk, by the loss module itself.

        Args:
            out: the outputs of the batch.
            batch: the batch.

        Returns:
            The scalar ``w_b loss(out, y_b)``.
        """
        return self.loss(out, batch.y) * batch.weight

    def batch_value(self, vector: torch.Tensor, batch: ModelBatch) -> torch.Tensor:
        """``w_b loss(f(x_b; vector), y_b)``.

        Args:
            vector: the flat parameter vector ``theta``.
            batch: the batch.

        Returns:
            The scalar batch share of the risk at ``vector``.
        """
        return self.batch_loss(self.outputs(vector, batch), batch)

    def value(self, vector: torch.Tensor | None = None) -> torch.Tensor:
        """``L(theta)`` summed over batches (at the risk's point by default).

        Args:
            vector: the flat parameter vector ``theta``; ``None`` means :attr:`point`.

        Returns:
            The scalar ``L(theta) = sum_b w_b loss(f(x_b; theta), y_b)`` (over every rank's
            batches with a group; then detached: it is all-reduced).
        """
        vector = self.point if vector is None else vector
        local = sum((self.batch_value(vector, b) for b in self.batches()), torch.zeros((), dtype=self.dtype))
        return local if self.group is None else all_reduce_sum(local, self.group)

    def output_hessian_products(self, out: torch.Tensor, directions: torch.Tensor, batch: ModelBatch) -> torch.Tensor:
        """``Lambda_b u`` for each of ``k`` output directions: the Hessian of ``w_b loss`` w.r.t. the outputs.

        By autograd of the loss module (:func:`lossgeom.losses.output_hessian_products`).

        Args:
            out: the outputs of the batch.
            directions: ``(k, *out.shape)``.
            batch: the batch.

        Returns:
            ``(k, *out.shape)``.
        """
        return output_hessian_products(self.loss, out, batch.y, directions, batch.weight)

    def example_shares(self, batch: ModelBatch) -> torch.Tensor:
        """``a_i`` per example of the batch, with ``L = sum_i a_i l_i`` and ``l_i`` the loss of example i alone.

        ``l_i`` is the loss module applied to example ``i`` alone, so ``a_i = t_i / D``
        (mean reduction; ``t_i`` the example's count, zero for an example whose every
        target is ignored) or 1 (sum reduction).

        Args:
            batch: the batch.

        Returns:
            A vector of length ``N_b`` holding ``a_i``, in the parameters' dtype and device.

        Raises:
            ValueError: for a loss module whose family the library does not know.
        """
        if batch.counts is None:
            raise ValueError(
                f"a per-example quantity (the empirical Fisher) needs each example's share of the loss, and "
                f"loss {type(self.loss).__name__} is not a family the library knows: give it a method "
                "term_counts(out, y)"
            )
        if is_sum(self.loss):
            shares = torch.ones_like(batch.counts)
        else:
            shares = batch.counts / self.total_terms
        return shares.to(dtype=self.dtype, device=self.device)


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
    "check_model",
    "closure_risk_pieces",
    "math_attention",
]

"""A model at one parameter point, with its loss, data and dense curvature: the stored form of the measures.

The measures of :mod:`lossgeom.flatness.measures` take ``(model, loss, data, *, params=None,
group=None)``; :func:`lossgeom.flatness.measures.measure_at` evaluates them at one
:class:`LossPoint` instead, which keeps the dense Hessian and Fisher several measures share.
The loss is any loss module with mean reduction, called for every value and derivative
(:mod:`lossgeom.losses`: its options and subclasses are exact by construction); the data
an ``(x, y)`` pair or an iterable of ``(x, y)`` batches, concatenated. Examples that carry
no term of the loss (a target equal to the loss's ``ignore_index``, or of class weight
zero) are dropped when the point is made, so every measure is that of the examples the
loss reads, as torch's mean of one big batch weights them. A measure that needs a
likelihood (the Fisher, the Fisher-Rao norm, the softmax proxies) asks
:func:`lossgeom.losses.likelihood` for one and raises :class:`NotApplicable` with its
reason for a loss it does not know (class weights, label smoothing, a subclass that
overrides ``forward``). The model is evaluated in its own dtype; results are Python
floats. A model may return a tuple, a dict or a ``ModelOutput``: ``output=`` selects the
tensor of outputs by the rule of :mod:`lossgeom.outputs`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping

import numpy as np
import torch
from torch import nn

from lossgeom._validation import positive_int
from lossgeom.batches import DataSource
from lossgeom.curvature import HessianOperator, dense_fisher
from lossgeom.losses import check_likelihood_targets, check_loss, likelihood, term_counts
from lossgeom.outputs import _output_model
from lossgeom.parameters import flatten_params
from lossgeom.risk import check_model, math_attention
from lossgeom.types import Data, Params

Inputs = torch.Tensor | dict[str, object]


class NotApplicable(ValueError):
    """A measure is not defined for this model or loss (the message says why)."""


def _mean_loss(loss: object) -> nn.Module:
    """The loss module (:func:`lossgeom.losses.check_loss`), refusing any reduction but a mean."""
    loss = check_loss(loss)
    reduction = getattr(loss, "reduction", None)
    if reduction is not None and reduction not in ("mean", "batchmean"):
        raise ValueError(
            f"loss must use reduction='mean' (the measures are of the mean loss), got reduction={reduction!r}"
        )
    return loss


def _as_data(data: Data) -> tuple[Inputs, torch.Tensor]:
    """The examples of ``data`` as one batch ``(inputs, y)``: ``inputs`` a tensor, or a dict of keyword inputs.

    The batch forms are those of :mod:`lossgeom.batches`; the batches are concatenated
    along axis 0, so their examples must have one shape (pad ragged sequences to one length).
    """
    batches = list(DataSource(data, None))
    if not batches:
        raise ValueError("data must hold at least one batch (empty data)")
    keyword = {bool(b.kwargs) or not b.args for b in batches}
    if len(keyword) > 1 or any(len(b.args) > 1 for b in batches):
        raise TypeError("data: every batch must have the same form, (x, y) pairs or keyword inputs with targets")
    if keyword.pop():
        keys = list(batches[0].kwargs)
        if any(list(b.kwargs) != keys for b in batches):
            raise ValueError("data: every dict batch must hold the same keyword inputs")
        inputs: Inputs = {k: _concatenated([b.kwargs[k] for b in batches], k) for k in keys}
    else:
        inputs = _concatenated([b.args[0] for b in batches], "x")
    y = _concatenated([b.y for b in batches], "y")
    n = _n_examples(inputs)
    if n == 0:
        raise ValueError("data must hold at least one example")
    if y.ndim == 0 or y.shape[0] != n:
        raise ValueError(
            f"data must hold one target per example: the inputs have {n} rows, y has shape {tuple(y.shape)}"
        )
    return inputs, y


def _concatenated(parts: list, name: str) -> object:
    """One entry of the batches joined along axis 0 (a non-tensor entry must be the same in every batch)."""
    if not all(isinstance(t, torch.Tensor) for t in parts):
        if any(t is not parts[0] and t != parts[0] for t in parts):
            raise ValueError(f"data: the non-tensor input {name!r} differs between batches")
        return parts[0]
    if len(parts) == 1:
        return parts[0]
    shapes = {tuple(t.shape[1:]) for t in parts}
    if len(shapes) > 1:
        raise ValueError(
            f"data: the batches' {name} have different shapes per example {sorted(shapes)}; the flatness "
            "measures take the examples as one batch, so pad ragged sequences to one length (the curvature "
            "operators take such batches one by one)"
        )
    # the mean loss over all examples is the size-weighted mean of the batch means
    return torch.cat(parts)


def _n_examples(inputs: Inputs) -> int:
    tensors = (
        [inputs] if isinstance(inputs, torch.Tensor) else [t for t in inputs.values() if isinstance(t, torch.Tensor)]
    )
    if not tensors or tensors[0].ndim == 0:
        raise ValueError("data: the inputs must hold the examples along axis 0")
    return tensors[0].shape[0]


def _map_inputs(inputs: Inputs, fn: Callable[[torch.Tensor], torch.Tensor]) -> Inputs:
    """``fn`` applied to every tensor with an example axis of ``inputs`` (other entries kept)."""
    if isinstance(inputs, torch.Tensor):
        return fn(inputs)
    return {k: fn(v) if isinstance(v, torch.Tensor) and v.ndim else v for k, v in inputs.items()}


def _as_dtype(inputs: Inputs, dtype: torch.dtype) -> Inputs:
    return _map_inputs(inputs, lambda t: t.to(dtype) if torch.is_floating_point(t) else t)


def _copied_params(model: nn.Module, params: Params | None) -> dict[str, torch.Tensor]:
    """A detached copy of ``params`` (default the model's own), checked against the model's names, shapes, dtypes.

    As everywhere in :mod:`lossgeom`, the point is the model's trainable parameters
    (``requires_grad=True``); a frozen parameter keeps its stored value and is not a
    coordinate of the curvature.
    """
    own = {name: p for name, p in model.named_parameters() if p.requires_grad}
    if not own:
        raise ValueError("model has no trainable parameters (none with requires_grad=True)")
    if params is None:
        params = own
    elif not isinstance(params, Mapping) or set(params) != set(own):
        raise ValueError(f"params must be a dict with exactly the model's trainable parameter names {list(own)}")
    for name, value in params.items():
        if not isinstance(value, torch.Tensor) or value.shape != own[name].shape or value.dtype != own[name].dtype:
            raise ValueError(
                f"params[{name!r}] must be a tensor of shape {tuple(own[name].shape)} and dtype "
                f"{own[name].dtype} like the model's"
            )
    return {name: params[name].detach().clone() for name in own}


class LossPoint:
    """A model at one parameter point, with its loss and data, and the curvature computed there.

    :func:`~lossgeom.flatness.measures.measure_at` evaluates the measures of
    :mod:`lossgeom.flatness.measures` at a ``LossPoint``: build one to evaluate several
    measures at one point without recomputing the dense Hessian (:meth:`hessian`) and the
    Fisher (:meth:`fisher`), which are kept after their first use. The parameters are
    copied when the point is made; the model itself is only called
    (``torch.func.functional_call``), never changed.

    Args:
        model: a ``torch.nn.Module`` whose parameters share one float dtype; layers with
            state (batch norm) must be in eval mode.
        loss: a loss module with mean reduction, called as ``loss(outputs, y)`` (e.g.
            ``nn.CrossEntropyLoss()`` on logits ``(N, K)`` and class indices, with any of its
            options, or ``nn.MSELoss()`` on targets of the outputs' shape); targets are
            checked against the outputs by :func:`lossgeom.losses.term_counts`.
        data: one batch or an iterable of batches (see :mod:`lossgeom.batches`), concatenated (torch's
            mean of one big batch is the mean of the examples' terms); examples with no term
            of the loss (every target ``ignore_index``) are dropped.
        params: evaluate at these parameters (a dict with the names, shapes and dtypes of
            ``model.named_parameters()``) instead of the model's own.
        max_dense: the largest parameter count for which a dense Hessian or Fisher is
            formed (their cost grows as ``n^2`` in memory and ``n`` products).
        output: a callable selecting the tensor of outputs from what ``model`` returns (a
            tuple, a dict); ``None``: the output itself, or its tensor ``logits`` (attribute
            or key, as a HuggingFace ``ModelOutput``). :attr:`model` is then a view of the
            model, with its parameters, that returns the selected tensor.

    Attributes:
        n_dropped: the number of examples dropped because they carry no term of the loss.

    Raises:
        TypeError, ValueError: on a bad model, loss, data, params or output (named), data
            whose every target is ignored, or a non-finite loss.
    """

    def __init__(
        self,
        model: nn.Module,
        loss: nn.Module,
        data: Data,
        *,
        params: Params | None = None,
        max_dense: int = 5000,
        output: Callable[[object], torch.Tensor] | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        loss = _mean_loss(loss)
        floating = [p for p in model.parameters() if torch.is_floating_point(p)]
        if not floating:
            raise ValueError(f"model {type(model).__name__} has no floating-point parameters")
        dtypes = {p.dtype for p in floating}
        if len(dtypes) > 1:
            raise ValueError(f"model parameters must share one dtype, got {sorted(map(str, dtypes))}")
        check_model(model)
        self.model, self.loss, self.dtype = model, loss, dtypes.pop()
        self.max_dense = positive_int("max_dense", max_dense)
        x, y = _as_data(data)
        #: the inputs of all examples (a tensor, or a dict of keyword inputs)
        self.x = _as_dtype(x, self.dtype)
        self.y = y.to(self.dtype) if torch.is_floating_point(y) else y
        self.params = _copied_params(model, params)
        _output_model(model, output)  # a bad output= is refused before the model is called
        with torch.no_grad():
            try:
                outputs = self.outputs(self.params)
            except RuntimeError as err:
                raise ValueError(f"model failed on the data ({self.n_examples} examples): {err}") from err
            self.model = _output_model(model, output, outputs)
            outputs = self.outputs(self.params) if self.model is not model else outputs
            outputs = self._keep_terms(outputs)
            value = self._loss_value(outputs)
        if not torch.isfinite(value):
            raise ValueError(f"the loss is not finite ({value.item()}) at the model's parameters")
        self._hessian: np.ndarray | None = None
        self._fisher: np.ndarray | None = None

    def _keep_terms(self, outputs: torch.Tensor) -> torch.Tensor:
        """Check the targets and drop the examples with no term of the loss; the kept outputs."""
        counts = term_counts(self.loss, outputs, self.y, "y")
        self.n_dropped = 0
        if counts is None or bool((counts > 0).all()):
            return outputs
        kept = (counts > 0).to(self.y.device)
        if not bool(kept.any()):
            raise ValueError(
                "every target of data is ignored (the loss's ignore_index, or zero class weights): the loss has "
                "no term to measure"
            )
        self.n_dropped = int((~kept).sum())
        self.x, self.y = _map_inputs(self.x, lambda t: t[kept.to(t.device)]), self.y[kept]
        return outputs[kept.to(outputs.device)]

    def _loss_value(self, outputs: torch.Tensor) -> torch.Tensor:
        """The loss module on the outputs, its failures named; a scalar tensor."""
        name = type(self.loss).__name__
        try:
            value = self.loss(outputs, self.y)
        except (RuntimeError, ValueError, IndexError, TypeError) as err:
            raise ValueError(
                f"loss {name} failed on the outputs (shape {tuple(outputs.shape)}) and y (shape "
                f"{tuple(self.y.shape)}): {str(err).splitlines()[0]}"
            ) from err
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise ValueError(f"loss {name} must return a scalar tensor, got {getattr(value, 'shape', type(value))}")
        return value.reshape(())

    def likelihood(self, what: str) -> str:
        """The likelihood of the loss (:func:`lossgeom.losses.likelihood`), for a measure that needs one.

        Args:
            what: the measure, named in the reason.

        Returns:
            ``"canonical"`` or ``"log_probabilities"``.

        Raises:
            NotApplicable: with :func:`lossgeom.losses.likelihood`'s reason, for a loss that
                is not a negative log-likelihood the library knows.
        """
        try:
            return likelihood(self.loss, what)
        except ValueError as err:
            raise NotApplicable(str(err)) from None

    @property
    def n_parameters(self) -> int:
        """The number of scalar parameters ``n`` at the point (the size of its Hessian)."""
        return sum(p.numel() for p in self.params.values())

    @property
    def n_examples(self) -> int:
        """The number of examples at the point (those carrying a term of the loss)."""
        return _n_examples(self.x)

    @property
    def data(self) -> tuple[Inputs, torch.Tensor]:
        """The examples as one ``(x, y)`` batch, in the model's dtype (``x`` a dict of keyword inputs, or a tensor)."""
        return self.x, self.y

    def model_at_point(self) -> nn.Module:
        """A copy of the model carrying the point's parameters (the model itself is not changed).

        Returns:
            a deep copy of ``model`` whose parameters are the point's ``params``.
        """
        twin = copy.deepcopy(self.model)
        with torch.no_grad():
            for name, value in twin.named_parameters():
                value.copy_(self.params[name])
        return twin

    def _typed(self, params: Params) -> dict[str, torch.Tensor]:
        return {k: (v.to(self.dtype) if torch.is_floating_point(v) else v) for k, v in params.items()}

    def outputs(self, params: Params) -> torch.Tensor:
        """The model's outputs on the data with ``params``.

        Args:
            params: a dict of parameter tensors with the model's names (floating ones are
                cast to the model's dtype).

        Returns:
            the outputs of ``model`` on ``x`` (``torch.func.functional_call``), e.g. logits ``(N, K)``.
        """
        with math_attention():
            if isinstance(self.x, torch.Tensor):
                return torch.func.functional_call(self.model, self._typed(params), (self.x,))
            return torch.func.functional_call(self.model, self._typed(params), (), self.x)

    def loss_fn(self, params: Params) -> torch.Tensor:
        """The mean loss on the data at ``params`` (a scalar tensor).

        Args:
            params: a dict of parameter tensors with the model's names.

        Returns:
            ``loss(outputs(params), y)``, a scalar tensor (differentiable in ``params``).
        """
        return self.loss(self.outputs(params), self.y)

    def value(self) -> float:
        """The mean loss at the point.

        Returns:
            ``loss_fn(params)`` at the point's parameters, as a Python float.
        """
        with torch.no_grad():
            return float(self.loss_fn(self.params))

    def flat(self) -> torch.Tensor:
        """The parameters as one float64 vector (the order of ``model.named_parameters()``).

        Returns:
            a detached float64 tensor of shape ``(n_parameters,)``.
        """
        return flatten_params(self.params)[0].detach().to(torch.float64)

    def unflatten(self, vector: torch.Tensor) -> dict[str, torch.Tensor]:
        """The inverse of :meth:`flat`: a flat parameter vector as a dict of parameter tensors.

        Args:
            vector: a tensor of shape ``(n_parameters,)`` in the order of :meth:`flat`.

        Returns:
            a dict with the model's parameter names and shapes.
        """
        return flatten_params(self.params)[1](vector)

    def value_and_gradient(self, vector: torch.Tensor) -> tuple[float, torch.Tensor]:
        """The loss and its gradient (float64, flat) at the flat parameter vector ``vector``.

        Args:
            vector: a flat parameter vector of shape ``(n_parameters,)`` (cast to float64).

        Returns:
            ``(value, gradient)``: the mean loss as a float and its gradient, a detached
            float64 tensor of shape ``(n_parameters,)``.
        """
        leaf = vector.detach().to(torch.float64).clone().requires_grad_(True)
        value = self.loss_fn(self.unflatten(leaf))
        (grad,) = torch.autograd.grad(value, leaf)
        return float(value.detach()), grad.detach()

    def _check_dense(self, what: str) -> None:
        if self.n_parameters > self.max_dense:
            raise NotApplicable(
                f"{what} needs the dense {self.n_parameters} x {self.n_parameters} matrix, above "
                f"max_dense = {self.max_dense}; pass max_dense={self.n_parameters} (to the measure or to "
                "LossPoint) if memory allows, or use a matrix-free measure: hessian_trace(..., "
                "method='hutchpp'), lossgeom.curvature.lambda_max, lossgeom.curvature.hutchpp_trace on "
                "lossgeom.curvature.fisher_operator"
            )

    def hessian(self) -> np.ndarray:
        """The dense loss Hessian (float64, symmetrised), from Hessian-vector products.

        Reverse-over-reverse products of :class:`lossgeom.curvature.HessianOperator`, one per
        column; computed once per point.

        Returns:
            ``H = (1/2)(H + H^T)``, a float64 array of shape ``(n_parameters, n_parameters)``.

        Raises:
            NotApplicable: if ``n_parameters > max_dense``.
        """
        if self._hessian is None:
            self._check_dense("the dense Hessian")
            operator = HessianOperator.from_closure(self.loss_fn, self.params, method="reverse-over-reverse")
            eye = torch.eye(operator.shape[0], dtype=operator.dtype, device=operator.device)
            H = operator.matmat(eye).detach().cpu().numpy().astype(np.float64)
            self._hessian = 0.5 * (H + H.T)
        return self._hessian

    def fisher(self) -> np.ndarray:
        """The Fisher of the likelihood whose mean negative log-likelihood is the loss (float64, dense).

        For the softmax cross-entropy this is the true Fisher
        ``(1/N) sum_i J_i^T (diag p_i - p_i p_i^T) J_i``; for the mean squared error, that of
        the Gaussian likelihood with the variance that makes its mean negative
        log-likelihood the loss. For these canonical likelihoods it equals the generalised
        Gauss-Newton matrix (Martens 2020); ``nn.NLLLoss`` on log-probabilities has its own
        (see :func:`lossgeom.losses.likelihood`). Computed by
        :func:`lossgeom.curvature.dense_fisher` (``kind="true"``); for a model in another
        dtype than float64, on a float64 copy of it.

        Returns:
            the symmetrised Fisher, a float64 array of shape ``(n_parameters, n_parameters)``.

        Raises:
            NotApplicable: if ``n_parameters > max_dense``, or the loss is not a likelihood
                the library knows (class weights, label smoothing, an unknown loss module),
                or the targets or outputs are not those of its likelihood.
        """
        if self._fisher is None:
            law = self.likelihood("the Fisher")
            with torch.no_grad():
                try:
                    check_likelihood_targets(law, self.loss, self.outputs(self.params), self.y)
                except ValueError as err:
                    raise NotApplicable(f"the Fisher: {err}") from None
            self._check_dense("the dense Fisher")
            model, params, x, y = self.model, self.params, self.x, self.y
            if self.dtype != torch.float64:
                model = copy.deepcopy(model).to(torch.float64)
                params = {k: v.to(torch.float64) for k, v in params.items()}
                x = _as_dtype(x, torch.float64)
                y = y.to(torch.float64) if torch.is_floating_point(y) else y
            G = dense_fisher(model, self.loss, (x, y), params=params, kind="true").detach()
            G = np.asarray(G.to(torch.float64).numpy())
            self._fisher = 0.5 * (G + G.T)
        return self._fisher

    def block_indices(self, name: str) -> np.ndarray:
        """The positions of parameter ``name`` in the flat vector (and in the Hessian's rows).

        Args:
            name: a parameter name of ``model.named_parameters()``.

        Returns:
            an integer array of the ``params[name].numel()`` consecutive flat indices.

        Raises:
            ValueError: if ``name`` is not a parameter of the model.
        """
        if name not in self.params:
            raise ValueError(f"{name!r} is not a parameter of the model; parameters are {sorted(self.params)}")
        start = 0
        for key, value in self.params.items():
            if key == name:
                return np.arange(start, start + value.numel())
            start += value.numel()
        raise AssertionError("unreachable")

    def softmax_classification(self, what: str) -> None:
        """Refuse a loss or data other than the softmax cross-entropy likelihood on ``(N, K)`` logits and classes.

        Args:
            what: the measure, named in the reason.

        Raises:
            NotApplicable: if the loss is not an ``nn.CrossEntropyLoss`` whose likelihood
                :func:`lossgeom.losses.likelihood` accepts (no class weights, no label
                smoothing, no overridden ``forward``), or the data are not logits ``(N, K)``
                with integer class targets ``(N,)``.
        """
        if not isinstance(self.loss, nn.CrossEntropyLoss):
            raise NotApplicable(f"{what} need a softmax cross-entropy loss (nn.CrossEntropyLoss)")
        self.likelihood(what)
        with torch.no_grad():
            shape = tuple(self.outputs(self.params).shape)
        if len(shape) != 2 or torch.is_floating_point(self.y):
            raise NotApplicable(
                f"{what} are derived for a softmax cross-entropy on logits (N, K) and integer class targets (N,), "
                f"got outputs {shape} and y {tuple(self.y.shape)} {self.y.dtype}"
            )

    def classifier(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``([W b], [h 1])``: the last Linear layer (bias as an extra column) and its input features.

        The features are what the Linear layer whose output is the model's output reads on
        the data (found with forward hooks, so any model whose logits come straight from an
        ``nn.Linear`` qualifies). A bias ``b`` joins ``W`` as a last column and ``h`` gains a
        constant 1, so the logits are ``[W b] [h; 1]`` and the common-row shift acts on the
        augmented rows.

        Returns:
            ``(W, h)``: the float64 weight ``(K, d)`` (``(K, d + 1)`` with a bias) and the
            float64 features ``(N, d)`` (``(N, d + 1)`` with a bias).

        Raises:
            NotApplicable: if the loss is not the plain softmax cross-entropy on logits
                ``(N, K)`` and class indices (its likelihood; ``ignore_index`` allowed), or the
                outputs are not an ``nn.Linear`` layer's output.
        """
        self.softmax_classification("the softmax proxies")
        seen: list[tuple[nn.Linear, torch.Tensor, torch.Tensor]] = []
        hooks = [
            m.register_forward_hook(lambda mod, args, out: seen.append((mod, args[0], out)))
            for m in self.model.modules()
            if isinstance(m, nn.Linear)
        ]
        try:
            with torch.no_grad():
                out = self.outputs(self.params)
        finally:
            for hook in hooks:
                hook.remove()
        found = [(mod, h) for mod, h, o in seen if o is out]
        if not found:
            raise NotApplicable(
                "the model's outputs are not the output of an nn.Linear layer, so there is no "
                "softmax classifier W to read"
            )
        module, h = found[-1]
        name = next(n for n, m in self.model.named_modules() if m is module)
        W = self.params[f"{name}.weight" if name else "weight"].detach().to(torch.float64)
        h = h.detach().to(torch.float64).reshape(h.shape[0], -1)
        if module.bias is not None:
            b = self.params[f"{name}.bias" if name else "bias"].detach().to(torch.float64)
            W = torch.cat([W, b[:, None]], dim=1)
            h = torch.cat([h, torch.ones(h.shape[0], 1, dtype=torch.float64)], dim=1)
        return W, h

r"""The loss module is the definition of the loss: what the library reads from it, and nothing more.

Every loss value, gradient, Hessian product and Gauss-Newton product of ``lossgeom`` is
computed by calling the caller's loss module itself, so every option (``weight``,
``ignore_index``, ``label_smoothing``, ``pos_weight``, ``reduction``) and every subclass is
exact by construction. The library needs three things more than the module's value, and this
module supplies them:

- **How a mean weights batches.** Torch's mean of one big batch divides the summed terms by
  a denominator :math:`D`; split into batches, the risk is :math:`\sum_b (D_b / D)\,
  \ell_b` with :math:`\ell_b` the module's mean on batch :math:`b`. :func:`term_counts` gives
  each example's share :math:`t_i` of :math:`D_b = \sum_i t_i`: the number of output entries
  for element-wise losses (``MSELoss``, ``BCEWithLogitsLoss``, ...), the summed class weights
  of the kept targets for ``CrossEntropyLoss`` and ``NLLLoss`` (``ignore_index`` entries
  count zero, as in torch), the positions for soft targets. A subclass is weighted as its
  base class; any module may define ``term_counts(out, y)`` itself (as :class:`CausalLMLoss`
  does), and a module the library does not know is accepted where no weighting is needed
  (one batch on one process, or ``reduction="sum"``) and refused by name elsewhere.
- **The Hessian with respect to the outputs** (:math:`\Lambda` of the Gauss-Newton matrix),
  by autograd of the module on the outputs: :func:`output_hessian_products`.
- **A likelihood**, only for what needs one (the true Fisher, the Fisher-Rao norm, the
  softmax measures): :func:`likelihood` knows the categorical likelihood of
  ``CrossEntropyLoss`` (and :class:`CausalLMLoss`), the Bernoulli one of
  ``BCEWithLogitsLoss``, the Gaussian one of ``MSELoss`` (variance 1/2, so that its negative
  log-likelihood is the squared error) and ``NLLLoss`` on log-probabilities, and refuses
  anything else, and any option that makes the loss other than a negative log-likelihood
  (class weights, label smoothing, ``pos_weight``), by name. A module may declare
  ``likelihood = "canonical"`` (its output Hessian is its Fisher) itself.

Targets are checked against the outputs where the family is known: exactly the expected
shape (nothing broadcasts) and class indices in range, except the ``ignore_index`` ones.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

_INDEX_TARGETS = (nn.CrossEntropyLoss, nn.NLLLoss)
_ELEMENTWISE = (
    nn.MSELoss,
    nn.L1Loss,
    nn.SmoothL1Loss,
    nn.HuberLoss,
    nn.BCELoss,
    nn.BCEWithLogitsLoss,
    nn.SoftMarginLoss,
    nn.KLDivLoss,
)
_LIKELIHOODS = (nn.CrossEntropyLoss, nn.NLLLoss, nn.BCEWithLogitsLoss, nn.MSELoss)
#: the reductions a loss module may have (``batchmean`` only for ``nn.KLDivLoss``)
REDUCTIONS = ("mean", "sum")


def check_loss(loss: object) -> nn.Module:
    """Check that ``loss`` is a loss module the library can call, and return it.

    Any ``nn.Module`` called as ``loss(outputs, targets)`` that returns a scalar is a loss;
    its ``reduction`` (when it has one) must be ``"mean"`` or ``"sum"`` (``"batchmean"`` for
    ``nn.KLDivLoss``): ``"none"`` returns per-element losses, not a loss.

    Args:
        loss: the loss module.

    Returns:
        ``loss`` itself.

    Raises:
        TypeError: if ``loss`` is a string, a dict or not an ``nn.Module`` (a function such
            as ``F.cross_entropy`` is refused: pass ``nn.CrossEntropyLoss()``).
        ValueError: on a reduction other than ``"mean"`` or ``"sum"``.
    """
    if isinstance(loss, str):
        raise TypeError(
            f"loss must be a loss module, got the string {loss!r}: pass e.g. nn.CrossEntropyLoss() "
            "or nn.MSELoss() (loss names are not accepted)"
        )
    if isinstance(loss, Mapping):
        raise TypeError(
            "loss must be a loss module (e.g. nn.CrossEntropyLoss()), got a dict: the form "
            "(model, params, x, y, loss) is gone; pass (model, loss, (x, y), params=params)"
        )
    if not isinstance(loss, nn.Module):
        raise TypeError(
            f"loss must be an nn.Module called as loss(outputs, targets), got {type(loss).__name__} "
            "(for a function such as F.cross_entropy pass the module nn.CrossEntropyLoss())"
        )
    reduction = getattr(loss, "reduction", None)
    allowed = (*REDUCTIONS, "batchmean") if isinstance(loss, nn.KLDivLoss) else REDUCTIONS
    if reduction is not None and reduction not in allowed:
        raise ValueError(
            f"the loss's reduction must be one of {list(allowed)}, got {reduction!r} (reduction='none' "
            "returns one loss per element, not a loss)"
        )
    return loss


def is_sum(loss: nn.Module) -> bool:
    """Whether the loss module sums its terms (``reduction="sum"``), so batches add with weight one.

    Args:
        loss: the loss module.

    Returns:
        ``True`` for ``reduction="sum"``.
    """
    return getattr(loss, "reduction", None) == "sum"


def term_counts(loss: nn.Module, out: torch.Tensor, y: torch.Tensor, where: str = "y") -> torch.Tensor | None:
    """Each example's share ``t_i`` of the denominator of the loss's mean, after checking the targets.

    ``sum_i t_i`` is what torch's mean reduction divides the summed terms of the batch by
    (see the module docstring); under ``reduction="sum"`` the same counts say which
    examples hold a term at all.

    Args:
        loss: the loss module.
        out: the batch's outputs (examples on axis 0).
        y: the batch's targets.
        where: the name of the targets, used in error messages.

    Returns:
        A float64 vector of length ``out.shape[0]`` on ``out``'s device, or ``None`` for a
        loss module whose family the library does not know (and that defines no
        ``term_counts(out, y)``).

    Raises:
        ValueError: on targets of the wrong shape or dtype, class indices outside ``[0, C)``
            (``ignore_index`` entries excepted), or a ``term_counts`` method that does not
            return one non-negative finite count per example.
    """
    custom = getattr(loss, "term_counts", None)
    if callable(custom):
        counts = custom(out, y)
        if not isinstance(counts, torch.Tensor) or counts.shape != out.shape[:1]:
            raise ValueError(
                f"{type(loss).__name__}.term_counts(out, y) must return one count per example, a tensor of shape "
                f"{tuple(out.shape[:1])}, got {getattr(counts, 'shape', type(counts).__name__)}"
            )
        counts = counts.detach().to(torch.float64)
        if not bool(torch.isfinite(counts).all()) or bool((counts < 0).any()):
            raise ValueError(f"{type(loss).__name__}.term_counts(out, y) must return non-negative finite counts")
        return counts
    if isinstance(loss, _INDEX_TARGETS):
        return _class_counts(loss, out, y, where)
    if isinstance(loss, _ELEMENTWISE):
        if y.shape != out.shape:
            raise ValueError(
                f"for {type(loss).__name__} {where} must have the outputs' shape {tuple(out.shape)}, got "
                f"{tuple(y.shape)} (it would broadcast)"
            )
        if y.dtype != out.dtype:
            raise ValueError(f"{where} must have the outputs' dtype {out.dtype}, got {y.dtype}")
        per_example = 1 if getattr(loss, "reduction", None) == "batchmean" else out[0].numel()
        return torch.full((out.shape[0],), float(per_example), dtype=torch.float64, device=out.device)
    return None


def _class_counts(loss: nn.Module, out: torch.Tensor, y: torch.Tensor, where: str) -> torch.Tensor:
    """``t_i`` of the cross-entropy and NLL: kept targets, weighted by their class weight."""
    name = type(loss).__name__
    if out.ndim < 2:
        raise ValueError(f"for {name} the outputs must be (N, C) or (N, C, d1, ...), got shape {tuple(out.shape)}")
    n_classes = out.shape[1]
    expected = out.shape[:1] + out.shape[2:]
    if torch.is_floating_point(y):
        if not isinstance(loss, nn.CrossEntropyLoss) or y.shape != out.shape:
            raise ValueError(
                f"for {name} with outputs of shape {tuple(out.shape)} {where} must hold integer class indices of "
                f"shape {tuple(expected)}"
                + (" or class probabilities of the outputs' shape" if isinstance(loss, nn.CrossEntropyLoss) else "")
                + f", got a floating tensor of shape {tuple(y.shape)}"
            )
        if y.dtype != out.dtype:
            raise ValueError(f"{where} (class probabilities) must have the outputs' dtype {out.dtype}, got {y.dtype}")
        positions = out[0].numel() // n_classes
        return torch.full((out.shape[0],), float(positions), dtype=torch.float64, device=out.device)
    if y.shape != expected:
        raise ValueError(
            f"for {name} with outputs of shape {tuple(out.shape)} (classes on axis 1) {where} must have shape "
            f"{tuple(expected)}, got {tuple(y.shape)}"
        )
    kept = y != loss.ignore_index
    if bool(kept.any()):
        values = y[kept]
        if int(values.min()) < 0 or int(values.max()) >= n_classes:
            raise ValueError(
                f"{where} must hold class indices in [0, {n_classes}) or the loss's ignore_index "
                f"{loss.ignore_index}, got values in [{int(values.min())}, {int(values.max())}]"
            )
    weight = kept.to(torch.float64)
    if loss.weight is not None:
        weight = weight * loss.weight.detach().to(torch.float64)[torch.where(kept, y, 0)]
    return weight.reshape(out.shape[0], -1).sum(dim=1)


def output_hessian_products(
    loss: nn.Module, out: torch.Tensor, y: torch.Tensor, directions: torch.Tensor, scale: float = 1.0
) -> torch.Tensor:
    """``Lambda u`` for each direction ``u``: the Hessian of ``scale * loss(out, y)`` w.r.t. the outputs.

    By autograd of the loss module itself (reverse over reverse, vmapped over the
    directions), so every option and subclass is exact by construction.

    Args:
        loss: the loss module.
        out: the outputs (detached), the point of the Hessian.
        y: the targets.
        directions: ``k`` output directions stacked on axis 0, shape ``(k, *out.shape)``.
        scale: the factor of the loss (the batch's weight in the risk).

    Returns:
        ``(k, *out.shape)``: ``Lambda`` applied to each direction.
    """
    grad = torch.func.grad(lambda o: loss(o, y) * scale)
    _, vjp = torch.func.vjp(grad, out.detach())
    return torch.func.vmap(lambda u: vjp(u)[0])(directions)


def likelihood(loss: nn.Module, what: str) -> str:
    """The likelihood whose negative log is the loss, for a quantity that needs one; refuses others by name.

    ``"canonical"``: the loss is the negative log-likelihood of an exponential family in
    its natural parameter (the cross-entropy on logits, the Bernoulli likelihood on logits,
    the Gaussian with variance 1/2), so the Fisher of the outputs is the loss's own Hessian
    with respect to them (Martens 2020). ``"log_probabilities"``: ``nn.NLLLoss`` on
    log-probabilities ``out``, whose Fisher is ``diag(exp(out))`` per position.

    Args:
        loss: the loss module.
        what: the quantity that needs the likelihood, named in the error.

    Returns:
        ``"canonical"`` or ``"log_probabilities"``.

    Raises:
        ValueError: if the loss is not one of those likelihoods (named), a subclass that
            overrides ``forward`` without declaring ``likelihood``, or has an option that
            makes it other than a negative log-likelihood (``weight``, ``label_smoothing``,
            ``pos_weight``).
    """
    declared = getattr(loss, "likelihood", None)
    base = next((cls for cls in _LIKELIHOODS if isinstance(loss, cls)), None)
    name = type(loss).__name__
    if declared not in (None, "canonical", "log_probabilities"):
        raise ValueError(f"{name}.likelihood must be 'canonical' or 'log_probabilities', got {declared!r}")
    if declared is None and base is None:
        raise ValueError(
            f"{what} needs a likelihood, and the loss {name} is not one the library knows: it knows "
            "nn.CrossEntropyLoss, nn.BCEWithLogitsLoss, nn.MSELoss and nn.NLLLoss on log-probabilities "
            "(a loss module may declare likelihood = 'canonical' when its output Hessian is its Fisher)"
        )
    if declared is None and type(loss).forward is not base.forward:
        raise ValueError(
            f"{what} needs a likelihood, and {name} overrides the forward of {base.__name__}, so it may "
            "compute another loss; declare likelihood = 'canonical' on the class if its output Hessian is "
            "its Fisher"
        )
    for option, off in (("weight", None), ("label_smoothing", 0.0), ("pos_weight", None)):
        value = getattr(loss, option, off)
        if value is not off and not (isinstance(value, float) and value == off):
            raise ValueError(
                f"{what} needs a likelihood, and {name}({option}=...) is not a negative log-likelihood "
                f"(the option reweights or smooths it); use {option}={off!r} for this quantity"
            )
    if declared is not None:
        return declared
    return "log_probabilities" if isinstance(loss, nn.NLLLoss) else "canonical"


def check_likelihood_targets(kind: str, loss: nn.Module, out: torch.Tensor, y: torch.Tensor) -> None:
    """Refuse outputs and targets for which the likelihood's Fisher is not the one stated.

    Soft cross-entropy targets must be probabilities (rows summing to one: the output
    Hessian scales with the row sum); ``nn.NLLLoss``'s outputs must be log-probabilities
    (``logsumexp`` over the class axis 1 equal to zero).

    Args:
        kind: what :func:`likelihood` returned.
        loss: the loss module.
        out: the outputs of one batch.
        y: its targets.

    Raises:
        ValueError: on soft targets that are not probabilities or outputs that are not
            log-probabilities.
    """
    tol = max(1e-6, 100 * torch.finfo(out.dtype).eps)
    if kind == "log_probabilities":
        worst = float(torch.logsumexp(out.detach(), dim=1).abs().max()) if out.numel() else 0.0
        if worst > tol:
            raise ValueError(
                f"nn.NLLLoss reads log-probabilities, but the outputs' logsumexp over the class axis 1 is off "
                f"zero by {worst:.3g}: end the model with log_softmax(dim=1)"
            )
    elif isinstance(loss, nn.CrossEntropyLoss) and torch.is_floating_point(y) and y.shape == out.shape:
        if float(y.min()) < 0 or float((y.sum(dim=1) - 1).abs().max()) > tol:
            raise ValueError(
                "soft cross-entropy targets y must be class probabilities (non-negative, summing to 1 over "
                "the class axis 1) for the likelihood's Fisher"
            )


def fisher_output_products(
    kind: str, loss: nn.Module, out: torch.Tensor, y: torch.Tensor, directions: torch.Tensor, scale: float = 1.0
) -> torch.Tensor:
    """``M u`` for each direction: the Fisher of the likelihood with respect to the outputs, times ``scale``.

    ``"canonical"``: the loss's own output Hessian (:func:`output_hessian_products`).
    ``"log_probabilities"``: ``c diag(exp(out))`` at the kept positions, ``c`` the weight of
    one term (``scale`` over the batch's count under mean reduction).

    Args:
        kind: what :func:`likelihood` returned.
        loss: the loss module.
        out: the outputs (detached).
        y: the targets.
        directions: ``(k, *out.shape)``.
        scale: the batch's weight in the risk.

    Returns:
        ``(k, *out.shape)``.
    """
    if kind == "canonical":
        return output_hessian_products(loss, out, y, directions, scale)
    kept = (y != loss.ignore_index).unsqueeze(1).to(out.dtype)
    count = float(kept.sum()) if getattr(loss, "reduction", "mean") == "mean" else 1.0
    c = scale / count if count else 0.0
    return c * kept * out.detach().exp() * directions


class CausalLMLoss(nn.CrossEntropyLoss):
    """The next-token cross-entropy of a causal language model, as a loss module.

    ``CausalLMLoss()(logits, labels)`` with logits ``(N, T, V)`` and labels ``(N, T)`` is the
    cross-entropy of the logits at positions ``0 .. T-2`` against the labels at ``1 .. T-1``
    (the labels are shifted, not the inputs), every option of ``nn.CrossEntropyLoss`` kept;
    ``ignore_index`` defaults to -100, torch's and HuggingFace's mark of padding. Its
    :meth:`term_counts` are the kept next-token targets of each sequence, so batches and
    ranks are weighted exactly as one big batch.

    >>> import torch
    >>> logits = torch.zeros(1, 3, 4, dtype=torch.float64)  # uniform over 4 tokens
    >>> labels = torch.tensor([[7, 1, -100]])  # the first label is never a target
    >>> round(float(CausalLMLoss()(logits, labels)), 12) == round(float(torch.log(torch.tensor(4.0))), 12)
    True
    """

    #: its output Hessian is its Fisher (a categorical likelihood on logits)
    likelihood = "canonical"

    def _shifted(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if logits.ndim != 3 or labels.shape != logits.shape[:2]:
            raise ValueError(
                f"CausalLMLoss needs logits (N, T, V) and labels (N, T), got {tuple(logits.shape)} and "
                f"{tuple(labels.shape)}"
            )
        return logits[:, :-1].movedim(-1, 1), labels[:, 1:]

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The mean (or summed) cross-entropy of each position's logits against the next label.

        Args:
            logits: ``(N, T, V)``.
            labels: ``(N, T)`` token ids, ``ignore_index`` where nothing is predicted.

        Returns:
            The scalar loss.
        """
        return super().forward(*self._shifted(logits, labels))

    def term_counts(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The kept next-token targets of each sequence (class-weighted with ``weight``).

        Args:
            logits: ``(N, T, V)``.
            labels: ``(N, T)``.

        Returns:
            A float64 vector of length ``N``.
        """
        return _class_counts(self, *self._shifted(logits, labels), where="labels")


__all__ = [
    "REDUCTIONS",
    "CausalLMLoss",
    "check_likelihood_targets",
    "check_loss",
    "fisher_output_products",
    "is_sum",
    "likelihood",
    "output_hessian_products",
    "term_counts",
]

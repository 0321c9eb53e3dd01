"""Batches as training code has them: pairs, dicts and HuggingFace batches, in memory or streamed.

``data`` is one batch or an iterable of batches. A batch is

- a pair ``(x, y)``: the model is called as ``model(x)`` and the loss reads ``y``; ``x`` may
  also be a dict of keyword inputs, ``model(**x)``;
- a dict (a HuggingFace ``BatchEncoding`` included) holding the targets under ``"labels"``:
  the model is called with every other entry as a keyword input,
  ``model(input_ids=..., attention_mask=...)``, and the loss reads ``batch["labels"]``.

Which entry is the target is this rule, and only this one: to use another key, build the
pairs, e.g. ``[({"input_ids": b["input_ids"]}, b["target"]) for b in loader]``.

An iterable of batches is read afresh for every product and never kept (random
augmentation would show as data that change between passes, and is refused); it must be
re-iterable, as a list or a ``torch.utils.data.DataLoader`` is: a one-shot iterator or
generator is refused, since every curvature product reads the data again. Each batch's
tensors move to the parameters' device.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import torch

#: the key of the targets in a dict batch (HuggingFace's convention)
TARGET_KEY = "labels"


@dataclass
class ModelBatch:
    """One batch split into the model's inputs and the loss's targets.

    Attributes:
        index: the batch's position in a pass over the data.
        args: the model's positional inputs (``(x,)`` for a pair, empty for keyword inputs).
        kwargs: the model's keyword inputs.
        y: the targets the loss module reads.
    """

    index: int
    args: tuple
    kwargs: dict
    y: torch.Tensor
    #: filled by :class:`lossgeom.risk.EmpiricalRisk`: the factor of the loss module's value
    weight: float = 1.0
    #: each example's share ``t_i`` of the mean's denominator (``None`` for an unknown loss)
    counts: torch.Tensor | None = field(default=None, repr=False)

    @property
    def n_examples(self) -> int:
        """The number of examples (axis 0 of the first input tensor)."""
        for value in (*self.args, *self.kwargs.values()):
            if isinstance(value, torch.Tensor) and value.ndim:
                return value.shape[0]
        return self.y.shape[0]

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The batch's input tensors with their names (``x`` or the keyword).

        Returns:
            An iterator of ``(name, tensor)`` pairs, positional inputs first.
        """
        for i, value in enumerate(self.args):
            if isinstance(value, torch.Tensor):
                yield ("x" if len(self.args) == 1 else f"x[{i}]"), value
        for key, value in self.kwargs.items():
            if isinstance(value, torch.Tensor):
                yield key, value

    def same_as(self, other: ModelBatch) -> bool:
        """Whether two batches hold the same tensors bit for bit (the same data read twice).

        Args:
            other: the batch to compare with.

        Returns:
            ``True`` if every input tensor and the targets agree in name, shape and value.
        """
        mine, theirs = list(self.tensors()), list(other.tensors())
        return (
            [k for k, _ in mine] == [k for k, _ in theirs]
            and all(a.shape == b.shape and torch.equal(a, b) for (_, a), (_, b) in zip(mine, theirs, strict=True))
            and self.y.shape == other.y.shape
            and torch.equal(self.y, other.y)
        )


def _move(value: object, device: torch.device) -> object:
    return value.to(device) if isinstance(value, torch.Tensor) and value.device != device else value


def split_batch(batch: object, index: int, device: torch.device | None = None) -> ModelBatch:
    """One batch as the model's inputs and the loss's targets (see the module docstring).

    Args:
        batch: a pair ``(x, y)`` (``x`` a tensor or a dict of keyword inputs) or a dict with
            the targets under ``"labels"``.
        index: its position in the data, named in errors.
        device: where its tensors move (``None``: where they are).

    Returns:
        The :class:`ModelBatch`.

    Raises:
        TypeError: if the batch has none of those forms or its targets are not a tensor.
    """
    where = "data" if index == 0 else f"batch {index} of data"
    if isinstance(batch, Mapping):
        if TARGET_KEY not in batch:
            raise TypeError(
                f"{where} is a dict without the targets under {TARGET_KEY!r} (keys {sorted(map(str, batch))}): "
                f"a dict batch holds the model's keyword inputs and the targets under {TARGET_KEY!r}; for another "
                "layout pass (inputs, y) pairs"
            )
        args, kwargs, y = (), {k: v for k, v in batch.items() if k != TARGET_KEY}, batch[TARGET_KEY]
    elif isinstance(batch, (tuple, list)) and len(batch) == 2:
        x, y = batch
        if isinstance(x, Mapping):
            args, kwargs = (), dict(x)
        elif isinstance(x, torch.Tensor):
            args, kwargs = (x,), {}
        else:
            raise TypeError(f"{where}: x must be a tensor or a dict of keyword inputs, got {type(x).__name__}")
    else:
        raise TypeError(
            f"{where} must be an (x, y) pair or a dict with the targets under {TARGET_KEY!r}, got "
            f"{type(batch).__name__}"
        )
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"{where}: the targets must be a tensor, got {type(y).__name__}")
    if device is not None:
        args = tuple(_move(a, device) for a in args)
        kwargs = {k: _move(v, device) for k, v in kwargs.items()}
        y = _move(y, device)
    return ModelBatch(index, args, kwargs, y)


def _is_one_batch(data: object) -> bool:
    if isinstance(data, Mapping):
        return TARGET_KEY in data and isinstance(data[TARGET_KEY], torch.Tensor)
    return (
        isinstance(data, (tuple, list))
        and len(data) == 2
        and isinstance(data[1], torch.Tensor)
        and isinstance(data[0], (torch.Tensor, Mapping))
    )


class DataSource:
    """The data of a risk: one batch, a list of batches, or a re-iterable read afresh each pass.

    Args:
        data: see the module docstring.
        device: where each batch's tensors move.

    Attributes:
        streamed: whether the batches are read afresh for every pass (a re-iterable such as
            a ``DataLoader``) rather than held (one batch or a list or tuple of batches).

    Raises:
        TypeError: on one tensor, a one-shot iterator or generator, or anything that is
            not an iterable of batches.
    """

    def __init__(self, data: object, device: torch.device) -> None:
        self.device = device
        if isinstance(data, torch.Tensor):
            raise TypeError(
                "data must be an (x, y) pair, a dict batch with 'labels', or an iterable of batches, got one tensor"
            )
        if isinstance(data, Mapping) and not _is_one_batch(data):
            split_batch(data, 0)  # a dict is one batch: names what it lacks
        if _is_one_batch(data):
            self._held: list | None = [data]
        elif isinstance(data, (list, tuple)):
            self._held = list(data)
        elif isinstance(data, Iterable):
            if iter(data) is data:
                raise TypeError(
                    f"data is a one-shot iterator ({type(data).__name__}), but every curvature product reads the "
                    "data again: pass a list of batches or a re-iterable such as a torch DataLoader"
                )
            self._held = None
            self._data = data
        else:
            raise TypeError(
                f"data must be an (x, y) pair, a dict batch with 'labels', or an iterable of batches, got "
                f"{type(data).__name__}"
            )
        if self._held is not None:
            self._batches = [split_batch(b, i, device) for i, b in enumerate(self._held)]
        self.streamed = self._held is None

    def __iter__(self) -> Iterator[ModelBatch]:
        """One pass over the batches (held ones are the same objects every pass)."""
        if not self.streamed:
            yield from self._batches
            return
        for i, batch in enumerate(self._data):
            yield split_batch(batch, i, self.device)


__all__ = ["TARGET_KEY", "DataSource", "ModelBatch", "split_batch"]

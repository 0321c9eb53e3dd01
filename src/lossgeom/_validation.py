"""Input validation shared by every module: clear errors that name the argument."""

from __future__ import annotations

import math
from numbers import Real
from typing import Any

import numpy as np
import torch


def as_real(name: str, value: Any) -> float:
    """Return ``value`` as a finite Python float or raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (Real, np.floating, np.integer)):
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        else:
            raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def positive(name: str, value: Any) -> float:
    """Return ``value`` as a float if it is finite and > 0, else raise naming ``name``."""
    value = as_real(name, value)
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value


def positive_int(name: str, value: Any) -> int:
    """Return ``value`` if it is an int >= 1, else raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


def finite_array(name: str, value: Any, ndim: int | None = None, shape: tuple | None = None) -> np.ndarray:
    """Return ``value`` as a float64 array, checking dimension, shape and finiteness."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name} must be array-like of real numbers ({err})") from None
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {arr.shape}")
    if shape is not None and arr.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must contain only finite values")
    return arr


def model_inputs(name: str, value: Any) -> torch.Tensor:
    """Return ``value``, a tensor of model inputs, unchanged; a floating one must be finite.

    Unlike :func:`finite_tensor` it keeps the dtype: integer inputs (token ids for an
    ``nn.Embedding``) stay integers.
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a tensor of model inputs, got {type(value).__name__}")
    if torch.is_floating_point(value) and not torch.isfinite(value).all():
        raise ValueError(f"{name} must contain only finite values")
    return value


def finite_tensor(name: str, value: Any) -> torch.Tensor:
    """Return ``value`` as a float64 tensor with finite entries, or raise naming ``name``."""
    if not isinstance(value, torch.Tensor):
        try:
            value = torch.as_tensor(value, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"{name} must be a tensor or array of real numbers ({err})") from None
    if not torch.is_floating_point(value):
        value = value.to(torch.float64)
    if not torch.isfinite(value).all():
        raise ValueError(f"{name} must contain only finite values")
    return value


def finite_inputs(name: str, value: Any) -> torch.Tensor:
    """Model inputs as a tensor: integer inputs (token ids) keep their dtype, floating ones must be finite.

    A non-tensor is converted to float64; a floating tensor keeps its dtype.
    """
    if not isinstance(value, torch.Tensor) or torch.is_floating_point(value):
        return finite_tensor(name, value)
    if value.dtype == torch.bool or value.is_complex():
        raise TypeError(f"{name} must hold real or integer inputs, got {value.dtype}")
    return value

"""Input checks of the book's own functions: clear errors that name the argument.

The library validates its inputs privately; the book keeps its own small checks so that
it builds on the library's public names only. Each returns the checked value (converted
where stated) or raises a ``TypeError`` or ``ValueError`` naming the argument.
"""

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


def finite_tensor(name: str, value: Any) -> torch.Tensor:
    """Return ``value`` as a floating tensor (float64 unless it already is floating) with finite entries."""
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


def _float64(name: str, value: Any) -> torch.Tensor:
    value = finite_tensor(name, value)
    return value if value.dtype == torch.float64 else value.to(torch.float64)


def classifier(W: Any) -> torch.Tensor:
    """A linear classifier ``W`` checked to be a finite (K, d) tensor with K >= 2, d >= 1, as float64."""
    if not isinstance(W, torch.Tensor):
        raise TypeError(f"W must be a torch.Tensor of shape (K, d), got {type(W).__name__}")
    if W.ndim != 2:
        raise ValueError(f"W must be 2-D of shape (K, d), got shape {tuple(W.shape)}")
    if W.shape[0] < 2:
        raise ValueError(f"W must have K >= 2 class rows, got K = {W.shape[0]}")
    if W.shape[1] < 1:
        raise ValueError(f"W must have at least one feature column, got shape {tuple(W.shape)}")
    return _float64("W", W)


def features(h: Any, d: int) -> torch.Tensor:
    """Features ``h`` checked to be one finite (d,) vector or a non-empty (n, d) batch, as float64."""
    if not isinstance(h, torch.Tensor):
        raise TypeError(f"h must be a torch.Tensor of shape (d,) or (n, d), got {type(h).__name__}")
    if h.ndim not in (1, 2) or h.shape[-1] != d:
        raise ValueError(f"h must have shape ({d},) or (n, {d}) to match W's d = {d}, got {tuple(h.shape)}")
    if h.ndim == 2 and h.shape[0] == 0:
        raise ValueError("h must hold at least one example")
    return _float64("h", h)

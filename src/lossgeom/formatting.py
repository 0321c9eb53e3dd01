"""Number formatting that survives a change of machine.

Every number that is printed or stored for comparison goes through :func:`fmt`,
:func:`round_sig` or :func:`rounding_level` (the book glues through them), so that what is
stored carries only digits that survive a change of machine. Another CPU's SIMD
kernels, another BLAS code path or another thread count change the last bits of a
float64 result; a stored output is compared digit for digit by strict nbval, so it must
hold the value rounded to a stated number of significant digits, never its full
``repr``. Rounding-level quantities (a discrepancy of about 1e-16) have no portable
digits at all: :func:`rounding_level` reports them by their order against a floor.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: Significant digits used in printed, glued and ledgered numbers unless a call says
#: otherwise. Six digits survive the change of kernels, BLAS path and thread count that
#: ``make test-portable`` exercises for everything the book computes in closed form or
#: by a few hundred well-conditioned steps; chaotic quantities need their own design.
SIGNIFICANT_DIGITS = 6


def fmt(value: Any, sig: int = SIGNIFICANT_DIGITS) -> str:
    """Format a real number with ``sig`` significant digits (``'%.{sig}g'``).

    Integers print as integers; non-numbers fall back to ``str``. Torch and numpy
    scalars are converted first.

    Args:
        value: the number to format (a Python, numpy or 0-d torch scalar; anything else
            is passed to ``str``).
        sig: the number of significant digits.

    Returns:
        The formatted text; ``nan`` and ``inf`` print as ``str`` does.

    >>> fmt(2.0), fmt(100.0001, 5), fmt(1/3, 4)
    ('2', '100', '0.3333')
    """
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return f"{value:.{sig}g}"
    return str(value)


def round_sig(value: Any, sig: int = SIGNIFICANT_DIGITS) -> Any:
    """``value`` rounded to ``sig`` significant digits, as the float :func:`fmt` prints.

    Integers, booleans and strings pass through; torch and numpy scalars are converted.
    ``round_sig(x, s)`` prints (``repr``) exactly as ``fmt(x, s)``, so a glued or ledgered
    value stores the digits the text shows and no more.

    Args:
        value: the value to round (a real number, a numpy or 0-d torch scalar, a boolean,
            a string or ``None``).
        sig: the number of significant digits, an int >= 1.

    Returns:
        ``float(f"{value:.{sig}g}")`` for a float; an integer as ``int``; a boolean, a
        string or ``None`` unchanged.

    Raises:
        ValueError: if ``sig`` is not an int >= 1, or a float ``value`` is not finite.
        TypeError: if ``value`` is not a real number, boolean, string or ``None``.

    >>> round_sig(0.032190034652589225, 4), round_sig(7, 2), round_sig(2 / 3, 3)
    (0.03219, 7, 0.667)
    """
    if isinstance(sig, bool) or not isinstance(sig, (int, np.integer)) or sig < 1:
        raise ValueError(f"sig must be an int >= 1 (significant digits), got {sig!r}")
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, (bool, str)) or value is None:
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"cannot round a non-finite value ({value}) for storage")
        return float(f"{value:.{int(sig)}g}")
    raise TypeError(f"value must be a real number, got {type(value).__name__}")


def rounding_level(value: Any, floor: float = 1e-13) -> Plain:
    """Report a rounding-level quantity by its order against a stated floor.

    A discrepancy such as 2.2e-16 between two float64 computations of the same number
    has no digits that survive another CPU: its value is the machine's, not the
    model's. What is portable is the statement that it lies below a floor set well above
    float64 rounding (the default 1e-13 is about 450 units of double-precision
    round-off at scale 1). The value is measured; the floor is a reporting scale, not an
    assert's tolerance. A value at or above the floor is a real measurement and raises,
    so that it is reported with its digits instead.

    Args:
        value: the measured quantity (a real number or a 0-d tensor/array); its absolute
            value is compared with ``floor``.
        floor: the reporting scale, a finite number > 0.

    Returns:
        A :class:`Plain` sentence ``"below {floor:g} (rounding level)"``.

    Raises:
        ValueError: if ``floor`` is not finite and > 0, ``value`` is not finite, or
            ``|value| >= floor``.

    >>> str(rounding_level(2.2e-16))
    'below 1e-13 (rounding level)'
    >>> str(rounding_level(0.0, floor=1e-12))
    'below 1e-12 (rounding level)'
    """
    value = abs(float(value.item() if hasattr(value, "item") else value))
    floor = float(floor)
    if not (math.isfinite(floor) and floor > 0):
        raise ValueError(f"floor must be a finite number > 0, got {floor}")
    if not math.isfinite(value):
        raise ValueError(f"value must be finite, got {value}")
    if value >= floor:
        raise ValueError(f"value {value:.3g} is not rounding level (floor {floor:g}): report it with its digits")
    return Plain(f"below {floor:g} (rounding level)")


class Plain(str):
    """A string whose text/plain representation is itself (no quotes).

    Glue a :class:`Plain` to show a computed sentence with ``{glue:text}``.
    """

    def __repr__(self) -> str:
        return str(self)

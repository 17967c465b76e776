"""Exceptions and argument checks shared by every module.

Every check raises :class:`InvalidArgument` (a ``ValueError``) whose message names the argument,
shows the offending value and says what was expected, so that the CLI can print it as one line.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

__all__ = [
    "LengthschedError",
    "InvalidArgument",
    "BudgetTooSmall",
    "ConfigError",
    "as_lengths",
    "check_int",
    "check_positive_float",
]


class LengthschedError(ValueError):
    """Base class of every error this package raises on purpose."""


class InvalidArgument(LengthschedError):
    """An argument has a value outside what the function accepts."""

    def __init__(self, name: str, value: Any, expected: str):
        self.name, self.value, self.expected = name, value, expected
        super().__init__(f"argument '{name}': got {_short(value)}; expected {expected}")

    def __reduce__(self):  # so that the error crosses process boundaries (worker pools) intact
        return (type(self), (self.name, self.value, self.expected))


class BudgetTooSmall(InvalidArgument):
    """A memory budget does not hold even one sequence next to the weights and the prompt."""


class ConfigError(LengthschedError):
    """A model config (``config.json``) is missing a field or has an unusable value."""


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value.tolist() if isinstance(value, np.ndarray) else value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_int(name: str, value: Any, *, minimum: int | None = None) -> int:
    """Return ``value`` as an ``int``; bools, floats with a fraction and non-numbers are rejected."""
    if type(value) is int or type(value) is np.int64:  # fast path: this runs per job in hot loops
        if minimum is None or value >= minimum:
            return int(value)
        raise InvalidArgument(name, value, "an integer" + _min_text(minimum))
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, float, np.floating)):
        raise InvalidArgument(name, value, "an integer" + _min_text(minimum))
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value) or value != math.floor(value):
            raise InvalidArgument(name, value, "an integer" + _min_text(minimum))
    out = int(value)
    if minimum is not None and out < minimum:
        raise InvalidArgument(name, value, "an integer" + _min_text(minimum))
    return out


def _min_text(minimum: int | None) -> str:
    return "" if minimum is None else f" >= {minimum}"


def check_positive_float(name: str, value: Any, *, maximum: float | None = None) -> float:
    """Return ``value`` as a finite float > 0 (and <= ``maximum`` when given)."""
    ok = isinstance(value, (numbers.Real, np.floating)) and not isinstance(value, bool)
    out = float(value) if ok else math.nan
    if not (math.isfinite(out) and out > 0 and (maximum is None or out <= maximum)):
        bound = "" if maximum is None else f" and <= {maximum}"
        raise InvalidArgument(name, value, f"a finite number > 0{bound}")
    return out


def check_nonnegative_float(name: str, value: Any) -> float:
    """Return ``value`` as a finite float >= 0 (bools and non-numbers are rejected)."""
    ok = isinstance(value, (numbers.Real, np.floating)) and not isinstance(value, (bool, np.bool_))
    out = float(value) if ok else math.nan
    if not (math.isfinite(out) and out >= 0):
        raise InvalidArgument(name, value, "a finite number >= 0")
    return out


def as_lengths(name: str, values: Any, *, minimum: int = 0, allow_empty: bool = False) -> np.ndarray:
    """Validate a 1-D sequence of token counts and return it as an ``int64`` array.

    Accepts Python ints, numpy integers and floats that hold whole numbers (as JSON produces).
    Rejects negative or fractional values, NaN, bools, nested sequences and strings.
    """
    expected = f"a 1-D sequence of integers >= {minimum} (token counts)"
    if isinstance(values, (str, bytes)) or values is None:
        raise InvalidArgument(name, values, expected)
    if isinstance(values, (list, tuple)) and any(isinstance(v, (bool, np.bool_)) for v in values):
        raise InvalidArgument(name, values, expected + ", not booleans")
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError) as exc:  # ragged nesting
        raise InvalidArgument(name, values, expected) from exc
    if arr.ndim != 1 or arr.dtype == bool or arr.dtype.kind not in "iuf":
        raise InvalidArgument(name, values, expected)
    if arr.size == 0:
        if allow_empty:
            return arr.astype(np.int64)
        raise InvalidArgument(name, values, expected + ", not empty")
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or np.any(arr != np.floor(arr)) or np.any(np.abs(arr) > 2**53):
            raise InvalidArgument(name, values, expected)
    out = arr.astype(np.int64)
    if out.min() < minimum:
        bad = int(out[out < minimum][0])
        raise InvalidArgument(name, values, expected + f" (found {bad})")
    return out

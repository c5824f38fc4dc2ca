"""The checks every argument and option goes through (numbers, durations, counts, text): one
set for the queue's arguments (``ValueError``) and the transport's options (``error=ConfigError``),
each message naming the argument and the value it got."""

from __future__ import annotations

import math
from typing import Literal, overload

#: The longest duration any argument or option takes: ten years, in seconds.
MAX_SECONDS = 10 * 365 * 24 * 3600


def number(
    label: str,
    value,
    *,
    low: float = 0.0,
    allow_low: bool = False,
    none: bool = False,
    high: float = math.inf,
    error: type[Exception] = ValueError,
):
    """A finite int or float (not a bool) above ``low`` (or equal when ``allow_low``), at most
    ``high``; None when ``none`` allows it."""
    if value is None and none:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < low
        or (value == low and not allow_low)
        or value > high
    ):
        rel = ">=" if allow_low else ">"
        top = f" and <= {high:g}" if high != math.inf else ""
        also = " or None" if none else ""
        raise error(f"{label} must be a finite number {rel} {low:g}{top}{also}, got {value!r} ({type(value).__name__})")
    return value


@overload
def seconds(
    label: str, value: object, *, zero: bool = ..., none: Literal[False] = ..., error: type[Exception] = ...
) -> float: ...
@overload
def seconds(
    label: str, value: object, *, zero: bool = ..., none: bool, error: type[Exception] = ...
) -> float | None: ...
def seconds(
    label: str, value: object, *, zero: bool = False, none: bool = False, error: type[Exception] = ValueError
) -> float | None:
    """A number of seconds > 0 (>= 0 with ``zero``), at most MAX_SECONDS, as a float."""
    checked = number(label, value, allow_low=zero, none=none, high=MAX_SECONDS, error=error)
    return None if checked is None else float(checked)


@overload
def count(label: str, value: object, *, low: int = ..., none: Literal[False], error: type[Exception] = ...) -> int: ...
@overload
def count(
    label: str, value: object, *, low: int = ..., none: bool = ..., error: type[Exception] = ...
) -> int | None: ...
def count(
    label: str, value: object, *, low: int = 1, none: bool = True, error: type[Exception] = ValueError
) -> int | None:
    """An int (not a bool) >= ``low``; None when ``none`` allows it."""
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        also = " or None" if none else ""
        raise error(f"{label} must be an integer >= {low}{also}, got {value!r} ({type(value).__name__})")
    return value


def text(label: str, value, *, forbidden: str = "", error: type[Exception] = ValueError) -> str:
    """A non-empty str without the ``forbidden`` characters (separators, spaces)."""
    if not isinstance(value, str) or not value or any(c in value for c in forbidden):
        extra = f" without {', '.join(repr(c) for c in forbidden)}" if forbidden else ""
        raise error(f"{label} must be a non-empty string{extra}, got {value!r}")
    return value

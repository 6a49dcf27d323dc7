"""Numbers as the gate pages print them: never a "-0", one rule for every row and table."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeGuard


def _finite(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _no_negative_zero(value: float, digits: int) -> float:
    # -0.0, or a tiny negative that rounds to zero, would print as "-0": a bar of "≥ -0"
    # reads as a negative bar when it is a bar of zero.
    return 0.0 if round(value, digits) == 0 else value


def num(value: Any, digits: int = 3) -> str:
    """A count as is, a float to three significant digits, None as a dash."""
    if not _finite(value):
        return "—" if value is None else str(value)
    if isinstance(value, int):
        return str(value)
    return f"{_no_negative_zero(value, 12):.{digits}g}"


def signed(value: Any) -> str:
    """A change in reward units: +0.36, -0.05, 0."""
    if not _finite(value):
        return "—"
    value = _no_negative_zero(float(value), 12)
    return "0" if value == 0 else f"{value:+.3g}"


def pct(value: Any) -> str:
    """A fraction as a percentage: 0.625 -> 62.5%."""
    if not _finite(value):
        return "—"
    return f"{_no_negative_zero(value * 100, 1):.1f}%"


def points(value: Any) -> str:
    """A difference of fractions in percentage points: -0.05 -> -5.0 points, 0 -> 0.0 points."""
    if not _finite(value):
        return "—"
    shown = _no_negative_zero(value * 100, 1)
    return "0.0 points" if round(shown, 1) == 0 else f"{shown:+.1f} points"


def interval(value: Any, show: Callable[[Any], str] = num) -> str:
    """``estimate [low, high]`` of a stats interval dict, or the plain value."""
    if not isinstance(value, Mapping):
        return show(value)
    low, high = value.get("low"), value.get("high")
    ci = f" [{show(low)}, {show(high)}]" if low is not None and high is not None else ""
    return f"{show(value.get('estimate'))}{ci}"


def at_least(bar: float, show: Callable[[Any], str] = num) -> str:
    """``≥ bar``; a bar of ``-max`` with max 0 prints as "≥ 0", not "≥ -0"."""
    return f"≥ {show(0.0 if bar == 0 else bar)}"


def estimate(value: Any) -> float | None:
    """The point estimate of an interval dict, or the number itself."""
    found = value.get("estimate") if isinstance(value, Mapping) else value
    return float(found) if _finite(found) else None


def upper(value: Any) -> float | None:
    """The interval's upper bound, None when it has none (unbounded or a plain number)."""
    found = value.get("high") if isinstance(value, Mapping) else None
    return float(found) if _finite(found) else None

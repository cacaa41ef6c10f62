"""The number checks the settings objects share: a finite number (not a bool), and
positive seconds; and a number shown as the command line shows it.

A bool is an ``int`` to Python, but ``True`` seconds is a caller's slip, so it is refused
everywhere a number is taken. Plain functions: no I/O, nothing raised.
"""

from __future__ import annotations

import math

__all__ = ("finite_number", "positive_number", "shown")


def finite_number(value: object) -> bool:
    """Whether ``value`` is an int or float (not a bool), neither NaN nor infinite."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def positive_number(value: object) -> bool:
    """Whether ``value`` is a :func:`finite_number` > 0 (seconds, a count)."""
    return finite_number(value) and value > 0  # type: ignore[operator]


def shown(value: object) -> str:
    """A number as the command line shows it (``0`` and ``0.0`` alike), else its repr."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:g}"
    return repr(value)

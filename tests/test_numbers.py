"""The shared number checks: a bool, NaN or infinity is never a number of seconds."""

from __future__ import annotations

import math

from aelastic._numbers import finite_number, positive_number, shown


def test_finite_and_positive_numbers() -> None:
    for value in (1, 0.5, 1e9):
        assert finite_number(value) and positive_number(value)
    for value in (0, 0.0, -1, -0.5):
        assert finite_number(value) and not positive_number(value)
    for value in (True, False, math.nan, math.inf, -math.inf, "5", None, [1]):
        assert not finite_number(value) and not positive_number(value)


def test_shown_as_the_command_line_shows_it() -> None:
    assert [shown(v) for v in (0, 0.0, 2.5, 300, -1)] == ["0", "0", "2.5", "300", "-1"]
    assert [shown(v) for v in (True, "x", None)] == ["True", "'x'", "None"]

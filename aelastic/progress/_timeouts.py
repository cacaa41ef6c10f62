"""``ProgressTimeouts``: how long a worker may go without showing progress."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import field

from .._dataclass import dataclass
from .._numbers import positive_number
from ._exceptions import ProgressTimeoutError

__all__ = ("ProgressTimeouts", "parse_section_timeouts")


@dataclass(frozen=True)
class ProgressTimeouts:
    """Hang-detection timeouts in seconds (None: that rule is off).

    Args:
        initial: from the worker's start to its first heartbeat or section (start-up,
            data loading).
        heartbeat: the longest allowed interval between two heartbeats afterwards.
        sections: ``{name: seconds}``; inside such a section its timeout replaces the
            heartbeat timeouts (a long checkpoint save is not a hang).
        out_of_section: outside every section, once the worker used sections.

    Only workers that use :mod:`aelastic.progress` are judged; all None (the
    default): hang detection is off and the agent does not look at all.
    """

    initial: float | None = None
    heartbeat: float | None = None
    sections: Mapping[str, float] = field(default_factory=dict)
    out_of_section: float | None = None

    def __post_init__(self) -> None:
        for name in ("initial", "heartbeat", "out_of_section"):
            _check(name, getattr(self, name))
        for name, seconds in self.sections.items():
            if not name:
                raise ProgressTimeoutError("a section timeout needs a name: use name=seconds")
            _check(f"section {name!r}", seconds)
        object.__setattr__(self, "sections", dict(self.sections))

    @property
    def enabled(self) -> bool:
        """Whether any rule is on (else no progress file is even created)."""
        return any(
            t is not None for t in (self.initial, self.heartbeat, self.out_of_section)
        ) or bool(self.sections)

    def shortest(self) -> float:
        """The shortest timeout set (how often an unattached worker is looked at again)."""
        values = [t for t in (self.initial, self.heartbeat, self.out_of_section) if t]
        return min([*values, *self.sections.values()], default=1.0)


def _check(name: str, value: float | None) -> None:
    if value is None:
        return
    if not positive_number(value):
        raise ProgressTimeoutError(
            f"{name} timeout must be a positive number of seconds (or unset), got {value!r}"
        )


def parse_section_timeouts(text: str) -> dict[str, float]:
    """``"fwd=2,checkpoint=600"`` -> ``{"fwd": 2.0, "checkpoint": 600.0}`` ('' -> {}).

    Raises:
        ProgressTimeoutError: an item is not ``name=seconds`` with seconds > 0.
    """
    out: dict[str, float] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, value = item.partition("=")
        name = name.strip()
        try:
            seconds = float(value) if sep and name else math.nan
        except ValueError:
            seconds = math.nan
        if not positive_number(seconds):
            raise ProgressTimeoutError(
                f"section timeout {item!r} is not name=seconds with seconds > 0;"
                " write e.g. 'forward=30,checkpoint=600'"
            )
        out[name] = seconds
    return out

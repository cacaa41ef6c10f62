"""``HangSettings``: the hang-detection timeouts a launch asks for, checked once, and
their ``aelastic run`` flags.

One frozen object per launch: its defaults (every rule off) are stated here and nowhere
else, and its checks run when it is made, so the command line
(``--initial-heartbeat-timeout``, ``--heartbeat-timeout``, ``--section-timeouts``,
``--out-of-section-timeout``, ``--learn-timeouts``: :data:`OPTIONS`, read into one by
:func:`config_fields`) and the Python API (``LaunchConfig(hangs=HangSettings(...))``)
refuse a bad value with the same message. The launcher's parser only appends
:data:`OPTIONS` to its table; it holds the object as ``LaunchConfig.hangs`` and hands
its fields, under the same names, to :class:`aelastic.agent.WorkerSpec`, whose fields
they are (the agent builds its :class:`~aelastic.progress._timeouts.ProgressTimeouts`
from those). Every flag also reads ``PET_<NAME>`` like torchrun's own. No anyio, no I/O.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from .._dataclass import dataclass
from .._numbers import positive_number, shown
from .._option_table import Option, OptionValues
from ._exceptions import ProgressTimeoutError

__all__ = ("OPTIONS", "HangSettings", "config_fields")

#: (flags, dest, kind, default, help), the ``aelastic run`` option table format.
OPTIONS: tuple[Option, ...] = (
    (
        ("--initial-heartbeat-timeout",),
        "initial_heartbeat_timeout",
        "str",
        None,
        "hang detection (aelastic.progress): seconds from a worker's start to its first heartbeat",
    ),
    (
        ("--heartbeat-timeout",),
        "heartbeat_timeout",
        "str",
        None,
        "hang detection: longest allowed interval between two heartbeats",
    ),
    (
        ("--section-timeouts",),
        "section_timeouts",
        "str",
        "",
        "hang detection: name=seconds,... for aelastic.progress.section(name)",
    ),
    (
        ("--out-of-section-timeout",),
        "out_of_section_timeout",
        "str",
        None,
        "hang detection: longest time outside every section, once sections are used",
    ),
    (
        ("--learn-timeouts",),
        "learn_timeouts",
        "str",
        None,
        "safety factor (e.g. 5): after a healthy attempt, use factor x the longest interval seen",
    ),
)


@dataclass(frozen=True)
class HangSettings:
    """When a worker that reports progress counts as hung (docs/hangs.md).

    Seconds, each None (the default) for that rule off: ``initial_heartbeat_timeout``
    from a worker's start to its first heartbeat, ``heartbeat_timeout`` between two
    heartbeats, ``section_timeouts`` (``{name: seconds}``) inside
    ``aelastic.progress.section(name)``, ``out_of_section_timeout`` outside every
    section once sections are used. ``learn_timeouts``: a safety factor > 1 (e.g. 5);
    after a healthy attempt the agent uses that many times the longest interval seen.
    A hung worker's stacks are written to its attempt's log directory and the group
    restarts as after a failure.

    Raises:
        ProgressTimeoutError: from construction, a value that cannot work (the message
            names the flag and the fix); nothing is kept.
    """

    initial_heartbeat_timeout: float | None = None
    heartbeat_timeout: float | None = None
    section_timeouts: Mapping[str, float] | None = None
    out_of_section_timeout: float | None = None
    learn_timeouts: float | None = None

    def __post_init__(self) -> None:
        problem = self._problem()
        if problem is not None:
            raise ProgressTimeoutError(problem)
        sections = self.section_timeouts
        # the caller's mapping stays as it was; an empty one is "off", like None
        object.__setattr__(self, "section_timeouts", dict(sections) if sections else None)

    @property
    def enabled(self) -> bool:
        """Whether any rule is on (else the agent does not look at the workers at all)."""
        return bool(self.section_timeouts) or any(
            t is not None
            for t in (
                self.initial_heartbeat_timeout,
                self.heartbeat_timeout,
                self.out_of_section_timeout,
            )
        )

    def spec_fields(self) -> dict[str, Any]:
        """The :class:`aelastic.agent.WorkerSpec` fields of the same names: every field
        of this object, so a field added here reaches the spec (or fails there, loudly)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def _problem(self) -> str | None:
        """What cannot work, as the one message to show (None: nothing)."""
        for flag, value in (
            ("initial-heartbeat-timeout", self.initial_heartbeat_timeout),
            ("heartbeat-timeout", self.heartbeat_timeout),
            ("out-of-section-timeout", self.out_of_section_timeout),
        ):
            if value is not None and not positive_number(value):
                return f"--{flag} {shown(value)}: need seconds > 0 (or unset: off)"
        sections = self.section_timeouts
        if sections is not None:
            if not isinstance(sections, Mapping):
                return (
                    f"--section-timeouts {sections!r}: need a mapping of section names to "
                    "seconds, such as {'checkpoint': 600}"
                )
            for name, seconds in sections.items():
                if not isinstance(name, str) or not name or not positive_number(seconds):
                    return (
                        f"--section-timeouts {name}={shown(seconds)}: need name=seconds "
                        "with a name and seconds > 0, such as checkpoint=600"
                    )
        factor = self.learn_timeouts
        if factor is not None and not (positive_number(factor) and factor > 1):
            return (
                f"--learn-timeouts {shown(factor)}: need a safety factor > 1, such as 5 "
                "(or unset: off)"
            )
        return None


def config_fields(v: OptionValues) -> dict[str, Any]:
    """``{"hangs": HangSettings}`` of the flags of :data:`OPTIONS`, checked.

    Raises:
        ProgressTimeoutError: a section that is not ``name=seconds``, or a value
            :class:`HangSettings` refuses (its message; the parser shows it as a usage
            error). A value that is not a number: the parser's own usage error.
    """
    timeouts: dict[str, float | None] = {}
    for dest in (
        "initial_heartbeat_timeout",
        "heartbeat_timeout",
        "out_of_section_timeout",
        "learn_timeouts",
    ):
        # only the number is read here; its range is HangSettings' check
        timeouts[dest] = v.float_(dest, minimum=-math.inf)
    sections = _sections(v.str_("section_timeouts") or "", v.source("section_timeouts"))
    return {"hangs": HangSettings(section_timeouts=sections, **timeouts)}


def _sections(text: str, source: str) -> dict[str, float] | None:
    """``"fwd=2,checkpoint=600"`` as ``{name: seconds}`` (None: none given); the seconds'
    range is HangSettings' check, only the shape is read here."""
    out: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        try:
            seconds = float(value) if sep and name.strip() else math.nan
        except ValueError:
            seconds = math.nan
        if math.isnan(seconds):
            raise ProgressTimeoutError(
                f"{source} {item}: need name=seconds with a name and seconds > 0, "
                "such as checkpoint=600"
            )
        out[name.strip()] = seconds
    return out or None

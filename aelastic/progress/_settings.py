"""``HangSettings``: the hang-detection timeouts a launch asks for, checked once.

One frozen object per launch: its defaults (every rule off) are stated here and nowhere
else, and its checks run when it is made, so the command line
(``--initial-heartbeat-timeout``, ``--heartbeat-timeout``, ``--section-timeouts``,
``--out-of-section-timeout``, ``--learn-timeouts``: ``aelastic.launcher._progress_args``
reads the flags into one) and the Python API (``LaunchConfig(hangs=HangSettings(...))``)
refuse a bad value with the same message. The launcher holds it as
``LaunchConfig.hangs`` and hands its fields, under the same names, to
:class:`aelastic.agent.WorkerSpec`, whose fields they are (the agent builds its
:class:`~aelastic.progress._timeouts.ProgressTimeouts` from those). No anyio, no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .._dataclass import dataclass
from .._numbers import positive_number, shown
from ._exceptions import ProgressTimeoutError

__all__ = ("HangSettings",)


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

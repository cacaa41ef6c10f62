"""The ``run`` flags of hang detection (``aelastic.progress``), and their checks.

Kept apart so the launcher's argument module only appends :data:`OPTIONS` to its
table and passes :func:`config_fields` to ``LaunchConfig``. Every flag also reads
``PET_<NAME>`` like torchrun's own. The hang flags' defaults (off) and range checks are
:class:`aelastic.progress._settings.HangSettings`'s (the Python API gets the same
messages); this module reads them into one, held as ``LaunchConfig.hangs``. The restart
policy's flags are ``aelastic.launcher._restart_args``.
"""

from __future__ import annotations

import math
from typing import Any

from ..progress._exceptions import ProgressTimeoutError
from ..progress._settings import HangSettings
from ._exceptions import UsageError
from ._option_table import Option, OptionValues

__all__ = ("OPTIONS", "config_fields")


#: (flags, dest, kind, default, help), the launcher's option table format.
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


def config_fields(v: OptionValues) -> dict[str, Any]:
    """``{"hangs": HangSettings}`` of these flags, checked.

    Raises:
        UsageError: a value that is not a number or not ``name=seconds``, or one
            :class:`HangSettings` refuses (its message).
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
    try:
        hangs = HangSettings(
            section_timeouts=_sections(
                v.str_("section_timeouts") or "", v.source("section_timeouts")
            ),
            **timeouts,
        )
    except ProgressTimeoutError as exc:
        raise UsageError(str(exc)) from None
    return {"hangs": hangs}


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
            raise UsageError(
                f"{source} {item}: need name=seconds with a name and seconds > 0, "
                "such as checkpoint=600"
            )
        out[name.strip()] = seconds
    return out or None

"""The ``run`` flags of the restart policy (``--max-no-progress-restarts``,
``--restart-backoff``, ``--restart-backoff-max``, ``--exit-grace``,
``--job-wide-restarts``).

Kept apart so the launcher's argument module only appends :data:`OPTIONS` to its table
and passes :func:`config_fields` to ``LaunchConfig``. Every flag also reads
``PET_<NAME>`` like torchrun's own. The defaults and range checks are
:class:`aelastic.launcher._restart_settings.RestartSettings`'s (the Python API gets the
same messages); this module reads the numbers into one, held as
``LaunchConfig.restarts``.
"""

from __future__ import annotations

import math
from typing import Any

from .._option_table import Option, OptionValues
from ._exceptions import LaunchConfigError, UsageError
from ._restart_settings import RestartSettings

__all__ = ("OPTIONS", "config_fields")

_DEFAULT = RestartSettings()

#: (flags, dest, kind, default, help), the launcher's option table format.
OPTIONS: tuple[Option, ...] = (
    (
        ("--max-no-progress-restarts",),
        "max_no_progress_restarts",
        "str",
        None,
        "stop with exit code 93 (do not requeue) after N failed attempts without step progress",
    ),
    (
        ("--restart-backoff",),
        "restart_backoff",
        "str",
        f"{_DEFAULT.restart_backoff:g}",
        "seconds before restarting after a failure, doubled per consecutive failure",
    ),
    (
        ("--restart-backoff-max",),
        "restart_backoff_max",
        "str",
        f"{_DEFAULT.restart_backoff_max:g}",
        "the longest back-off between restarts, in seconds",
    ),
    (
        ("--exit-grace",),
        "exit_grace",
        "str",
        f"{_DEFAULT.exit_grace:g}",
        "seconds a worker whose script ended may take to exit before it is killed (0: no limit)",
    ),
    (
        ("--job-wide-restarts",),
        "job_wide_restarts",
        "flag",
        False,
        "--max-restarts counts the failures of the whole job, not of this node",
    ),
)


def config_fields(v: OptionValues) -> dict[str, Any]:
    """``{"restarts": RestartSettings}`` of these flags, checked.

    Raises:
        UsageError: a value that is not a number, or one :class:`RestartSettings`
            refuses (its message).
    """
    # only the numbers are read here; their ranges are RestartSettings' checks
    seconds = {
        dest: v.float_(dest, minimum=-math.inf)
        for dest in ("restart_backoff", "restart_backoff_max", "exit_grace")
    }
    try:
        settings = RestartSettings(
            max_no_progress_restarts=v.int_("max_no_progress_restarts"),
            job_wide_restarts=v.flag("job_wide_restarts"),
            **{dest: value for dest, value in seconds.items() if value is not None},
        )
    except LaunchConfigError as exc:
        raise UsageError(str(exc)) from None
    return {"restarts": settings}

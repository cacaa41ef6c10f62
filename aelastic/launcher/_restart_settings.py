"""``RestartSettings``: how the agent restarts a failed group, checked once.

One frozen object per launch: its defaults (torchrun's behaviour: no back-off, no
no-progress stop, each node counting its own failures) are stated here for the launch
API, and its checks run when it is made, so the command line
(``--max-no-progress-restarts``, ``--restart-backoff``, ``--restart-backoff-max``,
``--job-wide-restarts``, ``--exit-grace``: ``aelastic.launcher._restart_args`` reads the
flags into one) and the Python API (``LaunchConfig(restarts=RestartSettings(...))``)
refuse a bad value with the same message. The launcher holds it as
``LaunchConfig.restarts`` and hands its fields, under the same names, to
:class:`aelastic.agent.WorkerSpec`, whose fields they are and whose rules
(:mod:`aelastic.agent._policy`) act on them.

It lives beside ``LaunchConfig`` rather than in ``aelastic.agent``: importing any module
of the agent loads the agent (anyio, the state machine), and ``aelastic run`` parses its
flags before that, while the workers' interpreters start. No anyio, no I/O.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .._dataclass import dataclass
from .._numbers import shown
from ._exceptions import LaunchConfigError

__all__ = ("RestartSettings",)


@dataclass(frozen=True)
class RestartSettings:
    """How a failed group is restarted (docs/hangs.md, "Restarts").

    ``max_no_progress_restarts``: stop the job (exit code 93, "do not requeue") after
    this many failed attempts in a row without step progress (None: never).
    ``restart_backoff``: seconds before the first restart after a failure, doubled with
    each consecutive failure up to ``restart_backoff_max`` (0: restart at once).
    ``job_wide_restarts``: ``max_restarts`` counts the failures of the whole job, not of
    this node. ``exit_grace``: seconds a worker whose script ended may take to exit
    before it is killed (0: no bound, torchrun's behaviour).

    Raises:
        LaunchConfigError: from construction, a value that cannot work (the message
            names the flag and the fix); nothing is kept.
    """

    max_no_progress_restarts: int | None = None
    restart_backoff: float = 0.0
    restart_backoff_max: float = 300.0
    job_wide_restarts: bool = False
    exit_grace: float | None = 60.0

    def __post_init__(self) -> None:
        n = self.max_no_progress_restarts
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise LaunchConfigError(
                f"--max-no-progress-restarts {shown(n)}: must be >= 1 (a whole number of "
                "attempts; unset: never stop for it)"
            )
        for flag, value in (
            ("restart-backoff", self.restart_backoff),
            ("restart-backoff-max", self.restart_backoff_max),
            ("exit-grace", 0.0 if self.exit_grace is None else self.exit_grace),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise LaunchConfigError(f"--{flag} {shown(value)}: must be >= 0 seconds")
        if not isinstance(self.job_wide_restarts, bool):
            raise LaunchConfigError(
                f"--job-wide-restarts {self.job_wide_restarts!r}: need True or False"
            )

    def spec_fields(self) -> dict[str, Any]:
        """The :class:`aelastic.agent.WorkerSpec` fields of the same names (every field)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

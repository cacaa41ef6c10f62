"""``BadNodeSettings``: the health checks and the exclusion a launch asks for, checked once.

One frozen object per launch: its defaults are stated here and nowhere else, and its
checks run when it is made, so the command line (``--node-health-*``,
``--no-builtin-health-checks``, ``--exclude-node-*``: ``aelastic.launcher._node_args``
reads the flags into one) and the Python API
(``LaunchConfig(bad_nodes=BadNodeSettings(...))``) refuse a bad value with the same
message. The launcher holds it as ``LaunchConfig.bad_nodes`` and builds the node's gate
from it. No anyio, no I/O, and the agent (which the error class derives from) is imported
only to raise: ``aelastic run`` parses its flags before it loads the agent.
"""

from __future__ import annotations

from .._dataclass import dataclass
from .._numbers import positive_number, shown
from ._policy import ExclusionSettings

__all__ = ("BadNodeSettings",)


@dataclass(frozen=True)
class BadNodeSettings:
    """What keeps a bad node out of the job's rounds (docs/bad-nodes.md).

    ``health_checks``: shell commands run before the node joins each round (exit 0:
    healthy), each within ``health_timeout`` seconds; an unhealthy node checks again after
    ``health_cooldown`` seconds. ``builtin_checks``: also run the built-in checks (log
    directory, memory, GPUs). ``exclude_after`` failed rounds (0: never) within
    ``exclude_window`` seconds keep the node out for ``exclude_cooldown`` seconds,
    doubled on each repeat, at most ``exclude_cooldown_max``.

    Raises:
        NodeHealthConfigError: from construction, a value that cannot work (the message
            names the flag and the fix); nothing is kept.
    """

    health_checks: tuple[str, ...] = ()
    health_timeout: float = 30.0
    health_cooldown: float = 30.0
    builtin_checks: bool = True
    exclude_after: int = 0
    exclude_window: float = 3600.0
    exclude_cooldown: float = 300.0
    exclude_cooldown_max: float = 3600.0

    def __post_init__(self) -> None:
        problem = self._problem()
        if problem is not None:
            from ._exceptions import NodeHealthConfigError

            raise NodeHealthConfigError(problem)
        object.__setattr__(self, "health_checks", tuple(self.health_checks))

    def _problem(self) -> str | None:
        """What cannot work, as the one message to show (None: nothing)."""
        commands = self.health_checks
        if not isinstance(commands, (tuple, list)) or not all(isinstance(c, str) for c in commands):
            return (
                f"--node-health-check {commands!r}: need a sequence of shell commands, "
                "such as ('nvidia-smi',)"
            )
        for command in commands:
            if not command.strip():
                return (
                    "--node-health-check: empty command; pass a shell command whose exit "
                    "status 0 means healthy"
                )
        for flag, value in (
            ("node-health-timeout", self.health_timeout),
            ("node-health-cooldown", self.health_cooldown),
            ("exclude-node-window", self.exclude_window),
            ("exclude-node-cooldown", self.exclude_cooldown),
            ("exclude-node-cooldown-max", self.exclude_cooldown_max),
        ):
            if not positive_number(value):
                return f"--{flag} {shown(value)}: need seconds > 0"
        after = self.exclude_after
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            return (
                f"--exclude-node-after {shown(after)}: need a whole number of failed rounds "
                ">= 0 (0: never exclude)"
            )
        return None

    @property
    def exclusion(self) -> ExclusionSettings:
        """The exclusion's part, as :class:`aelastic.nodes._exclusion.NodeExclusion` takes it."""
        return ExclusionSettings(
            self.exclude_after,
            self.exclude_window,
            self.exclude_cooldown,
            self.exclude_cooldown_max,
        )

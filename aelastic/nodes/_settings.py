"""``BadNodeSettings``: the health checks and the exclusion a launch asks for, checked
once, and their ``aelastic run`` flags.

One frozen object per launch: its defaults are stated here and nowhere else, and its
checks run when it is made, so the command line (``--node-health-*``,
``--no-builtin-health-checks``, ``--exclude-node-*``: :data:`OPTIONS`, read into one by
:func:`config_fields`) and the Python API (``LaunchConfig(bad_nodes=BadNodeSettings(...))``)
refuse a bad value with the same message. The launcher's parser only appends
:data:`OPTIONS` to its table; it holds the object as ``LaunchConfig.bad_nodes`` and builds
the node's gate from it (``aelastic.launcher._node_args.gate_for``, which also reads the
straggler action). Every flag also reads ``PET_<NAME>`` like torchrun's own
(``PET_NODE_HEALTH_CHECK``: one command). No anyio, no I/O, and the agent (which the
error class derives from) is imported only to raise: ``aelastic run`` parses its flags
before it loads the agent.
"""

from __future__ import annotations

from typing import Any

from .._dataclass import dataclass
from .._exceptions import ConfigError
from .._numbers import positive_number, shown
from .._option_table import Option, OptionValues
from ._policy import ExclusionSettings

__all__ = ("OPTIONS", "BadNodeSettings", "config_fields")


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


_DEFAULT = BadNodeSettings()

#: (flags, dest, kind, default, help), the ``aelastic run`` option table format.
OPTIONS: tuple[Option, ...] = (
    (
        ("--node-health-check",),
        "node_health_check",
        "append",
        None,
        "shell command run before this node joins each round; exit 0 = healthy "
        "(repeatable; an unhealthy node stays out and retries, exit 94 if the job ends)",
    ),
    (
        ("--node-health-timeout",),
        "node_health_timeout",
        "str",
        f"{_DEFAULT.health_timeout:g}",
        "seconds each health check may take (longer: unhealthy)",
    ),
    (
        ("--node-health-cooldown",),
        "node_health_cooldown",
        "str",
        f"{_DEFAULT.health_cooldown:g}",
        "seconds an unhealthy node waits before checking again",
    ),
    (
        ("--no-builtin-health-checks",),
        "no_builtin_health_checks",
        "flag",
        False,
        "skip the built-in checks (log dir writable with 1 GiB free, 512 MiB memory, NVML GPUs)",
    ),
    (
        ("--exclude-node-after",),
        "exclude_node_after",
        "str",
        str(_DEFAULT.exclude_after),
        "keep this node out of the next rounds after N failed rounds (or hangs) within "
        "--exclude-node-window; 0: never (exit 95 if the job ends while it is out)",
    ),
    (
        ("--exclude-node-window",),
        "exclude_node_window",
        "str",
        f"{_DEFAULT.exclude_window:g}",
        "seconds within which --exclude-node-after failures count",
    ),
    (
        ("--exclude-node-cooldown",),
        "exclude_node_cooldown",
        "str",
        f"{_DEFAULT.exclude_cooldown:g}",
        "seconds an excluded node stays out, doubled on each repeat",
    ),
    (
        ("--exclude-node-cooldown-max",),
        "exclude_node_cooldown_max",
        "str",
        f"{_DEFAULT.exclude_cooldown_max:g}",
        "the longest exclusion, in seconds",
    ),
)


def config_fields(v: OptionValues) -> dict[str, Any]:
    """``{"bad_nodes": BadNodeSettings}`` of the flags of :data:`OPTIONS`, checked.

    Raises:
        ConfigError: a number of seconds that is not a number, or a value
            :class:`BadNodeSettings` refuses (its ``NodeHealthConfigError``: an empty
            command, seconds not > 0, a negative count); the parser shows it as a usage
            error. A count that is not a whole number: the parser's own usage error.
    """
    raw = v.str_("node_health_check")
    seconds: dict[str, float] = {}
    for field, dest in (
        ("health_timeout", "node_health_timeout"),
        ("health_cooldown", "node_health_cooldown"),
        ("exclude_window", "exclude_node_window"),
        ("exclude_cooldown", "exclude_node_cooldown"),
        ("exclude_cooldown_max", "exclude_node_cooldown_max"),
    ):
        value = v.str_(dest)
        try:
            seconds[field] = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{v.source(dest)} {value!r}: expected a number of seconds") from None
    settings = BadNodeSettings(
        health_checks=(raw,) if isinstance(raw, str) else tuple(raw or ()),
        builtin_checks=not v.flag("no_builtin_health_checks"),
        exclude_after=v.int_("exclude_node_after") or 0,
        **seconds,
    )
    return {"bad_nodes": settings}

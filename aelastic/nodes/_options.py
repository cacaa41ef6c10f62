"""The ``run`` flags of the node gate, and the gate a :class:`LaunchConfig` asks for.

Kept here so the launcher's argument module only appends :data:`OPTIONS` to its
table and passes :func:`config_fields` to ``LaunchConfig``; importing it loads
neither anyio nor the agent (``aelastic run`` parses its flags before those). Every flag also reads
``PET_<NAME>`` like torchrun's own (``PET_NODE_HEALTH_CHECK``: one command).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..launcher import LaunchConfig
    from ._gate import NodeGate

__all__ = ("OPTIONS", "config_fields", "gate_for")


class _Values(Protocol):
    def source(self, dest: str) -> str: ...
    def str_(self, dest: str) -> Any: ...
    def flag(self, dest: str) -> bool: ...
    def float_(self, dest: str, *, minimum: float, strict: bool = False) -> float | None: ...


#: (flags, dest, kind, default, help), the launcher's option table format.
OPTIONS: tuple[tuple[tuple[str, ...], str, str, Any, str], ...] = (
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
        "30",
        "seconds each health check may take (longer: unhealthy)",
    ),
    (
        ("--node-health-cooldown",),
        "node_health_cooldown",
        "str",
        "30",
        "seconds an unhealthy node waits before checking again",
    ),
    (
        ("--no-builtin-health-checks",),
        "no_builtin_health_checks",
        "flag",
        False,
        "skip the built-in checks (log dir writable with 1 GiB free, 512 MiB memory, NVML GPUs)",
    ),
)


def config_fields(v: _Values) -> dict[str, Any]:
    """The ``LaunchConfig`` fields of these flags, checked.

    Raises:
        UsageError: an empty command, or a timeout or cooldown that is not > 0 seconds.
    """
    from ..launcher._args import UsageError

    raw = v.str_("node_health_check")
    commands = [raw] if isinstance(raw, str) else list(raw or [])
    for command in commands:
        if not command.strip():
            raise UsageError(
                f"{v.source('node_health_check')}: empty command; pass a shell command "
                "whose exit status 0 means healthy"
            )
    timeout = v.float_("node_health_timeout", minimum=0.0, strict=True)
    cooldown = v.float_("node_health_cooldown", minimum=0.0, strict=True)
    return {
        "node_health_checks": commands,
        "node_health_timeout": 30.0 if timeout is None else timeout,
        "node_health_cooldown": 30.0 if cooldown is None else cooldown,
        "node_health_builtins": not v.flag("no_builtin_health_checks"),
    }


def gate_for(config: LaunchConfig) -> NodeGate | None:
    """The gate of ``config``: its commands, the entry-point checks and the built-ins
    (unless off); None when there is no check at all.

    Raises:
        NodeHealthConfigError: an empty command, a timeout or cooldown <= 0.
    """
    from ._checks import builtin_checks, command_check, entry_point_checks
    from ._gate import NodeGate

    checks = [command_check(c) for c in config.node_health_checks or ()]
    checks += entry_point_checks()
    if config.node_health_builtins:
        checks += builtin_checks(config.log_dir)
    if not checks:
        return None
    return NodeGate(
        checks, timeout=config.node_health_timeout, cooldown=config.node_health_cooldown
    )

"""The ``run`` flags of the node gate and of placement, and the gate a
:class:`LaunchConfig` asks for.

Kept here so the launcher's argument module only appends :data:`OPTIONS` to its
table and passes :func:`config_fields` to ``LaunchConfig``; importing it loads
neither anyio nor the agent (``aelastic run`` parses its flags before those). Every flag also reads
``PET_<NAME>`` like torchrun's own (``PET_NODE_HEALTH_CHECK``: one command,
``PET_NODE_RANK_ORDER``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._exceptions import UsageError
from ._option_table import Option, OptionValues

if TYPE_CHECKING:
    from ..nodes._gate import NodeGate
    from ._config import LaunchConfig

__all__ = ("OPTIONS", "config_fields", "gate_for")


#: (flags, dest, kind, default, help), the launcher's option table format.
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
    (
        ("--exclude-node-after",),
        "exclude_node_after",
        "str",
        "0",
        "keep this node out of the next rounds after N failed rounds (or hangs) within "
        "--exclude-node-window; 0: never (exit 95 if the job ends while it is out)",
    ),
    (
        ("--exclude-node-window",),
        "exclude_node_window",
        "str",
        "3600",
        "seconds within which --exclude-node-after failures count",
    ),
    (
        ("--exclude-node-cooldown",),
        "exclude_node_cooldown",
        "str",
        "300",
        "seconds an excluded node stays out, doubled on each repeat",
    ),
    (
        ("--exclude-node-cooldown-max",),
        "exclude_node_cooldown_max",
        "str",
        "3600",
        "the longest exclusion, in seconds",
    ),
    (
        ("--node-rank-order",),
        "node_rank_order",
        "str",
        None,
        "group ranks by a topology key so neighbouring ranks share a switch: 'hostname' or "
        "'env:VAR' (VAR set on each node, e.g. a rack label); the store's host keeps rank "
        "0 (its group first). Dynamic rendezvous only (c10d, etcd), not --rdzv-backend static",
    ),
)


def config_fields(v: OptionValues) -> dict[str, Any]:
    """The ``LaunchConfig`` fields of these flags, checked.

    Raises:
        UsageError: an empty command, a timeout or cooldown that is not > 0 seconds, or
            a ``--node-rank-order`` that is neither ``hostname`` nor ``env:VAR``.
    """
    order = v.str_("node_rank_order")
    if order is not None:
        from ..rendezvous._placement import check_rank_order

        try:
            order = check_rank_order(order, v.source("node_rank_order"))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
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
    exclude = {
        name: v.float_(name, minimum=0.0, strict=True)
        for name in ("exclude_node_window", "exclude_node_cooldown", "exclude_node_cooldown_max")
    }
    return {
        "exclude_node_after": v.int_("exclude_node_after", minimum=0) or 0,
        **{name: value for name, value in exclude.items() if value is not None},
        "node_health_checks": commands,
        "node_health_timeout": 30.0 if timeout is None else timeout,
        "node_health_cooldown": 30.0 if cooldown is None else cooldown,
        "node_health_builtins": not v.flag("no_builtin_health_checks"),
        "node_rank_order": order,
    }


def gate_for(config: LaunchConfig) -> NodeGate | None:
    """The gate of ``config``: its commands, the entry-point checks and the built-ins
    (unless off), and the exclusion after repeated failures (when on); None when
    there is neither.

    Raises:
        NodeHealthConfigError: an empty command, a timeout or cooldown <= 0.
    """
    from ..nodes._checks import builtin_checks, command_check, entry_point_checks
    from ..nodes._exclusion import NodeExclusion
    from ..nodes._gate import NodeGate
    from ..nodes._policy import ExclusionSettings

    exclusion = None
    # a straggler is excluded through the same path (its failures never exclude it
    # unless --exclude-node-after is set too)
    if config.exclude_node_after > 0 or config.stragglers.action == "exclude":
        settings = ExclusionSettings(
            config.exclude_node_after,
            config.exclude_node_window,
            config.exclude_node_cooldown,
            config.exclude_node_cooldown_max,
        )
        exclusion = NodeExclusion(settings)
    checks = [command_check(c) for c in config.node_health_checks or ()]
    checks += entry_point_checks()
    if config.node_health_builtins:
        checks += builtin_checks(config.log_dir)
    if not checks and exclusion is None:
        return None
    return NodeGate(
        checks,
        timeout=config.node_health_timeout,
        cooldown=config.node_health_cooldown,
        exclusion=exclusion,
    )

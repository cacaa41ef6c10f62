"""The ``run`` flags of the node gate and of placement, and the gate a
:class:`LaunchConfig` asks for.

Kept here so the launcher's argument module only appends :data:`OPTIONS` to its
table and passes :func:`config_fields` to ``LaunchConfig``; importing it loads
neither anyio nor the agent (``aelastic run`` parses its flags before those). Every flag also reads
``PET_<NAME>`` like torchrun's own (``PET_NODE_HEALTH_CHECK``: one command,
``PET_NODE_RANK_ORDER``). The health and exclusion flags' defaults and range checks are
:class:`aelastic.nodes._settings.BadNodeSettings`'s (the Python API gets the same
messages); this module reads the flags into one. ``--node-rank-order`` is the
rendezvous's placement and stays a ``LaunchConfig`` field of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._exceptions import ConfigError
from .._option_table import Option, OptionValues
from ..nodes._settings import BadNodeSettings
from ._exceptions import UsageError

if TYPE_CHECKING:
    from ..nodes._gate import NodeGate
    from ._config import LaunchConfig

__all__ = ("OPTIONS", "config_fields", "gate_for")

_DEFAULT = BadNodeSettings()


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
    """``{"bad_nodes": BadNodeSettings, "node_rank_order": ...}`` of these flags, checked.

    Raises:
        UsageError: a value that is not a number, one :class:`BadNodeSettings` refuses
            (its message: an empty command, seconds not > 0, a negative count), or a
            ``--node-rank-order`` that is neither ``hostname`` nor ``env:VAR``.
    """
    order = v.str_("node_rank_order")
    if order is not None:
        from ..rendezvous._placement import check_rank_order

        try:
            order = check_rank_order(order, v.source("node_rank_order"))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
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
            raise UsageError(f"{v.source(dest)} {value!r}: expected a number of seconds") from None
    try:
        settings = BadNodeSettings(
            health_checks=(raw,) if isinstance(raw, str) else tuple(raw or ()),
            builtin_checks=not v.flag("no_builtin_health_checks"),
            exclude_after=v.int_("exclude_node_after") or 0,
            **seconds,
        )
    except ConfigError as exc:  # NodeHealthConfigError (its module loads the agent)
        raise UsageError(str(exc)) from None
    return {"bad_nodes": settings, "node_rank_order": order}


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

    bad_nodes, exclusion = config.bad_nodes, None
    # a straggler is excluded through the same path (its failures never exclude it
    # unless --exclude-node-after is set too)
    if bad_nodes.exclude_after > 0 or config.stragglers.action == "exclude":
        exclusion = NodeExclusion(bad_nodes.exclusion)
    checks = [command_check(c) for c in bad_nodes.health_checks]
    checks += entry_point_checks()
    if bad_nodes.builtin_checks:
        checks += builtin_checks(config.log_dir)
    if not checks and exclusion is None:
        return None
    return NodeGate(
        checks,
        timeout=bad_nodes.health_timeout,
        cooldown=bad_nodes.health_cooldown,
        exclusion=exclusion,
    )

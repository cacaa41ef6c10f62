"""The ``run`` flag of placement (``--node-rank-order``), and the gate a
:class:`LaunchConfig` asks for.

The health and exclusion flags live beside their settings object
(:mod:`aelastic.nodes._settings`); ``--node-rank-order`` is the rendezvous's placement,
a ``LaunchConfig`` field of its own, so its row and check stay with the launcher's
parser (it also reads ``PET_NODE_RANK_ORDER``). :func:`gate_for` builds the node's gate
from two features' settings (the bad nodes' and the straggler action), which is the
launcher's to join. Importing this module loads neither anyio nor the agent (``aelastic
run`` parses its flags before those).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._option_table import Option, OptionValues
from ._exceptions import UsageError

if TYPE_CHECKING:
    from ..nodes._gate import NodeGate
    from ._config import LaunchConfig

__all__ = ("OPTIONS", "config_fields", "gate_for")

#: (flags, dest, kind, default, help), the launcher's option table format.
OPTIONS: tuple[Option, ...] = (
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
    """``{"node_rank_order": ...}`` of ``--node-rank-order`` (None: not given), checked.

    Raises:
        UsageError: a ``--node-rank-order`` that is neither ``hostname`` nor ``env:VAR``.
    """
    order = v.str_("node_rank_order")
    if order is not None:
        from ..rendezvous._placement import check_rank_order

        try:
            order = check_rank_order(order, v.source("node_rank_order"))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return {"node_rank_order": order}


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

"""The ``run`` flags of torchft replica groups (``--replica-groups N`` and company).

Like the other flag groups: the parser appends :data:`OPTIONS` to its table (each
flag also reads ``PET_<NAME>``: ``PET_REPLICA_GROUPS``, ``PET_REPLICA_GROUP_ID``)
and :func:`replica_groups` turns the values into a
:class:`aelastic.replicas._settings.ReplicaGroups` (None without ``--replica-groups``).
Importing it loads neither anyio nor the agent. The flags' defaults are read from those
settings classes (stated once, there).
"""

from __future__ import annotations

from .._option_table import Option, OptionValues
from ..replicas._settings import LighthouseSettings, ReplicaGroups
from ._exceptions import UsageError

__all__ = ("OPTIONS", "replica_groups")

_LIGHTHOUSE = LighthouseSettings()
_SPARES = ReplicaGroups(1).spares  # the default: the count is what every instance needs

OPTIONS: tuple[Option, ...] = (
    (
        ("--replica-groups",),
        "replica_groups",
        "str",
        None,
        "run a torchft job as N replica groups, each its own rendezvous, stores and restart "
        "budget; one node with no rendezvous flags runs all N; implies --preload auto "
        "unless given (see docs/replica-groups.md)",
    ),
    (
        ("--replica-group-id",),
        "replica_group_id",
        "str",
        None,
        "with --replica-groups on many nodes: the group this node belongs to (0..N-1)",
    ),
    (
        ("--lighthouse",),
        "lighthouse",
        "str",
        None,
        "URL of a running torchft Lighthouse (http://HOST:PORT); default: aelastic starts "
        "and supervises one (many nodes: the node hosting the c10d store)",
    ),
    (
        ("--spare-replica-groups",),
        "spare_replica_groups",
        "str",
        str(_SPARES),
        "times a group that spent its restart budget is replaced by a fresh one before "
        "it stays excluded",
    ),
    (
        ("--lighthouse-join-timeout",),
        "lighthouse_join_timeout",
        "str",
        f"{_LIGHTHOUSE.join_timeout:g}",
        "seconds a quorum waits for a replica that heartbeats but has not joined",
    ),
    (
        ("--lighthouse-heartbeat-timeout",),
        "lighthouse_heartbeat_timeout",
        "str",
        f"{_LIGHTHOUSE.heartbeat_timeout:g}",
        "seconds without a heartbeat after which a replica no longer counts",
    ),
)


def replica_groups(
    v: OptionValues, *, standalone: bool, backend: str = "c10d"
) -> ReplicaGroups | None:
    """The replica-group settings of the parsed flags, or None without ``--replica-groups``.

    ``standalone``: this node hosts its own stores (no rendezvous flags, or
    ``--standalone``); only then may every group run here. ``backend``: the rendezvous
    backend; without ``--lighthouse`` many nodes need c10d (its store's host starts
    the Lighthouse).

    Raises:
        UsageError: a bad count or id, a missing ``--replica-group-id`` with rendezvous
            flags, a missing ``--lighthouse`` across nodes
            off the c10d backend, a bad URL or timeout.
    """
    groups = v.int_("replica_groups", minimum=1)
    group_id = v.int_("replica_group_id", minimum=0)
    if groups is None:
        if group_id is not None:
            raise UsageError(
                f"{v.source('replica_group_id')} needs --replica-groups N (the number of groups)"
            )
        return None
    from ..replicas._exceptions import ReplicaGroupConfigError

    if group_id is None and not standalone:
        raise UsageError(
            f"{v.source('replica_groups')} with rendezvous flags: give --replica-group-id K "
            "(this node's group), or drop the rendezvous flags to run every group here"
        )
    lighthouse = v.str_("lighthouse")
    if group_id is not None and lighthouse is None and (standalone or backend != "c10d"):
        where = "standalone" if standalone else f"with --rdzv-backend {backend}"
        raise UsageError(
            f"{v.source('replica_group_id')} {where}: the groups of a many-node job must "
            "share one Lighthouse: give --lighthouse http://HOST:PORT (torchft_lighthouse "
            "running there), or the c10d rendezvous flags shared by every group (the node "
            "hosting its store then starts one)"
        )
    join = v.float_("lighthouse_join_timeout", minimum=0.0)
    heartbeat = v.float_("lighthouse_heartbeat_timeout", minimum=0.0, strict=True)
    try:
        return ReplicaGroups(
            groups,
            group_id,
            lighthouse,
            v.int_("spare_replica_groups", minimum=0) or _SPARES,
            LighthouseSettings(
                join_timeout=_LIGHTHOUSE.join_timeout if join is None else join,
                heartbeat_timeout=_LIGHTHOUSE.heartbeat_timeout if heartbeat is None else heartbeat,
            ),
        )
    except ReplicaGroupConfigError as exc:
        raise UsageError(str(exc)) from None

"""What a replica-group job asks for, its ``aelastic run`` flags, and the plain decisions
about it (no I/O, no anyio).

``aelastic run`` parses its flags before anyio loads; this module is what it needs
then: :class:`ReplicaGroups` (the settings), the flags (``--replica-groups N`` and
company: :data:`OPTIONS`, which the launcher's parser appends to its table, read into
one by :func:`replica_groups`; each also reads ``PET_<NAME>``), :func:`parse_lighthouse_url`,
the workers' torchft variables (:func:`group_env`) and what to do when a group has
spent its restart budget (:func:`after_group_failure`). The flags' defaults are read
from the settings classes (stated once, there).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import urlsplit

from .._dataclass import dataclass
from .._option_table import Option, OptionValues
from ._exceptions import ReplicaGroupConfigError

__all__ = (
    "OPTIONS",
    "LighthouseSettings",
    "ReplicaGroups",
    "after_group_failure",
    "group_env",
    "group_run_id",
    "parse_lighthouse_url",
    "replica_groups",
)


@dataclass(frozen=True)
class LighthouseSettings:
    """The options aelastic gives the ``torchft_lighthouse`` it starts.

    ``join_timeout``: how long a quorum waits for a replica that still heartbeats but
    has not asked to join. torchft's default (60 s) makes the healthy groups wait for
    a failed group until its heartbeat expires; 0.1 s lets them go on at once, and a
    group restarted within it joins the same quorum. ``heartbeat_timeout``: when a
    replica that stopped heartbeating (torchft's managers beat every 0.1 s) stops
    counting; it alone bounds the stall of a two-group job whose failed group does
    not come back (torchft's default: 5 s). ``quorum_tick``: how often the
    Lighthouse re-checks a pending quorum. ``min_replicas``: the smallest quorum.
    """

    join_timeout: float = 0.1
    heartbeat_timeout: float = 1.0
    quorum_tick: float = 0.01
    min_replicas: int = 1
    host: str = "127.0.0.1"
    #: the host in its URL, when not ``host`` (a Lighthouse bound to all addresses)
    advertise: str | None = None
    #: seconds the Lighthouse may take to listen (each start)
    start_timeout: float = 30.0
    #: file the Lighthouse's log goes to (appended; None: kept in memory, last lines)
    log_path: str | None = None

    def argv(self, port: int) -> list[str]:
        """The Lighthouse's options (after the binary) for listening on ``port``."""
        return [
            "--bind",
            f"{self.host}:{port}",
            "--min_replicas",
            str(self.min_replicas),
            "--join_timeout_ms",
            str(round(self.join_timeout * 1000)),
            "--heartbeat_timeout_ms",
            str(max(1, round(self.heartbeat_timeout * 1000))),
            "--quorum_tick_ms",
            str(max(1, round(self.quorum_tick * 1000))),
        ]


@dataclass(frozen=True)
class ReplicaGroups:
    """A torchft job run as ``groups`` replica groups.

    ``group_id`` None: every group runs on this node (each its own standalone
    stores); else this node belongs to that one group (many nodes: the usual
    rendezvous flags, one rendezvous per group). ``lighthouse``: the user's
    Lighthouse URL; None: aelastic starts and supervises one. ``spares``: how many
    times a group that spent its restart budget is replaced by a fresh one (the
    same ``REPLICA_GROUP_ID``, a new budget) before it stays excluded.
    """

    groups: int
    group_id: int | None = None
    lighthouse: str | None = None
    spares: int = 0
    settings: LighthouseSettings = LighthouseSettings()

    def __post_init__(self) -> None:
        if self.groups < 1:
            raise ReplicaGroupConfigError(
                f"--replica-groups {self.groups}: need at least 1 replica group"
            )
        if self.group_id is not None and not 0 <= self.group_id < self.groups:
            raise ReplicaGroupConfigError(
                f"--replica-group-id {self.group_id}: must be 0..{self.groups - 1} "
                f"(--replica-groups {self.groups})"
            )
        if self.spares < 0:
            raise ReplicaGroupConfigError(f"--spare-replica-groups {self.spares}: must be >= 0")
        if self.lighthouse is not None:
            parse_lighthouse_url(self.lighthouse)
        s = self.settings
        if s.join_timeout < 0 or s.heartbeat_timeout <= 0 or s.quorum_tick <= 0:
            raise ReplicaGroupConfigError(
                "--lighthouse-join-timeout must be >= 0 and --lighthouse-heartbeat-timeout "
                f"> 0 seconds (got {s.join_timeout:g} and {s.heartbeat_timeout:g})"
            )

    def local_groups(self) -> list[int]:
        """The ids of the groups this node runs."""
        return list(range(self.groups)) if self.group_id is None else [self.group_id]


def parse_lighthouse_url(url: str) -> tuple[str, int]:
    """``(host, port)`` of a Lighthouse URL ``http://HOST:PORT``.

    Raises:
        ReplicaGroupConfigError: not an ``http://HOST:PORT`` URL.
    """
    fix = "give the Lighthouse's address as http://HOST:PORT (torchft_lighthouse --bind)"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ReplicaGroupConfigError(f"--lighthouse {url!r}: bad port; {fix}") from None
    if parts.scheme != "http" or not parts.hostname or port is None:
        raise ReplicaGroupConfigError(f"--lighthouse {url!r}: not an http://HOST:PORT URL; {fix}")
    if parts.path not in ("", "/") or parts.query:
        raise ReplicaGroupConfigError(f"--lighthouse {url!r}: no path expected; {fix}")
    return parts.hostname, port


#: torchft's manager retries a failed Lighthouse request this many times, sleeping
#: ``max(0.1 s, quorum timeout / (retries + 1))`` between tries: 600 keeps it at 0.1 s
#: for quorum timeouts up to a minute, so a restarted Lighthouse is found again at
#: once (torchft's default, 0, leaves the quorum hanging until the quorum timeout).
QUORUM_RETRIES = 600


def group_env(
    group_id: int, groups: int, lighthouse: str, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The variables torchft's workers read: the three torchft's own ``torchx`` launch
    sets, and ``TORCHFT_QUORUM_RETRIES`` (:data:`QUORUM_RETRIES`) unless ``environ``
    (the launcher's environment) sets it."""
    env = {
        "REPLICA_GROUP_ID": str(group_id),
        "NUM_REPLICA_GROUPS": str(groups),
        "TORCHFT_LIGHTHOUSE": lighthouse,
    }
    if "TORCHFT_QUORUM_RETRIES" not in (os.environ if environ is None else environ):
        env["TORCHFT_QUORUM_RETRIES"] = str(QUORUM_RETRIES)
    return env


def group_run_id(run_id: str, group_id: int) -> str:
    """Group ``group_id``'s rendezvous run id: groups never share a rendezvous."""
    return f"{run_id}-rg{group_id}"


def after_group_failure(spares_left: int) -> bool:
    """Whether a group that spent its restart budget is replaced by a spare (else it
    stays excluded and the job goes on with the others)."""
    return spares_left > 0


_LIGHTHOUSE = LighthouseSettings()
_SPARES = ReplicaGroups(1).spares  # the default: the count is what every instance needs

#: (flags, dest, kind, default, help), the ``aelastic run`` option table format.
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
    """The replica-group settings of the flags of :data:`OPTIONS`, or None without
    ``--replica-groups``.

    ``standalone``: this node hosts its own stores (no rendezvous flags, or
    ``--standalone``); only then may every group run here. ``backend``: the rendezvous
    backend; without ``--lighthouse`` many nodes need c10d (its store's host starts
    the Lighthouse).

    Raises:
        ReplicaGroupConfigError: a ``--replica-group-id`` without ``--replica-groups``,
            or missing with rendezvous flags, a missing ``--lighthouse`` across nodes
            off the c10d backend, or a value :class:`ReplicaGroups` refuses (a bad id,
            URL or timeout); the parser shows it as a usage error. A count or timeout
            that is not a number, or below its minimum: the parser's own usage error.
    """
    groups = v.int_("replica_groups", minimum=1)
    group_id = v.int_("replica_group_id", minimum=0)
    if groups is None:
        if group_id is not None:
            raise ReplicaGroupConfigError(
                f"{v.source('replica_group_id')} needs --replica-groups N (the number of groups)"
            )
        return None
    if group_id is None and not standalone:
        raise ReplicaGroupConfigError(
            f"{v.source('replica_groups')} with rendezvous flags: give --replica-group-id K "
            "(this node's group), or drop the rendezvous flags to run every group here"
        )
    lighthouse = v.str_("lighthouse")
    if group_id is not None and lighthouse is None and (standalone or backend != "c10d"):
        where = "standalone" if standalone else f"with --rdzv-backend {backend}"
        raise ReplicaGroupConfigError(
            f"{v.source('replica_group_id')} {where}: the groups of a many-node job must "
            "share one Lighthouse: give --lighthouse http://HOST:PORT (torchft_lighthouse "
            "running there), or the c10d rendezvous flags shared by every group (the node "
            "hosting its store then starts one)"
        )
    join = v.float_("lighthouse_join_timeout", minimum=0.0)
    heartbeat = v.float_("lighthouse_heartbeat_timeout", minimum=0.0, strict=True)
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

"""What a replica-group job asks for, and the plain decisions about it (no I/O, no anyio).

``aelastic run`` parses its flags before anyio loads; this module is what it needs
then: :class:`ReplicaGroups` (the settings), :func:`parse_lighthouse_url`, the
workers' torchft variables (:func:`group_env`) and what to do when a group has
spent its restart budget (:func:`after_group_failure`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import urlsplit

from .._dataclass import dataclass
from ._exceptions import ReplicaGroupConfigError

__all__ = (
    "LighthouseSettings",
    "ReplicaGroups",
    "after_group_failure",
    "group_env",
    "group_run_id",
    "parse_lighthouse_url",
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

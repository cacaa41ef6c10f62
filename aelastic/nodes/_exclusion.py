"""This node's record of its own failed rounds, and its exclusion from the next rounds.

The node whose workers failed decides for itself, from its own exits and its own
monotonic clock (no clock crosses machines): after ``--exclude-node-after N`` failed
rounds within the window it is out for a cooldown, doubled on each repeat up to a cap.
The failure that excludes it spends no restart, and a failure that would have ended
the job (budget spent) excludes it instead, so the others go on. The decision is
published job-wide in the rendezvous store (:func:`publish`) and as an event.
"""

from __future__ import annotations

import json
import logging
import socket
from dataclasses import field
from typing import TYPE_CHECKING, Any

import anyio

from .._dataclass import dataclass
from ._policy import ExclusionSettings, backoff_seconds, failures_in_window, should_exclude

if TYPE_CHECKING:
    from ..rendezvous import RendezvousHandler
    from ..store import Store

__all__ = (
    "NODE_ID_ENV",
    "ExclusionRecord",
    "NodeExclusion",
    "excluded_nodes",
    "node_id",
    "publish",
)

log = logging.getLogger("aelastic.nodes")

#: Environment variable naming this node in exclusion records (default: the host name).
NODE_ID_ENV = "AELASTIC_NODE_ID"
#: Bound on the store requests that publish or read exclusion records.
_STORE_BOUND = 5.0


def node_id(environ: dict[str, str] | None = None) -> str:
    """This node's name in exclusion records: ``$AELASTIC_NODE_ID``, else the host name."""
    import os

    env = os.environ if environ is None else environ
    return env.get(NODE_ID_ENV) or socket.gethostname()


@dataclass(frozen=True)
class ExclusionRecord:
    """One exclusion decision: who, how many times so far, for how long, and why."""

    node: str
    times: int
    cooldown: float
    reason: str

    def describe(self) -> str:
        return (
            f"{self.node} excluded for {self.cooldown:g} s (exclusion #{self.times}): {self.reason}"
        )


@dataclass
class NodeExclusion:
    """Failed rounds of this node and its current exclusion (times: ``anyio.current_time``)."""

    settings: ExclusionSettings
    node: str = field(default_factory=node_id)
    failures: list[float] = field(default_factory=list)
    times: int = 0
    until: float | None = None
    last: ExclusionRecord | None = None

    def note_failure(self, now: float, why: str) -> ExclusionRecord | None:
        """Count a failed round; return the exclusion it triggers, if it does."""
        self.failures = failures_in_window([*self.failures, now], now, self.settings.window)
        if not should_exclude(self.failures, now, self.settings):
            return None
        count = len(self.failures)
        return self.exclude_now(
            now,
            f"its workers failed {count} time(s) within {self.settings.window:g} s, last: {why}",
        )

    def exclude_now(self, now: float, reason: str) -> ExclusionRecord:
        """Exclude this node from now for the next cooldown, for ``reason`` (e.g. a
        straggler: ``aelastic.stragglers``); its failures so far stop counting."""
        self.failures = []
        self.times += 1
        s = self.settings
        cooldown = backoff_seconds(s.cooldown, self.times, s.cooldown_max)
        self.until = now + cooldown
        self.last = ExclusionRecord(self.node, self.times, cooldown, reason)
        return self.last

    def remaining(self, now: float) -> float:
        """Seconds of exclusion left (0: this node may join)."""
        if self.until is None:
            return 0.0
        left = self.until - now
        if left <= 0:
            self.until = None
            return 0.0
        return left


def _key(handler: RendezvousHandler) -> str:
    return f"rdzv/{handler.get_run_id()}/excluded"


def _store_of(handler: RendezvousHandler) -> Store | None:
    store = getattr(handler, "store", None)  # the dynamic backends' rendezvous store
    return store if store is not None and hasattr(store, "multi_get") else None


async def publish(handler: RendezvousHandler, record: ExclusionRecord) -> None:
    """Append ``record`` to the job's exclusion list in the rendezvous store.

    One ADD and one SET, bounded; a store that fails is only logged (the node keeps
    itself out either way).
    """
    store = _store_of(handler)
    if store is None:
        return
    key = _key(handler)
    with anyio.move_on_after(_STORE_BOUND):
        try:
            index = await store.add(f"{key}/count", 1)
            value = json.dumps(
                {
                    "node": record.node,
                    "times": record.times,
                    "cooldown": record.cooldown,
                    "reason": record.reason,
                }
            )
            await store.set(f"{key}/{index - 1}", value)
        except Exception as exc:
            log.warning("could not publish this node's exclusion in the store: %s", exc)


async def excluded_nodes(handler: RendezvousHandler) -> list[ExclusionRecord]:
    """Every exclusion of the job so far (oldest first); [] when the store cannot tell."""
    store = _store_of(handler)
    if store is None:
        return []
    key = _key(handler)
    with anyio.move_on_after(_STORE_BOUND):
        try:
            count = await store.add(f"{key}/count", 0)
            if count <= 0:
                return []
            raws = await store.multi_get([f"{key}/{i}" for i in range(count)])
            return [_record(json.loads(raw)) for raw in raws]
        except Exception as exc:
            log.warning("could not read the job's exclusions from the store: %s", exc)
    return []


def _record(data: dict[str, Any]) -> ExclusionRecord:
    return ExclusionRecord(
        str(data["node"]), int(data["times"]), float(data["cooldown"]), str(data["reason"])
    )

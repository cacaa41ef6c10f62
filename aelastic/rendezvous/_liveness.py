"""How a round's coordinator decides that a member is gone, without comparing clocks.

The coordinator publishes numbered ticks (every ``keep_alive_interval`` and on every
change) and remembers, on its *own* monotonic clock, when it published each one.
Members block on the next tick and acknowledge it. A member that owes an
acknowledgement has lapsed when the last tick it acknowledged was published more
than ``heartbeat_timeout`` + ``min(keep_alive_interval, 1 s)`` ago (that tick is its
last sign of life, within one store round trip; the margin is the grace a slow
member had before, capped at 1 s). The coordinator sweeps at each periodic tick and
also at the moment the earliest such deadline expires (:meth:`Liveness.next_sweep`),
so a silent member is removed at most ``heartbeat_timeout`` + 1 s after it went
silent (before: up to two keep-alive intervals later, 20-22 s with 15 s / 5 s). Members
judge the coordinator the same way: no new tick within ``heartbeat_timeout`` on their
own clock means the coordinator is gone. No wall clock ever crosses machines.

:class:`Liveness` is the strategy seam: :class:`StoreLiveness` keeps the evidence in
store keys; an etcd backend can instead attach each member's node key to a lease and
report the members whose key expired.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from dataclasses import field

from .._dataclass import dataclass
from ..store import StoreTimeoutError
from ._ops import Ops
from ._state import Keys, parse_int

__all__ = ("Liveness", "StoreLiveness", "TickClock")

#: How far past a member's deadline its sweep is scheduled (seconds).
_PAST_DEADLINE = 0.01


@dataclass
class TickClock:
    """The coordinator's own-clock record of a round: when each tick was published and
    when each ticket was first observed (``time.monotonic``/``anyio.current_time``)."""

    published: dict[int, float] = field(default_factory=dict)
    first_seen: dict[int, float] = field(default_factory=dict)
    latest: int = -1
    #: the last tick each ticket was seen to acknowledge (-1: none yet), at the last sweep
    acked: dict[int, int] = field(default_factory=dict)

    def publish(self, n: int, now: float) -> None:
        self.published[n] = now
        self.latest = n
        if len(self.published) > 4096:  # keep memory bounded on very long runs
            for old in sorted(self.published)[:2048]:
                del self.published[old]

    def observe(self, ticket: int, now: float) -> None:
        self.first_seen.setdefault(ticket, now)

    def last_heard(self, ticket: int, acked: int) -> float:
        """When ``ticket`` last showed life: the publication of the last tick it
        acknowledged (or when it was first observed), on this clock; -inf if forgotten."""
        first = self.first_seen.get(ticket)
        since = self.published.get(acked) if acked >= 0 else first
        if since is None:  # so old it was forgotten (or never observed: lapsed at once)
            return float("-inf")
        return since if first is None else max(since, first)

    def lapsed_since(self, ticket: int, acked: int, now: float) -> float:
        """Seconds since ``ticket`` last showed life, if it owes an acknowledgement (else 0)."""
        if acked + 1 > self.latest:
            return 0.0
        return now - self.last_heard(ticket, acked)


class Liveness(abc.ABC):
    """Strategy: how members leave evidence of life and how the coordinator reads it."""

    @abc.abstractmethod
    async def attach(
        self, ops: Ops, keys: Keys, round_: int, ticket: int, descriptor: str, placed: bool = False
    ) -> None:
        """Register ticket holder ``ticket`` of ``round_`` (called once, right after joining):
        its descriptor at ``keys.node``, and with ``placed`` (its descriptor holds placement
        facts) the round's ``keys.placed`` mark, in the same request."""

    @abc.abstractmethod
    async def ack(self, ops: Ops, keys: Keys, round_: int, ticket: int, n: int) -> None:
        """Acknowledge tick ``n`` (called by a member each time it receives a tick)."""

    @abc.abstractmethod
    async def lapsed(
        self,
        ops: Ops,
        keys: Keys,
        round_: int,
        tickets: Sequence[int],
        clock: TickClock,
        now: float,
    ) -> list[int]:
        """Return the tickets among ``tickets`` whose holders are gone (coordinator side)."""

    def next_sweep(self, clock: TickClock, tickets: Sequence[int]) -> float:
        """When :meth:`lapsed` may next find one of ``tickets`` gone, on ``clock``'s time
        (from what the last sweep saw); ``inf`` (the default): only at periodic ticks."""
        return math.inf


class StoreLiveness(Liveness):
    """Acknowledgements in ``<r>/seen/<ticket>`` keys, judged on the coordinator's clock.

    Cost: one fire-and-forget ``set`` per member per tick, one ``multi_get`` per sweep
    for the coordinator.
    """

    def __init__(self, heartbeat_timeout: float, grace: float = 0.0) -> None:
        self.heartbeat_timeout = heartbeat_timeout
        #: added to ``heartbeat_timeout`` when judging a member by its last ack
        self.grace = grace

    async def attach(
        self, ops: Ops, keys: Keys, round_: int, ticket: int, descriptor: str, placed: bool = False
    ) -> None:
        names, values = [keys.node(round_, ticket), keys.seen(round_, ticket)], [descriptor, "-1"]
        if placed:
            names.append(keys.placed(round_))
            values.append("1")
        await ops.multi_set(names, values)

    async def ack(self, ops: Ops, keys: Keys, round_: int, ticket: int, n: int) -> None:
        await ops.set(keys.seen(round_, ticket), str(n))

    async def lapsed(
        self,
        ops: Ops,
        keys: Keys,
        round_: int,
        tickets: Sequence[int],
        clock: TickClock,
        now: float,
    ) -> list[int]:
        if not tickets:
            return []
        names = [keys.seen(round_, t) for t in tickets]
        try:
            values: list[bytes | None] = list(
                await ops.multi_get(
                    names, timeout=min(self.heartbeat_timeout / 2, ops.read_timeout)
                )
            )
        except StoreTimeoutError:
            # A holder died between taking its ticket and registering: find the missing keys.
            values = []
            for name in names:
                values.append(await ops.get(name, timeout=0.001) if await ops.check(name) else None)
        gone: list[int] = []
        for ticket, name, raw in zip(tickets, names, values, strict=True):
            acked = -1 if raw is None else parse_int(name, raw)
            clock.acked[ticket] = acked
            if raw is None and now - clock.first_seen.get(ticket, now) <= self.heartbeat_timeout:
                continue
            if clock.lapsed_since(ticket, acked, now) > self.heartbeat_timeout + self.grace:
                gone.append(ticket)
        return gone

    def next_sweep(self, clock: TickClock, tickets: Sequence[int]) -> float:
        heard = [
            clock.last_heard(t, clock.acked[t])
            for t in tickets
            if t in clock.acked and clock.acked[t] < clock.latest
        ]
        # just past the deadline: a sweep exactly at it would find the member in time
        limit = self.heartbeat_timeout + self.grace
        return min(heard, default=math.inf) + limit + _PAST_DEADLINE

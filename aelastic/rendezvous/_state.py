"""The dynamic rendezvous's keys and JSON records, validated on every read.

Layout (every key under ``rdzv/<run_id>/c/``):

``round``                 decimal counter: the round new joiners enter
``closed``                exists once the rendezvous is closed
``<r>/joined``            decimal counter: tickets taken in round ``r`` (join order)
``<r>/node/<ticket>``     JSON node descriptor of a ticket holder: its address, whether
                          it hosts the store, its topology key and last group rank
                          (read by the coordinator at completion: :mod:`._placement`)
``<r>/placed``            exists once a ticket holder registered placement facts (it
                          hosts the store, has a topology key or a last group rank)
``<r>/seen/<ticket>``     decimal: the last tick this ticket acknowledged
``<r>/tick``              JSON :class:`Tick`: the latest tick of round ``r``
``<r>/tick/<n>``          JSON :class:`Tick` number ``n`` (members block on ``n + 1``)
``<r>/inbox``             queue of JSON :class:`Message` for the round's coordinator

Every record is small (O(1) bytes) except a tick's ``removed`` list, which holds only
the tickets that failed or withdrew in that round, and a running tick's ``order``
(the members in rank order, when that is not join order with the lead first).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import field
from typing import Any

from .._dataclass import dataclass
from ._exceptions import RendezvousStateError
from ._placement import Seat, seat_of

__all__ = (
    "Keys",
    "Tick",
    "Message",
    "parse_int",
    "descriptor",
    "descriptor_addr",
    "descriptor_seat",
    "live_members",
    "TICK_STATES",
    "MESSAGE_OPS",
)

#: joining: gathering nodes; running: membership fixed; dissolved: the round ended,
#: join the next one; closed: the rendezvous is closed for good; lost: written by the
#: store server when the coordinator's connection closed (it died).
TICK_STATES = frozenset({"joining", "running", "dissolved", "closed", "lost"})
#: Messages a round's coordinator accepts in its inbox.
MESSAGE_OPS = frozenset({"joined", "waiting", "withdraw", "leave", "gone", "close", "tick"})


class Keys:
    """Key names of one run's rendezvous state."""

    def __init__(self, run_id: str, epoch: int = 0) -> None:
        self.run_id = run_id
        #: Which store incarnation these keys live in: 0 at first, +1 each time the
        #: store was re-hosted after its host was lost (see ``_c10d``).
        self.epoch = epoch
        self.base = f"rdzv/{run_id}/c" if epoch == 0 else f"rdzv/{run_id}/c.e{epoch}"
        self.round = f"{self.base}/round"
        self.closed = f"{self.base}/closed"
        #: set in a frozen host's store by the survivors that moved on: its successor
        self.deposed = f"{self.base}/deposed"

    def moved_marks(self) -> dict[str, str]:
        """What a re-hosted store of this epoch holds before it listens: the round key
        of every earlier epoch set to ``-epoch`` (see :func:`moved_to_epoch`)."""
        return {Keys(self.run_id, e).round: str(-self.epoch) for e in range(self.epoch)}

    def dissolved_ticks(self, round_: int, last_seen: int, kept: int) -> dict[str, str]:
        """What a re-hosted store holds for the waiters of ``round_`` of these (earlier)
        keys: a ``dissolved`` tick at every number a member may be blocked on (the
        ``kept`` before ``last_seen``, the heir's newest, up to two past it) and as the
        latest. A member whose blocking read reconnected silently to the successor at
        the same address reads it at once and rejoins (where the round key sends it to
        the new epoch) instead of waiting on a tick no coordinator will write."""
        numbers = range(max(0, last_seen - kept), last_seen + 3)
        marks = {self.tick(round_, n): Tick(n, "dissolved").dumps() for n in numbers}
        marks[self.tick_latest(round_)] = Tick(last_seen + 2, "dissolved").dumps()
        return marks

    def agent_prefix(self, round_: int) -> str:
        """Prefix of the store handed to the agent for ``round_``."""
        if self.epoch == 0:
            return f"rdzv/{self.run_id}/{round_}"
        return f"rdzv/{self.run_id}/e{self.epoch}.{round_}"

    def joined(self, r: int) -> str:
        return f"{self.base}/{r}/joined"

    def node(self, r: int, ticket: int) -> str:
        return f"{self.base}/{r}/node/{ticket}"

    def seen(self, r: int, ticket: int) -> str:
        return f"{self.base}/{r}/seen/{ticket}"

    def done(self, r: int, ticket: int) -> str:
        """Set by a member once it is done with round ``r``: it saw the round closed, or
        left it (what a closing store host waits for before its store goes)."""
        return f"{self.base}/{r}/done/{ticket}"

    def tick_latest(self, r: int) -> str:
        return f"{self.base}/{r}/tick"

    def tick(self, r: int, n: int) -> str:
        return f"{self.base}/{r}/tick/{n}"

    def inbox(self, r: int) -> str:
        return f"{self.base}/{r}/inbox"

    def placed(self, r: int) -> str:
        return f"{self.base}/{r}/placed"


def moved_to_epoch(round_value: int) -> int | None:
    """The epoch a round counter read says the store serves now, or None (no move).

    Rounds count up from 0; a re-hosted store sets the round keys of the epochs
    before its own to ``-epoch``, so the read that starts every join (``ADD round
    0``) also tells a node whose client silently reconnected to the successor.
    """
    return -round_value if round_value < 0 else None


def parse_int(key: str, raw: bytes) -> int:
    """Parse a decimal counter stored at ``key``."""
    try:
        text = raw.decode("ascii").strip()
        if not text.lstrip("-").isdigit():
            raise ValueError
        return int(text)
    except (UnicodeDecodeError, ValueError):
        raise RendezvousStateError(
            f"rendezvous key {key!r} holds {raw[:64]!r}, expected a decimal integer; "
            "the store was written by something else (delete the key or use another run_id)"
        ) from None


def _load(key: str, raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise RendezvousStateError(
            f"rendezvous key {key!r} holds {raw[:64]!r}, which is not JSON; "
            "the store was written by something else (use another run_id)"
        ) from None
    if not isinstance(data, dict):
        raise RendezvousStateError(f"rendezvous key {key!r}: expected a JSON object, got {data!r}")
    return data


def _field_int(key: str, data: dict[str, Any], name: str, minimum: int = 0) -> int:
    value = data.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise RendezvousStateError(
            f"rendezvous key {key!r}: field {name!r} must be an integer >= {minimum}, got {value!r}"
        )
    return value


def _field_str(key: str, data: dict[str, Any], name: str) -> str:
    value = data.get(name)
    if not isinstance(value, str):
        raise RendezvousStateError(
            f"rendezvous key {key!r}: field {name!r} must be a string, got {value!r}"
        )
    return value


def _field_choice(
    key: str, data: dict[str, Any], name: str, allowed: frozenset[str], what: str
) -> str:
    value = data.get(name)
    if not isinstance(value, str) or value not in allowed:  # a list/dict is unhashable
        raise RendezvousStateError(
            f"rendezvous key {key!r}: unknown {what} {value!r} (expected one of {sorted(allowed)})"
        )
    return str(value)


@dataclass(frozen=True)
class Tick:
    """One announcement of a round's coordinator; members acknowledge each tick.

    In state ``running`` the members are the tickets below ``upto`` not in ``removed``;
    a member's rank is its position in ``order`` (the members in rank order, see
    :mod:`._placement`) or, when ``order`` is empty, among them in join order with
    ``lead`` first. ``waiting`` counts ticket
    holders beyond ``upto`` (late arrivals, or spares when ``world`` is the maximum).
    """

    n: int
    state: str
    upto: int = 0
    world: int = 0
    waiting: int = 0
    removed: tuple[int, ...] = field(default=())
    #: The member that re-hosts the rendezvous store if its host is lost (ticket and
    #: address; -1 and "" when there is none): see ``_c10d``.
    heir_ticket: int = -1
    heir: str = ""
    #: The member that gets rank 0 (the store's host: its workers' store is then on the
    #: machine every node reaches), the others keep join order; -1: join order only.
    lead: int = -1
    #: The members in rank order; empty when that is join order with ``lead`` first.
    order: tuple[int, ...] = field(default=())

    def is_member(self, ticket: int) -> bool:
        return self.state == "running" and ticket < self.upto and ticket not in self.removed

    def rank_of(self, ticket: int) -> int:
        if self.order:
            return self.order.index(ticket)
        if ticket == self.lead:
            return 0
        rank = ticket - sum(1 for t in self.removed if t < ticket)
        return rank + 1 if 0 <= ticket < self.lead else rank

    def dumps(self) -> str:
        data: dict[str, Any] = {
            "n": self.n,
            "state": self.state,
            "upto": self.upto,
            "world": self.world,
            "waiting": self.waiting,
            "removed": list(self.removed),
        }
        if self.heir_ticket >= 0:
            data["heir_ticket"] = self.heir_ticket
            data["heir"] = self.heir
        if self.lead >= 0:
            data["lead"] = self.lead
        if self.order:
            data["order"] = list(self.order)
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def loads(cls, key: str, raw: bytes) -> Tick:
        data = _load(key, raw)
        state = _field_choice(key, data, "state", TICK_STATES, "state")
        removed = _tickets(key, data, "removed")
        order = _tickets(key, data, "order")
        tick = cls(
            n=_field_int(key, data, "n"),
            state=state,
            upto=_field_int(key, data, "upto"),
            world=_field_int(key, data, "world"),
            waiting=_field_int(key, data, "waiting"),
            removed=tuple(removed),
            heir_ticket=_field_int(key, data, "heir_ticket", -1) if "heir_ticket" in data else -1,
            heir=_field_str(key, data, "heir") if "heir_ticket" in data else "",
            lead=_field_int(key, data, "lead", -1) if "lead" in data else -1,
            order=tuple(order),
        )
        if tick.state == "running" and tick.world != tick.upto - sum(
            1 for t in tick.removed if t < tick.upto
        ):
            raise RendezvousStateError(
                f"rendezvous key {key!r}: world {tick.world} does not match upto {tick.upto} "
                f"minus removed {list(tick.removed)}"
            )
        if tick.lead >= 0 and not tick.is_member(tick.lead):
            raise RendezvousStateError(
                f"rendezvous key {key!r}: lead {tick.lead} is not a member of the round"
            )
        if tick.order and sorted(tick.order) != [
            t for t in range(tick.upto) if t not in tick.removed
        ]:
            raise RendezvousStateError(
                f"rendezvous key {key!r}: order {list(tick.order)} is not the round's members"
            )
        return tick


def _tickets(key: str, data: dict[str, Any], name: str) -> list[int]:
    value = data.get(name, [])
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
    ):
        raise RendezvousStateError(
            f"rendezvous key {key!r}: {name!r} must be a list of tickets, got {value!r}"
        )
    return value


@dataclass(frozen=True)
class Message:
    """A message to a round's coordinator (pushed onto the round's inbox queue)."""

    op: str
    ticket: int = -1

    def dumps(self) -> str:
        return json.dumps({"op": self.op, "ticket": self.ticket}, separators=(",", ":"))

    @classmethod
    def loads(cls, key: str, raw: bytes) -> Message:
        data = _load(key, raw)
        op = _field_choice(key, data, "op", MESSAGE_OPS, "message op")
        ticket = data.get("ticket", -1)
        if not isinstance(ticket, int) or isinstance(ticket, bool) or ticket < -1:
            raise RendezvousStateError(f"rendezvous key {key!r}: bad ticket {ticket!r}")
        return cls(op=op, ticket=ticket)


def descriptor(
    addr: str,
    hostname: str,
    pid: int,
    local_id: int,
    *,
    host: bool = False,
    key: str | None = None,
    last: tuple[int, int, int] | None = None,
) -> str:
    """JSON descriptor of a node: who it is, whether it hosts the store (``host``), its
    topology key and the ``(epoch, round, rank)`` it was last admitted with (read
    back by :func:`descriptor_seat`)."""
    data: dict[str, Any] = {"addr": addr, "hostname": hostname, "pid": pid, "local_id": local_id}
    if host:
        data["host"] = True
    if key is not None:
        data["key"] = key
    if last is not None:
        data["last"] = list(last)
    return json.dumps(data, separators=(",", ":"))


def descriptor_seat(key: str, raw: bytes) -> tuple[Seat, bool]:
    """The placement facts of the node descriptor at ``key``, and whether it hosts the store."""
    data = _load(key, raw)
    return seat_of(data), data.get("host") is True


def descriptor_addr(key: str, raw: bytes) -> str:
    """The ``addr`` of the node descriptor stored at ``key``."""
    addr = _load(key, raw).get("addr")
    if not isinstance(addr, str) or not addr:
        raise RendezvousStateError(f"rendezvous key {key!r}: node descriptor has no 'addr'")
    return addr


def live_members(joined: int, removed: Sequence[int] | set[int], max_nodes: int) -> list[int]:
    """The first ``max_nodes`` tickets in ``range(joined)`` not in ``removed`` (join order)."""
    gone = set(removed)
    out: list[int] = []
    for t in range(joined):
        if t not in gone:
            out.append(t)
            if len(out) == max_nodes:
                break
    return out

"""The coordinator of one round of the dynamic rendezvous (ticket 0): the only writer of
the round's outcome.

It blocks on its inbox (:class:`~._alarm.InboxAlarm` wakes it for periodic ticks),
publishes a numbered tick every ``keep_alive_interval`` and on every change, sweeps the
members' liveness (:class:`~._liveness.Liveness` on a :class:`~._liveness.TickClock`),
starts the last call at ``min_nodes`` live holders and completes at ``max_nodes``, when
the last call expires, or at once when exactly its previous round's members are back
(:mod:`._rejoin`): the ``running`` tick names the members, their rank order
(:func:`~._placement.place`) and the heir that re-hosts the store if its host is lost.
Before each tick ``n`` is out, the store holds an order to write a ``lost`` tick ``n+1``
if this process dies (:class:`~._guards.LostOrders`). The algorithm as a whole is in
:mod:`._dynamic`'s docstring; this module holds the coordinator's side of it, and
the handler drives it through :class:`CoordinatorLink` only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Protocol

import anyio

from .._dataclass import dataclass
from ..store import StoreTimeoutError
from ..store._interface import OnCloseAction
from ._alarm import InboxAlarm
from ._guards import LostOrders
from ._liveness import Liveness, TickClock
from ._ops import Ops
from ._placement import Seat, place
from ._rejoin import Previous, may_close_now, worth_checking
from ._settings import DynamicSettings
from ._state import Keys, Message, Tick, descriptor_addr, descriptor_seat, live_members
from ._view import RoundView

__all__ = ("TICKS_KEPT", "CoordinatorLink", "EventSink", "RoundCoordinator", "publish_tick")

#: How many old tick keys stay in the store besides the latest ones.
TICKS_KEPT = 8

#: Why the coordinator removes a ticket, by inbox message.
_REASONS = {
    "withdraw": "withdrew",
    "leave": "left",
    "gone": "died: its connection to the store closed",
}


async def publish_tick(ops: Ops, keys: Keys, round_: int, tick: Tick) -> None:
    """Write ``tick`` of ``round_`` and the round's latest tick in one request, then prune
    the tick ``TICKS_KEPT`` before it. Raises rendezvous errors (see :class:`~._ops.Ops`)."""
    raw = tick.dumps()
    await ops.multi_set([keys.tick(round_, tick.n), keys.tick_latest(round_)], [raw, raw])
    if tick.n >= TICKS_KEPT:
        await ops.delete(keys.tick(round_, tick.n - TICKS_KEPT))


class EventSink(Protocol):
    """Records a rendezvous event of the handler (``DynamicRendezvousHandler._event``)."""

    def __call__(self, name: str, message: str, *, state: str = "RUNNING") -> None: ...


@dataclass(frozen=True)
class CoordinatorLink:
    """What a round's coordinator needs from its node's handler; nothing else is shared."""

    #: the store's requests (guarded by the handler's store watch)
    ops: Ops
    #: the keys of the store incarnation the round lives in
    keys: Keys
    settings: DynamicSettings
    liveness: Liveness
    min_nodes: int
    max_nodes: int
    #: this node's address (the heir when it does not host the store)
    addr: str
    #: whether this node hosts the store (it cannot be its own heir)
    hosts_store: bool
    #: this node's placement facts (ticket 0 registers no descriptor)
    seat: Seat
    event: EventSink
    #: ``(view, key, action, value)``: have the store do ``action`` if this process
    #: dies; the action's id (recorded in ``view.actions``), None if none was registered
    on_close: Callable[[RoundView, str, OnCloseAction, str], Awaitable[int | None]]
    #: cancel these on-close actions (best effort; never raises)
    cancel_actions: Callable[[list[int]], Awaitable[None]]
    #: tell a closing store host that this node is done with the round (best effort)
    done_with: Callable[[RoundView], Awaitable[None]]
    #: the round this node was last admitted to (None: none): when exactly its members
    #: are back, the round closes without its last call (see :mod:`._rejoin`)
    previous: Previous | None = None


class RoundCoordinator:
    """Ticket 0 of round ``view.round``: decides the round alone and publishes its ticks
    to ``view`` (this node's own view of the round) and the store.

    Owns the round's coordinator state: the inbox, the members' clocks, the removed
    tickets, the tick numbers, the heir and the rank order.
    """

    def __init__(self, view: RoundView, link: CoordinatorLink) -> None:
        self._view = view
        self._link = link
        self._round = view.round
        self._inbox = link.keys.inbox(view.round)
        self._clock = TickClock()
        self._removed: set[int] = set()
        self._n = -1  # the last tick published
        self._heir_ticket, self._heir, self._lead = -1, "", -1
        self._order: tuple[int, ...] = ()
        self._orders: LostOrders | None = None

    async def run(self) -> None:
        """Coordinate the round until it completes and then ends (dissolved, closed).

        Returns when the round ended; cancellation stops it at once (the inbox alarm
        and the ``lost`` orders' registrations with it; the handler withdraws the
        orders). Raises rendezvous errors of the store (as is, not as an exception
        group), e.g. :class:`~._exceptions.RendezvousConnectionError`.
        """
        link, view = self._link, self._view
        alarm = InboxAlarm(link.ops, self._inbox, link.settings.heartbeat_timeout)
        keys, r = link.keys, view.round
        error: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(alarm.run)

            async def order(k: int) -> int | None:
                return await link.on_close(view, keys.tick(r, k), "set", Tick(k, "lost").dumps())

            async def withdraw(action_id: int) -> None:
                if action_id in view.actions:
                    view.actions.remove(action_id)
                    await link.cancel_actions([action_id])

            self._orders = LostOrders(order, withdraw, tg)
            try:
                await self._decide(alarm)
            except Exception as exc:  # raised below as is, not as an exception group
                error = exc
            finally:
                tg.cancel_scope.cancel()
        if error is not None:
            raise error

    async def _publish(self, state: str, upto: int = 0, world: int = 0, waiting: int = 0) -> Tick:
        # Before tick n is out, the store holds an order to write a "lost" tick n+1
        # if this process dies: members blocked on n+1 wake at once (see _guards).
        # The order for n is cancelled after n is out (dying in between, both are
        # written: still a "lost" tick wherever a member waits).
        orders = self._orders
        assert orders is not None
        self._n += 1
        n = self._n
        tick = Tick(n, state, upto, world, waiting, tuple(sorted(self._removed)))
        if state == "running":
            tick = dataclasses.replace(
                tick,
                heir_ticket=self._heir_ticket,
                heir=self._heir,
                lead=self._lead,
                order=self._order,
            )
        going_on = state in ("joining", "running")
        if going_on:
            await orders.hold(n)
        await publish_tick(self._link.ops, self._link.keys, self._round, tick)
        self._clock.publish(n, anyio.current_time())
        self._view.publish(tick)
        await orders.release(n if going_on else None)
        return tick

    async def _dissolve(self, reason: str) -> None:
        link, r = self._link, self._round
        await link.ops.compare_set(link.keys.round, str(r), str(r + 1))
        await self._publish("dissolved")
        link.event("dissolved", f"round {r} dissolved: {reason}")
        # Only the latest tick matters now (late readers learn the round is over).
        for old in range(max(0, self._n - TICKS_KEPT), self._n):
            await link.ops.delete(link.keys.tick(r, old))

    def _remove(self, tickets: list[int], why: str) -> None:
        for t in tickets:
            if t not in self._removed and t != 0:
                self._removed.add(t)
                self._link.event("node_removed", f"round {self._round}: ticket {t} removed ({why})")

    async def _decide(self, alarm: InboxAlarm) -> None:
        link = self._link
        ops, keys, s = link.ops, link.keys, link.settings
        r, inbox, clock, removed = self._round, self._inbox, self._clock, self._removed
        publish, dissolve, remove = self._publish, self._dissolve, self._remove
        orders = self._orders
        assert orders is not None

        orders.start(1)  # placed while the next request is in flight
        if await ops.check(keys.closed):
            await publish("closed")
            return
        await publish("joining")
        clock.observe(0, anyio.current_time())
        joined = 1
        next_tick = anyio.current_time() + s.keep_alive_interval
        last_call: float | None = None
        checked: list[int] = []  # the live tickets last checked for a rejoined round
        found: dict[int, bytes] | None = None  # their descriptors, when it closes at once

        # -- joining: wait for min, then last call or max ------------------------
        while True:
            wake_at = next_tick if last_call is None else min(next_tick, last_call)
            candidates = [t for t in range(1, joined) if t not in removed]
            sweep_at = link.liveness.next_sweep(clock, candidates)
            raw = await alarm.pop(min(wake_at, sweep_at))
            if raw is not None:
                msg = Message.loads(inbox, raw)
                if msg.op == "close":
                    await publish("closed")
                    return
                if msg.op in ("withdraw", "leave", "gone"):
                    remove([msg.ticket], _REASONS[msg.op])
            now = anyio.current_time()
            count = await ops.add(keys.joined(r), 0)
            for t in range(joined, count):
                clock.observe(t, now)
            joined = max(joined, count)
            if now >= next_tick:
                if await ops.add(keys.round, 0) != r:
                    await dissolve("a member judged this coordinator gone")
                    return
                candidates = [t for t in range(1, joined) if t not in removed]
                gone = await link.liveness.lapsed(ops, keys, r, candidates, clock, now)
                remove(gone, "heartbeat lapsed")
                await publish("joining")
                next_tick = now + s.keep_alive_interval
            elif now >= sweep_at:  # a member's deadline passed between two ticks
                gone = await link.liveness.lapsed(ops, keys, r, candidates, clock, now)
                if gone:
                    remove(gone, "heartbeat lapsed")
                    await publish("joining")
            live = joined - len(removed)
            if live >= link.max_nodes:
                break
            if live >= link.min_nodes:
                if last_call is None:
                    last_call = now + s.last_call_timeout
                    link.event(
                        "last_call",
                        f"round {r}: {live} nodes (min {link.min_nodes}); last call "
                        f"for {s.last_call_timeout}s",
                    )
                if worth_checking(link.previous, keys.epoch, live):
                    live_now = live_members(joined, removed, link.max_nodes)
                    if live_now != checked:
                        settled, found = await self._rejoined(live_now)
                        if found is not None:
                            break
                        if settled:  # else a registration is late: check at the next wake
                            checked = live_now
            else:
                last_call = None
            if last_call is not None and now >= last_call:
                break

        # -- complete: the first max_nodes live tickets, ranked by _placement ----
        members = live_members(joined, removed, link.max_nodes)
        upto = members[-1] + 1
        world = len(members)
        if found is None:
            found = await self._descriptors(members)
        self._heir_ticket, self._heir = self._choose_heir(members, found)
        self._lead, self._order = self._ranking(members, found)

        def waiting_count(total: int) -> int:
            return total - upto - sum(1 for t in removed if t >= upto)

        tick = await publish("running", upto, world, waiting_count(joined))
        link.event("round_complete", f"round {r} complete with {world} nodes")

        # -- running: heartbeat sweeps, waiting nodes, leaves, close -------------
        others = [t for t in members if t != 0]
        while True:
            sweep_at = link.liveness.next_sweep(clock, others)
            raw = await alarm.pop(min(next_tick, sweep_at))
            if raw is not None:
                msg = Message.loads(inbox, raw)
                if msg.op == "close":
                    await publish("closed")
                    await link.done_with(self._view)  # a closing store host waits for it
                    return
                if msg.op in ("withdraw", "leave", "gone") and (
                    msg.ticket == 0 or tick.is_member(msg.ticket)
                ):
                    if msg.ticket != 0:
                        remove([msg.ticket], _REASONS[msg.op])
                    await dissolve(f"ticket {msg.ticket}: {_REASONS[msg.op]}")
                    return
                if msg.op in ("withdraw", "leave", "gone") and msg.ticket >= upto:
                    # A late arrival or spare went away: it no longer counts as waiting
                    # (the members would otherwise restart to admit a dead node).
                    remove([msg.ticket], _REASONS[msg.op])
                if msg.op in ("waiting", "joined", "withdraw", "leave", "gone"):
                    joined = max(joined, await ops.add(keys.joined(r), 0))
                    if waiting_count(joined) != tick.waiting:
                        tick = await publish("running", upto, world, waiting_count(joined))
                continue
            now = anyio.current_time()
            if now >= next_tick or now >= sweep_at:
                if now >= next_tick and await ops.add(keys.round, 0) != r:
                    await dissolve("a member judged this coordinator gone")
                    return
                gone = await link.liveness.lapsed(ops, keys, r, others, clock, now)
                if gone:
                    remove(gone, "heartbeat lapsed")
                    await dissolve(f"tickets {gone} lapsed")
                    return
                if now >= next_tick:
                    tick = await publish("running", upto, world, tick.waiting)
                    next_tick = now + s.keep_alive_interval

    async def _rejoined(self, members: list[int]) -> tuple[bool, dict[int, bytes] | None]:
        """``(settled, found)``: ``found`` holds the other ``members``' descriptors by
        ticket if they are exactly the members of this node's previous round, back with
        nobody else arriving (the round closes at once, see :mod:`._rejoin`); else None
        (the last call goes on). ``settled`` is False when a registration was missing
        (a holder between its ticket and its descriptor): the caller asks again later.

        Two requests: the previous round's ticket count (one ADD) and the descriptors
        (one ``multi_get``, bounded by ``min(keep_alive_interval, 1 s)``). Raises
        rendezvous errors of the store.
        """
        link, r = self._link, self._round
        ops, previous, others = link.ops, link.previous, members[1:]
        if previous is None:
            return True, None
        joined_before = await ops.add(link.keys.joined(previous.round), 0)
        if joined_before != previous.upto:
            return True, None
        names = [link.keys.node(r, t) for t in others]
        try:
            bound = min(link.settings.keep_alive_interval, 1.0)
            raws = await ops.multi_get(names, timeout=bound) if names else []
        except StoreTimeoutError:
            return False, None
        seats = [descriptor_seat(k, raw)[0] for k, raw in zip(names, raws, strict=True)]
        if not may_close_now(previous, link.keys.epoch, seats, joined_before):
            return True, None
        link.event(
            "rejoined",
            f"round {r}: the {len(members)} members of round {previous.round} are back and "
            "no other node is arriving; closing it without the last call",
        )
        return True, dict(zip(others, raws, strict=True))

    def _choose_heir(self, members: list[int], found: dict[int, bytes]) -> tuple[int, str]:
        """The member that re-hosts the store if its host is lost: the first member (in
        join order) that does not host it and whose descriptor was ``found``;
        ``(-1, "")`` when no other member qualifies."""
        link = self._link
        if not link.hosts_store:
            return 0, link.addr  # this coordinator, ticket 0, is the first member
        for ticket in members[1:]:
            if ticket in found:
                return ticket, descriptor_addr(link.keys.node(self._round, ticket), found[ticket])
        return -1, ""

    async def _descriptors(self, members: list[int]) -> dict[int, bytes]:
        """The other members' descriptors by ticket, where they matter: always on this
        node's own store (when it hosts it: no network request; the heir is chosen from
        them), else only when a member registered placement facts (``<r>/placed``: the
        one CHECK a completion cost before, of which member hosts the store), then one
        ``multi_get``. None of a fresh job's first round waits for a registration. A
        registration still missing after ``min(keep_alive_interval, 1 s)`` (its holder
        died before registering, or the request was lost with a connection) is left out,
        found by one CHECK per member: a completing round is never held up for long."""
        link, r = self._link, self._round
        ops, others = link.ops, members[1:]
        names = [link.keys.node(r, t) for t in others]
        if not names or not (link.hosts_store or await ops.check(link.keys.placed(r))):
            return {}
        try:
            bound = min(link.settings.keep_alive_interval, 1.0)
            return dict(zip(others, await ops.multi_get(names, timeout=bound), strict=True))
        except StoreTimeoutError:
            return {
                t: await ops.get(k)
                for t, k in zip(others, names, strict=True)
                if await ops.check(k)
            }

    def _ranking(self, members: list[int], found: dict[int, bytes]) -> tuple[int, tuple[int, ...]]:
        """``(lead, order)`` of the running tick: the member hosting the store (-1: this
        coordinator or none) and the members in rank order (empty: join order with the
        lead first), by :func:`~._placement.place`."""
        link = self._link
        seats, lead = [link.seat], 0 if link.hosts_store else -1
        for i, ticket in enumerate(members[1:], 1):
            raw = found.get(ticket)
            seat, host = (
                (Seat(), False)
                if raw is None
                else descriptor_seat(link.keys.node(self._round, ticket), raw)
            )
            seats.append(seat)
            if host and lead < 0:
                lead = i
        lead_ticket = members[lead] if lead > 0 else -1
        order = tuple(members[i] for i in place(seats, lead))
        default = [t for t in members if t == lead_ticket] + [
            t for t in members if t != lead_ticket
        ]
        return lead_ticket, () if list(order) == default else order

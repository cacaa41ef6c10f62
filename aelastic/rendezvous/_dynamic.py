"""The dynamic (elastic) rendezvous, written against the :class:`Store` ABC.

Algorithm (one round ``r``; keys in :mod:`._state`):

* **Join.** A node reads ``round`` and takes a ticket with ``add(<r>/joined, 1)``;
  ticket order is join order. Ticket 0 is the round's **coordinator**, the only
  writer of the round's outcome. Every other holder registers (one
  fire-and-forget ``multi_set``), then blocks on the coordinator's ticks. The holders
  of ticket ``min_nodes-1`` and of tickets ``>= max_nodes-1`` push a ``joined``
  message so the coordinator wakes exactly when a threshold may be crossed.
* **Coordinator.** Blocks on its inbox queue (``queue_pop`` with a timeout, never
  polling), publishes a numbered tick every ``keep_alive_interval`` and on every
  change, sweeps liveness before each periodic tick, starts the last call when
  ``min_nodes`` live holders are in, and completes at ``max_nodes`` or when the last
  call expires: one ``running`` tick fixes the membership (the first ``max_nodes``
  live tickets) and every member computes its own rank from it.
* **Members** block on tick ``n+1`` (``get`` with timeout ``heartbeat_timeout``) and
  acknowledge each tick (:class:`~._liveness.Liveness`). No tick in time means the
  coordinator is gone: the member ends the round (``compare_set`` on ``round``). A
  coordinator that finds ``round`` moved on (it was judged gone) dissolves its round.
* **Ranks** are the position of a member's ticket among the members: join order.
* **Late arrivals and spares** take a ticket after completion, push ``waiting`` and
  keep watching the round's ticks; the coordinator republishes the tick with the
  number of waiting holders, which wakes :meth:`wait_for_membership_change` on every
  member when the world may grow. They join round ``r+1`` once the round dissolves.
* **Round end.** A member that leaves (calls :meth:`next_rendezvous` again, shuts
  down or lapses) dissolves the round: ``round`` goes from ``r`` to ``r+1`` by
  ``compare_set`` and a ``dissolved`` tick tells everyone at once.
* **Close.** ``closed`` is set and a ``close`` message makes the coordinator publish
  a ``closed`` tick; a coordinator checks ``closed`` when a round starts.
* **Withdrawal.** A node whose join times out, fails or is cancelled pushes
  ``withdraw`` (the coordinator drops its ticket); a coordinator dissolves its round
  instead, so the others regroup in the next one at once.

* **Death.** Where the store offers ephemeral sessions (aelastic's server), each node
  keeps one: a member registers a ``gone`` push to the coordinator's inbox, and the
  coordinator, before each tick ``n`` is out, an order to write a ``lost`` tick
  ``n+1``. The server performs them the moment the node's connection closes, so a
  SIGKILLed node is noticed at once; heartbeats remain for silent loss.
* **Store loss.** A node whose store becomes unreachable ends its round and, joining
  again, retries until ``join_timeout`` (the c10d backend instead moves to the round's
  heir when the store's host is gone, see :mod:`._c10d`).

Costs: N nodes joining at once make O(N) requests in total, each O(1) bytes (the
coordinator's completion tick carries only the removed tickets): a member makes 7
store calls to be admitted (2 ADDs, 1 on-close registration on its session, 1
fire-and-forget MULTI_SET, 2 GETs, 1 SET); the holder of a threshold ticket adds a
confirmed push (PUSH + CHECK). A waiting node blocks on one key; an idle member costs
one blocking read and one fire-and-forget write per tick; the coordinator one ADD, one
MULTI_GET (its sweep), one MULTI_SET and two session calls (the next ``lost`` order,
cancelling the last) per tick. No wall clock crosses machines (see
:mod:`._liveness`). Backends plug in a :class:`~aelastic.store.Store` (a TCPStore
client, an etcd-backed store) and optionally their own :class:`~._liveness.Liveness`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import socket
import threading
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, AsyncExitStack, nullcontext
from dataclasses import dataclass
from types import TracebackType

import anyio
from anyio.abc import TaskGroup, TaskStatus

from ..store import (
    EphemeralSession,
    OnCloseAction,
    PrefixStore,
    Store,
    StoreError,
    StoreTimeoutError,
    StoreUnsupportedError,
)
from . import _events
from ._api import RendezvousHandler, RendezvousInfo, RendezvousStoreInfo
from ._exceptions import (
    RendezvousClosedError,
    RendezvousConfigError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousTimeoutError,
)
from ._guards import LostOrders
from ._hostwatch import StoreWatch
from ._liveness import Liveness, StoreLiveness, TickClock
from ._ops import Ops
from ._params import RendezvousParameters
from ._state import (
    Keys,
    Message,
    Tick,
    descriptor,
    descriptor_addr,
    live_members,
    moved_to_epoch,
    parse_int,
)

__all__ = ("DynamicSettings", "DynamicRendezvousHandler")

#: How many old tick keys stay in the store besides the latest ones.
_TICKS_KEPT = 8

_log = logging.getLogger("aelastic.rendezvous")

_local_ids = iter(range(1 << 62))
_local_ids_lock = threading.Lock()


def _next_local_id() -> int:
    with _local_ids_lock:
        return next(_local_ids)


@dataclass(frozen=True)
class DynamicSettings:
    """Timeouts of the dynamic rendezvous, in seconds (floats allowed).

    ``heartbeat_timeout`` defaults to ``keep_alive_interval * keep_alive_max_attempt``:
    a node that acknowledged no tick for that long is removed, and a coordinator that
    published none for that long is considered gone.
    """

    join_timeout: float = 600.0
    last_call_timeout: float = 30.0
    close_timeout: float = 30.0
    keep_alive_interval: float = 5.0
    keep_alive_max_attempt: int = 3
    heartbeat_timeout: float = 15.0
    read_timeout: float = 60.0

    @classmethod
    def from_params(cls, params: RendezvousParameters) -> DynamicSettings:
        """Read torch's ``--rdzv-conf`` keys; raise RendezvousConfigError naming a bad one."""
        interval = params.get_positive_float("keep_alive_interval", 5.0)
        attempts = params.get_as_int("keep_alive_max_attempt", 3)
        assert attempts is not None
        if attempts < 1:
            raise RendezvousConfigError(
                f"rendezvous config keep_alive_max_attempt={attempts} must be >= 1"
            )
        return cls(
            join_timeout=params.get_positive_float("join_timeout", 600.0),
            last_call_timeout=params.get_positive_float("last_call_timeout", 30.0),
            close_timeout=params.get_positive_float("close_timeout", 30.0),
            keep_alive_interval=interval,
            keep_alive_max_attempt=attempts,
            heartbeat_timeout=params.get_positive_float("heartbeat_timeout", interval * attempts),
            read_timeout=params.get_positive_float("read_timeout", 60.0),
        )


class _View:
    """What this node knows of the round it is in; updated by its background task."""

    def __init__(
        self, round_: int, ticket: int, store: Store | None = None, keys: Keys | None = None
    ) -> None:
        self.round = round_
        self.ticket = ticket
        self.store = store  # the store this round lives in (the store may move: c10d)
        self.keys = keys  # and its keys (the epoch may change: c10d)
        self.tick: Tick | None = None
        self.coordinator_lost = False
        self.store_lost: RendezvousConnectionError | None = None  # why the store is gone
        self.error: BaseException | None = None
        self.member_tick: Tick | None = None  # the running tick this node was admitted by
        self.scope: anyio.CancelScope | None = None
        self.done = anyio.Event()  # the background task has ended
        self.forgotten = False  # this node's keys of the round were deleted
        self.actions: list[int] = []  # on-close actions registered for this round
        self.event = anyio.Event()

    def wake(self) -> None:
        self.event.set()
        self.event = anyio.Event()

    def publish(self, tick: Tick) -> None:
        self.tick = tick
        self.wake()

    @property
    def ended(self) -> bool:
        """The round is over for this node (dissolved, closed, coordinator gone, error)."""
        tick = self.tick
        return (
            self.coordinator_lost
            or self.error is not None
            or (tick is not None and tick.state in ("dissolved", "closed"))
        )

    def membership_changed(self, max_nodes: int) -> bool:
        if self.ended:
            return True
        tick = self.tick
        if tick is None or self.member_tick is None:
            return False
        if tick.state == "running" and tick.waiting > 0 and tick.world < max_nodes:
            return True
        return tick.state != "running" or self.ticket in tick.removed


class _Alarm:
    """Wakes a coordinator blocked on its inbox at a given time, by a ``tick`` message.

    A blocking pop that times out (or is cancelled) costs a TCPStoreClient its pooled
    connection; one ended by a message keeps it. So the coordinator pops with a long
    safety timeout and this alarm, a task next to it, pushes the wake-up: one
    fire-and-forget push per wake-up instead of a reconnect.
    """

    def __init__(self, ops: Ops, inbox: str, safety: float) -> None:
        self._ops = ops
        self._inbox = inbox
        self._safety = safety
        self._at = math.inf
        self._changed = anyio.Event()

    async def pop(self, at: float) -> bytes | None:
        """Pop the next message, or return None at time ``at`` (never a ``tick``)."""
        if at != self._at:
            self._at = at
            self._changed.set()
            self._changed = anyio.Event()
        while True:
            remaining = at - anyio.current_time()
            if remaining <= 0:
                return None
            raw = await self._ops.pop(self._inbox, remaining + self._safety)
            if raw is None:
                return None
            if raw != _TICK_MESSAGE.encode():
                return raw

    async def run(self) -> None:
        """Push a ``tick`` when the armed time comes; re-arm on every :meth:`pop`."""
        while True:
            changed = self._changed
            delay = self._at - anyio.current_time()
            if delay <= 0:
                self._at = math.inf
                try:
                    await self._ops.push(self._inbox, _TICK_MESSAGE, confirm=False)
                except RendezvousError:
                    return  # the pop's safety timeout takes over
                continue
            with anyio.move_on_after(delay):
                await changed.wait()


_TICK_MESSAGE = Message("tick").dumps()

#: Why the coordinator removes a ticket, by inbox message.
_REASONS = {
    "withdraw": "withdrew",
    "leave": "left",
    "gone": "died: its connection to the store closed",
}


async def _open_session(stack: AsyncExitStack, store: Store) -> EphemeralSession | None:
    """Open ``store``'s ephemeral session on ``stack``; None where the store has none."""
    try:
        return await stack.enter_async_context(store.ephemeral())
    except StoreUnsupportedError:
        return None
    except (StoreError, OSError) as exc:
        _log.warning("no ephemeral store session (%s); peers rely on heartbeats", exc)
        return None


async def _close(stack: AsyncExitStack, tg: TaskGroup) -> None:
    """Close a handler's store resources, then cancel and join its background tasks.

    Two steps, not one ``AsyncExitStack`` holding the task group: when a resource's exit
    raises a cancellation (the handler is left from a cancelled task) and the stack then
    hands it to the task group, which re-raises that same exception, CPython 3.11's
    ``ExitStack`` makes the exception its own ``__context__`` and anyio's asyncio backend
    walks that chain forever (the loop spun at 100% CPU when an ``open_job`` block
    waiting in its rendezvous was left). The body's exception propagates as is: the
    task group only holds background tasks, which never raise.
    """
    try:
        await stack.aclose()
    finally:
        tg.cancel_scope.cancel()
        await tg.__aexit__(None, None, None)


async def _first_of(a: anyio.Event, b: anyio.Event) -> None:
    """Wait until either event is set."""
    async with anyio.create_task_group() as tg:

        async def wait(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        tg.start_soon(wait, a)
        tg.start_soon(wait, b)


class DynamicRendezvousHandler(RendezvousHandler):
    """Elastic rendezvous over any concurrency-safe :class:`Store`.

    Use as an async context manager: ``async with handler:`` runs the node's background
    task (the round's coordinator, or a member's tick watcher) in the handler's task
    group; leaving the block leaves the current round (dissolving it for the others,
    who re-rendezvous at once) without closing the rendezvous.

    ``store`` must accept concurrent calls from several tasks (``TCPStoreClient``,
    ``LocalStore``, ``StoreServer.local_store`` and an etcd store all do). Subclasses
    that build their store when entered override :meth:`_open_store`.
    """

    def __init__(
        self,
        run_id: str,
        min_nodes: int,
        max_nodes: int,
        settings: DynamicSettings | None = None,
        *,
        store: Store | None = None,
        backend: str = "c10d",
        liveness: Liveness | None = None,
        local_addr: str | None = None,
        bootstrap_store_info: RendezvousStoreInfo | None = None,
        master_endpoint: str = "",
    ) -> None:
        if min_nodes < 1 or max_nodes < min_nodes:
            raise RendezvousConfigError(
                f"the dynamic rendezvous needs 1 <= min_nodes <= max_nodes, got "
                f"min_nodes={min_nodes}, max_nodes={max_nodes}; pass --nnodes MIN:MAX with "
                "1 <= MIN <= MAX"
            )
        self._run_id = run_id
        self._min = min_nodes
        self._max = max_nodes
        self._settings = settings or DynamicSettings()
        self._store = store
        self._backend = backend
        self._liveness = liveness or StoreLiveness(
            self._settings.heartbeat_timeout, min(self._settings.keep_alive_interval, 1.0)
        )
        self._keys = Keys(run_id)
        self._local_id = _next_local_id()
        self._hostname = socket.gethostname()
        self._addr = local_addr or self._hostname
        self._descriptor = descriptor(self._addr, self._hostname, os.getpid(), self._local_id)
        self._bootstrap = bootstrap_store_info
        self._master_endpoint = master_endpoint
        self._tg: TaskGroup | None = None
        self._stack: AsyncExitStack | None = None
        self._view: _View | None = None
        self._view_set = anyio.Event()
        self._shut = False
        self._lock: anyio.Lock | None = None
        self._session: EphemeralSession | None = None
        self._heir: tuple[bool, str] | None = None  # (this node is the heir, its address)
        self._member_view: _View | None = None  # the round this node was last admitted to
        self._host_watch: StoreWatch | None = None  # notices a frozen store host (c10d)

    # -- plumbing ------------------------------------------------------------

    def get_backend(self) -> str:
        return self._backend

    def get_run_id(self) -> str:
        return self._run_id

    @property
    def use_agent_store(self) -> bool:
        return True

    @property
    def settings(self) -> DynamicSettings:
        return self._settings

    @property
    def store(self) -> Store:
        """The rendezvous store (available once the handler is entered)."""
        if self._store is None:
            raise RendezvousError(
                "the rendezvous handler is not started: use 'async with handler:' first"
            )
        return self._store

    @property
    def epoch(self) -> int:
        """How many times this node saw the store re-hosted (after its host was lost).

        A client that reconnected to a re-hosted store at the same address learns it at
        its next join; keys written before are gone then.
        """
        return self._keys.epoch

    def _ops(self) -> Ops:
        return Ops(self.store, self._settings.read_timeout, self._guard)

    def _guard(self) -> AbstractContextManager[None]:
        """Around a store request: the store watch's guard, if the backend has one."""
        return nullcontext() if self._host_watch is None else self._host_watch.guard()

    def _store_watch(self) -> StoreWatch | None:
        """A watch that judges the store's host when requests go unanswered (c10d)."""
        return None

    def _start_watch(self, tg: TaskGroup) -> None:
        if self._host_watch is not None:
            self._host_watch.stop()
        self._host_watch = self._store_watch()
        if self._host_watch is not None:
            tg.start_soon(self._host_watch.run)

    def _event(
        self, name: str, message: str, *, state: str = "RUNNING", rank: int | None = None
    ) -> None:
        _events.record(
            self._run_id,
            message,
            name=name,
            state=state,
            master_endpoint=self._master_endpoint,
            local_id=self._local_id,
            rank=rank,
            stacklevel=2,
        )

    async def _open_store(self, stack: AsyncExitStack, tg: TaskGroup) -> Store:
        """Return the store to use; subclasses may open (and register on ``stack``) one."""
        if self._store is None:
            raise RendezvousError("no rendezvous store was given to the handler")
        return self._store

    def _hosts_store(self) -> bool:
        """Whether this node hosts the rendezvous store (it cannot be its own heir)."""
        return False

    async def _recover_store(self, exc: RendezvousConnectionError, deadline: float) -> None:
        """The store became unreachable while joining: make it usable again or raise.

        The default retries the same store until ``deadline`` (a node cut off for a
        while rejoins once the link is back); backends that can move the store
        (c10d: the heir re-hosts it) override this. Raises ``exc`` (naming the
        store) if the store does not answer by ``deadline``.
        """
        delay = 0.1
        while anyio.current_time() < deadline:
            with anyio.move_on_after(max(0.0, deadline - anyio.current_time())):
                await anyio.sleep(delay)
            delay = min(delay * 2, 2.0)
            try:
                await self._ops().add(self._keys.round, 0)
            except RendezvousConnectionError as again:
                exc = again
                continue
            self._event("store_back", "the rendezvous store answers again; rejoining")
            await self._reopen_session()
            return
        raise exc

    async def _read_round(self) -> int:
        """The current round (``ADD round 0``), after moving to the keys of the store
        incarnation this node talks to now.

        A client may reconnect to a re-hosted store at the same address without
        noticing; the round key of its old epoch then reads ``-epoch`` there (see
        :func:`moved_to_epoch`): the same one request per join tells.
        """
        while True:
            keys = self._keys
            value = await self._ops().add(keys.round, 0)
            epoch = moved_to_epoch(value)
            if epoch is None or epoch == keys.epoch:
                return max(value, 0)
            self._keys = Keys(self._run_id, epoch)
            self._event("epoch", f"the rendezvous store was re-hosted: epoch {epoch}")
            # The old session's connection went with the old incarnation of the store.
            await self._reopen_session()

    async def _reopen_session(self) -> None:
        """Open a new ephemeral session after the store came back (the old one's
        connection closed with the link, and the server performed its actions)."""
        if self._stack is not None and self._store is not None:
            self._session = await _open_session(self._stack, self._store)

    async def __aenter__(self) -> DynamicRendezvousHandler:
        if self._tg is not None:
            raise RendezvousError("the rendezvous handler is already started")
        # The task group is entered apart from the stack of store resources, and left
        # after it (see _close): never one AsyncExitStack around both.
        tg = anyio.create_task_group()
        await tg.__aenter__()
        stack = AsyncExitStack()
        try:
            self._store = await self._open_store(stack, tg)
            self._session = await _open_session(stack, self._store)
            self._start_watch(tg)
        except BaseException:
            await _close(stack, tg)  # raises the error itself, not a group
            raise
        self._stack, self._tg, self._shut = stack, tg, False
        self._lock = anyio.Lock()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, tg = self._stack, self._tg
        try:
            with anyio.CancelScope(shield=True), anyio.move_on_after(self._settings.close_timeout):
                await self.shutdown()
                if self._session is not None:  # left cleanly: nothing to announce
                    await self._session.cancel()
        except (StoreError, OSError):
            pass  # the session's connection is gone; its actions ran or will not matter
        finally:
            self._tg = self._stack = self._session = None
            if stack is not None and tg is not None:
                await _close(stack, tg)

    @property
    def started(self) -> bool:
        return self._tg is not None and self._store is not None

    async def _require_started(self) -> TaskGroup:
        await self._autostart()
        if self._tg is None or self._store is None:
            raise RendezvousError(
                "the rendezvous handler is not started: use 'async with handler:' "
                "around next_rendezvous(), or give it a task group with handler.run_in(tg)"
            )
        return self._tg

    # -- public API ----------------------------------------------------------

    async def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round and return once it completed with this node admitted.

        Leaves the round this node was in first (the others see the round dissolve
        and re-rendezvous). Waits at most ``join_timeout`` (time spent as a spare of a
        full round does not count). Cancellation or an error withdraws this node
        from the pending round before propagating.

        Raises:
            RendezvousClosedError: the rendezvous is closed.
            RendezvousGracefulExitError: closed while this node was a spare.
            RendezvousTimeoutError: no round admitted this node within ``join_timeout``.
            RendezvousConnectionError: the store is unreachable.
            RendezvousStateError: the store holds malformed rendezvous state.
        """
        tg = await self._require_started()
        assert self._lock is not None
        async with self._lock:
            # The store may be gone, and the round with it: recovered below.
            with contextlib.suppress(RendezvousConnectionError):
                await self._leave()
            self._shut = False
            self._event("join", f"node {self._addr}#{self._local_id} joins", state="INIT")
            deadline = anyio.current_time() + self._settings.join_timeout
            try:
                while True:
                    try:
                        info, was_spare = await self._attempt(tg, deadline)
                    except RendezvousConnectionError as exc:
                        await self._abandon()  # the store is unreachable: nothing to tell it
                        await self._recover_store(exc, deadline)
                        continue
                    if info is not None:
                        return info
                    if was_spare:
                        deadline = anyio.current_time() + self._settings.join_timeout
            except RendezvousTimeoutError:
                self._event("timeout", "join timed out", state="FAILED")
                await self._withdraw()
                raise
            except BaseException:
                await self._withdraw()
                raise

    async def _attempt(self, tg: TaskGroup, deadline: float) -> tuple[RendezvousInfo | None, bool]:
        """Take a ticket in the current round and follow it until admitted or the round ends.

        Returns ``(info, False)`` once admitted, ``(None, was_spare)`` when the round
        ended for this node and the next one must be joined.
        """
        round_ = await self._read_round()
        ops, keys = self._ops(), self._keys
        # A ticket taken must be handed to a view (whose withdrawal releases it) and
        # its coordinator or watcher started: no cancellation in between, but bounded.
        with anyio.CancelScope(shield=True) as shield:
            shield.deadline = anyio.current_time() + self._settings.read_timeout
            ticket = await ops.add(keys.joined(round_), 1) - 1
            view = _View(round_, ticket, self._store, keys)
            self._set_view(view)
            if ticket == 0:
                await tg.start(self._background, view, self._coordinate)
            else:
                # If this process dies, the store tells the coordinator at once.
                await self._on_close(
                    view, keys.inbox(round_), "queue_push", Message("gone", ticket).dumps()
                )
                await self._liveness.attach(ops, keys, round_, ticket, self._descriptor)
                if self._hosts_store():  # rank 0 goes to the store's host (Tick.lead)
                    await ops.set(keys.store_host(round_), str(ticket))
                await tg.start(self._background, view, self._watch)
        if shield.cancelled_caught:
            raise RendezvousConnectionError(
                f"the rendezvous store at {self._master_endpoint or 'the given store'} did not "
                f"answer within read_timeout={self._settings.read_timeout}s while joining"
            )
        if ticket == 0 and (self._min == 1 or self._max == 1):
            # Ticket 0 alone reaches min/max: wake the coordinator now, not at its
            # first periodic tick (a one-node round otherwise took keep_alive_interval).
            await ops.push(keys.inbox(round_), Message("joined", ticket).dumps())
        if ticket > 0 and (ticket + 1 == self._min or ticket + 1 >= self._max):
            await ops.push(keys.inbox(round_), Message("joined", ticket).dumps())
        waiting_sent = False
        spare = False
        while True:
            event = view.event
            if self._view is not view:  # shutdown() ran meanwhile
                raise RendezvousGracefulExitError(
                    f"the rendezvous handler of {self._run_id!r} was shut down while joining"
                )
            if view.error is not None:
                raise view.error
            tick = view.tick
            if view.coordinator_lost:
                if view.store_lost is not None:
                    # A request of ours failed, which may be one connection, not the
                    # store: withdraw the ticket if the store hears it, so the
                    # coordinator does not count it until its heartbeat lapses.
                    await self._withdraw(bound=self._settings.heartbeat_timeout)
                else:
                    await self._stop(view)
                return None, spare
            if tick is not None:
                if tick.state == "closed":
                    await self._stop(view)
                    if spare:
                        raise RendezvousGracefulExitError(
                            f"rendezvous {self._run_id!r} closed while this node was a spare"
                        )
                    raise RendezvousClosedError.for_run(self._run_id)
                if tick.state == "dissolved" or ticket in tick.removed:
                    await self._stop(view)
                    return None, spare
                if tick.state == "running":
                    if tick.is_member(ticket):
                        return self._admitted(view, tick), False
                    spare = tick.world >= self._max
                    if not waiting_sent:
                        waiting_sent = True
                        await ops.push(keys.inbox(round_), Message("waiting", ticket).dumps())
            remaining = math.inf if spare else deadline - anyio.current_time()
            if remaining <= 0:
                raise RendezvousTimeoutError(
                    f"rendezvous {self._run_id!r} did not admit this node within "
                    f"join_timeout={self._settings.join_timeout}s (round {round_}: "
                    f"{self._describe(tick)}); raise --rdzv-conf join_timeout or start "
                    f"at least min_nodes={self._min} nodes"
                )
            with anyio.move_on_after(remaining):
                await event.wait()

    def _set_view(self, view: _View | None) -> None:
        self._view = view
        self._view_set.set()
        self._view_set = anyio.Event()

    def _describe(self, tick: Tick | None) -> str:
        if tick is None:
            return "no word from the round's coordinator yet"
        return f"state {tick.state}, tick {tick.n}"

    def _admitted(self, view: _View, tick: Tick) -> RendezvousInfo:
        view.member_tick = tick
        self._member_view = view
        self._heir = (tick.heir_ticket == view.ticket, tick.heir) if tick.heir_ticket >= 0 else None
        rank = tick.rank_of(view.ticket)
        self._event(
            "complete",
            f"round {view.round} complete: rank {rank} of {tick.world}",
            rank=rank,
        )
        return RendezvousInfo(
            store=PrefixStore(self._keys.agent_prefix(view.round), self.store),
            rank=rank,
            world_size=tick.world,
            bootstrap_store_info=self._bootstrap,
            round=view.round,
        )

    async def is_closed(self) -> bool:
        await self._require_started()
        return await self._ops().check(self._keys.closed)

    async def set_closed(self) -> None:
        """Close the rendezvous: every pending and later join raises RendezvousClosedError."""
        await self._require_started()
        ops, keys = self._ops(), self._keys
        with anyio.fail_after(self._settings.close_timeout):
            await ops.set(keys.closed, "1")
            round_ = await ops.add(keys.round, 0)
            await ops.push(keys.inbox(round_), Message("close").dumps())
        self._event("close", f"rendezvous closed (round {round_})", state="SUCCEEDED")

    async def num_nodes_waiting(self) -> int:
        """Nodes waiting to join a next round, spares excluded.

        Served from the last tick of the round (the coordinator republishes it as soon
        as a node arrives): no store request.
        """
        view = self._view
        if view is None or view.tick is None or view.tick.state != "running":
            return 0
        tick = view.tick
        return tick.waiting if tick.world < self._max else 0

    async def wait_for_membership_change(self) -> None:
        """Return once the round this node runs in changes.

        That is: a member's heartbeat lapsed or it left, the coordinator is gone, the
        rendezvous was closed, or nodes wait to join while the world is below
        ``max_nodes``. Push-based: costs no store request. Before the first completed
        round it waits until one completes and changes. Raises the error that stopped
        the node's background task (e.g. RendezvousStateError), if any.
        """
        while True:
            view, view_set = self._view, self._view_set
            if view is None:
                await view_set.wait()
                continue
            if view.error is not None:
                raise view.error
            if view.member_tick is not None and view.membership_changed(self._max):
                return
            await _first_of(view.event, view_set)

    async def shutdown(self) -> bool:
        """Leave the current round (the others re-rendezvous); does not close the run.

        A handler started by :meth:`run_in` then stops (its store closes); the next
        call starts it again.
        """
        try:
            if self._shut or self._tg is None:
                self._shut = True
                return True
            self._shut = True
            try:
                with (
                    anyio.CancelScope(shield=True),
                    anyio.move_on_after(self._settings.close_timeout),
                ):
                    await self._leave()
                    return True
            except RendezvousError:
                return False
            return False
        finally:
            self._serve_ends()

    # -- leaving -------------------------------------------------------------

    async def _stop(self, view: _View, *, forget_now: bool = False) -> None:
        """Stop the view's background task; then forget this node's keys of that round
        (in the background, or before returning with ``forget_now``: when leaving, the
        handler's task group may end right after)."""
        if view.scope is not None:
            view.scope.cancel()
        # The task ends at its next checkpoint; the bound only guards against a bug
        # (the handler's task group cancels a straggler when the handler is left).
        with anyio.CancelScope(shield=True), anyio.move_on_after(self._settings.close_timeout):
            await view.done.wait()
        if self._tg is not None and not view.forgotten:
            view.forgotten = True
            if forget_now:
                await self._forget(view)
            else:
                self._tg.start_soon(self._forget, view)

    async def _forget(self, view: _View) -> None:
        """Delete this node's registration of a round it left and cancel its on-close
        actions there (best effort).

        Keeps the store from growing with every restart; the coordinator no longer
        sweeps a ticket that withdrew, left or belongs to an ended round.
        """
        if view.store is not self._store or view.keys is not self._keys:
            return  # the store moved: the old one is gone with these keys and actions
        if self._host_watch is not None and self._host_watch.lost is not None:
            return  # its host is lost (frozen): requests would only wait
        ops, keys = self._ops(), self._keys
        with anyio.move_on_after(self._settings.read_timeout):
            await self._cancel_actions(view.actions)
            if view.ticket == 0:
                return
            try:
                await ops.delete(keys.seen(view.round, view.ticket))
                await ops.delete(keys.node(view.round, view.ticket))
            except RendezvousError:
                pass

    # -- liveness tied to the store connection -------------------------------

    async def _on_close(
        self, view: _View, key: str, action: OnCloseAction, value: str
    ) -> int | None:
        """Have the store server do ``action`` on ``key`` if this process dies.

        The server performs it when this node's session connection closes (SIGKILL,
        crash): peers learn of the death at once instead of after a heartbeat timeout.
        Best effort: without a session (a store that cannot, e.g. torch's server) or
        when registering fails, heartbeats remain the only evidence.
        """
        session = self._session
        if session is None:
            return None
        aid: int | None = None
        # Never hold a join up for long (a session whose link broke may not answer).
        with anyio.move_on_after(
            min(self._settings.read_timeout, self._settings.heartbeat_timeout)
        ):
            try:
                with self._guard():
                    aid = await session.on_close(action, key, value)
            except (StoreError, OSError) as exc:
                _log.warning("rendezvous %s: no on-close action (%s)", self._run_id, exc)
        if aid is None:
            self._session = None  # heartbeats only, until the store is reconnected
            return None
        view.actions.append(aid)
        return aid

    async def _cancel_actions(self, actions: list[int]) -> None:
        session = self._session
        while actions:
            aid = actions.pop()
            if session is None:
                continue
            try:
                with self._guard():
                    await session.cancel(aid)
            except (StoreError, OSError):
                self._session = session = None

    async def _dissolve(self, round_: int) -> None:
        """Move joiners on to round ``round_ + 1`` (no-op if someone already did)."""
        await self._ops().compare_set(self._keys.round, str(round_), str(round_ + 1))

    async def _leave(self) -> None:
        """Leave the round this node was admitted to, dissolving it for the others."""
        view = self._view
        if view is not None and view.member_tick is None:
            await self._withdraw()  # still joining (shutdown() during next_rendezvous)
            return
        self._set_view(None)
        if view is None:
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(self._settings.close_timeout):
            try:
                if not view.ended:
                    await self._dissolve(view.round)
                    if view.ticket != 0 or not view.done.is_set():
                        await self._ops().push(
                            self._keys.inbox(view.round), Message("leave", view.ticket).dumps()
                        )
                    if view.ticket == 0:
                        # Our coordinator publishes the dissolution; if it was cancelled
                        # already (the handler's task group with it), we do.
                        with anyio.move_on_after(self._settings.read_timeout):
                            await view.done.wait()
                        await self._publish_dissolved(view.round)
            finally:
                await self._stop(view, forget_now=True)

    async def _publish_dissolved(self, round_: int) -> None:
        """Publish a ``dissolved`` tick after the round's last one, unless it ended already.

        Reads the last tick from the store (ticks and ``tick_latest`` are written in one
        request), so a tick published just before the coordinator was cancelled counts.
        """
        ops, latest = self._ops(), self._keys.tick_latest(round_)
        n = 0
        if await ops.check(latest):
            last = Tick.loads(latest, await ops.get(latest))
            if last.state in ("dissolved", "closed"):
                return
            n = last.n + 1
        await self._publish(round_, Tick(n, "dissolved"))

    async def _abandon(self) -> None:
        """Drop the pending round without telling the store (it is unreachable); the
        coordinator sees this node's ticket lapse, or its connection close."""
        view = self._view
        self._set_view(None)
        if view is not None:
            with anyio.CancelScope(shield=True):
                await self._stop(view)  # bounded; forgets in the background

    async def _withdraw(self, *, bound: float | None = None) -> None:
        """Withdraw from a round that has not admitted this node (timeout, error, cancel).

        Shielded; takes at most ``bound`` seconds (default ``close_timeout``), errors
        of an unreachable store are ignored.
        """
        view = self._view
        self._set_view(None)
        if view is None:
            return
        limit = self._settings.close_timeout if bound is None else bound
        with anyio.CancelScope(shield=True), anyio.move_on_after(limit):
            try:
                await self._stop(view, forget_now=True)
                if view.ended:
                    return
                if view.ticket == 0:
                    # Nobody else can finish this round: hand it over to the next one.
                    await self._dissolve(view.round)
                    await self._publish_dissolved(view.round)
                else:
                    await self._ops().push(
                        self._keys.inbox(view.round), Message("withdraw", view.ticket).dumps()
                    )
            except (RendezvousError, OSError):
                pass

    # -- background tasks ----------------------------------------------------

    async def _background(
        self,
        view: _View,
        body: Callable[[_View], Awaitable[None]],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run ``body`` (coordinator or watcher); its errors go to the view, never up."""
        with anyio.CancelScope() as scope:
            view.scope = scope
            task_status.started()
            try:
                await body(view)
            except RendezvousConnectionError as exc:
                # The store is unreachable: the round is over for this node, which
                # rejoins (next_rendezvous reconnects, or moves to the heir's store).
                view.store_lost = exc
                view.coordinator_lost = True
            except RendezvousError as exc:
                view.error = exc
            except Exception as exc:  # a bug must not take the agent's task group down
                err = RendezvousError(f"rendezvous background task failed: {exc!r}")
                err.__cause__ = exc
                view.error = err
            finally:
                view.done.set()
                view.wake()

    async def _publish(self, round_: int, tick: Tick) -> None:
        keys = self._keys
        raw = tick.dumps()
        ops = self._ops()
        await ops.multi_set([keys.tick(round_, tick.n), keys.tick_latest(round_)], [raw, raw])
        if tick.n >= _TICKS_KEPT:
            await ops.delete(keys.tick(round_, tick.n - _TICKS_KEPT))

    async def _watch(self, view: _View) -> None:
        """Member side: block on each next tick, acknowledge it, judge the coordinator."""
        ops, keys, s = self._ops(), self._keys, self._settings
        r, ticket = view.round, view.ticket
        latest = keys.tick_latest(r)
        try:
            tick = Tick.loads(latest, await ops.get(latest, timeout=s.heartbeat_timeout))
        except StoreTimeoutError:
            await self._coordinator_gone(view, None)
            return
        # Registering counted as the first acknowledgement. With heartbeat_timeout >= 2
        # intervals, acks are spaced by at least half an interval: the burst of ticks of
        # a mass join (joining, then running) costs no ack, while periodic ticks (one per
        # interval) are all acknowledged, well within heartbeat_timeout.
        last_ack = anyio.current_time()
        spacing = (
            s.keep_alive_interval / 2 if s.heartbeat_timeout >= 2 * s.keep_alive_interval else 0.0
        )
        while True:
            if tick.state == "lost":  # written by the store when the coordinator died
                await self._coordinator_gone(view, tick, "its connection to the store closed")
                return
            view.publish(tick)
            if tick.state in ("dissolved", "closed") or ticket in tick.removed:
                return
            now = anyio.current_time()
            if (tick.state == "joining" or tick.is_member(ticket)) and now - last_ack >= spacing:
                await self._liveness.ack(ops, keys, r, ticket, tick.n)
                last_ack = now
            key = keys.tick(r, tick.n + 1)
            try:
                raw = await ops.get(key, timeout=s.heartbeat_timeout)
                if not raw:
                    # Deleted between the wake-up and the read (the coordinator prunes old
                    # ticks; a GET of a missing key answers empty): read the latest one.
                    raw = await ops.get(latest)
                    key = latest
                tick = Tick.loads(key, raw)
            except StoreTimeoutError:
                newest = Tick.loads(latest, await ops.get(latest))
                if newest.n > tick.n:  # we fell behind; resynchronise
                    tick = newest
                    continue
                await self._coordinator_gone(view, tick)
                return

    async def _choose_heir(self, round_: int, members: list[int]) -> tuple[int, str]:
        """The member that re-hosts the store if its host is lost: the first member (in
        join order) that does not host it and whose descriptor is in the store. Costs
        one read of this node's own store per member tried (the coordinator hosts it);
        ``(-1, "")`` when no other member qualifies."""
        if not self._hosts_store():
            return 0, self._addr  # this coordinator, ticket 0, is the first member
        ops = self._ops()  # on this node's own store: no network request
        for ticket in members[1:]:
            # A member whose registration never arrived (it withdrew, or its request was
            # lost with a connection) is skipped: never block a completing round on it.
            key = self._keys.node(round_, ticket)
            if await ops.check(key):
                return ticket, descriptor_addr(key, await ops.get(key))
        return -1, ""

    async def _store_host_ticket(self, round_: int, members: list[int]) -> int:
        """The member (not this coordinator) that hosts the store, or -1: one CHECK."""
        if self._hosts_store():
            return -1  # this coordinator, ticket 0, has rank 0 already
        ops, key = self._ops(), self._keys.store_host(round_)
        if not await ops.check(key):
            return -1
        ticket = parse_int(key, await ops.get(key))
        return ticket if ticket in members[1:] else -1

    async def _coordinator_gone(self, view: _View, tick: Tick | None, why: str = "") -> None:
        why = why or f"it published no tick for {self._settings.heartbeat_timeout}s"
        self._event(
            "node_removed",
            f"round {view.round}: coordinator gone ({why}); starting round {view.round + 1}",
            state="FAILED",
        )
        await self._dissolve(view.round)
        view.coordinator_lost = True
        view.wake()

    async def _coordinate(self, view: _View) -> None:
        """Ticket 0: decide round ``view.round`` alone; see the module docstring."""
        alarm = _Alarm(self._ops(), self._keys.inbox(view.round), self._settings.heartbeat_timeout)
        keys, r = self._keys, view.round
        error: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(alarm.run)

            async def order(k: int) -> int | None:
                return await self._on_close(view, keys.tick(r, k), "set", Tick(k, "lost").dumps())

            async def withdraw(action_id: int) -> None:
                if action_id in view.actions:
                    view.actions.remove(action_id)
                    await self._cancel_actions([action_id])

            orders = LostOrders(order, withdraw, tg)
            try:
                await self._coordinate_round(view, alarm, orders)
            except Exception as exc:  # raised below as is, not as an exception group
                error = exc
            finally:
                tg.cancel_scope.cancel()
        if error is not None:
            raise error

    async def _coordinate_round(self, view: _View, alarm: _Alarm, orders: LostOrders) -> None:
        ops, keys, s = self._ops(), self._keys, self._settings
        r = view.round
        inbox = keys.inbox(r)
        clock = TickClock()
        removed: set[int] = set()
        n = -1

        heir_ticket, heir, lead = -1, "", -1

        async def publish(state: str, upto: int = 0, world: int = 0, waiting: int = 0) -> Tick:
            # Before tick n is out, the store holds an order to write a "lost" tick n+1
            # if this process dies: members blocked on n+1 wake at once (see _guards).
            # The order for n is cancelled after n is out (dying in between, both are
            # written: still a "lost" tick wherever a member waits).
            nonlocal n
            n += 1
            tick = Tick(n, state, upto, world, waiting, tuple(sorted(removed)))
            if state == "running":
                tick = dataclasses.replace(tick, heir_ticket=heir_ticket, heir=heir, lead=lead)
            going_on = state in ("joining", "running")
            if going_on:
                await orders.hold(n)
            await self._publish(r, tick)
            clock.publish(n, anyio.current_time())
            view.publish(tick)
            await orders.release(n if going_on else None)
            return tick

        async def dissolve(reason: str) -> None:
            await self._dissolve(r)
            await publish("dissolved")
            self._event("dissolved", f"round {r} dissolved: {reason}")
            # Only the latest tick matters now (late readers learn the round is over).
            for old in range(max(0, n - _TICKS_KEPT), n):
                await ops.delete(keys.tick(r, old))

        def remove(tickets: list[int], why: str) -> None:
            for t in tickets:
                if t not in removed and t != 0:
                    removed.add(t)
                    self._event("node_removed", f"round {r}: ticket {t} removed ({why})")

        orders.start(1)  # placed while the next request is in flight
        if await ops.check(keys.closed):
            await publish("closed")
            return
        await publish("joining")
        clock.observe(0, anyio.current_time())
        joined = 1
        next_tick = anyio.current_time() + s.keep_alive_interval
        last_call: float | None = None

        # -- joining: wait for min, then last call or max ------------------------
        while True:
            wake_at = next_tick if last_call is None else min(next_tick, last_call)
            candidates = [t for t in range(1, joined) if t not in removed]
            sweep_at = self._liveness.next_sweep(clock, candidates)
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
                gone = await self._liveness.lapsed(ops, keys, r, candidates, clock, now)
                remove(gone, "heartbeat lapsed")
                await publish("joining")
                next_tick = now + s.keep_alive_interval
            elif now >= sweep_at:  # a member's deadline passed between two ticks
                gone = await self._liveness.lapsed(ops, keys, r, candidates, clock, now)
                if gone:
                    remove(gone, "heartbeat lapsed")
                    await publish("joining")
            live = joined - len(removed)
            if live >= self._max:
                break
            if live >= self._min:
                if last_call is None:
                    last_call = now + s.last_call_timeout
                    self._event(
                        "last_call",
                        f"round {r}: {live} nodes (min {self._min}); last call "
                        f"for {s.last_call_timeout}s",
                    )
            else:
                last_call = None
            if last_call is not None and now >= last_call:
                break

        # -- complete: the first max_nodes live tickets, in join order -----------
        members = live_members(joined, removed, self._max)
        upto = members[-1] + 1
        world = len(members)
        heir_ticket, heir = await self._choose_heir(r, members)
        lead = await self._store_host_ticket(r, members)

        def waiting_count(total: int) -> int:
            return total - upto - sum(1 for t in removed if t >= upto)

        tick = await publish("running", upto, world, waiting_count(joined))
        self._event("round_complete", f"round {r} complete with {world} nodes")

        # -- running: heartbeat sweeps, waiting nodes, leaves, close -------------
        others = [t for t in members if t != 0]
        while True:
            sweep_at = self._liveness.next_sweep(clock, others)
            raw = await alarm.pop(min(next_tick, sweep_at))
            if raw is not None:
                msg = Message.loads(inbox, raw)
                if msg.op == "close":
                    await publish("closed")
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
                gone = await self._liveness.lapsed(ops, keys, r, others, clock, now)
                if gone:
                    remove(gone, "heartbeat lapsed")
                    await dissolve(f"tickets {gone} lapsed")
                    return
                if now >= next_tick:
                    tick = await publish("running", upto, world, tick.waiting)
                    next_tick = now + s.keep_alive_interval

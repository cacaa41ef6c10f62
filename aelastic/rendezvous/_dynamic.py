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
  ``min_nodes`` live holders are in, and completes at ``max_nodes``, when the last
  call expires, or at once when the live holders are exactly the members of the
  coordinator's previous round and nobody else took a ticket there after it completed
  (a restart: nobody is arriving, see :mod:`._rejoin`; one ADD and one ``multi_get``
  of their descriptors, made when the count matches): one ``running`` tick fixes the
  membership (the first ``max_nodes`` live tickets) and every member computes its own
  rank from it. The holder of the ticket that completes its previous round's count
  pushes ``joined`` too.
* **Members** block on tick ``n+1`` (``get`` with timeout ``heartbeat_timeout``) and
  acknowledge each tick (:class:`~._liveness.Liveness`). No tick in time means the
  coordinator is gone: the member ends the round (``compare_set`` on ``round``) and
  publishes its ``dissolved`` tick, so holders that joined later need not wait out their
  own timeout. A coordinator that finds ``round`` moved on (it was judged gone)
  dissolves its round.
* **Ranks** (:mod:`._placement`): a member whose descriptor holds placement facts
  (it hosts the store, has a ``--node-rank-order`` key or a last group rank) also sets
  ``<r>/placed`` in its registration's request. At completion the coordinator checks
  that mark (the one CHECK it made before, of which member hosts the store) and, if
  set, reads the members' descriptors (one ``multi_get``); the ``running`` tick lists
  the members in rank order: the store's host first, then by topology key, each
  member keeping its group rank of the last round where it can (newcomers take freed
  ranks). The order is left out when it is join order with the store's host first.
* **Late arrivals and spares** take a ticket after completion, push ``waiting`` and
  keep watching the round's ticks; the coordinator republishes the tick with the
  number of waiting holders, which wakes :meth:`wait_for_membership_change` on every
  member when the world may grow. They join round ``r+1`` once the round dissolves.
* **Round end.** A member that leaves (calls :meth:`next_rendezvous` again, shuts
  down or lapses) dissolves the round: ``round`` goes from ``r`` to ``r+1`` by
  ``compare_set`` and a ``dissolved`` tick tells everyone at once.
* **Close.** ``closed`` is set and a ``close`` message makes the coordinator publish
  a ``closed`` tick; a coordinator checks ``closed`` when a round starts. A member that
  saw the tick sets its ``done`` key (as does one leaving a round) and never joins again;
  a closing store host waits for the other members' keys (bounded) before its store goes.
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

Costs: N nodes joining at once make O(N) requests in total, each O(1) bytes but the
running ticks (the removed tickets, and the members in rank order when that is not
join order: O(N) bytes, read by every member) and the coordinator's read of the
members' descriptors at completion (O(N) bytes, in rounds with placement facts): a
member makes 7
store calls to be admitted (2 ADDs, 1 on-close registration on its session, 1
fire-and-forget MULTI_SET, 2 GETs, 1 SET); the holder of a threshold ticket adds a
confirmed push (PUSH + CHECK). A waiting node blocks on one key; an idle member costs
one blocking read and one fire-and-forget write per tick; the coordinator one ADD, one
MULTI_GET (its sweep), one MULTI_SET and two session calls (the next ``lost`` order,
cancelling the last) per tick. No wall clock crosses machines (see
:mod:`._liveness`). Backends plug in a :class:`~aelastic.store.Store` (a TCPStore
client, an etcd-backed store) and optionally their own :class:`~._liveness.Liveness`.

This module holds the node's handler (joining, the member's watch, leaving); the
coordinator is :class:`~._coordinator.RoundCoordinator`, which the handler drives
through a :class:`~._coordinator.CoordinatorLink`, and the on-close actions are
:class:`~._session.SessionActions`.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager, AsyncExitStack, asynccontextmanager, nullcontext

import anyio
from anyio.abc import TaskGroup, TaskStatus

from .._tasks import background_tasks
from ..store import (
    PrefixStore,
    Store,
    StoreError,
    StoreTimeoutError,
)
from . import _events
from ._coordinator import CoordinatorLink, RoundCoordinator, publish_tick
from ._exceptions import (
    RendezvousClosedError,
    RendezvousConfigError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousTimeoutError,
)
from ._handler import RendezvousHandler, RendezvousInfo, RendezvousStoreInfo
from ._hostwatch import StoreWatch
from ._liveness import Liveness, StoreLiveness
from ._ops import Ops
from ._placement import Seat, rank_key
from ._rejoin import Previous
from ._session import SessionActions, open_session
from ._settings import DynamicSettings
from ._state import (
    Keys,
    Message,
    Tick,
    descriptor,
    moved_to_epoch,
)
from ._view import RoundView
from ._waiting import WaitReporter, waiting_message

__all__ = ("DynamicSettings", "DynamicRendezvousHandler")

_local_ids = iter(range(1 << 62))
_local_ids_lock = threading.Lock()


def _next_local_id() -> int:
    with _local_ids_lock:
        return next(_local_ids)


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
        rank_order: str | None = None,
    ) -> None:
        """``rank_order``: ``--node-rank-order`` (``hostname`` or ``env:VAR``), None: none.

        Raises:
            RendezvousConfigError: bad node counts or ``rank_order`` (form, or its
                environment variable unset or empty here).
        """
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
        self._rank_key = None if rank_order is None else rank_key(rank_order, self._hostname)
        #: (epoch, round, group rank) of the last round this node was admitted to
        self._last: tuple[int, int, int] | None = None
        #: that round's size as this node saw it (a rejoined round closes at once)
        self._previous: Previous | None = None
        self._bootstrap = bootstrap_store_info
        self._master_endpoint = master_endpoint
        self._tg: TaskGroup | None = None
        self._stack: AsyncExitStack | None = None
        self._view: RoundView | None = None
        self._view_set = anyio.Event()
        self._shut = False
        self._lock: anyio.Lock | None = None
        self._session_actions = SessionActions(run_id, self._settings, self._guard)
        self._heir: tuple[bool, str] | None = None  # (this node is the heir, its address)
        self._member_view: RoundView | None = None  # the round this node was last admitted to
        self._host_watch: StoreWatch | None = None  # notices a frozen store host (c10d)
        #: says what a join (or c10d's connect) waits for, every wait_report_interval
        self._reporter = WaitReporter(self._settings.wait_report_interval)

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
            self._session_actions.use(await open_session(self._stack, self._store))

    @asynccontextmanager
    async def __asynccontextmanager__(self) -> AsyncIterator[DynamicRendezvousHandler]:
        """Open the store and its session and run the background tasks for the block;
        at its end leave the round (shielded, bounded by ``close_timeout``), close
        the store resources, then cancel and join the tasks."""
        # The task group is left after the stack of store resources, and never sees
        # their exit's exception (see _tasks.background_tasks): one AsyncExitStack
        # holding both spun the loop forever on CPython 3.11 (a resource's exit
        # re-raised a cancellation that the group then re-raised, and ExitStack made
        # the exception its own __context__).
        async with background_tasks() as tg, AsyncExitStack() as stack:
            self._store = await self._open_store(stack, tg)
            self._session_actions.use(await open_session(stack, self._store))
            self._start_watch(tg)
            self._stack, self._tg, self._shut = stack, tg, False
            self._lock = anyio.Lock()
            try:
                yield self
            finally:
                try:
                    with (
                        anyio.CancelScope(shield=True),
                        anyio.move_on_after(self._settings.close_timeout),
                    ):
                        await self.shutdown()
                        await self._session_actions.cancel_all()  # left cleanly
                except (StoreError, OSError):
                    pass  # the session's connection or the store's host is gone (or frozen)
                finally:
                    self._tg = self._stack = None
                    self._session_actions.use(None)

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
            if self._saw_closed():
                # Closed is final, and the store may be gone with its host by now: a
                # join would find it lost and re-host it (without ``closed``) as heir.
                raise RendezvousClosedError.for_run(self._run_id)
            self._shut = False
            self._event("join", f"node {self._addr}#{self._local_id} joins", state="INIT")
            deadline = anyio.current_time() + self._settings.join_timeout
            try:
                with self._reporter.waiting(self._waiting, tg):
                    while True:
                        try:
                            info, was_spare = await self._attempt(tg, deadline)
                        except RendezvousConnectionError as exc:
                            await self._abandon()  # the store is unreachable: tell nobody
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
            view = RoundView(round_, ticket, self._store, keys)
            self._set_view(view)
            if ticket == 0:
                await tg.start(self._background, view, self._coordinate)
            else:
                # If this process dies, the store tells the coordinator at once.
                await self._session_actions.on_close(
                    view, keys.inbox(round_), "queue_push", Message("gone", ticket).dumps()
                )
                placed = self._hosts_store() or self._rank_key is not None or self._last is not None
                await self._liveness.attach(ops, keys, round_, ticket, self._descriptor(), placed)
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
        previous = self._previous
        if ticket > 0 and (
            ticket + 1 == self._min
            or ticket + 1 >= self._max
            # the last of the previous round's members may close it (see _rejoin)
            or (
                previous is not None
                and previous.epoch == keys.epoch
                and ticket + 1 == previous.world
            )
        ):
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

    def _set_view(self, view: RoundView | None) -> None:
        self._view = view
        self._view_set.set()
        self._view_set = anyio.Event()

    async def _waiting(self, waited: float) -> str:
        """The "still waiting" line of a joining node (one store read: the round's joins)."""
        view = self._view
        progress = "no round joined yet"
        forming: int | None = None  # the live joins of a round still forming
        if view is not None:
            tick = view.tick
            joined = await self._ops().add(self._keys.joined(view.round), 0)
            joined -= len(tick.removed) if tick is not None else 0
            nodes = "node" if joined == 1 else "nodes"
            progress = f"round {view.round}: {joined} {nodes} joined"
            if tick is None or tick.state == "joining":
                forming = joined
            if tick is not None and tick.state == "running" and not tick.is_member(view.ticket):
                progress += "; this node is a spare of a full round"
        return waiting_message(
            backend=self.get_backend(),
            run_id=self._run_id,
            endpoint=self._master_endpoint or "the given store",
            min_nodes=self._min,
            max_nodes=self._max,
            waited=waited,
            join_timeout=self._settings.join_timeout,
            progress=progress,
            joined=forming,
            last_call_timeout=self._settings.last_call_timeout,
        )

    def _describe(self, tick: Tick | None) -> str:
        if tick is None:
            return "no word from the round's coordinator yet"
        return f"state {tick.state}, tick {tick.n}"

    def _descriptor(self) -> str:
        """This node's registration: what the coordinator places it by (rank 0 goes to
        the store's host, see :mod:`._placement`)."""
        return descriptor(
            self._addr,
            self._hostname,
            os.getpid(),
            self._local_id,
            host=self._hosts_store(),
            key=self._rank_key,
            last=self._last,
        )

    def _admitted(self, view: RoundView, tick: Tick) -> RendezvousInfo:
        view.member_tick = tick
        self._member_view = view
        self._heir = (tick.heir_ticket == view.ticket, tick.heir) if tick.heir_ticket >= 0 else None
        rank = tick.rank_of(view.ticket)
        self._last = (self._keys.epoch, view.round, rank)
        self._previous = Previous(self._keys.epoch, view.round, rank, tick.world, tick.upto)
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

    def _saw_closed(self) -> bool:
        """This node saw the last round it was admitted to closed (no store request)."""
        view = self._member_view
        return view is not None and view.tick is not None and view.tick.state == "closed"

    async def is_closed(self) -> bool:
        await self._require_started()
        if self._saw_closed():
            return True
        return await self._ops().check(self._keys.closed)

    async def set_closed(self) -> None:
        """Close the rendezvous: every pending and later join raises RendezvousClosedError.

        On the node that hosts the store, returns once the other members of its round
        saw the close (or left the round), waiting at most ``min(close_timeout,
        heartbeat_timeout)`` for them (a dead member costs that bound, no more): the
        store goes when this node leaves, and a member that had not read the ``closed``
        tick by then would find the store lost, re-host it as heir (without ``closed``)
        and wait out its ``join_timeout`` for a job that already failed.
        """
        await self._require_started()
        ops, keys = self._ops(), self._keys
        with anyio.fail_after(self._settings.close_timeout):
            await ops.set(keys.closed, "1")
            round_ = await ops.add(keys.round, 0)
            await ops.push(keys.inbox(round_), Message("close").dumps())
        self._event("close", f"rendezvous closed (round {round_})", state="SUCCEEDED")
        if self._hosts_store():
            await self._wait_until_members_done(round_)

    async def _wait_until_members_done(self, round_: int) -> None:
        """Wait (bounded, see :meth:`set_closed`) until the other members of this node's
        round ``round_`` set their ``done`` key; never raises."""
        view = self._member_view
        if view is None or view.round != round_ or view.keys is not self._keys:
            return  # not a member of the round the close went to: its joiners see ``closed``
        tick = view.tick if view.tick is not None and view.tick.state == "running" else None
        tick = tick or view.member_tick
        if tick is None:
            return
        others = [t for t in range(tick.upto) if tick.is_member(t) and t != view.ticket]
        if not others:
            return
        bound = min(self._settings.close_timeout, self._settings.heartbeat_timeout)
        names = [self._keys.done(round_, t) for t in others]
        with contextlib.suppress(StoreTimeoutError, RendezvousError):
            await self._ops().multi_get(names, timeout=bound)

    async def _done_with(self, view: RoundView) -> None:
        """Tell a closing store host that this node is done with the view's round (see
        :meth:`set_closed`). Best effort; a SET has no reply, so it costs no wait."""
        if view.store is self._store and view.keys is self._keys:
            with contextlib.suppress(RendezvousError, OSError):
                await self._ops().set(self._keys.done(view.round, view.ticket), "1")

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

    async def _stop(self, view: RoundView, *, forget_now: bool = False) -> None:
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

    async def _forget(self, view: RoundView) -> None:
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
            await self._session_actions.cancel(view.actions)
            if view.ticket == 0:
                return
            try:
                await ops.delete(keys.seen(view.round, view.ticket))
                await ops.delete(keys.node(view.round, view.ticket))
            except RendezvousError:
                pass

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
                await self._done_with(view)
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
        await publish_tick(ops, self._keys, round_, Tick(n, "dissolved"))

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
        view: RoundView,
        body: Callable[[RoundView], Awaitable[None]],
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

    async def _watch(self, view: RoundView) -> None:
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
            if tick.state == "closed":
                await self._done_with(view)
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

    async def _coordinator_gone(self, view: RoundView, tick: Tick | None, why: str = "") -> None:
        silent = not why
        why = why or f"it published no tick for {self._settings.heartbeat_timeout}s"
        self._event(
            "node_removed",
            f"round {view.round}: coordinator gone ({why}); starting round {view.round + 1}",
            state="FAILED",
        )
        await self._dissolve(view.round)
        if silent:
            # A silent (frozen) coordinator never publishes the end: this node does, or
            # each holder that joined after it would wait out its own heartbeat timeout.
            await self._publish_dissolved(view.round)
        view.coordinator_lost = True
        view.wake()

    async def _coordinate(self, view: RoundView) -> None:
        """Ticket 0: decide round ``view.round`` alone, see :mod:`._coordinator`."""
        link = CoordinatorLink(
            ops=self._ops(),
            keys=self._keys,
            settings=self._settings,
            liveness=self._liveness,
            min_nodes=self._min,
            max_nodes=self._max,
            addr=self._addr,
            hosts_store=self._hosts_store(),
            seat=Seat(self._rank_key, self._last),
            previous=self._previous,
            event=self._event,
            on_close=self._session_actions.on_close,
            cancel_actions=self._session_actions.cancel,
            done_with=self._done_with,
        )
        await RoundCoordinator(view, link).run()

"""The etcd rendezvous backend (``--rdzv-backend etcd``, alias ``etcd-v2``).

Same semantics as the ``c10d`` backend (min..max nodes, last call, join timeout,
late arrivals wait for the next round, spares beyond ``max_nodes``, close), built
on what etcd offers rather than on the store-level algorithm: etcd has no atomic
increment, so a shared join counter costs O(N) compare-and-set retries per node
under contention. Here joining is one transaction that puts the node's own key and
reads the round's counts; only the joiner whose count crosses ``min_nodes`` (writes
the ``quorum`` key, starting everyone's last call) or ``max_nodes`` (completes the
round) acts, and everyone else watches two control keys. Liveness is an etcd lease
per node (etcd's clock): the node's join key is attached to it, a keep-alive task
refreshes it, and a node that dies loses its key within the lease TTL, which every
peer's watch sees at once. No wall clock is compared across machines (last call is
each node's own monotonic timer).

The keys (the open ``round``, ``closed``, and each round's ``join/<node>``, ``ctl/quorum``,
``ctl/done`` and ``store/``) are laid out in :mod:`._keys`; the node's lease is
:mod:`._lease`, the stored state's parsing :mod:`._state`.

A round completes only once every participant of the previous round has moved on
(its key moved to the new round) or died (lease expired). The completing node
writes ``done`` and advances ``round`` in one transaction. Ranks among the first
``max_nodes`` joiners by join revision follow :func:`~.._placement.place` (each
descriptor carries the node's topology key and last group rank): by
``--node-rank-order`` key when given, each node keeping its group rank of the last
round where it can, else the order of node ids (``addr:pid:local_id``, like torch's
sorted node descriptors). A round whose joiners are exactly the previous round's
members (a restart: nobody is arriving) completes at once, without the last call: the
previous round's rank 0, when its count matches, reads the joiners (one read) and
checks (:mod:`.._rejoin`). Requests per node and round: a lease
grant and keep-alive stream (once per handler), one join transaction, two watch
streams; the completing node adds one read and one transaction.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import random
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream

from ..._dataclass import dataclass
from ..._net import is_loopback
from ..._tasks import background_tasks
from ...store import StoreError
from .._events import record
from .._exceptions import (
    RendezvousClosedError,
    RendezvousConfigError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousStateError,
    RendezvousTimeoutError,
    rendezvous_error,
)
from .._handler import RendezvousHandler, RendezvousInfo, RendezvousStoreInfo
from .._placement import place, rank_key, seat_of
from .._rejoin import same_members
from .._waiting import reporting_wait, waiting_message
from ._client import (
    EtcdClient,
    EtcdConfig,
    cmp_value,
    cmp_version,
    op_delete,
    op_put,
    op_range,
    op_txn,
    prefix_end,
    require_asyncio,
)
from ._exceptions import EtcdCompactedError
from ._keys import RunKeys
from ._lease import NodeLease
from ._settings import EtcdRendezvousSettings, settings_from_params
from ._state import Round, encode_done, parse_done, parse_joiner, parse_round
from ._store import EtcdStore

__all__ = ("EtcdRendezvousHandler", "create_etcd_handler")

log = logging.getLogger(__name__)

_local_ids = itertools.count()


def create_etcd_handler(params: Any) -> EtcdRendezvousHandler:
    """Registry factory for ``etcd`` and ``etcd-v2``: build (not connect) a handler.

    Raises:
        RendezvousConfigError: a config key or the endpoint is malformed (the message names it).
    """
    config, settings = settings_from_params(params)
    local_addr = params.local_addr
    if not local_addr:
        if all(is_loopback(h) for h, _ in config.endpoints):
            local_addr = "127.0.0.1"
        else:
            local_addr = socket.getfqdn()
    return EtcdRendezvousHandler(
        run_id=params.run_id,
        min_nodes=params.min_nodes,
        max_nodes=params.max_nodes,
        config=config,
        settings=settings,
        local_addr=local_addr,
        backend=params.backend,
        rank_order=params.get("node_rank_order"),
    )


#: How long nodes wait for the node that reached ``max_nodes`` to write ``done``
#: before completing the round themselves (it may have died in between).
_GRACE = 2.0


@dataclass(frozen=True)
class _Joined:
    """What a join transaction saw: its revision and the round's counts."""

    revision: int
    count: int
    quorum: bool
    prev_alive: int


class _LeaseLost(Exception):
    """This node's lease expired (etcd lost contact for longer than the TTL)."""


class EtcdRendezvousHandler(RendezvousHandler):
    """Dynamic rendezvous on etcd; enter it with ``async with`` before use.

    Entering opens no connection yet; the first :meth:`next_rendezvous` grants this
    node's lease and starts its keep-alive task in the handler's task group.
    Leaving the block (or :meth:`shutdown`) revokes the lease, so peers see this
    node leave at once. Errors: an unreachable etcd raises
    :class:`RendezvousConnectionError` (at the latest after ``join_timeout``),
    malformed state :class:`RendezvousStateError`.
    """

    def __init__(
        self,
        *,
        run_id: str,
        min_nodes: int,
        max_nodes: int,
        config: EtcdConfig,
        settings: EtcdRendezvousSettings | None = None,
        local_addr: str = "127.0.0.1",
        backend: str = "etcd",
        rank_order: str | None = None,
    ) -> None:
        if not 1 <= min_nodes <= max_nodes:
            raise RendezvousConfigError(
                f"need 1 <= min_nodes ({min_nodes}) <= max_nodes ({max_nodes})"
            )
        self._run_id = run_id
        self._min = min_nodes
        self._max = max_nodes
        self._backend = backend
        self.settings = settings or EtcdRendezvousSettings()
        self.client = EtcdClient(config)
        self._keys = RunKeys.for_run(self.settings.prefix, run_id)
        self.local_addr = local_addr
        self._local_id = next(_local_ids)
        self.node_id = f"{local_addr}:{os.getpid():010d}:{self._local_id:06d}"
        hostname = socket.gethostname()
        self._node: dict[str, Any] = {
            "id": self.node_id,
            "addr": local_addr,
            "hostname": hostname,
            "pid": os.getpid(),
            "local_id": self._local_id,
        }
        if rank_order is not None:  # RendezvousConfigError: a bad form, an empty variable
            self._node["key"] = rank_key(rank_order, hostname)
        self._tg: TaskGroup | None = None
        self._lease = NodeLease(
            self.settings.lease_ttl,
            f"rendezvous {run_id}: lease of node {self.node_id}",
            self._forget_join,
        )
        self._next_guess = 0  # the round this node expects to be open
        self._joined: int | None = None  # round whose join key this node holds
        self._round: Round | None = None  # last round this node completed as participant
        self._last: list[int] | None = None  # [0, round, group rank] of the last one
        #: the node ids of that round, kept across joins (a rejoined round closes at once)
        self._previous_ids: list[str] = []
        self._shut = False

    # -- API basics --------------------------------------------------------------------

    def get_backend(self) -> str:
        return self._backend

    def get_run_id(self) -> str:
        return self._run_id

    @property
    def use_agent_store(self) -> bool:
        return True

    def _where(self) -> str:
        return f"etcd {self.client.config.describe()}"

    def _record(
        self, name: str, message: str, *, state: str = "RUNNING", rank: int | None = None
    ) -> None:
        record(
            self._run_id,
            message,
            name=name,
            state=state,
            master_endpoint=self.client.config.describe(),
            local_id=self._local_id,
            rank=rank,
            stacklevel=2,
        )

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self._tg is not None

    @asynccontextmanager
    async def __asynccontextmanager__(self) -> AsyncIterator[EtcdRendezvousHandler]:
        """Open the etcd client and run the lease keep-alive for the block; at its end
        revoke the lease (:meth:`shutdown`: shielded, bounded by ``close_timeout``),
        cancel the keep-alive and close the client."""
        require_asyncio()
        if self.client.closed:  # entered again after a shutdown
            self.client = EtcdClient(self.client.config)
        self._shut = False
        async with self.client, background_tasks() as tg:
            self._tg = tg
            try:
                yield self
            finally:
                try:
                    await self.shutdown()
                finally:
                    self._tg = None

    async def shutdown(self) -> bool:
        """Revoke this node's lease (peers see it leave at once); idempotent, shielded."""
        try:
            return await self._shutdown()
        finally:
            self._serve_ends()

    async def _shutdown(self) -> bool:
        if self._shut:
            return True
        self._shut = True
        clean = True
        with anyio.move_on_after(self.settings.close_timeout, shield=True) as scope:
            clean = await self._lease.revoke(self.client)
        if scope.cancelled_caught:
            clean = False
        if self._tg is None:  # used without ``async with``
            await self.client.aclose()
        return clean

    # -- lease ---------------------------------------------------------------------------

    async def _ensure_lease(self) -> int:
        if self._tg is None:
            raise RendezvousError(
                "enter the etcd rendezvous handler with 'async with handler:' (or give "
                "it a task group with handler.run_in(tg)) before calling "
                "next_rendezvous: it runs a lease keep-alive task"
            )
        return await self._lease.ensure(self.client, self._tg)

    def _forget_join(self) -> None:
        """The lease expired: this node's join key went with it."""
        self._joined = None

    # -- helpers -------------------------------------------------------------------------

    def _parse_round(self, raw: bytes | None) -> int | None:
        return parse_round(self._keys.open_round, raw, self._where())

    def _parse_done(self, round_: int, raw: bytes) -> Round:
        return parse_done(round_, self._keys.done(round_), raw, self._where())

    async def _read_open_round(self) -> tuple[int | None, bool]:
        (round_, closed_), _ = await self.client.read([self._keys.open_round, self._keys.closed])
        kvs_round = round_.kvs
        closed = bool(closed_.kvs)
        return self._parse_round(bytes(kvs_round[0].value) if kvs_round else None), closed

    # -- next_rendezvous -----------------------------------------------------------------

    async def next_rendezvous(self) -> RendezvousInfo:
        """Join the open round and wait until it completes with this node admitted.

        Cancellation withdraws this node's join key (shielded, bounded by
        ``close_timeout``) before propagating.
        """
        require_asyncio()
        await self._autostart()
        timeout = self.settings.join_timeout
        self._round = None
        self._record("RENDEZVOUS_JOIN", f"node {self.node_id} joining")
        spare = [False]
        try:
            with anyio.CancelScope(deadline=anyio.current_time() + timeout) as scope:
                try:
                    async with reporting_wait(self._waiting, self.settings.wait_report_interval):
                        info = await self._rendezvous(scope, spare)
                except StoreError as exc:
                    raise rendezvous_error(exc, f"join rendezvous {self._run_id!r}") from exc
            if scope.cancelled_caught:
                raise self._join_timeout(timeout)
        except RendezvousClosedError:
            await self._withdraw()
            self._record("RENDEZVOUS_CLOSED", "rendezvous closed", state="SUCCEEDED")
            if spare[0]:
                raise RendezvousGracefulExitError(
                    f"rendezvous {self._run_id} closed while node {self.node_id} was a spare"
                ) from None
            raise
        except BaseException:
            await self._withdraw()
            raise
        self._record(
            "RENDEZVOUS_COMPLETE",
            f"round {info.round}: rank {info.rank} of {info.world_size}",
            rank=info.rank,
        )
        return info

    async def _waiting(self, waited: float) -> str:
        """The "still waiting" line of a joining node (no request: what it last saw)."""
        return waiting_message(
            backend=self._backend,
            run_id=self._run_id,
            endpoint=self.client.config.describe(),
            min_nodes=self._min,
            max_nodes=self._max,
            waited=waited,
            join_timeout=self.settings.join_timeout,
            progress=self._progress,
        )

    def _join_timeout(self, timeout: float) -> RendezvousError:
        self._record("RENDEZVOUS_TIMEOUT", "join timeout", state="FAILED")
        if self.client.stats.requests and self.client.stats.reconnects and not self._joined_ok:
            return RendezvousConnectionError(
                f"rendezvous {self._run_id}: etcd unreachable within join_timeout={timeout:g}s "
                f"({self.client.failures()}); check --rdzv-endpoint and that etcd is running"
            )
        return RendezvousTimeoutError(
            f"rendezvous {self._run_id} did not complete within join_timeout={timeout:g}s "
            f"(min_nodes={self._min}, max_nodes={self._max}; last seen {self._progress}); "
            "start more nodes or raise join_timeout in --rdzv-conf"
        )

    _joined_ok = False
    _progress = "no answer from etcd yet"

    async def _withdraw(self) -> None:
        joined, self._joined = self._joined, None
        if joined is None or self._round is not None:
            return
        with anyio.move_on_after(self.settings.close_timeout, shield=True):
            try:
                await self.client.delete(self._keys.join(joined, self.node_id))
            except StoreError as exc:
                log.debug("could not withdraw from round %d: %s", joined, exc)

    async def _rendezvous(self, scope: anyio.CancelScope, spare: list[bool]) -> RendezvousInfo:
        previous = self._joined
        guess = self._next_guess
        while True:
            lease = await self._ensure_lease()
            joined = await self._join(guess, lease, previous)
            if isinstance(joined, tuple):
                actual, closed = joined
                if closed:
                    raise RendezvousClosedError.for_run(self._run_id)
                guess = actual if actual is not None else 0
                continue
            self._joined, previous = guess, guess
            self._joined_ok = True
            try:
                outcome = await self._await_round(guess, joined)
            except _LeaseLost:
                previous = None  # our key vanished with the lease: join afresh
                self._joined = None
                continue
            if isinstance(outcome, RendezvousInfo):
                self._next_guess = guess + 1
                return outcome
            # Not admitted: wait in the next round (a spare when the world is full).
            if len(outcome.nodes) >= self._max:
                spare[0] = True
                scope.deadline = math.inf
            guess = guess + 1

    async def _join(
        self, r: int, lease: int, previous: int | None
    ) -> _Joined | tuple[int | None, bool]:
        """Move this node's join key to round ``r`` in one transaction.

        Returns what the join saw, or ``(open round, closed)`` when ``r`` is not open.
        """
        round_key, closed_key = self._keys.open_round, self._keys.closed
        ops = []
        if previous is not None and previous != r:
            ops.append(op_delete(self._keys.join(previous, self.node_id)))
        ops.append(op_put(self._keys.join(r, self.node_id), self._descriptor(), lease))
        first = len(ops)
        jp = self._keys.joins(r)
        ops.append(op_range(jp, prefix_end(jp), count_only=True))
        ops.append(op_range(self._keys.quorum(r)))
        if r > 0:
            pp = self._keys.joins(r - 1)
            ops.append(op_range(pp, prefix_end(pp), count_only=True))
        state = [op_range(round_key), op_range(closed_key)]
        not_closed = cmp_version(closed_key, 0)
        failure = state
        if r == 0:  # the round key may not exist yet: create it in a nested transaction
            failure = [
                op_txn(
                    [not_closed, cmp_version(round_key, 0)],
                    [op_put(round_key, b"0"), *ops],
                    state,
                )
            ]
        reply = await self.client.txn(
            [not_closed, cmp_value(round_key, str(r).encode())], ops, failure
        )
        responses = reply.responses
        if not reply.succeeded and r == 0:
            inner = responses[0].response_txn
            responses = inner.responses
            if inner.succeeded:
                responses = responses[1:]
            else:
                reply = inner
        if not reply.succeeded:
            kvs = responses[0].response_range.kvs
            open_round = self._parse_round(bytes(kvs[0].value) if kvs else None)
            return open_round, bool(responses[1].response_range.kvs)
        return _Joined(
            revision=int(reply.header.revision),
            count=int(responses[first].response_range.count),
            quorum=bool(responses[first + 1].response_range.kvs),
            prev_alive=int(responses[first + 2].response_range.count) if r > 0 else 0,
        )

    async def _await_round(self, r: int, joined: _Joined) -> RendezvousInfo | Round:
        """Follow round ``r`` by watch until it completes; return our info or the round.

        Watch streams (the round's control keys, the ``closed`` key and, while some
        remain, the previous round's members) feed one channel; a deadline (last call,
        or the fallback for a completer that died) bounds each receive.
        """
        send, receive = anyio.create_memory_object_stream[list[Any] | Exception](math.inf)
        start = joined.revision + 1
        lost = self._lease.lost

        async def pump(key: bytes, end: bytes | None) -> None:
            try:
                async with self.client.watch(key, end, start_revision=start) as watch:
                    while True:
                        await send.send(await watch.next())
            except Exception as exc:  # handed to _follow, raised outside the task group
                await send.send(exc)

        async def lease() -> None:
            await lost.wait()
            await send.send([])

        outcome: list[RendezvousInfo | Round] = []
        failure: list[Exception] = []
        async with anyio.create_task_group() as tg:
            ctl = self._keys.control(r)
            tg.start_soon(pump, ctl, prefix_end(ctl))
            tg.start_soon(pump, self._keys.closed, None)
            if joined.prev_alive > 0:
                pp = self._keys.joins(r - 1)
                tg.start_soon(pump, pp, prefix_end(pp))
            tg.start_soon(lease)
            try:
                outcome.append(await self._follow(r, joined, receive))
            except Exception as exc:
                failure.append(exc)
            finally:
                tg.cancel_scope.cancel()
        if failure:
            raise failure[0]
        return outcome[0]

    async def _follow(
        self,
        r: int,
        joined: _Joined,
        receive: MemoryObjectReceiveStream[list[Any] | Exception],
    ) -> RendezvousInfo | Round:
        prev_prefix = self._keys.joins(r - 1) if r > 0 else None
        done_key, quorum_key, closed_key = (
            self._keys.done(r),
            self._keys.quorum(r),
            self._keys.closed,
        )
        prev_alive = joined.prev_alive
        deadline = math.inf  # when to try completing the round ourselves
        count = joined.count

        def last_call(now: float) -> float:
            # Jittered so that, of the nodes whose timers expire together, one completes
            # first and the others see its ``done`` before reading the joiners themselves.
            return now + self.settings.last_call_timeout + random.random() * 0.05

        def may_be_back(count: int) -> bool:
            # Only the previous round's rank 0 reads the joiners (one read per round).
            last = self._last
            return last is not None and last[2] == 0 and count == len(self._previous_ids)

        async def rejoined(count: int, now: float) -> float | None:
            """Complete round ``r`` at once if its ``count`` joiners are exactly the
            previous round's members (see .._rejoin); the new deadline, else None."""
            if self._min <= count < self._max and may_be_back(count):
                jp = self._keys.joins(r)
                reply = await self.client.range(jp, prefix_end(jp))
                where = self._where()
                ids = [str(parse_joiner(bytes(kv.key), bytes(kv.value), jp, where)["id"])
                       for kv in reply.kvs]  # fmt: skip
                if same_members(self._previous_ids, ids):
                    # the previous round's members are all back and nobody else joined:
                    # nobody is arriving, so no last call (see .._rejoin)
                    self._record("RENDEZVOUS_REJOINED", f"round {r}: {count} members back")
                    await self.client.txn([cmp_version(quorum_key, 0)], [op_put(quorum_key, b"1")])
                    await self._complete(r)
                    return now + _GRACE  # the done event follows
            return None

        async def quorum_reached(count: int, now: float, crossed: bool) -> float:
            """Return the new completion deadline after seeing ``count`` joiners."""
            if (at := await rejoined(count, now)) is not None:
                return at
            if count >= self._max:
                if not crossed:
                    return now + random.random() * 0.05
                # The quorum key first: should this node die before completing, the
                # others complete the round when their last call expires.
                await self.client.txn([cmp_version(quorum_key, 0)], [op_put(quorum_key, b"1")])
                await self._complete(r)
                return now + _GRACE  # the done event follows
            if count >= self._min:
                await self.client.txn([cmp_version(quorum_key, 0)], [op_put(quorum_key, b"1")])
                self._record("RENDEZVOUS_LAST_CALL", f"round {r}: {count} >= min {self._min}")
                return last_call(now)
            return math.inf

        if prev_alive <= 0:
            if joined.quorum:
                deadline = last_call(anyio.current_time())
            # Only the joiner that crosses min/max acts (its count is exact).
            if count == self._min or count >= self._max:
                deadline = await quorum_reached(count, anyio.current_time(), True)
            elif (at := await rejoined(count, anyio.current_time())) is not None:
                deadline = at
        while True:
            self._progress = f"round {r}: {count}+ joined" + (
                f", {prev_alive} still in round {r - 1}" if prev_alive > 0 else ""
            )
            events: list[Any] = []
            with anyio.move_on_at(deadline) as timer:
                item = await receive.receive()
                if isinstance(item, EtcdCompactedError):
                    raise RendezvousStateError(
                        f"rendezvous {self._run_id}: etcd compacted history this node needs "
                        f"({item}); call next_rendezvous again"
                    )
                if isinstance(item, Exception):
                    raise item
                events = item
            if timer.cancelled_caught:  # last call over (or the completer vanished)
                complete = await self._complete(r)
                if complete is None:  # fewer than min_nodes left: wait for joiners again
                    deadline = math.inf
                    await self.client.delete(quorum_key)
                else:
                    deadline = anyio.current_time() + _GRACE
                continue
            if not events and self._lease.lost.is_set() and self._lease.id is None:
                raise _LeaseLost
            for event in events:
                kv = event.kv
                key = bytes(kv.key)
                deleted = event.type == 1  # mvccpb.Event.DELETE
                if key == closed_key and not deleted:
                    # The done key arrives on another stream: a node admitted just
                    # before the close still gets its round.
                    reply = await self.client.range(done_key)
                    if reply.kvs:
                        admitted = self._admit(r, bytes(reply.kvs[0].value))
                        if isinstance(admitted, RendezvousInfo):
                            return admitted
                    raise RendezvousClosedError.for_run(self._run_id)
                if key == quorum_key:
                    if deleted:
                        deadline = math.inf
                    elif deadline == math.inf:
                        deadline = last_call(anyio.current_time())
                elif prev_prefix is not None and key.startswith(prev_prefix):
                    if deleted:
                        prev_alive -= 1
                    elif kv.version == 1:
                        prev_alive += 1
                    if deleted and prev_alive == 0:
                        # The previous round drained: every joiner checks the count once.
                        jp = self._keys.joins(r)
                        count = int(
                            (await self.client.range(jp, prefix_end(jp), count_only=True)).count
                        )
                        deadline = await quorum_reached(count, anyio.current_time(), False)
                elif key == done_key and not deleted:
                    return self._admit(r, bytes(kv.value))

    def _descriptor(self) -> bytes:
        """This node's join record: who it is, its topology key and last group rank."""
        node = self._node if self._last is None else {**self._node, "last": self._last}
        return json.dumps(node, separators=(",", ":")).encode()

    def _admit(self, r: int, raw: bytes) -> RendezvousInfo | Round:
        """This node's info if round ``r``'s ``done`` record lists it, else the round."""
        done = self._parse_done(r, raw)
        ids = done.ids
        if self.node_id not in ids:
            return done
        self._round = done
        self._last = [0, r, ids.index(self.node_id)]
        self._previous_ids = ids
        return RendezvousInfo(
            store=EtcdStore(self.client, self._keys.store(r)),
            rank=self._last[2],
            world_size=len(ids),
            bootstrap_store_info=RendezvousStoreInfo(str(done.nodes[0].get("addr", "")), 0),
            round=r,
        )

    async def _complete(self, r: int) -> bool | None:
        """Try to mark round ``r`` complete with its first ``max_nodes`` joiners.

        Returns None when fewer than ``min_nodes`` are there, else whether this call
        wrote ``done`` (False: another node did first).
        """
        jp = self._keys.joins(r)
        reply = await self.client.range(jp, prefix_end(jp), limit=self._max, sort_by_create=True)
        nodes = [
            parse_joiner(bytes(kv.key), bytes(kv.value), jp, self._where()) for kv in reply.kvs
        ]
        if len(nodes) < self._min:
            return None
        nodes.sort(key=lambda n: str(n["id"]))
        nodes = [nodes[i] for i in place([seat_of(n) for n in nodes])]
        done = encode_done(nodes, int(reply.header.revision))
        reply = await self.client.txn(
            [cmp_version(self._keys.done(r), 0), cmp_value(self._keys.open_round, str(r).encode())],
            [
                op_put(self._keys.done(r), done),
                op_put(self._keys.open_round, str(r + 1).encode()),
            ],
        )
        return bool(reply.succeeded)

    # -- membership ----------------------------------------------------------------------

    async def wait_for_membership_change(self) -> None:
        """Return once a participant of the current round is gone (lease expired, left,
        re-joined) or, when the world may grow, a node waits for the next round.

        Push-based: one watch stream, no polling; survives etcd restarts.
        """
        current = self._round
        if current is None:
            await anyio.sleep_forever()
            return
        r = current.number
        members = {n.encode() for n in current.ids}
        members.discard(self.node_id.encode())
        grows = len(current.nodes) < self._max
        jp, np_ = self._keys.joins(r), self._keys.joins(r + 1)
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                start = current.revision + 1
                while True:
                    try:
                        async with self.client.watch(
                            self._keys.round(r),
                            prefix_end(self._keys.round(r + 1)),
                            start_revision=start,
                        ) as w:
                            while True:
                                for event in await w.next():
                                    key = bytes(event.kv.key)
                                    start = int(event.kv.mod_revision) + 1
                                    if event.type == 1 and key.startswith(jp):
                                        if key[len(jp) :] in members:
                                            tg.cancel_scope.cancel()
                                            return
                                    elif event.type == 0 and grows and key.startswith(np_):
                                        tg.cancel_scope.cancel()
                                        return
                    except EtcdCompactedError:
                        tg.cancel_scope.cancel()  # history lost: report a change
                        return
                    except StoreError as exc:
                        log.warning("membership watch failed (%s); re-watching", exc)
                        await anyio.sleep(1)

            async def lease() -> None:
                await self._lease.lost.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            tg.start_soon(lease)
        self._record("RENDEZVOUS_MEMBERSHIP_CHANGE", f"round {r}: membership changed")

    # -- queries ---------------------------------------------------------------------------

    async def num_nodes_waiting(self) -> int:
        """Nodes waiting for the next round (spares excluded when the world is full)."""
        try:
            open_round, _ = await self._read_open_round()
            if open_round is None:
                return 0
            jp = self._keys.joins(open_round)
            reply = await self.client.range(jp, prefix_end(jp), count_only=True)
        except StoreError as exc:
            raise rendezvous_error(exc, f"count the nodes waiting in {self._run_id!r}") from exc
        current = self._round
        if current is not None and len(current.nodes) >= self._max:
            return 0
        return int(reply.count)

    async def is_closed(self) -> bool:
        try:
            _, closed = await self._read_open_round()
        except StoreError as exc:
            raise rendezvous_error(exc, f"read the closed flag of {self._run_id!r}") from exc
        return closed

    async def set_closed(self) -> None:
        """Close the rendezvous: waiting nodes raise RendezvousClosedError at once."""
        try:
            with anyio.fail_after(self.settings.close_timeout):
                await self.client.put(self._keys.closed, b"1")
        except TimeoutError:
            raise RendezvousTimeoutError(
                f"rendezvous {self._run_id}: could not close within close_timeout="
                f"{self.settings.close_timeout:g}s on {self._where()}"
            ) from None
        except StoreError as exc:
            raise rendezvous_error(exc, f"close rendezvous {self._run_id!r}") from exc
        self._record("RENDEZVOUS_CLOSE", "rendezvous closed", state="SUCCEEDED")

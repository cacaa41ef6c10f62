"""One client connection of :class:`~aelastic.store.StoreServer`: parse, apply, answer.

The connection owns a non-blocking socket. While it is idle (no partial request,
nothing to await) it has no task: the server's dispatcher (:mod:`._dispatch`)
calls :meth:`_Connection.readable` when its socket has data. Otherwise its own
task (:meth:`_Connection.serve`) waits with :func:`anyio.wait_readable` (every
anyio backend), receives, and answers, and hands the connection back to the
dispatcher once it is idle. Answers are written with a plain non-blocking
``send``, also from the callbacks that wake a parked WAIT when another connection
sets its key, so a wake costs no task switch. What the kernel does not take at
once goes to an outbox that a drain task empties; beyond ~4 MiB queued the
connection reads nothing more (backpressure: a peer that does not read cannot make
the server buffer).

Work per wake-up is bounded: one ``recv`` of at most :data:`RECV_SIZE` bytes is
parsed (linear, see :class:`RequestParser`), and requests over many keys
(MULTI_SET, MULTI_GET, WAIT, CHECK, LIST_KEYS of a big store) are applied in
slices of :data:`SLICE` keys with a checkpoint in between, so no request holds
the event loop for more than a few milliseconds.
"""

from __future__ import annotations

import functools
import logging
import socket
import struct
import time

import anyio
import anyio.lowlevel

from ._ephemeral import MAX_ON_CLOSE_ACTIONS
from ._exceptions import ProtocolError
from ._limits import ConnectionHost
from ._protocol import AE_VERSION, Request, RequestParser, encode_bytes_list
from ._state import Waiter

__all__ = ("RECV_SIZE", "SLICE", "_Connection")

logger = logging.getLogger("aelastic.store")

_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")
_STOP = b"\x00"
_CANCELED = b"\x01"
_READY = b"\x00"
_NOT_READY = b"\x01"
_EMPTY_POP = _I64.pack(0)
_ONE = _I64.pack(1)
_U64_unpack_from = _U64.unpack_from
_U64_pack = _U64.pack
#: A request's opcode and the u64 that follows it (a key length, or WAIT's key count).
_OP_LEN_unpack_from = struct.Struct("<BQ").unpack_from

#: Bytes read per wake-up (bounds the parsing done between two checkpoints).
RECV_SIZE = 64 * 1024
#: Keys applied between two checkpoints by a request over many keys.
SLICE = 8192
#: Answers collected before they are written (and backpressure is checked).
_BATCH_LIMIT = 4 * 1024 * 1024
#: Larger GET values skip the fast path (which writes once per segment).
_FAST_VALUE_LIMIT = 64 * 1024
#: Requests over more keys than this are applied in slices (asynchronously).
_BIG = frozenset({5, 6, 10, 11})


class _Closed(Exception):
    """Internal: the connection was closed (by us or the peer) while serving it."""


class _Connection:
    """One client connection: parse requests, apply them, write answers in order."""

    __slots__ = (
        "_batch",
        "_data",
        "_drained",
        "_fast",
        "_fd",
        "_frame_t0",
        "_held",
        "_host",
        "_key_waiters",
        "_max_key",
        "_max_value",
        "_on_close",
        "_outbox",
        "_outsize",
        "_state",
        "_waiters",
        "accepted_at",
        "closed",
        "dispatched",
        "parser",
        "peer",
        "sock",
    )

    def __init__(self, host: ConnectionHost, sock: socket.socket, peer: str) -> None:
        self._host = host
        self._state = host.state
        self.sock = sock
        self._fd = sock.fileno()
        self.peer = peer
        # served by the host's dispatcher (no task of its own), see _dispatch
        self.dispatched = False
        limits = host.limits
        self.parser = RequestParser(
            max_key_size=limits.max_key_size,
            max_value_size=limits.max_value_size,
            max_key_count=limits.max_key_count,
            max_frame_size=limits.max_frame_size,
        )
        self._waiters: list[Waiter] = []
        self._batch: list[bytes] | None = None
        self._max_key = limits.max_key_size
        self._max_value = limits.max_value_size
        # the fast path applies: validated, no partial frame, no backlog
        self._fast = False
        self.closed = False
        self._data = self._state.data
        self._key_waiters = self._state._waiters
        # AE_ON_CLOSE actions: id -> (opcode, key, value), performed when the connection closes
        self._on_close: dict[int, tuple[int, bytes, bytes]] | None = None
        # answers the kernel did not take yet, emptied by _drain
        self._outbox: list[bytes] = []
        self._outsize = 0
        self._drained: anyio.Event | None = None
        # bytes of a partial request counted in the server's buffer budget, since when
        self._held = 0
        self._frame_t0 = 0.0
        #: ``anyio.current_time()`` when accepted: it must validate within frame_timeout
        self.accepted_at = time.monotonic()  # the sweep's clock (no event loop needed)

    # -- writing ------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        """Send ``data`` now; what the kernel does not take waits in the outbox."""
        if self._outbox or self.closed:
            if not self.closed:
                self._outbox.append(data)
                self._outsize += len(data)
            return
        try:
            n = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError as exc:
            self.close(f"send failed: {exc}", quiet=True)
            return
        if n < len(data):
            rest = data[n:]
            self._outbox.append(rest)
            self._outsize = len(rest)
            self._drained = anyio.Event()
            self._host.spawn(self._drain, self)

    async def _drain(self) -> None:
        """Empty the outbox as the peer reads (a task of the server's task group)."""
        try:
            while self._outbox and not self.closed:
                await anyio.wait_writable(self.sock)
                data = b"".join(self._outbox) if len(self._outbox) > 1 else self._outbox[0]
                try:
                    n = self.sock.send(data)
                except (BlockingIOError, InterruptedError):
                    n = 0
                self._outbox = [data[n:]] if n < len(data) else []
                self._outsize = len(data) - n
        except (OSError, anyio.ClosedResourceError) as exc:
            self.close(f"send failed: {exc}", quiet=True)
        finally:
            self._outbox = []
            self._outsize = 0
            drained, self._drained = self._drained, None
            if drained is not None:
                drained.set()

    async def _wait_drained(self) -> None:
        drained = self._drained
        if drained is not None:
            await drained.wait()
        if self.closed:
            raise _Closed

    # -- lifetime -----------------------------------------------------------------------

    def close(self, reason: str | None = None, *, quiet: bool = False) -> None:
        """Close the socket (idempotent); waits of this connection are dropped.

        A connection without a task of its own (served by the dispatcher) is
        finished (budget, on-close actions) by a task spawned here, unless the
        server is stopping.
        """
        if self.closed:
            return
        self.closed = True
        self._fast = False
        if reason is not None:
            warn = not quiet and self._host.first_refusal(self.peer)
            log = logger.warning if warn else logger.debug
            log("store %s: closing connection from %s: %s", self._host.address, self.peer, reason)
        self._cancel_waits()
        if self.dispatched:  # no task of its own: one finishes it
            self._leave_dispatcher()
            if not self._host.closing:
                self._host.spawn(self._finish_later, self)
        anyio.notify_closing(self.sock)
        self.sock.close()

    def _cancel_waits(self) -> None:
        if self._waiters:
            cancel = self._state.cancel_waiter
            for w in self._waiters:
                cancel(w)
            self._waiters = []

    def run_on_close(self) -> None:
        """Perform the AE_ON_CLOSE actions (once), unless the server is stopping."""
        actions, self._on_close = self._on_close, None
        if not actions or self._host.closing:
            return
        for op, key, value in actions.values():
            try:
                self._state.apply(op, key, value)
            except ValueError as exc:  # ADD on a non-counter: nothing to add to
                logger.warning(
                    "store %s: on-close action of %s skipped: %s",
                    self._host.address,
                    self.peer,
                    exc,
                )

    def _stop_waiting(self) -> None:
        batch = self._batch
        if batch is not None:
            batch.append(_STOP)
        else:
            self._write(_STOP)

    def _answer_get_wait(self, key: bytes) -> None:
        """A parked ``AE_GET_WAIT``'s key was set: answer with its value."""
        v = self._state.data.get(key, b"")
        answer = _U64.pack(len(v)) + v
        batch = self._batch
        if batch is not None:
            batch.append(answer)
        else:
            self._write(answer)

    def _track(self, waiter: Waiter) -> None:
        waiters = self._waiters
        if len(waiters) >= 32:
            waiters = self._waiters = [w for w in waiters if w.active]
        waiters.append(waiter)

    # -- the connection's task ----------------------------------------------------------

    def readable(self) -> None:
        """Read and serve what arrived, for the dispatcher (the connection is idle).

        Synchronous and never raises: a failure closes the connection (and is
        logged if it is a bug). If what arrived leaves work that must await (a
        partial request, a request over many keys, answers piling up), the
        connection leaves the dispatcher and continues in a task of its own
        (:meth:`serve`).
        """
        try:
            try:
                data = self.sock.recv(RECV_SIZE)
            except (BlockingIOError, InterruptedError):
                return  # a stale event (the descriptor was reused)
            except OSError as exc:
                self.close(f"connection failed: {exc}", quiet=True)
                return
            if not data:
                self.close()  # at EOF, which cannot be mid-request here
                return
            rest = self.data_received(data)
            if self._fast and self._outsize <= _BATCH_LIMIT:
                return  # the common case: idle again (``_fast`` implies no ``rest``)
            if self.closed:
                return
            if rest or self._outsize > _BATCH_LIMIT or self.parser.buffered:
                self._leave_dispatcher()
                self._host.spawn(functools.partial(self.serve, rest), self)
        except Exception:
            logger.exception("store %s: connection from %s failed", self._host.address, self.peer)
            self.close()

    def _leave_dispatcher(self) -> None:
        dispatcher = self._host.dispatcher
        if self.dispatched and dispatcher is not None:
            self.dispatched = False
            dispatcher.forget(self._fd)

    def _idle(self) -> bool:
        """Back to the dispatcher (if there is one): nothing held, nothing to await."""
        dispatcher = self._host.dispatcher
        if dispatcher is None or self.parser.buffered or self._outsize > _BATCH_LIMIT:
            return False
        self.dispatched = True
        dispatcher.adopt(self, self._fd)
        return True

    async def serve(self, rest: list[Request] | None = None) -> None:
        """Serve until the peer closes, misbehaves or the server stops; then clean up.

        ``rest``: the dispatcher read the last data and left these requests (maybe
        none: a partial request or backpressure) to this task. Returns early,
        without cleaning up, when the connection is idle and a dispatcher takes it
        back.
        """
        more = False  # the last recv filled its buffer: more data is likely there
        # Waiting for readability costs far more than a recv (a reader registered
        # and removed each time). Peer requests often arrive while other
        # connections are served, so after answering, the task first yields once
        # and tries a recv; it keeps doing so while that finds data, and retries
        # it every 8th wait otherwise.
        peek = True
        waits = 0
        handed_back = False
        try:
            if rest is not None:
                await self._after(rest)
            while not self.closed:  # closed by the server, maybe before this task ran
                if self._idle():
                    handed_back = True
                    return
                data: bytes | None = None
                if more:
                    data = self._try_recv()
                elif peek:
                    await anyio.lowlevel.checkpoint()
                    data = self._try_recv()
                    peek = data is not None
                if data is None:
                    await self._wait_for_data()
                    waits += 1
                    peek = waits % 8 == 0
                    data = self._try_recv()
                    if data is None:
                        more = False
                        continue
                if not data:
                    if self.parser.buffered:
                        self.close(
                            "EOF in the middle of a request "
                            f"({self.parser.buffered} bytes of a half-sent message dropped)"
                        )
                    return
                await self._after(self.data_received(data))
                more = len(data) == RECV_SIZE
                if more:
                    await anyio.lowlevel.checkpoint()  # a fast sender: let others run
        except (_Closed, anyio.ClosedResourceError):
            pass
        except OSError as exc:  # the socket failed under wait_readable/wait_writable
            self.close(f"connection failed: {exc}", quiet=True)
        finally:
            if not handed_back:
                self._finish()

    async def _after(self, rest: list[Request]) -> None:
        """After :meth:`data_received`: the requests it left, backpressure, the budget."""
        if self.closed:
            raise _Closed
        while rest:
            await self._wait_drained()
            rest = await self._process_big(rest)
        if self._outsize > _BATCH_LIMIT:
            await self._wait_drained()
        if self._held or self.parser.buffered:
            await self._account()

    def _finish(self) -> None:
        """The connection ended: close, give back its buffer budget, run on-close actions."""
        self.close()
        self._release_budget()
        self.run_on_close()
        self._host.connections.discard(self)

    async def _finish_later(self) -> None:
        self._finish()

    def _try_recv(self) -> bytes | None:
        """One ``recv`` (``None``: nothing there yet); :class:`OSError` if the socket failed."""
        try:
            return self.sock.recv(RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return None

    async def _wait_for_data(self) -> None:
        """Wait until readable; a half-sent request has ``frame_timeout`` seconds in all."""
        if self.parser.ready or not self._held:
            await anyio.wait_readable(self.sock)
            return
        timeout = self._host.limits.frame_timeout
        with anyio.move_on_after(self._frame_t0 + timeout - anyio.current_time()):
            await anyio.wait_readable(self.sock)
            return
        self.close(
            f"request not completed within frame_timeout={timeout} s "
            f"({self.parser.buffered} bytes of it received)"
        )
        raise _Closed

    async def _account(self) -> None:
        """Count this connection's partial request in the per-connection and total budgets."""
        limits = self._host.limits
        budget = self._host.budget
        held = self.parser.buffered
        limit = limits.max_connection_buffer
        if limit is not None and held > limit:
            self.close(f"a request of more than {limit} bytes held (max_connection_buffer)")
            raise _Closed
        if not self._held and held:
            self._frame_t0 = anyio.current_time()
        budget.hold(self, self._held, held)
        self._held = held
        if not held:
            return
        # over the budget of all connections: stop reading until others complete theirs
        # The oldest partial request completes or times out within frame_timeout,
        # so a wait of twice that is bounded yet outlasts it. The request gets a
        # fresh frame_timeout once it may read again (the pause was ours).
        while not budget.may_buffer(self) and not self.closed:
            with anyio.move_on_after(2 * limits.frame_timeout):
                await budget.wait()
                self._frame_t0 = anyio.current_time()
                continue
            self.close(
                f"no buffer space within 2 x frame_timeout={limits.frame_timeout} s "
                f"(waiting for it: {budget.held} bytes held by all "
                f"connections, max_buffered_bytes={budget.limit})"
            )
            raise _Closed

    def _release_budget(self) -> None:
        self._host.budget.release(self, self._held)
        self._held = 0

    # -- parsing and applying -----------------------------------------------------------

    def data_received(self, data: bytes) -> list[Request]:
        """Apply the requests ``data`` completes; return those left for :meth:`_process_big`.

        Synchronous: the fused fast path and the generic path for requests over a
        bounded number of keys. What is returned starts with a request over many
        keys or was stopped by backpressure (the outbox filled up).
        """
        # Fast path for what torch clients send most: whole SET, GET and WAIT-of-
        # one-present-key requests (a torch set() and the WAIT of the next get()
        # often share a segment), parsed and answered inline while nothing is
        # buffered or parked (``_fast``). Answers are collected and written once
        # per segment. At the first request it does not cover, including every
        # malformed, oversized or partial frame, the rest of the data takes the
        # generic path, which enforces the protocol and the limits. A test checks
        # both paths give identical answers and state on random streams.
        if self._fast:
            pos = 0
            n = len(data)
            store = self._data
            max_key = self._max_key
            out: list[bytes] = []
            size = 0
            while n - pos > 8:
                op, k = _OP_LEN_unpack_from(data, pos)
                if op == 1:  # SET
                    e = pos + 9 + k
                    if k > max_key or e + 8 > n:
                        break
                    vl = _U64_unpack_from(data, e)[0]
                    end = e + 8 + vl
                    if vl > self._max_value or end > n:
                        break
                    key = data[pos + 9 : e]
                    store[key] = data[e + 8 : end]
                    if key in self._key_waiters:
                        # wakes may answer this connection's own WAIT: keep the order
                        if out:
                            self._write(b"".join(out))
                            out.clear()
                        self._state._wake(key)
                elif op == 3:  # GET
                    end = pos + 9 + k
                    if k > max_key or end > n:
                        break
                    v = store.get(data[pos + 9 : end], b"")
                    if len(v) > _FAST_VALUE_LIMIT or size > _BATCH_LIMIT:
                        break  # the generic path applies backpressure
                    size += len(v)
                    out.append(_U64_pack(len(v)) + v)
                elif op == 6:  # WAIT
                    if k != 1 or n - pos < 17:
                        break
                    k = _U64_unpack_from(data, pos + 9)[0]
                    end = pos + 17 + k
                    if k > max_key or end > n or data[pos + 17 : end] not in store:
                        break
                    out.append(_STOP)
                else:
                    break
                pos = end
            if out:
                self._write(out[0] if len(out) == 1 else b"".join(out))
            if pos:
                if pos == n:
                    return []
                data = data[pos:]
        try:
            requests = self.parser.feed(data)
        except ProtocolError as exc:
            self.close(str(exc))
            return []
        rest = self._process(requests) if requests else []
        self._fast = not rest and not self._outbox and self.parser.ready and not self.closed
        return rest

    def _process(self, requests: list[Request]) -> list[Request]:
        """Apply ``requests`` in order and write their answers in one batch.

        Stops at a request over more than :data:`SLICE` keys, or when answers pile
        up in the outbox (a peer that does not read), and returns the requests
        from there on, for :meth:`_process_big`.
        """
        state = self._state
        out: list[bytes] = []
        self._batch = out
        append = out.append
        size = 0
        rest: list[Request] = []
        try:
            for i, req in enumerate(requests):
                if size > _BATCH_LIMIT:
                    self._batch = None
                    self._write(b"".join(out))
                    out.clear()
                    self._batch = out
                    size = 0
                    if self._outbox:
                        rest = requests[i:]
                        break
                op = req[0]
                if op == 1:  # SET
                    state.set(req[1], req[2])
                elif op == 3:  # GET
                    v = state.data.get(req[1], b"")
                    append(_U64.pack(len(v)))
                    append(v)
                    size += len(v)
                elif op in _BIG and len(req[1]) > SLICE:
                    rest = requests[i:]
                    break
                elif op == 6:  # WAIT
                    w = state.add_waiter(req[1], self._stop_waiting)
                    if w is None:
                        append(_STOP)
                    else:
                        self._track(w)
                elif op == 4:  # ADD
                    append(_I64.pack(state.add(req[1], req[2])))
                elif op == 5:  # CHECK
                    append(_READY if state.check(req[1]) else _NOT_READY)
                elif op == 2:  # COMPARE_SET
                    v = state.compare_set(req[1], req[2], req[3])
                    append(_U64.pack(len(v)))
                    append(v)
                    size += len(v)
                elif op == 10:  # MULTI_GET
                    append(encode_bytes_list(state.multi_get(req[1])))
                    size += len(out[-1])
                elif op == 11:  # MULTI_SET
                    state.multi_set(req[1], req[2])
                elif op == 9:  # APPEND
                    self._check_append(req[1], req[2])
                    state.append(req[1], req[2])
                elif op == 8:  # DELETE_KEY
                    append(_ONE if state.delete(req[1]) else _EMPTY_POP)
                elif op == 7:  # GETNUMKEYS
                    append(_I64.pack(state.num_keys()))
                elif op == 12:  # CANCEL_WAIT
                    self._cancel_waits()
                    append(_CANCELED)
                elif op == 13:  # PING
                    append(_U32.pack(req[1]))
                elif op == 14:  # QUEUE_PUSH
                    state.queue_push(req[1], req[2])
                elif op == 15:  # QUEUE_POP
                    v2 = state.queue_pop(req[1])
                    if v2 is None:
                        append(_EMPTY_POP)
                    else:
                        append(_ONE)
                        append(_U64.pack(len(v2)))
                        append(v2)
                        size += len(v2)
                elif op == 16:  # QUEUE_LEN
                    append(_I64.pack(state.queue_len(req[1])))
                elif op == 17:  # LIST_KEYS
                    if state.num_keys() > SLICE:
                        rest = requests[i:]
                        break
                    keys = state.list_keys()
                    append(_I64.pack(len(keys)))
                    append(encode_bytes_list(keys))
                    size += len(out[-1])
                elif op == 18:  # BARRIER
                    w = state.barrier(req[1], req[2], self._stop_waiting)
                    if w is None:
                        append(_STOP)
                    else:
                        self._track(w)
                elif op == 0xA1:  # AE_ON_CLOSE
                    append(_I64.pack(self._register_on_close(req[1], req[2], req[3])))
                elif op == 0xA0:  # AE_HELLO
                    append(_U32.pack(AE_VERSION))
                elif op == 0xA2:  # AE_ON_CLOSE_CANCEL
                    append(_I64.pack(self._cancel_on_close(req[1])))
                elif op == 0xA3:  # AE_GET_WAIT: the value, once the key exists
                    key = req[1]
                    w = state.add_waiter([key], functools.partial(self._answer_get_wait, key))
                    if w is None:
                        v = state.data.get(key, b"")
                        append(_U64.pack(len(v)))
                        append(v)
                        size += len(v)
                    else:
                        self._track(w)
                # op 0 (VALIDATE) needs no answer
        except ValueError as exc:  # ADD on a non-counter, APPEND too long, too many actions
            self._batch = None
            if out:
                self._write(b"".join(out))
            self.close(str(exc))
            return []
        finally:
            self._batch = None
        if out:
            self._write(b"".join(out) if len(out) > 1 else out[0])
        return rest

    async def _process_big(self, requests: list[Request]) -> list[Request]:
        """Apply ``requests[0]`` (maybe over many keys) in slices; then the rest, in sync."""
        req = requests[0]
        op = req[0]
        state = self._state
        if op == 11:  # MULTI_SET
            keys, values = req[1], req[2]
            for i in range(0, len(keys), SLICE):
                state.multi_set(keys[i : i + SLICE], values[i : i + SLICE])
                await anyio.lowlevel.checkpoint()
        elif op == 10:  # MULTI_GET
            keys = req[1]
            for i in range(0, len(keys), SLICE):
                self._write(encode_bytes_list(state.multi_get(keys[i : i + SLICE])))
                await self._wait_drained()
                await anyio.lowlevel.checkpoint()
        elif op == 5:  # CHECK
            keys = req[1]
            ready = True
            for i in range(0, len(keys), SLICE):
                if not state.check(keys[i : i + SLICE]):
                    ready = False
                    break
                await anyio.lowlevel.checkpoint()
            self._write(_READY if ready else _NOT_READY)
        elif op == 6:  # WAIT
            keys = req[1]
            w = state.open_waiter(self._stop_waiting)
            self._track(w)
            for i in range(0, len(keys), SLICE):
                state.extend_waiter(w, keys[i : i + SLICE])
                await anyio.lowlevel.checkpoint()
            if state.close_waiter(w):
                self._write(_STOP)
        elif op == 17:  # LIST_KEYS of a big store
            keys = state.list_keys()
            self._write(_I64.pack(len(keys)))
            for i in range(0, len(keys), SLICE):
                self._write(encode_bytes_list(keys[i : i + SLICE]))
                await self._wait_drained()
                await anyio.lowlevel.checkpoint()
        else:  # stopped by backpressure: the outbox has drained
            return self._process(requests)
        if self.closed:
            raise _Closed
        return self._process(requests[1:])

    def _check_append(self, key: bytes, value: bytes) -> None:
        old = self._state.data.get(key)
        total = len(value) + (0 if old is None else len(old))
        if total > self._max_value:
            raise ValueError(
                f"APPEND would grow key {key[:64]!r} to {total} bytes, above "
                f"max_value_size={self._max_value}"
            )

    def _register_on_close(self, op: int, key: bytes, value: bytes) -> int:
        actions = self._on_close
        if actions is None:
            actions = self._on_close = {}
        if len(actions) >= MAX_ON_CLOSE_ACTIONS:
            raise ValueError(f"more than {MAX_ON_CLOSE_ACTIONS} on-close actions on one connection")
        action_id = self._host.new_action_id()
        actions[action_id] = (op, key, value)
        return action_id

    def _cancel_on_close(self, action_id: int) -> int:
        actions = self._on_close
        if not actions:
            return 0
        if action_id == -1:
            n = len(actions)
            actions.clear()
            return n
        return 1 if actions.pop(action_id, None) is not None else 0

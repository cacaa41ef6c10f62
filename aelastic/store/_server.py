"""``StoreServer``: an asyncio TCP server speaking torch's TCPStore protocol."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import struct
from types import TracebackType
from typing import cast

import anyio

from .._net import is_loopback
from ._ephemeral import MAX_ON_CLOSE_ACTIONS
from ._exceptions import ProtocolError, StoreConfigError, StoreError
from ._local import LocalStore
from ._protocol import (
    AE_VERSION,
    MAX_FRAME_SIZE,
    MAX_KEY_COUNT,
    MAX_KEY_SIZE,
    MAX_VALUE_SIZE,
    Request,
    RequestParser,
    encode_bytes_list,
    encode_string_list,
)
from ._state import StoreState, Waiter

__all__ = ("StoreServer",)

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
#: Responses produced before checking the transport's buffer (backpressure).
_BATCH_LIMIT = 4 * 1024 * 1024
#: Larger GET values skip the fast path (which checks backpressure only between segments).
_FAST_VALUE_LIMIT = 64 * 1024

#: Default maximum number of simultaneous client connections.
MAX_CONNECTIONS = 16384


class _Connection(asyncio.Protocol):
    """One client connection: parse requests, apply them, write responses in order."""

    __slots__ = (
        "_batch",
        "_data",
        "_dropped",
        "_fast",
        "_key_waiters",
        "_max_key",
        "_max_value",
        "_on_close",
        "_pending",
        "_server",
        "_state",
        "_waiters",
        "parser",
        "peer",
        "transport",
    )

    def __init__(self, server: StoreServer) -> None:
        self._server = server
        self._state = server._state
        self.parser = RequestParser(
            max_key_size=server.max_key_size,
            max_value_size=server.max_value_size,
            max_key_count=server.max_key_count,
            max_frame_size=server.max_frame_size,
        )
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self._waiters: list[Waiter] = []
        self._batch: list[bytes] | None = None
        self._max_key = server.max_key_size
        self._max_value = server.max_value_size
        self._pending: list[Request] | None = None
        # data_received may take its fast path: validated, no partial frame, not paused
        self._fast = False
        self._dropped = False
        self._data = self._state.data
        self._key_waiters = self._state._waiters
        # AE_ON_CLOSE actions: id -> (opcode, key, value), performed when the connection closes
        self._on_close: dict[int, tuple[int, bytes, bytes]] | None = None

    # -- asyncio.Protocol ---------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses but quack alike
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        server = self._server
        if len(server._connections) >= server.max_connections:
            logger.warning(
                "store %s: refusing connection from %s: %d connections already open "
                "(max_connections); raise the limit if this is expected",
                server.address,
                self.peer,
                len(server._connections),
            )
            self.transport.abort()
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        server._connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server._connections.discard(self)
        self._cancel_waits()
        self._run_on_close()

    def _run_on_close(self) -> None:
        actions, self._on_close = self._on_close, None
        if not actions or self._server._closing:
            return
        for op, key, value in actions.values():
            try:
                self._state.apply(op, key, value)
            except ValueError as exc:  # ADD on a non-counter: nothing to add to
                logger.warning(
                    "store %s: on-close action of %s skipped: %s",
                    self._server.address,
                    self.peer,
                    exc,
                )

    def _register_on_close(self, op: int, key: bytes, value: bytes) -> int:
        actions = self._on_close
        if actions is None:
            actions = self._on_close = {}
        if len(actions) >= MAX_ON_CLOSE_ACTIONS:
            raise ValueError(f"more than {MAX_ON_CLOSE_ACTIONS} on-close actions on one connection")
        self._server._next_action_id += 1
        action_id = self._server._next_action_id
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

    def resume_writing(self) -> None:
        # the transport drained below its low-water mark: answer the parked requests
        pending = self._pending
        if pending is None or self.transport is None or self.transport.is_closing():
            return
        self._pending = None
        self._process(pending)
        if self._pending is None and not self.transport.is_closing():
            self._fast = self.parser.ready and not self._dropped
            self.transport.resume_reading()

    def eof_received(self) -> bool:
        if self.parser.buffered:
            logger.warning(
                "store %s: closing connection from %s: EOF in the middle of a request "
                "(%d bytes of a half-sent message dropped)",
                self._server.address,
                self.peer,
                self.parser.buffered,
            )
        return False

    def _drop(self, reason: str) -> None:
        logger.warning(
            "store %s: closing connection from %s: %s",
            self._server.address,
            self.peer,
            reason,
        )
        self._fast = False
        self._dropped = True
        self._cancel_waits()
        if self.transport is not None:
            self.transport.abort()

    def _cancel_waits(self) -> None:
        if self._waiters:
            cancel = self._state.cancel_waiter
            for w in self._waiters:
                cancel(w)
            self._waiters = []

    def _stop_waiting(self) -> None:
        batch = self._batch
        if batch is not None:
            batch.append(_STOP)
        elif self.transport is not None:
            self.transport.write(_STOP)

    def _track(self, waiter: Waiter) -> None:
        waiters = self._waiters
        if len(waiters) >= 32:
            waiters = self._waiters = [w for w in waiters if w.active]
        waiters.append(waiter)

    def data_received(self, data: bytes) -> None:
        # Fast path for what torch clients send most: whole SET, GET and WAIT-of-
        # one-present-key requests (a torch set() and the WAIT of the next get()
        # often share a segment), parsed and answered inline while nothing is
        # buffered or parked (``_fast``). Responses are collected and written
        # once per segment. At the first request it does not cover, including
        # every malformed, oversized or partial frame, the rest of the data takes
        # the generic path, which enforces the protocol and the limits. A test
        # checks both paths give identical responses and state on random streams.
        if self._fast:
            pos = 0
            n = len(data)
            store = self._data
            out: list[bytes] = []
            size = 0
            while n - pos > 8:
                op = data[pos]
                if op == 1:  # SET
                    k = _U64_unpack_from(data, pos + 1)[0]
                    e = pos + 9 + k
                    if k > self._max_key or e + 8 > n:
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
                            self.transport.write(b"".join(out))  # type: ignore[union-attr]
                            out.clear()
                        self._state._wake(key)
                elif op == 3:  # GET
                    k = _U64_unpack_from(data, pos + 1)[0]
                    end = pos + 9 + k
                    if k > self._max_key or end > n:
                        break
                    v = store.get(data[pos + 9 : end], b"")
                    if len(v) > _FAST_VALUE_LIMIT or size > _BATCH_LIMIT:
                        break  # the generic path applies backpressure
                    size += len(v)
                    out.append(_U64_pack(len(v)) + v)
                elif op == 6:  # WAIT
                    if n - pos < 17 or _U64_unpack_from(data, pos + 1)[0] != 1:
                        break
                    k = _U64_unpack_from(data, pos + 9)[0]
                    end = pos + 17 + k
                    if k > self._max_key or end > n or data[pos + 17 : end] not in store:
                        break
                    out.append(_STOP)
                else:
                    break
                pos = end
            if out:
                self.transport.write(  # type: ignore[union-attr]
                    out[0] if len(out) == 1 else b"".join(out)
                )
            if pos:
                if pos == n:
                    return
                data = data[pos:]
        elif self._pending is not None:  # paused for backpressure: queue, do not answer
            try:
                self._pending.extend(self.parser.feed(data))
            except ProtocolError as exc:
                self._drop(str(exc))
            return
        try:
            requests = self.parser.feed(data)
        except ProtocolError as exc:
            self._drop(str(exc))
            return
        if requests:
            self._process(requests)
        self._fast = self._pending is None and self.parser.ready and not self._dropped

    def _process(self, requests: list[Request]) -> None:
        """Apply ``requests`` in order and write their responses in one batch.

        If the responses pile up in the transport (a peer that does not read),
        the remaining requests are parked in ``_pending`` and reading is paused
        until the transport drains (:meth:`resume_writing`).
        """
        state = self._state
        out: list[bytes] = []
        self._batch = out
        append = out.append
        size = 0
        try:
            for i, req in enumerate(requests):
                if size > _BATCH_LIMIT and self.transport is not None:
                    self.transport.write(b"".join(out))
                    out.clear()
                    size = 0
                    if self.transport.get_write_buffer_size() > _BATCH_LIMIT:
                        self._pending = requests[i:]
                        self.transport.pause_reading()
                        return
                op = req[0]
                if op == 1:  # SET
                    state.set(req[1], req[2])
                elif op == 3:  # GET
                    v = state.data.get(req[1], b"")
                    append(_U64.pack(len(v)))
                    append(v)
                    size += len(v)
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
                    append(encode_string_list(state.list_keys()))
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
                # op 0 (VALIDATE) needs no answer
        except ValueError as exc:  # ADD on a non-integer value, too many on-close actions
            self._batch = None
            if out and self.transport is not None:
                self.transport.write(b"".join(out))
            self._drop(str(exc))
            return
        self._batch = None
        if out and self.transport is not None:
            self.transport.write(b"".join(out) if len(out) > 1 else out[0])


class StoreServer:
    """A TCPStore-compatible key-value server on asyncio.

    ::

        async with StoreServer("127.0.0.1", 0) as server:
            print(server.address)          # "127.0.0.1:41234"
            await server.local_store.set("k", "v")   # in-process, no TCP

    Unmodified ``torch.distributed.TCPStore(host, port, is_master=False)`` clients
    and :class:`~aelastic.store.TCPStoreClient` can connect. Listening starts in
    ``__aenter__`` and stops in ``__aexit__``, which is shielded from
    cancellation: every client connection is closed, so clients blocked in
    ``WAIT``/``GET`` see the connection drop and raise (ours raise
    :class:`~aelastic.store.StoreConnectionError` naming the endpoint) instead of
    hanging; blocked calls on :attr:`local_store` raise
    :class:`~aelastic.store.StoreClosedError`.

    A connection that sends bytes which are not a valid request (first message
    not ``VALIDATE``, unknown opcode, length above ``max_key_size`` /
    ``max_value_size`` / ``max_key_count``, ADD on a non-integer, EOF mid-request)
    is closed with a warning on the ``aelastic.store`` logger naming the peer
    and the reason; other connections and the stored data are unaffected.

    Binding to a non-loopback ``host`` requires ``allow_non_loopback=True``
    (the store has no authentication); ``host="::"`` then listens dual-stack.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_key_size: int = MAX_KEY_SIZE,
        max_value_size: int = MAX_VALUE_SIZE,
        max_key_count: int = MAX_KEY_COUNT,
        max_frame_size: int = MAX_FRAME_SIZE,
        max_connections: int = MAX_CONNECTIONS,
        allow_non_loopback: bool = False,
        backlog: int | None = None,
    ) -> None:
        if not allow_non_loopback and not is_loopback(host):
            raise StoreConfigError(
                f"refusing to listen on non-loopback address {host!r}: the store has no "
                "authentication; pass allow_non_loopback=True (--allow-non-loopback) to "
                "expose it, or use 127.0.0.1"
            )
        if not 0 <= port <= 65535:
            raise StoreConfigError(f"port {port} is out of range 0-65535")
        for name, value in (
            ("max_key_size", max_key_size),
            ("max_value_size", max_value_size),
            ("max_key_count", max_key_count),
            ("max_frame_size", max_frame_size),
            ("max_connections", max_connections),
        ):
            if value <= 0:
                raise StoreConfigError(f"{name} must be positive, got {value}")
        self.host = "127.0.0.1" if host == "localhost" else host
        self.port = port
        self.max_key_size = max_key_size
        self.max_value_size = max_value_size
        self.max_key_count = max_key_count
        self.max_frame_size = max_frame_size
        self.max_connections = max_connections
        self.backlog = backlog if backlog is not None else max(socket.SOMAXCONN, 4096)
        self._state = StoreState()
        self._connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None
        self._closing = False
        self._next_action_id = 0
        self.local_store = LocalStore(_state=self._state, name=f"{self.host}:{port}")

    @property
    def address(self) -> str:
        """``host:port`` with the bound port (``[v6]:port`` for IPv6 literals)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def num_connections(self) -> int:
        """Number of open client connections."""
        return len(self._connections)

    def __repr__(self) -> str:
        return f"StoreServer({self.address!r})"

    def _make_socket(self) -> socket.socket:
        host = self.host
        if host in ("", "::"):
            # dual-stack like torch's server; IPv4 only where IPv6 is unavailable
            try:
                return self._bind(socket.AF_INET6, ("::", self.port), dual_stack=True)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise
            self.host = "0.0.0.0"
            return self._bind(socket.AF_INET, ("0.0.0.0", self.port))
        if ":" in host:
            return self._bind(socket.AF_INET6, (host, self.port))
        return self._bind(socket.AF_INET, (host, self.port))

    @staticmethod
    def _bind(family: int, addr: tuple[str, int], dual_stack: bool = False) -> socket.socket:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if dual_stack:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(addr)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock

    async def start(self) -> None:
        """Bind and start listening (what ``__aenter__`` does)."""
        if self._server is not None:
            raise StoreConfigError(f"store server {self.address} is already started")
        try:
            sock = self._make_socket()
        except OSError as exc:
            raise StoreError(
                f"cannot listen on {self.address}: {exc.strerror or exc}; choose another "
                "port or use port 0 for a free one"
            ) from None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), sock=sock, backlog=self.backlog
        )
        self.port = sock.getsockname()[1]
        self.local_store.name = self.address
        logger.info("store listening on %s", self.address)

    async def aclose(self) -> None:
        """Stop listening and close every connection. Idempotent, shielded from cancellation."""
        with anyio.CancelScope(shield=True):
            server, self._server = self._server, None
            self._closing = True
            await self.local_store.aclose()
            if server is None:
                return
            server.close()
            for conn in list(self._connections):
                conn._cancel_waits()
                if conn.transport is not None:
                    conn.transport.abort()
            self._connections.clear()
            await server.wait_closed()
            logger.info("store %s stopped", self.address)

    async def __aenter__(self) -> StoreServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def serve_forever(self) -> None:
        """Run until cancelled (the server must be started)."""
        if self._server is None:
            raise StoreConfigError("call start() or use 'async with' before serve_forever()")
        await anyio.sleep_forever()

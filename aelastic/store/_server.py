"""``StoreServer``: a TCP server speaking torch's TCPStore protocol, on any anyio backend."""

from __future__ import annotations

import errno
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
from anyio import AsyncContextManagerMixin
from anyio.abc import TaskGroup, TaskStatus

from .._net import is_loopback
from .._tasks import background_tasks
from ._dispatch import open_dispatcher
from ._exceptions import StoreConfigError, StoreError
from ._limits import (
    FRAME_TIMEOUT,
    MAX_BUFFERED_BYTES,
    MAX_CONNECTIONS,
    ConnectionHost,
    StoreLimits,
)
from ._local import LocalStore
from ._protocol import MAX_KEY_COUNT, MAX_KEY_SIZE, MAX_VALUE_SIZE
from ._server_conn import _Connection
from ._state import StoreState

__all__ = ("StoreServer",)

logger = logging.getLogger("aelastic.store")


class StoreServer(AsyncContextManagerMixin):
    """A TCPStore-compatible key-value server, on asyncio, uvloop or trio (anyio).

    ::

        async with StoreServer("127.0.0.1", 0) as server:
            print(server.address)          # "127.0.0.1:41234"
            await server.local_store.set("k", "v")   # in-process, no TCP

    Unmodified ``torch.distributed.TCPStore(host, port, is_master=False)`` clients
    and :class:`~aelastic.store.TCPStoreClient` can connect. The server listens for
    the length of its ``async with`` block, or of its :meth:`serve` task
    (``port = await tg.start(server.serve)``); :meth:`start` and :meth:`aclose` are
    shims for code that cannot nest. Listening starts on entering and stops on
    leaving, in the same task: the server runs its connections in a task group of
    its own. Cancelling ``__aenter__`` at any point leaves no listening
    socket behind (the socket is bound and listening only after the last await).
    ``__aexit__`` works under cancellation and ends at once: every client
    connection is closed, so clients blocked in ``WAIT``/``GET`` see the
    connection drop and raise (ours raise
    :class:`~aelastic.store.StoreConnectionError` naming the endpoint) instead of
    hanging; blocked calls on :attr:`local_store` raise
    :class:`~aelastic.store.StoreClosedError`.

    A connection that sends bytes which are not a valid request (first message
    not ``VALIDATE``, unknown opcode, length above ``max_key_size`` /
    ``max_value_size`` / ``max_key_count`` / ``max_frame_size`` when set, ADD on a
    non-integer, APPEND beyond ``max_value_size``, EOF mid-request) is closed with
    a warning on the ``aelastic.store`` logger naming the peer and the reason;
    other connections and the stored data are unaffected.

    **Limits.** The defaults accept every request torch's (libuv) server accepts:
    keys up to 8 KiB, values up to 8 MiB, 128 Ki keys per request, and no bound on
    a whole request (``max_frame_size``) or on the partial request held for one
    connection (``max_connection_buffer``); set those two to close a connection
    that sends more. :attr:`limits` holds them all (a ``StoreLimits``).

    **Memory.** Bounded by back-pressure, not by closing connections: the server
    holds at most ``max_buffered_bytes`` (48 MiB) of partial requests for all
    connections together, plus the oldest one's, which may always progress. A
    connection whose partial request would exceed the total stops being read (its
    bytes wait in the kernel and then in its sender) until the older ones complete
    or time out (at most 2 x ``frame_timeout``; it then gets a fresh
    ``frame_timeout``). A request must be complete ``frame_timeout`` (30 s) after
    its first byte, and the first request (``VALIDATE``) must arrive within
    ``frame_timeout`` of connecting, or the connection is closed. Answers a peer
    does not read are not buffered beyond ~4 MiB per connection (it is not read
    meanwhile). So the
    server's memory is its data (keys, values, queues) plus at most
    ``max_buffered_bytes`` + the oldest partial request + ``max_connections`` x
    (64 KiB receive + 4 MiB answers in flight, only for peers that send requests
    without reading) + ~10 KiB per connection.

    ``task_group``: run the connections in this (running) task group instead of
    one of the server's own, which frees the server from being entered and left
    by the same task (see :meth:`start`).

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
        max_frame_size: int | None = None,
        max_connection_buffer: int | None = None,
        max_buffered_bytes: int = MAX_BUFFERED_BYTES,
        frame_timeout: float = FRAME_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
        allow_non_loopback: bool = False,
        backlog: int | None = None,
        task_group: TaskGroup | None = None,
    ) -> None:
        if not allow_non_loopback and not is_loopback(host):
            raise StoreConfigError(
                f"refusing to listen on non-loopback address {host!r}: the store has no "
                "authentication; pass allow_non_loopback=True (--allow-non-loopback) to "
                "expose it, or use 127.0.0.1"
            )
        if not 0 <= port <= 65535:
            raise StoreConfigError(f"port {port} is out of range 0-65535")
        self.limits = StoreLimits(
            max_key_size=max_key_size,
            max_value_size=max_value_size,
            max_key_count=max_key_count,
            max_frame_size=max_frame_size,
            max_connection_buffer=max_connection_buffer,
            max_buffered_bytes=max_buffered_bytes,
            frame_timeout=frame_timeout,
            max_connections=max_connections,
        )
        self.host = "127.0.0.1" if host == "localhost" else host
        self.port = port
        self.backlog = backlog if backlog is not None else max(socket.SOMAXCONN, 4096)
        self._state = StoreState()
        self._hub = ConnectionHost(self._state, self.limits, self._spawn)
        self._hub.address = self.address
        self._connections: set[_Connection] = self._hub.connections
        self._listener: socket.socket | None = None
        self._task_group = task_group
        self._tg: TaskGroup | None = None
        self._stopped: anyio.Event | None = None
        self.local_store = LocalStore(_state=self._state, name=self.address)

    @property
    def address(self) -> str:
        """``host:port`` with the bound port (``[v6]:port`` for IPv6 literals)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def num_connections(self) -> int:
        """Number of open client connections."""
        return len(self._connections)

    @property
    def buffered_bytes(self) -> int:
        """Bytes of partial requests held for all connections (at most ``max_buffered_bytes``
        plus one connection's last receive)."""
        return self._hub.budget.held

    def __repr__(self) -> str:
        return f"StoreServer({self.address!r})"

    # -- listening socket -------------------------------------------------------------

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

    def _bind(self, family: int, addr: tuple[str, int], dual_stack: bool = False) -> socket.socket:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if dual_stack:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(addr)
            sock.setblocking(False)
            sock.listen(self.backlog)
        except BaseException:
            sock.close()
            raise
        return sock

    # -- lifetime ---------------------------------------------------------------------

    @asynccontextmanager
    async def __asynccontextmanager__(self) -> AsyncIterator[StoreServer]:
        """Listen for the block (``async with server:``); see the class docstring.

        The connections run in ``task_group`` if one was given, else in a task group
        of the block's own (an error of the block leaves as itself, not in a group).
        Raises :class:`~aelastic.store.StoreError` if the address cannot be bound.
        """
        given = self._task_group
        if given is not None:
            self._listen(given)
            try:
                yield self
            finally:
                # our tasks end by themselves in the given group: their sockets are closed
                self._stop()
                self._tg = None
            return
        async with background_tasks() as tg:  # cancelled and joined at the end of the block
            self._listen(tg)
            try:
                yield self
            finally:
                self._stop()
                self._tg = None

    def _listen(self, tg: TaskGroup) -> None:
        """Bind, listen and accept in ``tg``; no await, so a cancelled start leaves no socket."""
        try:
            sock = self._make_socket()
        except OSError as exc:
            raise StoreError(
                f"cannot listen on {self.address}: {exc.strerror or exc}; choose another "
                "port or use port 0 for a free one"
            ) from None
        self._tg = tg
        self._listener = sock
        self._stopped = anyio.Event()
        self._hub.closing = False
        self.port = sock.getsockname()[1]
        self.local_store.name = self._hub.address = self.address
        dispatcher = self._hub.dispatcher = open_dispatcher()
        if dispatcher is not None:
            tg.start_soon(dispatcher.run)
        tg.start_soon(self._accept_loop, sock)
        tg.start_soon(self._sweep_unvalidated, self._stopped)
        logger.info("store listening on %s", self.address)

    async def _sweep_unvalidated(self, stopped: anyio.Event) -> None:
        """Close connections that sent no ``VALIDATE`` within ``frame_timeout`` of their
        accept (an idle or slow stranger must not hold a connection slot forever); a
        check every quarter of ``frame_timeout`` until the server stops."""
        timeout = self.limits.frame_timeout
        while not stopped.is_set():
            with anyio.move_on_after(timeout / 4):
                await stopped.wait()
            now = time.monotonic()
            for conn in list(self._connections):
                if (
                    not conn.closed
                    and not conn.parser.validated
                    and now - conn.accepted_at > timeout
                ):
                    conn.close(f"no VALIDATE within frame_timeout={timeout} s of connecting")

    async def serve(self, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled or :meth:`aclose`; report the bound port to ``tg.start``.

        ::

            async with anyio.create_task_group() as tg:
                port = await tg.start(StoreServer("127.0.0.1", 0).serve)

        Raises :class:`~aelastic.store.StoreError` (from ``tg.start``) if the address
        cannot be bound. Cancelling the task stops the server like leaving its
        ``async with`` block: at once, closing every connection.
        """
        async with self:
            stopped = self._stopped
            assert stopped is not None  # set by _listen
            task_status.started(self.port)
            await stopped.wait()

    async def start(self) -> None:
        """Bind and start listening: ``await server.__aenter__()``, for code that cannot
        use ``async with`` (leave with ``await server.__aexit__(None, None, None)``).

        Without ``task_group``, the server's connections run in a task group
        entered here and joined by ``__aexit__``, which the same task must await,
        nested like any cancel scope: use ``async with`` (or an ``AsyncExitStack``
        entered and left by one task), or :meth:`serve` in a task group. With
        ``task_group`` (a running group that outlives the server) they run there and
        the server may be entered and left from any tasks and scopes. Raises
        :class:`~aelastic.store.StoreError` if the address cannot be bound;
        cancelled, it leaves nothing behind (no await after the socket exists).
        """
        if self._tg is not None:
            raise StoreConfigError(f"store server {self.address} is already started")
        await self.__aenter__()

    async def aclose(self) -> None:
        """Stop listening and close every connection; usable from any task.

        Idempotent and without awaiting anything that can block: sockets are
        closed, blocked :attr:`local_store` calls raise, the connection tasks
        end (their sockets are closed under them), and :meth:`serve` returns.
        Leaving the ``async with`` block then cancels and joins them: every await
        in them is cancellable, so that join ends at their next checkpoint and
        needs no shield.
        """
        self._stop()

    def _stop(self) -> None:
        self._hub.closing = True
        self.local_store.close()
        listener, self._listener = self._listener, None
        if listener is not None:
            anyio.notify_closing(listener)
            listener.close()
            logger.info("store %s stopped", self.address)
        dispatcher, self._hub.dispatcher = self._hub.dispatcher, None
        if dispatcher is not None:
            dispatcher.close()
        for conn in list(self._connections):
            conn.close()  # wakes its task (and its drain) with ClosedResourceError
        self._connections.clear()
        self._hub.budget.wake()
        if self._stopped is not None:
            self._stopped.set()

    async def serve_forever(self) -> None:
        """Run until cancelled (the server must be started; :meth:`serve` also starts it)."""
        if self._tg is None:
            raise StoreConfigError("call start() or use 'async with' before serve_forever()")
        await anyio.sleep_forever()

    # -- connections ------------------------------------------------------------------

    async def _accept_loop(self, listener: socket.socket) -> None:
        while self._listener is listener:  # not stopped (maybe before this task first ran)
            try:
                await anyio.wait_readable(listener)
            except (anyio.ClosedResourceError, OSError, ValueError):
                return
            for _ in range(64):  # a burst of connections, then let them run
                try:
                    sock, addr = listener.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as exc:
                    if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                        logger.warning(
                            "store %s: cannot accept connections: %s; retrying in 0.1 s",
                            self.address,
                            exc,
                        )
                        await anyio.sleep(0.1)  # out of descriptors: a back-off, not a sync
                        break
                    if exc.errno in (errno.EBADF, errno.EINVAL):
                        return  # the listener was closed
                    break  # ECONNABORTED and friends: that one is gone
                self._admit(sock, addr)

    def _admit(self, sock: socket.socket, addr: object) -> None:
        peer = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)
        if len(self._connections) >= self.limits.max_connections or self._tg is None:
            logger.warning(
                "store %s: refusing connection from %s: %d connections already open "
                "(max_connections); raise the limit if this is expected",
                self.address,
                peer,
                len(self._connections),
            )
            sock.close()
            return
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            sock.close()
            return
        conn = _Connection(self._hub, sock, peer)
        self._connections.add(conn)
        if self._hub.dispatcher is not None:
            conn.dispatched = True
            self._hub.dispatcher.adopt(conn, sock.fileno())
        else:
            self._tg.start_soon(self._guarded, conn.serve, conn)

    async def _guarded(self, func: Callable[[], Awaitable[None]], conn: _Connection) -> None:
        # the task group encloses the host's code: a bug in one connection must not
        # cancel it (nor the other connections)
        try:
            await func()
        except Exception:
            logger.exception("store %s: connection from %s failed", self.address, conn.peer)
            conn.close()

    def _spawn(self, func: Callable[[], Awaitable[None]], conn: _Connection) -> None:
        """Run ``func`` (a connection's task or outbox drain) in the server's task group."""
        if self._tg is not None:
            self._tg.start_soon(self._guarded, func, conn)

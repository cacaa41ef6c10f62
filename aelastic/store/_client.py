"""``TCPStoreClient``: an async client of torch's TCPStore protocol.

Concurrency design
------------------
One client object is shared by many tasks. Non-blocking requests (SET, ADD,
CHECK, GET of a present key, ...) are **pipelined** on one *main* connection:
requests of tasks running in one event-loop iteration leave in one send, and
responses are matched to requests in order, because both torch's server and
ours answer requests of one connection in order (see ``_client_conn``).
Requests of 64 concurrent tasks therefore share a handful of TCP segments. No
background task: on asyncio (and uvloop) a loop callback reads each connection,
registered once; on trio the waiting tasks take turns reading (see ``_client_conn``).

A server answers ``WAIT`` only once the keys exist, which would stall every
later request on a pipelined connection. So calls that may block (``get``,
``wait``, ``multi_get``, ``queue_pop`` of missing keys, ``barrier_arrive``)
first try a non-blocking fast path on the main connection (``CHECK`` + ``GET``
pipelined in one round trip) and only if the keys are missing borrow a
**dedicated pooled connection** on which they send ``WAIT``. A blocked task thus
never delays other tasks. A ``get`` sends ``AE_GET_WAIT`` there instead of
``WAIT`` then ``GET`` (one round trip, not two) where the server answered
``AE_HELLO`` with version 2 or later, i.e. once a session was opened on it. When
such a wait times out or is cancelled, its pooled connection is closed rather
than reused: the server drops a closed connection's waits, which is simpler and
race-free compared to the ``CANCEL_WAIT`` dance (whose answer may race a
``STOP_WAITING``). The client stays usable; the next blocking call opens a fresh
connection. Each call that is actually blocked holds one pooled connection (idle
ones are kept up to ``max_idle_connections``), so N simultaneously blocked tasks
use N + 1 connections to the server.

The main connection has a response watchdog: if the server leaves a request
unanswered for ``timeout`` seconds the connection is failed with
:class:`~aelastic.store.StoreTimeoutError` (never a silent hang), and the next
call reconnects.

All keys are sent with torch's ``/`` prefix (like ``torch.distributed.TCPStore``)
so our clients and torch's read and write the same keys.
"""

# The Store API takes per-call timeouts (torch parity), hence ASYNC109.
# ruff: noqa: ASYNC109
from __future__ import annotations

import contextlib
import os
import random
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio

from . import _protocol as P
from ._client_conn import Replies, _Conn, connect_socket
from ._ephemeral import MAX_ON_CLOSE_ACTIONS, action_opcode
from ._exceptions import (
    NotAStoreError,
    QueueEmptyError,
    StoreClosedError,
    StoreConnectionError,
    StoreError,
    StoreLimitError,
    StoreTimeoutError,
    StoreUnsupportedError,
)
from ._interface import DEFAULT_TIMEOUT, EphemeralSession, OnCloseAction, Store, Value, to_bytes
from ._local import KEY_PREFIX, describe_keys, strip_prefix

__all__ = ("TCPStoreClient",)

_Replies = Replies
_U8 = ((P.Reply.U8, 0),)
_I64 = ((P.Reply.I64, 0),)
_BYTES = ((P.Reply.BYTES, 0),)
_CHECK_GET = ((P.Reply.U8, 0), (P.Reply.BYTES, 0))
_POP = ((P.Reply.QUEUE_POP, 0),)
_LIST = ((P.Reply.STRING_LIST, 0),)
_U32 = ((P.Reply.U32, 0),)
#: First bytes of other servers' greetings or refusals, and what they are.
_KNOWN_HEADS = (
    (b"HTTP/", "an HTTP server"),
    (b"SSH-", "an SSH server"),
    (b"\x15\x03", "a TLS server"),
    (b"-ERR", "a Redis server"),
)


def _not_a_store(head: bytes, endpoint: str) -> NotAStoreError:
    """The error of a handshake answered by ``head``: names what it looks like."""
    what = next((name for prefix, name in _KNOWN_HEADS if head.startswith(prefix)), None)
    looks = f"it looks like {what}" if what else "not a TCPStore server (torch >= 2.4)"
    return NotAStoreError(
        f"the endpoint answered the store handshake with {head[:32]!r}: {looks}; check the "
        "address and port (another service may hold them)",
        endpoint=endpoint,
        head=head,
    )


def _describe(error: BaseException | None, connected: bool) -> str:
    """A failed attempt's cause for the message (some backends' errors have empty text)."""
    if isinstance(error, TimeoutError) and connected:
        return "connected, but the server did not answer the store handshake"
    if error is None:
        return "none"
    return str(error) or type(error).__name__


class TCPStoreClient(Store):
    """Async client of a TCPStore server (ours, or torch's own).

    ::

        async with TCPStoreClient("127.0.0.1", 29400, timeout=30) as store:
            await store.set("k", "v")
            assert await store.get("k") == b"v"

    ``__aenter__`` connects, retrying with exponential backoff and jitter for up
    to ``connect_timeout`` seconds, then raises
    :class:`~aelastic.store.StoreConnectionError` naming the endpoint. Many
    tasks may use one client at once (see the module docstring for how blocking
    calls avoid stalling the others). Blocking calls raise
    :class:`~aelastic.store.StoreTimeoutError` after ``timeout`` (default
    :attr:`timeout`), :class:`~aelastic.store.StoreConnectionError` if the
    connection is lost (e.g. the server stops) and
    :class:`~aelastic.store.StoreClosedError` if the client is closed meanwhile.
    Cancelling any call leaves the client usable. If the main connection is
    lost, pending calls fail and the next call reconnects; once the client has
    been connected, a *refused* reconnect fails at once (the server is gone and
    its in-memory data with it) instead of retrying for ``connect_timeout``.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = 60.0,
        max_idle_connections: int = 8,
    ) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.max_idle_connections = max_idle_connections
        self.endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._main: _Conn | None = None
        self._main_lock: anyio.Lock | None = None
        self._idle: list[_Conn] = []
        self._busy: set[_Conn] = set()
        self._sessions: set[_Conn] = set()
        self._closed = False
        self._was_connected = False
        # aelastic extensions version the server answered AE_HELLO with (0: unknown)
        self._ae_version = 0

    def __repr__(self) -> str:
        return f"TCPStoreClient({self.endpoint!r})"

    # -- connection management ----------------------------------------------

    @classmethod
    async def aconnect(
        cls,
        host: str,
        port: int,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = 60.0,
    ) -> TCPStoreClient:
        """Create a client and connect it; the caller must ``aclose()`` it."""
        client = cls(host, port, timeout=timeout, connect_timeout=connect_timeout)
        await client.connect()
        return client

    async def connect(self) -> None:
        """Open the main connection now (otherwise done by the first call)."""
        await self._get_main()

    async def __aenter__(self) -> TCPStoreClient:
        await self.connect()
        return self

    async def _open(self) -> _Conn:
        """Connect + VALIDATE + PING, retrying with backoff and jitter until the deadline."""
        deadline = anyio.current_time() + self.connect_timeout
        delay = 0.02
        attempts = 0
        last: BaseException | None = None
        connected = False  # the last attempt's TCP connection was made
        while True:
            if self._closed:
                raise StoreClosedError("the client is closed", endpoint=self.endpoint)
            attempts += 1
            remaining = deadline - anyio.current_time()
            conn: _Conn | None = None
            try:
                with anyio.fail_after(max(remaining, 0.001)):
                    conn = _Conn(await connect_socket(self.host, self.port), self.endpoint)
                    nonce = os.getpid() & 0xFFFFFFFF
                    conn.queue(P.request_validate())
                    echoed = await conn.result(conn.request(P.request_ping(nonce), _U32))
                if echoed != nonce:
                    raise _not_a_store(conn.head, self.endpoint)
                self._was_connected = True
                return conn
            except NotAStoreError:
                assert conn is not None
                conn.close()
                raise
            except (OSError, StoreConnectionError, TimeoutError) as exc:
                connected = conn is not None
                if conn is not None:
                    conn.close()
                    if conn.head:  # it answered, with bytes that are no PING reply
                        raise _not_a_store(conn.head, self.endpoint) from None
                last = exc
                if isinstance(exc, ConnectionRefusedError) and self._was_connected:
                    raise StoreConnectionError(
                        "the store server has stopped (reconnect refused); its data is gone",
                        endpoint=self.endpoint,
                    ) from exc
            except BaseException:  # cancelled mid-handshake: do not leak the socket
                if conn is not None:
                    conn.close()
                raise
            remaining = deadline - anyio.current_time()
            if remaining <= 0:
                raise StoreConnectionError(
                    f"could not connect within {self.connect_timeout} s "
                    f"({attempts} attempts; last error: {_describe(last, connected)}); is the "
                    "store running there?",
                    endpoint=self.endpoint,
                )
            await anyio.sleep(min(delay * random.uniform(0.5, 1.0), remaining))
            delay = min(delay * 2, 2.0)

    async def _get_main(self) -> _Conn:
        main = self._main
        if main is not None and main.error is None:
            return main
        if self._closed:
            raise StoreClosedError("the client is closed", endpoint=self.endpoint)
        if self._main_lock is None:
            self._main_lock = anyio.Lock()
        async with self._main_lock:
            main = self._main
            if main is None or main.error is not None:
                main = await self._open()
                if self._closed:  # closed while we were connecting
                    main.close()
                    raise StoreClosedError("the client is closed", endpoint=self.endpoint)
                self._main = main
                main.watch(self.timeout)
            return main

    async def _borrow(self) -> _Conn:
        while self._idle:
            conn = self._idle.pop()
            if not conn.peer_closed():
                self._busy.add(conn)
                return conn
            conn.close()
        conn = await self._open()
        if self._closed:
            conn.close()
            raise StoreClosedError("the client is closed", endpoint=self.endpoint)
        self._busy.add(conn)
        return conn

    def _release(self, conn: _Conn, reusable: bool) -> None:
        self._busy.discard(conn)
        if (
            reusable
            and not self._closed
            and conn.error is None
            and len(self._idle) < self.max_idle_connections
        ):
            self._idle.append(conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        """Close every connection; pending calls raise StoreClosedError. Idempotent.

        Requests already issued without a reply (``set``, ``append``, ``multi_set``,
        ``queue_push``) are still sent before the connections close.
        """
        self._closed = True
        conns = [*self._idle, *self._busy, *self._sessions]
        if self._main is not None:
            conns.append(self._main)
        self._idle.clear()
        self._busy.clear()
        self._sessions.clear()
        self._main = None
        for conn in conns:
            conn.close(graceful=True)

    @contextlib.asynccontextmanager
    async def ephemeral(self) -> AsyncIterator[EphemeralSession]:
        """An ephemeral session on a connection of its own (see :class:`EphemeralSession`).

        Entering opens the connection and checks that the server knows aelastic's
        extensions (``AE_HELLO``); torch's own server drops the connection on it,
        which raises :class:`~aelastic.store._exceptions.StoreUnsupportedError` at once,
        before anything is registered. Leaving the block closes the connection:
        the server then performs the actions still registered. If the client
        process dies, the kernel closes the connection and the same happens.
        """
        conn = await self._open()
        self._sessions.add(conn)
        try:
            try:
                version = await conn.result(conn.request(P.request_ae_hello(), _U32))
            except StoreConnectionError:
                raise StoreUnsupportedError(
                    "the store server does not support ephemeral sessions (aelastic "
                    "extension AE_HELLO refused; torch's own TCPStore server does this): "
                    "use heartbeat keys instead, or an aelastic StoreServer",
                    endpoint=self.endpoint,
                ) from None
            if version < 1:
                raise StoreUnsupportedError(
                    f"the store server speaks aelastic extensions version {version}, need 1",
                    endpoint=self.endpoint,
                )
            self._ae_version = version
            yield _TCPEphemeralSession(self, conn)
        finally:
            self._sessions.discard(conn)
            conn.close(graceful=True)

    # -- request helpers ------------------------------------------------------------

    def _k(self, key: str) -> bytes:
        return (KEY_PREFIX + key).encode()

    def _error(self, exc: StoreError, what: str, key: str | None) -> StoreError:
        msg = str(exc)
        if key is not None and "key" not in what:
            what = f"{what} of key {key!r}"
        suffix = f" [store {self.endpoint}]"
        if msg.endswith(suffix):
            msg = msg[: -len(suffix)]
        return type(exc)(f"{what}: {msg}", endpoint=self.endpoint, key=key)

    async def _call(self, data: bytes, replies: _Replies, what: str, key: str | None) -> Any:
        """Send a request on the main connection; return its reply (a list for several)."""
        conn = self._main
        if conn is None or conn.error is not None:
            conn = await self._get_main()
        try:
            return await conn.result(conn.request(data, replies))
        except (StoreConnectionError, StoreClosedError, StoreTimeoutError) as exc:
            raise self._error(exc, what, key) from None

    async def _send(self, data: bytes, what: str, key: str | None) -> None:
        conn = self._main
        if conn is None or conn.error is not None:
            conn = await self._get_main()
        try:
            await conn.send(data)
        except (StoreConnectionError, StoreClosedError) as exc:
            raise self._error(exc, what, key) from None

    async def _blocking(
        self,
        keys: Sequence[str],
        raw: Sequence[bytes],
        timeout: float | None,
        then: bytes | None,
        then_replies: _Replies,
        *,
        deadline: float | None = None,
        get_wait: bool = False,
    ) -> Any:
        """WAIT for ``raw`` on a pooled connection, then send ``then`` on it.

        With ``get_wait`` (one key, a server known to answer AE_GET_WAIT), one
        AE_GET_WAIT request does both: its answer is the key's value.
        """
        what = f"waiting for {describe_keys(keys)}"
        key = keys[0] if len(keys) == 1 else None
        t = self.timeout if timeout is None else timeout
        if deadline is None:
            deadline = anyio.current_time() + t
        conn = await self._borrow()
        reusable = False
        try:
            if get_wait:
                slot = conn.request(P.request_get_wait(raw[0]), _BYTES)
            else:
                slot = conn.request(P.request_wait(raw), _U8)
            with anyio.move_on_after(deadline - anyio.current_time()) as scope:
                answer = await conn.result(slot)
            if scope.cancelled_caught:
                raise StoreTimeoutError(
                    f"timed out after {t} s {what}", endpoint=self.endpoint, key=key
                )
            if get_wait:
                reusable = True
                return answer
            if answer != P.STOP_WAITING:
                raise StoreConnectionError(
                    f"server answered WAIT with {answer}, expected STOP_WAITING",
                    endpoint=self.endpoint,
                    key=key,
                )
            result = None
            if then is not None:
                result = await conn.result(conn.request(then, then_replies))
            reusable = True
            return result
        except StoreClosedError as exc:
            raise self._error(exc, f"closed while {what}", key) from None
        except StoreConnectionError as exc:
            raise self._error(exc, what, key) from None
        finally:
            self._release(conn, reusable)

    # -- Store API ------------------------------------------------------------

    async def set(self, key: str, value: Value) -> None:
        await self._send(P.request_set(self._k(key), to_bytes(value)), "set", key)

    async def get(self, key: str, *, timeout: float | None = None) -> bytes:
        raw = self._k(key)
        ready, value = await self._call(
            P.request_check([raw]) + P.request_get(raw), _CHECK_GET, "get", key
        )
        if ready == P.CHECK_READY:
            result: bytes = value
            return result
        # Where the server answers AE_GET_WAIT (learnt when a session was opened),
        # the wait and the read are one round trip instead of two.
        get_wait = self._ae_version >= P.AE_GET_WAIT_VERSION
        result = await self._blocking(
            [key], [raw], timeout, P.request_get(raw), _BYTES, get_wait=get_wait
        )
        return result

    async def add(self, key: str, amount: int) -> int:
        value = await self._call(P.request_add(self._k(key), amount), _I64, "add", key)
        result: int = value
        return result

    async def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        value = await self._call(
            P.request_compare_set(self._k(key), to_bytes(expected), to_bytes(desired)),
            _BYTES,
            "compare_set",
            key,
        )
        result: bytes = value
        return result

    async def wait(self, keys: Sequence[str], *, timeout: float | None = None) -> None:
        keys = list(keys)
        raw = [self._k(k) for k in keys]
        if await self._check_raw(raw, keys):
            return
        await self._blocking(keys, raw, timeout, None, ())

    async def _check_raw(self, raw: list[bytes], keys: list[str]) -> bool:
        answer = await self._call(
            P.request_check(raw), _U8, "check", keys[0] if len(keys) == 1 else None
        )
        return bool(answer == P.CHECK_READY)

    async def check(self, keys: Sequence[str]) -> bool:
        keys = list(keys)
        return await self._check_raw([self._k(k) for k in keys], keys)

    async def delete_key(self, key: str) -> bool:
        value = await self._call(P.request_delete_key(self._k(key)), _I64, "delete_key", key)
        return bool(value)

    async def num_keys(self) -> int:
        value = await self._call(P.request_num_keys(), _I64, "num_keys", None)
        result: int = value
        return result

    async def list_keys(self) -> list[str]:
        value = await self._call(P.request_list_keys(), _LIST, "list_keys", None)
        return [strip_prefix(k) for k in value]

    async def multi_get(self, keys: Sequence[str], *, timeout: float | None = None) -> list[bytes]:
        keys = list(keys)
        if not keys:
            return []
        raw = [self._k(k) for k in keys]
        replies = ((P.Reply.U8, 0), (P.Reply.BYTES_LIST, len(raw)))
        ready, values = await self._call(
            P.request_check(raw) + P.request_multi_get(raw), replies, "multi_get", None
        )
        if ready != P.CHECK_READY:
            values = await self._blocking(keys, raw, timeout, P.request_multi_get(raw), replies[1:])
        result: list[bytes] = values
        return result

    async def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        if len(keys) != len(values):
            raise ValueError(f"multi_set got {len(keys)} keys but {len(values)} values")
        await self._send(
            P.request_multi_set([self._k(k) for k in keys], [to_bytes(v) for v in values]),
            "multi_set",
            None,
        )

    async def append(self, key: str, value: Value) -> None:
        await self._send(P.request_append(self._k(key), to_bytes(value)), "append", key)

    async def queue_push(self, key: str, value: Value) -> None:
        await self._send(P.request_queue_push(self._k(key), to_bytes(value)), "queue_push", key)

    async def queue_pop(
        self, key: str, *, block: bool = True, timeout: float | None = None
    ) -> bytes:
        raw = self._k(key)
        value = await self._call(P.request_queue_pop(raw), _POP, "queue_pop", key)
        if value is not None:
            result: bytes = value
            return result
        if not block:
            raise QueueEmptyError(f"queue {key!r} is empty", endpoint=self.endpoint, key=key)
        deadline = anyio.current_time() + (self.timeout if timeout is None else timeout)
        while True:
            value = await self._blocking(
                [key], [raw], timeout, P.request_queue_pop(raw), _POP, deadline=deadline
            )
            if value is not None:
                result = value
                return result

    async def queue_len(self, key: str) -> int:
        value = await self._call(P.request_queue_len(self._k(key)), _I64, "queue_len", key)
        result: int = value
        return result

    async def barrier_arrive(
        self, key: str, world_size: int, *, timeout: float | None = None
    ) -> None:
        """Server-side BARRIER (opcode 18): return once ``world_size`` clients arrived at ``key``.

        Needs a server that implements BARRIER (ours; torch's from early 2026).
        """
        raw = self._k(key)
        what = f"in barrier {key!r} of {world_size}"
        t = self.timeout if timeout is None else timeout
        conn = await self._borrow()
        reusable = False
        try:
            slot = conn.request(P.request_barrier(raw, world_size), _U8)
            with anyio.move_on_after(t) as scope:
                await conn.result(slot)
            if scope.cancelled_caught:
                raise StoreTimeoutError(
                    f"timed out after {t} s {what}", endpoint=self.endpoint, key=key
                )
            reusable = True
        except (StoreConnectionError, StoreClosedError) as exc:
            raise self._error(exc, what, key) from None
        finally:
            self._release(conn, reusable)


class _TCPEphemeralSession(EphemeralSession):
    """Registers on-close actions on a dedicated connection (AE_ON_CLOSE / _CANCEL)."""

    def __init__(self, client: TCPStoreClient, conn: _Conn) -> None:
        self._client = client
        self._conn = conn
        self._count = 0

    async def on_close(self, action: OnCloseAction, key: str, value: Value = b"") -> int:
        raw = to_bytes(value)
        op = action_opcode(action, raw)
        if self._count >= MAX_ON_CLOSE_ACTIONS:
            raise StoreLimitError(
                f"an ephemeral session holds at most {MAX_ON_CLOSE_ACTIONS} on-close actions",
                endpoint=self._client.endpoint,
                key=key,
            )
        try:
            action_id: int = await self._conn.result(
                self._conn.request(P.request_on_close(op, self._client._k(key), raw), _I64)
            )
        except (StoreConnectionError, StoreClosedError) as exc:
            raise self._client._error(exc, f"on_close {action}", key) from None
        self._count += 1
        return action_id

    async def cancel(self, action_id: int | None = None) -> int:
        try:
            n: int = await self._conn.result(
                self._conn.request(
                    P.request_on_close_cancel(-1 if action_id is None else action_id), _I64
                )
            )
        except (StoreConnectionError, StoreClosedError) as exc:
            raise self._client._error(exc, "cancel on_close", None) from None
        self._count -= n
        return n

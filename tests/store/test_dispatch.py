"""Idle connections served by the dispatcher, and their moves to and from a task of their own."""

from __future__ import annotations

import select
import struct
from collections.abc import Callable

import anyio
import anyio.lowlevel
import pytest

from aelastic.store import StoreServer, TCPStoreClient, _server
from aelastic.store import _protocol as P
from aelastic.store._server_conn import SLICE, _Connection

from ._backends import on_every_backend

VALIDATE = P.request_validate()
needs_epoll = pytest.mark.skipif(not hasattr(select, "epoll"), reason="no epoll: no dispatcher")


def _only(server: StoreServer) -> _Connection:
    (conn,) = server._connections
    return conn


async def _until(ready: Callable[[], bool]) -> None:
    """Let the server run until ``ready()``: its reads follow the client's sends by at least
    one pass of the event loop, which ``wait_all_tasks_blocked`` does not wait for on asyncio
    (a task waiting on a socket counts as blocked until the loop polls)."""
    with anyio.fail_after(20):
        while not ready():
            await anyio.lowlevel.checkpoint()


async def _receive_exactly(stream: anyio.abc.SocketStream, n: int) -> bytes:
    data = b""
    with anyio.fail_after(20):
        while len(data) < n:
            data += await stream.receive()
    assert len(data) == n
    return data


@needs_epoll
@on_every_backend
async def test_a_request_split_across_reads_leaves_and_returns_to_the_dispatcher() -> None:
    async with (
        StoreServer() as server,
        await anyio.connect_tcp(server.host, server.port) as raw,
    ):
        frame = P.request_set(b"/k", b"v" * 1000)
        await raw.send(VALIDATE + frame[:500])
        await _until(lambda: server.buffered_bytes == 500)  # the server read what was sent
        conn = _only(server)
        assert not conn.dispatched  # a partial request: in a task of its own
        await raw.send(frame[500:] + P.request_get(b"/k"))
        assert await _receive_exactly(raw, 8 + 1000) == P.encode_bytes(b"v" * 1000)
        await _until(lambda: conn.dispatched)  # idle again: back to the dispatcher
        assert server.buffered_bytes == 0
        # and served from the dispatcher, a request split in its header too
        get = P.request_get(b"/k")
        await raw.send(get[:3])
        await anyio.wait_all_tasks_blocked()
        await raw.send(get[3:])
        assert await _receive_exactly(raw, 8 + 1000) == P.encode_bytes(b"v" * 1000)


@on_every_backend
async def test_several_requests_in_one_read_are_answered_in_order() -> None:
    async with (
        StoreServer() as server,
        await anyio.connect_tcp(server.host, server.port) as raw,
    ):
        await raw.send(
            VALIDATE
            + P.request_ping(7)
            + P.request_set(b"/a", b"1")
            + P.request_wait([b"/a"])
            + P.request_get(b"/a")
            + P.request_add(b"/n", 5)
            + P.request_check([b"/a", b"/missing"])
            + P.request_get(b"/missing")
        )
        expected = (
            struct.pack("<I", 7)
            + b"\x00"
            + P.encode_bytes(b"1")
            + struct.pack("<q", 5)
            + b"\x01"
            + P.encode_bytes(b"")
        )
        assert await _receive_exactly(raw, len(expected)) == expected


@on_every_backend
async def test_big_requests_interleaved_with_small_ones_on_one_connection() -> None:
    """A MULTI_SET over more than SLICE keys between small requests, in one send, while
    another client is served: every answer in order, the data complete."""
    n = SLICE * 2 + 5
    keys = [b"/m%d" % i for i in range(n)]
    values = [b"%d" % i for i in range(n)]
    async with (
        StoreServer() as server,
        await anyio.connect_tcp(server.host, server.port) as raw,
        TCPStoreClient(server.host, server.port, timeout=10) as other,
    ):
        await raw.send(
            VALIDATE
            + P.request_set(b"/before", b"b")
            + P.request_multi_set(keys, values)
            + P.request_get(b"/m7")
            + P.request_multi_get([keys[0], keys[-1]])
            + P.request_get(b"/before")
        )
        await other.set("x", "y")
        assert await other.get("x") == b"y"
        expected = (
            P.encode_bytes(b"7")
            + P.encode_bytes(values[0])
            + P.encode_bytes(values[-1])
            + P.encode_bytes(b"b")
        )
        assert await _receive_exactly(raw, len(expected)) == expected
        assert await server.local_store.get(f"m{n - 1}") == values[-1]
        assert await other.get("x") == b"y"


@on_every_backend
async def test_a_parked_wait_of_an_idle_connection_is_answered_by_another_set() -> None:
    async with (
        StoreServer() as server,
        await anyio.connect_tcp(server.host, server.port) as waiter,
        TCPStoreClient(server.host, server.port, timeout=10) as setter,
    ):
        await waiter.send(VALIDATE + P.request_wait([b"/later"]))
        await _until(lambda: server._state.waiter_count() == 1)  # parked, not yet answered
        await setter.set("later", "1")
        assert await _receive_exactly(waiter, 1) == b"\x00"
        await waiter.send(P.request_get(b"/later"))
        assert await _receive_exactly(waiter, 9) == P.encode_bytes(b"1")


@on_every_backend
async def test_an_idle_connection_that_closes_runs_its_on_close_actions() -> None:
    async with StoreServer() as server:
        async with await anyio.connect_tcp(server.host, server.port) as raw:
            await raw.send(VALIDATE + P.request_on_close(1, b"/gone", b"yes"))
            await _receive_exactly(raw, 8)
        with anyio.fail_after(10):
            assert await server.local_store.get("gone") == b"yes"
        await _until(lambda: server.num_connections == 0)


@on_every_backend
async def test_without_a_dispatcher_every_connection_has_a_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where epoll is missing: the same answers, split requests included."""
    monkeypatch.setattr(_server, "open_dispatcher", lambda: None)
    async with (
        StoreServer() as server,
        await anyio.connect_tcp(server.host, server.port) as raw,
        TCPStoreClient(server.host, server.port, timeout=10) as other,
    ):
        frame = P.request_set(b"/k", b"v" * 100) + P.request_get(b"/k")
        await raw.send(VALIDATE + frame[:50])
        await anyio.wait_all_tasks_blocked()
        await raw.send(frame[50:])
        assert await _receive_exactly(raw, 108) == P.encode_bytes(b"v" * 100)
        await raw.send(P.request_wait([b"/w"]))
        await other.set("w", "1")
        assert await _receive_exactly(raw, 1) == b"\x00"
        assert not any(conn.dispatched for conn in server._connections)

"""Concurrency, cancellation, shutdown, bad input and limits of our server and client."""

from __future__ import annotations

import contextlib
import logging
import struct

import anyio
import pytest
from _ports import free_port  # tests/ is on sys.path

from aelastic.store import (
    StoreClosedError,
    StoreConnectionError,
    StoreError,
    StoreServer,
    StoreTimeoutError,
    TCPStoreClient,
    barrier,
    get_all,
    synchronize,
)
from aelastic.store._exceptions import StoreConfigError
from aelastic.store._protocol import request_validate

from ._backends import on_every_backend

VALIDATE = request_validate()


def _s(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


@on_every_backend
async def test_many_tasks_share_one_client(store_client: TCPStoreClient) -> None:
    async def worker(i: int) -> None:
        for j in range(20):
            await store_client.set(f"k/{i}/{j}", str(j))
            assert await store_client.get(f"k/{i}/{j}") == str(j).encode()
            await store_client.add("total", 1)

    async with anyio.create_task_group() as tg:
        for i in range(50):
            tg.start_soon(worker, i)
    assert await store_client.get("total") == b"1000"


@on_every_backend
async def test_blocked_tasks_do_not_stall_others(store_client: TCPStoreClient) -> None:
    async with anyio.create_task_group() as tg:
        for i in range(10):
            tg.start_soon(store_client.wait, [f"gate{i}"])
        await anyio.wait_all_tasks_blocked()
        for _ in range(100):
            await store_client.add("n", 1)
        await store_client.multi_set([f"gate{i}" for i in range(10)], ["1"] * 10)
    assert await store_client.get("n") == b"100"


@on_every_backend
async def test_cancelled_get_leaves_client_usable(
    store_server: StoreServer, store_client: TCPStoreClient
) -> None:
    with anyio.move_on_after(0.1) as scope:
        await store_client.get("never")
    assert scope.cancelled_caught
    async with anyio.create_task_group() as tg:
        tg.start_soon(store_client.get, "soon")
        await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    await store_client.set("k", "v")
    assert await store_client.get("k") == b"v"
    got = []
    async with anyio.create_task_group() as tg:

        async def getter() -> None:
            got.append(await store_client.get("later", timeout=5))

        tg.start_soon(getter)
        await anyio.wait_all_tasks_blocked()
        await store_server.local_store.set("later", "x")
    assert got == [b"x"]


@on_every_backend
async def test_server_shutdown_wakes_waiting_clients() -> None:
    errors: list[BaseException] = []
    server = StoreServer()
    async with server, TCPStoreClient(server.host, server.port, timeout=60) as client:

        async def blocked(coro_fn: object) -> None:
            try:
                await coro_fn()  # type: ignore[operator]
            except (StoreConnectionError, StoreClosedError) as exc:
                errors.append(exc)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(blocked, lambda: client.get("never"))
                tg.start_soon(blocked, lambda: client.queue_pop("q"))
                tg.start_soon(blocked, lambda: server.local_store.get("never"))
                await anyio.wait_all_tasks_blocked()
                await server.aclose()
    assert len(errors) == 3
    messages = sorted(str(e) for e in errors)
    assert all(server.address in m for m in messages), messages
    assert any("waiting for key 'never'" in m for m in messages), messages
    assert any(isinstance(e, StoreClosedError) for e in errors)


@on_every_backend
async def test_client_close_wakes_waiters(store_server: StoreServer) -> None:
    client = await TCPStoreClient.aconnect(store_server.host, store_server.port)
    errors: list[BaseException] = []

    async def blocked() -> None:
        try:
            await client.get("never")
        except StoreClosedError as exc:
            errors.append(exc)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(blocked)
            await anyio.wait_all_tasks_blocked()
            await client.aclose()
    assert len(errors) == 1 and "never" in str(errors[0])
    with pytest.raises(StoreClosedError):
        await client.set("k", "v")


async def _raw(server: StoreServer, payload: bytes, *, eof: bool = False) -> bytes:
    """Send ``payload`` on a raw connection; return what the server sent until it closed."""
    async with await anyio.connect_tcp(server.host, server.port) as stream:
        await stream.send(payload)
        if eof:
            await stream.send_eof()
        received = b""
        with anyio.fail_after(5):
            try:
                while True:
                    received += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
                pass
    return received


@pytest.mark.parametrize(
    ("payload", "eof", "reason"),
    [
        (b"GET / HTTP/1.1\r\n\r\n", False, "first request must be VALIDATE"),
        (b"\x00\x01\x02\x03\x04", False, "VALIDATE carries magic"),
        (VALIDATE + b"\x63", False, "unknown opcode 99"),
        (VALIDATE + b"\x01" + struct.pack("<Q", 1 << 40), False, "exceeds the limit"),
        (VALIDATE + b"\x05" + struct.pack("<Q", 1 << 30), False, "key count"),
        (VALIDATE + b"\x01" + _s(b"/half") + struct.pack("<Q", 100) + b"xx", True, "half-sent"),
        (VALIDATE + b"\x01" + _s(b"/n") + _s(b"abc") + b"\x04" + _s(b"/n") + b"\1" * 8,
         False, "not a decimal integer"),
    ],
)  # fmt: skip
@on_every_backend
async def test_bad_input_closes_only_that_connection(
    store_server: StoreServer,
    store_client: TCPStoreClient,
    caplog: pytest.LogCaptureFixture,
    payload: bytes,
    eof: bool,
    reason: str,
) -> None:
    await store_client.set("safe", "data")
    async with anyio.create_task_group() as tg:
        tg.start_soon(store_client.wait, ["arrives-later"])
        await anyio.wait_all_tasks_blocked()
        with caplog.at_level(logging.WARNING, logger="aelastic.store"):
            assert await _raw(store_server, payload, eof=eof) == b""
        await store_client.set("arrives-later", "1")
    assert reason in caplog.text
    assert "closing connection from 127.0.0.1:" in caplog.text
    assert await store_client.get("safe") == b"data"
    assert await store_client.num_keys() == (2 if "decimal" not in reason else 3)


@on_every_backend
async def test_limits_are_configurable(caplog: pytest.LogCaptureFixture) -> None:
    async with StoreServer(max_key_size=16, max_value_size=32, max_connections=2) as server:
        frame = VALIDATE + b"\x01" + _s(b"/" + b"k" * 20) + _s(b"v")
        with caplog.at_level(logging.WARNING, logger="aelastic.store"):
            assert await _raw(server, frame) == b""
        assert "key length 21 exceeds the limit of 16 bytes" in caplog.text
        frame = VALIDATE + b"\x01" + _s(b"/k") + _s(b"v" * 33)
        assert await _raw(server, frame) == b""
        async with TCPStoreClient(server.host, server.port, timeout=5) as client:
            await client.set("k", "v" * 32)
            async with await anyio.connect_tcp(server.host, server.port) as second:
                await second.send(VALIDATE)
                with caplog.at_level(logging.WARNING, logger="aelastic.store"):
                    assert await _raw(server, VALIDATE) == b""  # third: refused
                assert "max_connections" in caplog.text
            assert await client.get("k") == b"v" * 32


def test_non_loopback_needs_explicit_flag() -> None:
    with pytest.raises(StoreConfigError, match="allow_non_loopback=True"):
        StoreServer("0.0.0.0", 0)
    with pytest.raises(StoreConfigError, match="non-loopback"):
        StoreServer("::", 0)
    StoreServer("::", 0, allow_non_loopback=True)  # constructing does not bind
    StoreServer("localhost", 0)
    StoreServer("::1", 0)


@on_every_backend
async def test_connect_gives_up_naming_endpoint() -> None:
    port = free_port()
    client = TCPStoreClient("127.0.0.1", port, connect_timeout=0.3)
    with anyio.fail_after(5), pytest.raises(StoreConnectionError) as info:
        await client.connect()
    assert f"127.0.0.1:{port}" in str(info.value)
    assert "could not connect within 0.3 s" in str(info.value)


@on_every_backend
async def test_connect_retries_until_server_starts() -> None:
    port = free_port()
    done = anyio.Event()
    got: list[bytes] = []

    async def connect() -> None:
        async with TCPStoreClient("127.0.0.1", port, connect_timeout=20) as client:
            await client.set("x", "1")
            got.append(await client.get("x"))
        done.set()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(connect)
            await anyio.wait_all_tasks_blocked()  # the client is backing off
            async with StoreServer("127.0.0.1", port):
                await done.wait()
    assert got == [b"1"]


@on_every_backend
async def test_barrier_rounds_and_synchronize(store_client: TCPStoreClient) -> None:
    n = 5
    order: list[tuple[int, int]] = []

    async def participant(rank: int) -> None:
        for rnd in range(3):
            order.append((rnd, rank))
            await barrier(store_client, n, "bar", timeout=10)
        data = await synchronize(store_client, f"r{rank}", rank, n, "sync/", timeout=10)
        assert data == [f"r{i}".encode() for i in range(n)]
        assert await get_all(store_client, rank, "sync/", n) == data

    async with anyio.create_task_group() as tg:
        for rank in range(n):
            tg.start_soon(participant, rank)
    # every participant of round r arrived before anyone entered round r + 1
    rounds = [rnd for rnd, _ in order]
    assert rounds == sorted(rounds)


@on_every_backend
async def test_server_side_barrier(store_server: StoreServer) -> None:
    async with TCPStoreClient(store_server.host, store_server.port, timeout=10) as client:
        for _ in range(2):  # reusable
            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(client.barrier_arrive, "b", 3)
        with pytest.raises(TimeoutError):
            await client.barrier_arrive("b2", 2, timeout=0.1)


@on_every_backend
async def test_silent_server_times_out_instead_of_hanging() -> None:
    """A server that completes the handshake and then never answers: a timeout, not a hang."""

    async def handle(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            data = b""
            while len(data) < 10:
                data += await stream.receive()
            await stream.send(data[6:10])  # PING echo, then silence
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                while True:
                    await stream.receive()

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        async with TCPStoreClient("127.0.0.1", port, timeout=0.3) as client:
            with anyio.fail_after(10), pytest.raises(StoreTimeoutError) as info:
                await client.add("counter", 1)
        assert "no response from the store within 0.3 s" in str(info.value)
        assert "'counter'" in str(info.value) and f"127.0.0.1:{port}" in str(info.value)
        tg.cancel_scope.cancel()


@on_every_backend
async def test_client_reconnects_after_server_restart() -> None:
    async with StoreServer() as first:
        port = first.port
        client = await TCPStoreClient.aconnect("127.0.0.1", port, timeout=10, connect_timeout=1)
        await client.set("k", "1")
    try:
        with pytest.raises(StoreConnectionError, match=f"127.0.0.1:{port}"):
            await client.add("n", 1)
        async with StoreServer("127.0.0.1", port):
            assert await client.add("n", 1) == 1  # reconnected; new server, fresh data
            assert not await client.check(["k"])
    finally:
        await client.aclose()


@on_every_backend
async def test_stopped_server_fails_calls_at_once_not_after_connect_timeout() -> None:
    # A refused reconnect after the server was reached means it is gone: no
    # connect_timeout (60 s here) of retries, so leaving a finished job is prompt.
    async with StoreServer() as server:
        port = server.port
        client = await TCPStoreClient.aconnect("127.0.0.1", port, timeout=60, connect_timeout=60)
        await client.set("k", "1")
    try:
        for _ in range(2):  # the call that sees the loss, then one that must reconnect
            with anyio.fail_after(5), pytest.raises(StoreConnectionError, match=str(port)):
                await client.compare_set("k", "1", "2")
    finally:
        await client.aclose()


@on_every_backend
async def test_large_values_round_trip(store_client: TCPStoreClient) -> None:
    big = bytes(range(256)) * (8 * 1024 * 4)  # 8 MiB, the default limit
    await store_client.set("big", big)
    assert await store_client.get("big") == big
    assert await store_client.multi_get(["big", "big"]) == [big, big]


@on_every_backend
async def test_writes_are_sent_before_close(store_server: StoreServer) -> None:
    client = await TCPStoreClient.aconnect(store_server.host, store_server.port)
    await client.set("a", "1")
    await client.append("b", "2")
    await client.queue_push("q", "3")
    await client.multi_set(["c"], ["4"])
    await client.aclose()
    local = store_server.local_store
    with anyio.fail_after(5):
        assert await local.multi_get(["a", "b", "c"]) == [b"1", b"2", b"4"]
        assert await local.queue_pop("q") == b"3"


@on_every_backend
async def test_client_not_reading_does_not_block_others(store_server: StoreServer) -> None:
    """A peer pipelining big GETs without reading is paused, others are served,
    the server's buffer for it stays bounded, and it gets every answer once it reads."""
    value = bytes(range(256)) * 4096  # 1 MiB
    await store_server.local_store.set("big", value)
    get_big = b"\x03" + _s(b"/big")
    n = 48
    async with await anyio.connect_tcp(store_server.host, store_server.port) as greedy:
        await greedy.send(VALIDATE + get_big * n)  # 48 MiB of answers, not read yet
        async with TCPStoreClient(store_server.host, store_server.port, timeout=10) as other:
            with anyio.fail_after(10):
                await other.set("k", "v")
                assert await other.get("k") == b"v"
        for conn in store_server._connections:
            assert conn._outsize <= 10 * 1024 * 1024  # answers held for the greedy peer
        expected = (struct.pack("<Q", len(value)) + value) * n
        received = bytearray()
        with anyio.fail_after(20):
            while len(received) < len(expected):
                received += await greedy.receive(1 << 20)
        assert received == expected


@on_every_backend
async def test_port_in_use_is_a_clear_error(store_server: StoreServer) -> None:
    with pytest.raises(StoreError, match=r"cannot listen on 127\.0\.0\.1:\d+: .*port 0"):
        async with StoreServer("127.0.0.1", store_server.port):
            pass


@on_every_backend
async def test_server_in_a_given_task_group_is_entered_and_left_from_other_tasks() -> None:
    """With task_group=, a child task may enter the server on the parent's exit stack
    (inside scopes that end before it) and the parent leaves it later."""
    async with anyio.create_task_group() as tg, contextlib.AsyncExitStack() as stack:
        servers: list[StoreServer] = []

        async def enter() -> None:
            with anyio.fail_after(10):  # a scope that ends long before the server
                servers.append(
                    await stack.enter_async_context(StoreServer("127.0.0.1", 0, task_group=tg))
                )

        async with anyio.create_task_group() as inner:
            inner.start_soon(enter)
        server = servers[0]
        async with TCPStoreClient(server.host, server.port, timeout=10) as client:
            await client.set("k", "v")
            assert await client.get("k") == b"v"
        await stack.aclose()  # the parent leaves it
        with pytest.raises(OSError):
            await anyio.connect_tcp(server.host, server.port)


@on_every_backend
async def test_serve_reports_the_bound_port_and_stops_when_cancelled_or_closed() -> None:
    """``tg.start(server.serve)`` returns once the server listens, with its port;
    cancelling the task, or ``aclose()``, stops it and closes its clients."""
    async with anyio.create_task_group() as tg:
        server = StoreServer("127.0.0.1", 0)
        port = await tg.start(server.serve)
        assert port == server.port != 0
        async with TCPStoreClient("127.0.0.1", port, timeout=10) as client:
            await client.set("k", "v")
            assert await server.local_store.get("k") == b"v"
            tg.cancel_scope.cancel()
    with pytest.raises(OSError):
        await anyio.connect_tcp("127.0.0.1", port)

    closing = StoreServer("127.0.0.1", 0)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            port = await tg.start(closing.serve)
            await closing.aclose()  # serve returns: the group ends without a cancel
    with pytest.raises(OSError):
        await anyio.connect_tcp("127.0.0.1", port)


@on_every_backend
async def test_serve_raises_the_bind_error_from_start(store_server: StoreServer) -> None:
    async with anyio.create_task_group() as tg:
        with pytest.raises(StoreError, match=r"cannot listen on 127\.0\.0\.1:\d+: .*port 0"):
            await tg.start(StoreServer("127.0.0.1", store_server.port).serve)


@on_every_backend
async def test_a_host_s_refused_connections_are_warned_about_once(
    store_server: StoreServer,
    store_client: TCPStoreClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A scanner that keeps connecting must not flood the log: one warning per host,
    the rest at debug level (each refusal is still logged)."""
    with caplog.at_level(logging.DEBUG, logger="aelastic.store"):
        for _ in range(3):
            assert await _raw(store_server, b"GET / HTTP/1.1\r\n\r\n", eof=False) == b""
    refusals = [r for r in caplog.records if "closing connection from" in r.getMessage()]
    assert [r.levelno for r in refusals] == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    await store_client.set("still", "served")
    assert await store_client.get("still") == b"served"

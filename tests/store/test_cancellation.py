"""Cancellation safety: cancelling at each await point in turn leaves nothing behind.

A canceller task yields N times, then cancels the scope the operation runs in,
for N = 0, 1, 2, ... until the operation completes before the cancellation
lands: so every await point of the operation is hit on some round (on each
backend's scheduling order). After each round no file descriptor (listening or
connected socket) and no thread remains beyond the baseline.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Awaitable, Callable

import anyio
import anyio.lowlevel

from aelastic.store import StoreServer, TCPStoreClient

from ._backends import on_every_backend

#: More rounds than any operation here has await points (a guard against a loop).
_MAX_ROUNDS = 200


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


async def _quiesce() -> None:
    """Let in-process servers notice closed peers (they close their side)."""
    for _ in range(3):
        await anyio.wait_all_tasks_blocked()


async def _cancel_after(n: int, scope: anyio.CancelScope, completed: list[bool]) -> None:
    for _ in range(n):
        await anyio.lowlevel.checkpoint()
    if not completed:
        scope.cancel()


async def cancel_at_each_checkpoint(operation: Callable[[], Awaitable[None]]) -> int:
    """Run ``operation`` cancelled after 0, 1, 2, ... checkpoints; return the rounds run.

    Asserts after each round that no fd and no thread was left behind.
    """
    await _quiesce()
    fds, threads = _open_fds(), threading.active_count()
    for n in range(_MAX_ROUNDS):
        completed: list[bool] = []
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_cancel_after, n, scope, completed)
                await operation()
                completed.append(True)
        await _quiesce()
        leaked = _open_fds() - fds
        assert not leaked, f"round {n}: fds left open: {sorted(leaked)}"
        assert threading.active_count() == threads, f"round {n}: a thread was left running"
        if completed:
            return n + 1
    raise AssertionError(f"operation still cancelled after {_MAX_ROUNDS} rounds")


@on_every_backend
async def test_cancelled_server_start_leaves_no_listener() -> None:
    async def start_and_leave() -> None:
        async with StoreServer("127.0.0.1", 0) as server:
            assert server.port

    rounds = await cancel_at_each_checkpoint(start_and_leave)
    assert rounds >= 1


@on_every_backend
async def test_cancelled_client_connect_and_calls_leave_no_socket(
    store_server: StoreServer,
) -> None:
    async def connect_and_use() -> None:
        async with TCPStoreClient(store_server.host, store_server.port, timeout=10) as client:
            await client.set("k", "v")
            assert await client.get("k") == b"v"
            await client.wait(["k"])

    rounds = await cancel_at_each_checkpoint(connect_and_use)
    assert rounds > 2  # connect, handshake and calls have several await points
    assert store_server.num_connections == 0


@on_every_backend
async def test_cancelled_ephemeral_session_leaves_no_socket(store_server: StoreServer) -> None:
    async with TCPStoreClient(store_server.host, store_server.port, timeout=10) as client:

        async def session() -> None:
            async with client.ephemeral() as s:
                await s.on_close("set", "gone", "1")

        await cancel_at_each_checkpoint(session)
    await _quiesce()
    assert store_server.num_connections == 0


@on_every_backend
async def test_a_call_cancelled_while_its_request_is_partly_sent_leaves_the_client_usable(
    store_server: StoreServer,
) -> None:
    """7 MiB (under the server's 8 MiB value limit) do not fit the loopback socket
    buffers at once, so the cancel lands mid-send. asyncio finishes the send from a
    loop callback (the request is applied whole); elsewhere the connection is closed
    and the next call reconnects. Either way no partial request is applied and the
    client keeps working."""
    big = os.urandom(7 * 1024 * 1024)
    async with TCPStoreClient(store_server.host, store_server.port, timeout=60) as client:
        await client.set("big", b"old")
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_cancel_after, 1, scope, [])
                await client.compare_set("big", b"old", big)
        assert scope.cancelled_caught
        await client.set("after", "1")
        assert await client.get("after") == b"1"
        value = await client.get("big")
        assert value in (b"old", big)  # never a torn value
        if _library() == "asyncio":
            assert value == big  # the loop sent the rest of the request
    await _quiesce()
    assert store_server.num_connections == 0


def _library() -> str:
    import sniffio

    return sniffio.current_async_library()

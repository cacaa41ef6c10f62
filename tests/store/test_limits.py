"""Memory bounds and time slicing of the server, over real TCP on loopback."""

from __future__ import annotations

import struct

import anyio
import pytest

from aelastic.store import StoreServer, TCPStoreClient
from aelastic.store import _protocol as P
from aelastic.store._exceptions import StoreConfigError
from aelastic.store._server_conn import SLICE

from ._backends import on_every_backend

VALIDATE = P.request_validate()


def _set_header(key: bytes, value_len: int) -> bytes:
    """A SET frame up to (not including) its value bytes."""
    return b"\x01" + struct.pack("<Q", len(key)) + key + struct.pack("<Q", value_len)


async def _closed_by_server(stream: anyio.abc.SocketStream) -> None:
    """Return once the server closed ``stream`` (EOF or reset)."""
    with anyio.fail_after(20):
        try:
            while await stream.receive():
                pass
        except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
            pass


async def _still_served(server: StoreServer) -> None:
    async with TCPStoreClient(server.host, server.port, timeout=10) as other:
        with anyio.fail_after(10):
            await other.set("alive", "1")
            assert await other.get("alive") == b"1"


@on_every_backend
async def test_partial_request_above_connection_buffer_is_closed() -> None:
    async with StoreServer(max_connection_buffer=256 * 1024) as server:
        async with await anyio.connect_tcp(server.host, server.port) as raw:
            await raw.send(VALIDATE + _set_header(b"/big", 1 << 20) + b"x" * (512 * 1024))
            await _closed_by_server(raw)
        await _still_served(server)
        assert server.buffered_bytes == 0


@on_every_backend
async def test_half_sent_request_times_out_and_only_it() -> None:
    async with StoreServer(frame_timeout=0.5) as server:
        async with await anyio.connect_tcp(server.host, server.port) as raw:
            await raw.send(VALIDATE + _set_header(b"/slow", 100) + b"x" * 10)
            async with anyio.create_task_group() as tg:
                tg.start_soon(_still_served, server)
                await _closed_by_server(raw)
        assert server.buffered_bytes == 0
        assert await server.local_store.check(["alive"])
        assert not await server.local_store.check(["slow"])


@on_every_backend
async def test_total_budget_pauses_the_newer_partial_request() -> None:
    """Over max_buffered_bytes only the oldest partial request is read; the newer
    one waits (its bytes stay in the kernel) and completes once space is free."""
    budget = 512 * 1024
    async with StoreServer(
        max_buffered_bytes=budget, max_connection_buffer=budget, frame_timeout=2.0
    ) as server:
        async with (
            await anyio.connect_tcp(server.host, server.port) as old,
            await anyio.connect_tcp(server.host, server.port) as new,
        ):
            await old.send(VALIDATE + _set_header(b"/old", budget) + b"o" * (budget - 100))
            await anyio.wait_all_tasks_blocked()  # the server has read what was sent
            assert server.buffered_bytes == len(_set_header(b"/old", 0)) + budget - 100
            await new.send(VALIDATE + _set_header(b"/new", budget // 2) + b"n" * (budget // 2))
            # the old request never completes: its frame_timeout closes it, then
            # the new one is read and applied
            await _closed_by_server(old)
            with anyio.fail_after(20):
                assert await server.local_store.get("new") == b"n" * (budget // 2)
        assert server.buffered_bytes <= 0
        assert not await server.local_store.check(["old"])


@on_every_backend
async def test_append_cannot_grow_a_value_past_the_value_limit() -> None:
    async with StoreServer(max_value_size=1000) as server:
        await server.local_store.set("log", b"x" * 900)
        async with await anyio.connect_tcp(server.host, server.port) as raw:
            await raw.send(VALIDATE + P.request_append(b"/log", b"y" * 200))
            await _closed_by_server(raw)
        assert await server.local_store.get("log") == b"x" * 900
        await _still_served(server)


@pytest.mark.parametrize(
    "kwargs", [{"max_frame_size": 0}, {"max_buffered_bytes": -1}, {"frame_timeout": 0}]
)
def test_limits_must_be_positive(kwargs: dict[str, float]) -> None:
    with pytest.raises(StoreConfigError, match="must be positive"):
        StoreServer(**kwargs)  # type: ignore[arg-type]


@on_every_backend
async def test_requests_over_many_keys_are_applied_in_slices_correctly() -> None:
    n = 3 * SLICE + 5
    keys = [f"k{i}" for i in range(n)]
    async with (
        StoreServer() as server,
        TCPStoreClient(server.host, server.port, timeout=30) as client,
    ):
        await client.multi_set(keys[: n // 2], [k.encode() for k in keys[: n // 2]])
        assert not await client.check(keys)
        async with anyio.create_task_group() as tg:
            got: list[list[bytes]] = []

            async def reader() -> None:
                got.append(await client.multi_get(keys))  # WAIT over n keys, half missing

            tg.start_soon(reader)
            await anyio.wait_all_tasks_blocked()
            await client.multi_set(keys[n // 2 :], [k.encode() for k in keys[n // 2 :]])
        assert got == [[k.encode() for k in keys]]
        assert await client.check(keys)
        assert sorted(await client.list_keys()) == sorted(keys)

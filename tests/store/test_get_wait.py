"""AE_GET_WAIT (aelastic extension 0xA3): a blocking get in one round trip."""

from __future__ import annotations

import struct

import anyio
import anyio.lowlevel
import pytest

from aelastic.store import StoreServer, StoreTimeoutError, TCPStoreClient
from aelastic.store import _protocol as P


async def test_the_server_answers_with_the_value_once_the_key_is_set(
    store_server: StoreServer,
) -> None:
    async with await anyio.connect_tcp(store_server.host, store_server.port) as raw:
        await raw.send(P.request_validate() + P.request_get_wait(b"/k"))
        with anyio.move_on_after(0.2):  # nothing is answered while the key is missing
            early = await raw.receive()
            pytest.fail(f"answered {early!r} before the key existed")
        await store_server.local_store.set("k", b"value")
        answer = b""
        with anyio.fail_after(10):
            while len(answer) < 13:
                answer += await raw.receive()
        assert answer == struct.pack("<Q", 5) + b"value"
        # A present key is answered at once, on the same connection, in order.
        await raw.send(P.request_get_wait(b"/k") + P.request_get(b"/k"))
        answer = b""
        with anyio.fail_after(10):
            while len(answer) < 26:
                answer += await raw.receive()
        assert answer == 2 * (struct.pack("<Q", 5) + b"value")


async def test_a_client_with_a_session_gets_a_later_key_and_times_out_cleanly(
    store_server: StoreServer,
) -> None:
    state = store_server._state
    async with TCPStoreClient(store_server.host, store_server.port, timeout=10) as client:
        async with client.ephemeral():
            pass
        assert client._ae_version >= P.AE_GET_WAIT_VERSION  # it will use AE_GET_WAIT
        with pytest.raises(StoreTimeoutError):
            await client.get("late", timeout=0.1)
        got: list[bytes] = []

        async def read() -> None:
            got.append(await client.get("late", timeout=10))

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            with anyio.fail_after(10):
                while state.waiter_count() == 0:  # the read is parked on the server
                    await anyio.lowlevel.checkpoint()
            await client.set("late", b"v1")
        assert got == [b"v1"]
        assert await client.get("late") == b"v1"

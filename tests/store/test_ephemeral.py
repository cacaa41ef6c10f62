"""Ephemeral sessions: writes the server performs when a client's connection closes."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest

from aelastic.store import LocalStore, PrefixStore, Store, StoreServer, TCPStoreClient
from aelastic.store._exceptions import StoreUnsupportedError

from ._backends import on_every_backend

TORCH_OPS = str(Path(__file__).with_name("_torch_ops.py"))


@contextlib.asynccontextmanager
async def open_pair(kind: str) -> AsyncIterator[tuple[Store, Store]]:
    """(store that opens the session, store that observes), same data."""
    if kind == "local":
        async with LocalStore(timeout=10) as s:
            yield s, s
        return
    async with (
        StoreServer() as server,
        TCPStoreClient(server.host, server.port, timeout=10) as client,
    ):
        if kind == "prefix":
            yield PrefixStore("p", client), PrefixStore("p", server.local_store)
        else:
            yield client, server.local_store


kinds = pytest.mark.parametrize("kind", ["local", "tcp", "prefix"])


@kinds
@on_every_backend
async def test_actions_run_when_the_session_ends(kind: str) -> None:
    async with open_pair(kind) as pair:
        store, observer = pair
        await store.set("n", "5")
        async with store.ephemeral() as session:
            await session.on_close("queue_push", "departed", "node-a")
            await session.on_close("set", "dead/node-a", "1")
            await session.on_close("add", "n", "-1")
            await session.on_close("append", "log", "a;")
            await session.on_close("delete_key", "alive/node-a")
            await store.set("alive/node-a", "1")
            assert await store.get("alive/node-a") == b"1"  # applied before the session ends
            assert await observer.queue_len("departed") == 0
            assert not await observer.check(["dead/node-a"])
        with anyio.fail_after(10):
            assert await observer.queue_pop("departed") == b"node-a"
            assert await observer.get("dead/node-a") == b"1"
        assert await observer.get("n") == b"4"
        assert await observer.get("log") == b"a;"
        assert not await observer.check(["alive/node-a"])


@kinds
@on_every_backend
async def test_cancelled_actions_do_not_run(kind: str) -> None:
    async with open_pair(kind) as pair:
        store, observer = pair
        async with store.ephemeral() as session:
            first = await session.on_close("set", "a", "1")
            await session.on_close("set", "b", "1")
            await session.on_close("set", "c", "1")
            assert await session.cancel(first) == 1
            assert await session.cancel(first) == 0
            await session.on_close("queue_push", "done", "x")
        with anyio.fail_after(10):
            await observer.queue_pop("done")
        assert await observer.check(["b", "c"]) and not await observer.check(["a"])
        async with store.ephemeral() as session:
            await session.on_close("set", "z", "1")
            assert await session.cancel() == 1
        await store.set("after", "1")
        with anyio.fail_after(10):
            await observer.get("after")
        assert not await observer.check(["z"])


@kinds
@on_every_backend
async def test_bad_actions_are_value_errors(kind: str) -> None:
    async with open_pair(kind) as pair:
        store, _ = pair
        async with store.ephemeral() as session:
            with pytest.raises(ValueError, match="one of"):
                await session.on_close("get", "k")  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="decimal integer"):
                await session.on_close("add", "k", "x")


_DYING_CLIENT = textwrap.dedent(
    """
    import sys, anyio
    from aelastic.store import TCPStoreClient

    async def main():
        async with TCPStoreClient("127.0.0.1", int(sys.argv[1]), timeout=30) as c:
            async with c.ephemeral() as session:
                await session.on_close("queue_push", "departed", "victim")
                print("ready", flush=True)
                await anyio.sleep_forever()

    anyio.run(main)
    """
)


@on_every_backend
async def test_sigkilled_client_is_noticed_at_once(store_server: StoreServer) -> None:
    async with await anyio.open_process(
        [sys.executable, "-c", _DYING_CLIENT, str(store_server.port)],
        stdout=subprocess.PIPE,
    ) as proc:
        assert proc.stdout is not None
        with anyio.fail_after(30):
            line = b""
            while not line.endswith(b"\n"):
                line += await proc.stdout.receive(1)
        assert line == b"ready\n"
        assert await store_server.local_store.queue_len("departed") == 0
        proc.send_signal(signal.SIGKILL)
        # woken by the server seeing the dead process's connection close
        with anyio.fail_after(10):
            assert await store_server.local_store.queue_pop("departed") == b"victim"


@pytest.fixture(scope="module")
def torch_server_port() -> Iterator[int]:
    """torch's own TCPStore server in a subprocess, shared by the backends' runs (each
    backend's client talks to it over its own sockets; torch's start-up costs seconds)."""
    with subprocess.Popen(
        [sys.executable, TORCH_OPS, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        try:
            yield int(proc.stdout.readline().split()[1])
        finally:
            proc.stdin.close()
            proc.wait(timeout=20)


@on_every_backend
async def test_torch_server_raises_unsupported(torch_server_port: int) -> None:
    async with TCPStoreClient("127.0.0.1", torch_server_port, timeout=30) as client:
        with anyio.fail_after(30), pytest.raises(StoreUnsupportedError, match="torch"):
            async with client.ephemeral():
                pass
        # the client's other connections are unaffected
        await client.set("k", "v")
        assert await client.get("k") == b"v"

"""The ``store`` destination end to end with a real StoreServer; ``python -m aelastic events``."""

from __future__ import annotations

import signal
import subprocess
import sys

import anyio
import pytest

from aelastic import events
from aelastic.events import Event, EventSource, NodeState, RdzvEvent
from aelastic.events._dispatch import arecord, flush, unregister_handler
from aelastic.events._exceptions import EventHandlerError
from aelastic.events._record import construct_and_record_rdzv_event
from aelastic.events._store import StoreEventHandler, configure_store, events_key
from aelastic.store import LocalStore, StoreServer, TCPStoreClient


def _cli(port: int, run_id: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "aelastic", "events", "--store", f"127.0.0.1:{port}",
            "--run-id", run_id, *extra]  # fmt: skip


async def _read_lines(stream: anyio.abc.ByteReceiveStream, n: int) -> list[str]:
    buf = b""
    with anyio.fail_after(30):
        while buf.count(b"\n") < n:
            buf += await stream.receive()
    return buf.decode().splitlines()


async def test_store_destination_and_events_command(
    store_server: StoreServer, store_client: TCPStoreClient
) -> None:
    handler = configure_store(store_client, "run-a", destinations=("store", "dynamic_rendezvous"))
    try:
        sent = [Event(f"e{i}", EventSource.AGENT, i) for i in range(20)]
        for event in sent:
            events.record(event, "store")
        other = Event("elsewhere", EventSource.WORKER, metadata={"run_id": "run-b"})
        await arecord(other, "store")
        construct_and_record_rdzv_event("run-b", "joined", NodeState.RUNNING, rank=0)
        await flush()
        assert await store_client.queue_len(events_key("run-a")) == 20
        assert await store_client.queue_len("aelastic/events/run-b") == 2
    finally:
        unregister_handler("store", handler)
        unregister_handler("dynamic_rendezvous", handler)

    out = await anyio.run_process(_cli(store_server.port, "run-a"))
    assert [Event.deserialize(line) for line in out.stdout.decode().splitlines()] == sent
    out = await anyio.run_process(_cli(store_server.port, "run-b"))
    first, second = out.stdout.decode().splitlines()
    assert Event.deserialize(first) == other
    rdzv = RdzvEvent.deserialize(second)
    assert (rdzv.run_id, rdzv.message, rdzv.name) == (
        "run-b",
        "joined",
        "test_store.py:test_store_destination_and_events_command",
    )
    # popping consumed them
    assert await store_client.queue_len(events_key("run-a")) == 0
    out = await anyio.run_process(_cli(store_server.port, "run-a"))
    assert out.stdout == b""


async def test_events_command_follow_until_sigterm(
    store_server: StoreServer, store_client: TCPStoreClient
) -> None:
    key = events_key("followed")
    await store_client.queue_push(key, Event("before", EventSource.AGENT).serialize())
    async with await anyio.open_process(
        _cli(store_server.port, "followed", "--follow"), stderr=subprocess.PIPE
    ) as proc:
        assert proc.stdout is not None
        assert await _read_lines(proc.stdout, 1) == [Event("before", EventSource.AGENT).serialize()]
        handler = configure_store(store_client, "followed")
        try:
            await arecord(Event("after", EventSource.AGENT), "store")
        finally:
            unregister_handler("store", handler)
        assert await _read_lines(proc.stdout, 1) == [Event("after", EventSource.AGENT).serialize()]
        proc.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            assert await proc.wait() == 0


async def test_events_command_against_a_store_subprocess(
    store_server_process: tuple[str, int],
) -> None:
    host, port = store_server_process
    async with TCPStoreClient(host, port, timeout=30) as client:
        handler = configure_store(client, "sub")
        try:
            await arecord(Event("x", EventSource.WORKER), "store")
        finally:
            unregister_handler("store", handler)
    out = await anyio.run_process(_cli(port, "sub"))
    assert out.stdout.decode().splitlines() == [Event("x", EventSource.WORKER).serialize()]


async def test_local_store_and_missing_run_id() -> None:
    async with LocalStore() as store:
        handler = configure_store(store, destinations=("local-store",))
        try:
            await arecord(Event("ok", EventSource.AGENT, metadata={"run_id": "r"}), "local-store")
            assert (
                await store.queue_pop(events_key("r"))
                == Event("ok", EventSource.AGENT, metadata={"run_id": "r"}).serialize().encode()
            )
            with pytest.raises(EventHandlerError, match="pass run_id to configure_store"):
                await arecord(Event("no-run", EventSource.AGENT), "local-store")
        finally:
            unregister_handler("local-store", handler)
    with pytest.raises(TypeError, match=r"aelastic\.store\.Store"):
        StoreEventHandler(object())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--store", "nohost", "--run-id", "x"], "expected HOST:PORT"),
        (["--run-id", "x"], "--store"),
        (["--store", "127.0.0.1:1", "--run-id", "x", "--timeout", "0.5"], "is the store running"),
    ],
)
async def test_events_command_bad_input(args: list[str], message: str) -> None:
    out = await anyio.run_process([sys.executable, "-m", "aelastic", "events", *args], check=False)
    assert out.returncode in (1, 2)
    assert message in out.stderr.decode()
    assert "Traceback" not in out.stderr.decode()

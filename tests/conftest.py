"""Shared fixtures: a store server in-process, a client to it, and a store server subprocess."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator

import anyio
import pytest

from aelastic.store import StoreServer, TCPStoreClient

READY_PREFIX = "aelastic store listening on "


@pytest.fixture
async def store_server() -> AsyncIterator[StoreServer]:
    """An in-process :class:`StoreServer` on 127.0.0.1, free port."""
    async with StoreServer("127.0.0.1", 0) as server:
        yield server


@pytest.fixture
async def store_client(store_server: StoreServer) -> AsyncIterator[TCPStoreClient]:
    """A :class:`TCPStoreClient` connected to :func:`store_server` (30 s timeout)."""
    async with TCPStoreClient(store_server.host, store_server.port, timeout=30.0) as client:
        yield client


@pytest.fixture
async def store_server_process() -> AsyncIterator[tuple[str, int]]:
    """``python -m aelastic store --port 0`` in a subprocess; yields ``(host, port)``.

    Use it when torch clients run in the test process (a torch client holds the
    GIL while blocked on its socket, so an in-process server could deadlock).
    """
    async with await anyio.open_process(
        [sys.executable, "-m", "aelastic", "store", "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=None,
    ) as proc:
        assert proc.stdout is not None
        line = b""
        with anyio.fail_after(30):
            while not line.endswith(b"\n"):
                chunk = await proc.stdout.receive(1)
                line += chunk
        text = line.decode().strip()
        assert text.startswith(READY_PREFIX), f"unexpected store output: {text!r}"
        host, _, port = text[len(READY_PREFIX) :].rpartition(":")
        try:
            yield host, int(port)
        finally:
            with anyio.CancelScope(shield=True):
                if proc.returncode is None:
                    proc.terminate()
                    with anyio.move_on_after(10):
                        await proc.wait()
                    if proc.returncode is None:
                        proc.kill()
                        await proc.wait()

"""A client pointed at something that is not a store: told what answered, at once.

Real servers on loopback: one answering like an HTTP server (immediately, as uvicorn or
nginx do on a request line they cannot parse), and one that accepts and stays silent
(as Python's http.server does until it reads a line end). On every anyio backend;
then a job whose c10d rendezvous endpoint is one of them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
import anyio.abc
import pytest

from aelastic import LaunchConfig, open_job
from aelastic.rendezvous import RendezvousConnectionError
from aelastic.rendezvous._exceptions import RendezvousEndpointError
from aelastic.store import StoreConnectionError, TCPStoreClient
from aelastic.store._exceptions import NotAStoreError

from ._backends import on_every_backend

HTTP_400 = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


@contextlib.asynccontextmanager
async def fake_server(reply: bytes | None) -> AsyncIterator[int]:
    """Listen on 127.0.0.1; answer each connection's first bytes with ``reply`` and close
    it (None: read and never answer). Yields the port."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)

    async def handle(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                await stream.receive()
                if reply is None:
                    while True:
                        await stream.receive()
                await stream.send(reply)

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        yield int(listener.extra(anyio.abc.SocketAttribute.local_port))
        tg.cancel_scope.cancel()


async def _connect_error(reply: bytes | None, connect_timeout: float) -> StoreConnectionError:
    """What connecting a client to a :func:`fake_server` raises (within 30 s)."""
    async with fake_server(reply) as port:
        client = TCPStoreClient("127.0.0.1", port, connect_timeout=connect_timeout, timeout=600)
        with anyio.fail_after(30), pytest.raises(StoreConnectionError) as info:
            async with client:
                pytest.fail("connected to a server that is not a store")
    assert f"127.0.0.1:{port}" in str(info.value)
    return info.value


@on_every_backend
async def test_an_http_server_is_named_at_once_not_retried() -> None:
    # Far longer than the bound of 30 s: a retried failure would hit the bound.
    error = await _connect_error(HTTP_400, connect_timeout=600)
    assert isinstance(error, NotAStoreError) and "it looks like an HTTP server" in str(error)
    assert error.head.startswith(b"HTTP/1.1 400")


@on_every_backend
async def test_a_silent_server_is_described_on_every_backend() -> None:
    error = await _connect_error(None, connect_timeout=0.5)
    # uvloop's and asyncio's timeouts have no text: the cause was lost ("last error: )")
    assert "last error: connected, but the server did not answer the store handshake" in str(error)
    assert not isinstance(error, NotAStoreError)


def _job_config(port: int, **rdzv: float) -> LaunchConfig:
    return LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=1,
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{port}",
        rdzv_configs=rdzv,
        max_restarts=0,
    )


async def test_a_rendezvous_endpoint_that_is_an_http_server_fails_the_job_naming_it() -> None:
    async with fake_server(HTTP_400) as port:
        config = _job_config(port, join_timeout=600, read_timeout=600)
        with anyio.fail_after(30):
            async with open_job(config, "/bin/true") as job:
                with pytest.raises(RendezvousEndpointError) as info:
                    await job.wait()
    message = str(info.value)
    assert f"rendezvous endpoint 127.0.0.1:{port} is not a store" in message
    assert "HTTP server" in message and "--rdzv-endpoint" in message
    assert isinstance(info.value.__cause__, NotAStoreError)


async def test_a_silent_rendezvous_endpoint_is_bounded_by_join_timeout() -> None:
    async with fake_server(None) as port:
        config = _job_config(port, join_timeout=0.5)  # read_timeout stays 60 s
        with anyio.fail_after(30):
            async with open_job(config, "/bin/true") as job:
                with pytest.raises(RendezvousConnectionError) as info:
                    await job.wait()
    assert "within join_timeout=0.5s" in str(info.value)
    assert "did not answer the store handshake" in str(info.value)

"""Handlers used without ``async with``: given a task group (seed style), or by the agent."""

from __future__ import annotations

import socket

import anyio
import pytest

from aelastic.rendezvous import RendezvousError, RendezvousParameters, get_rendezvous_handler
from aelastic.rendezvous._static import StaticRendezvousHandler

from .test_c10d import c10d

pytestmark = pytest.mark.anyio


def refuses(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:``port`` any more."""
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


async def test_seed_style_next_rendezvous_in_a_given_task_group() -> None:
    handler = c10d("127.0.0.1:0", 1, 1)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            handler.run_in(tg)
            assert not handler.started
            info = await handler.next_rendezvous()  # starts the handler (hosts the store)
            assert handler.started and handler.server is not None
            port = handler.server.port
            assert (info.rank, info.world_size) == (0, 1)
            await info.store.set("k", "v")
            assert await info.store.get("k") == b"v"
            assert not await handler.is_closed()
            assert await handler.shutdown()
            # shutdown() ended the handler's task: the task group finishes on its own.
    assert not handler.started
    assert refuses(port)


async def test_concurrent_first_calls_start_the_handler_once() -> None:
    handler = c10d("127.0.0.1:0", 1, 1)
    servers: list[object] = []

    async def ask() -> None:
        assert not await handler.is_closed()
        servers.append(handler.server)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            handler.run_in(tg)
            async with anyio.create_task_group() as callers:
                for _ in range(4):
                    callers.start_soon(ask)
            assert len(servers) == 4 and len({id(s) for s in servers}) == 1
            await handler.shutdown()


async def test_cancelling_the_task_group_leaves_the_handler() -> None:
    handler = c10d("127.0.0.1:0", 1, 1)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            handler.run_in(tg)
            await handler.next_rendezvous()
            assert handler.server is not None
            port = handler.server.port
            tg.cancel_scope.cancel()
    assert not handler.started
    assert refuses(port)


async def test_static_handler_in_a_given_task_group() -> None:
    params = RendezvousParameters("static", "127.0.0.1:0", "job", 1, 1, rank=0, timeout=10)
    handler = get_rendezvous_handler(params)
    assert isinstance(handler, StaticRendezvousHandler)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            handler.run_in(tg)
            info = await handler.next_rendezvous()
            assert (info.rank, info.world_size) == (0, 1)
            assert handler.server is not None
            port = handler.server.port
            await handler.shutdown()
    assert refuses(port)


async def test_without_task_group_or_async_with_the_error_names_both_fixes() -> None:
    handler = c10d("127.0.0.1:0", 1, 1)
    with pytest.raises(RendezvousError, match=r"async with handler.*run_in"):
        await handler.next_rendezvous()

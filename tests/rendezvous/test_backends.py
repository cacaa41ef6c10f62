"""The c10d and static handlers over real TCP on asyncio, uvloop and trio (issue 11).

(The other c10d tests use pytest-asyncio fixtures, so they stay on asyncio.)
"""

from __future__ import annotations

import anyio
import pytest

from aelastic.rendezvous import RendezvousParameters, get_rendezvous_handler
from aelastic.rendezvous._c10d import C10dRendezvousHandler
from aelastic.rendezvous._static import StaticRendezvousHandler

from .test_c10d import c10d, rendezvous_all

pytestmark = pytest.mark.anyio


async def test_c10d_host_and_clients_rendezvous_and_regroup() -> None:
    async with c10d("127.0.0.1:0", 2, 3) as host:
        assert isinstance(host, C10dRendezvousHandler) and host.server is not None
        endpoint = f"127.0.0.1:{host.server.port}"
        async with c10d(endpoint, 2, 3) as b, c10d(endpoint, 2, 3) as c:
            # the host's exit barrier waits for its peers before the store closes
            assert host.hosts_store and not b.hosts_store and not c.hosts_store
            with anyio.fail_after(20):
                infos = await rendezvous_all([host, b, c])
            assert sorted((i.rank, i.world_size) for i in infos) == [(0, 3), (1, 3), (2, 3)]
            await infos[1].store.set("k", "v")
            assert await infos[2].store.get("k") == b"v"
            with anyio.fail_after(20):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(host.wait_for_membership_change)
                    tg.start_soon(b.wait_for_membership_change)
                    await c.shutdown()  # c leaves: the others see the round dissolve
                again = await rendezvous_all([host, b])
            assert sorted((i.rank, i.world_size, i.round) for i in again) == [(0, 2, 1), (1, 2, 1)]


async def test_static_rank0_hosts_rank1_connects() -> None:
    def static(endpoint: str, rank: int) -> StaticRendezvousHandler:
        params = RendezvousParameters("static", endpoint, "job", 2, 2, rank=rank, timeout=10)
        handler = get_rendezvous_handler(params)
        assert isinstance(handler, StaticRendezvousHandler)
        return handler

    async with static("127.0.0.1:0", 0) as first:
        assert first.server is not None
        async with static(f"127.0.0.1:{first.server.port}", 1) as second:
            a, b = await first.next_rendezvous(), await second.next_rendezvous()
            assert (a.rank, b.rank, a.world_size) == (0, 1, 2)
            assert first.hosts_store and not second.hosts_store
            await second.set_closed()
            assert await first.is_closed()


async def test_a_handler_block_raises_its_own_error_and_serve_holds_the_handler() -> None:
    """Leaving a handler's block with an error raises that error (not its task group's
    ExceptionGroup) and stops its store; ``tg.start(handler.serve)`` is the same block,
    held until :meth:`shutdown`."""
    host = c10d("127.0.0.1:0", 1, 1)
    with pytest.raises(KeyError, match="the block's own"):
        async with host:
            assert host.server is not None
            port = host.server.port
            raise KeyError("the block's own")
    with pytest.raises(OSError):
        await anyio.connect_tcp("127.0.0.1", port)

    params = RendezvousParameters("static", "127.0.0.1:0", "job", 1, 1, rank=0, timeout=10)
    static = get_rendezvous_handler(params)
    assert isinstance(static, StaticRendezvousHandler)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(static.serve)
            assert static.started and static.server is not None
            info = await static.next_rendezvous()
            assert (info.rank, info.world_size) == (0, 1)
            await static.shutdown()  # serve leaves the block: the group ends uncancelled
    assert not static.started

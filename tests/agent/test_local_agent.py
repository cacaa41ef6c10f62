"""LocalElasticAgent with real subprocess workers (torch-free probes), one node."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import anyio
import pytest

from aelastic.agent import LocalElasticAgent, SignalException, WorkerState
from aelastic.errors import ChildFailedError

from .conftest import (
    LocalRendezvous,
    local_spec,
    open_fds,
    open_reporter,
    pid_alive,
    start_run,
)

_spec = local_spec


async def test_env_contract_and_success(tmp_path: Path) -> None:
    rdzv = LocalRendezvous()
    async with open_reporter() as rep, anyio.create_task_group() as tg:
        agent = LocalElasticAgent(_spec(rdzv, rep.args("hold"), tmp_path))
        results = start_run(tg, agent)
        reports = sorted(await rep.next(2), key=lambda r: r.rank)
        assert agent.get_worker_group().state is WorkerState.HEALTHY
        env0, env1 = reports[0].env, reports[1].env
        assert (env0["RANK"], env1["RANK"]) == ("0", "1")
        assert (env0["LOCAL_RANK"], env1["LOCAL_RANK"]) == ("0", "1")
        for env in (env0, env1):
            assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "2"
            assert env["GROUP_RANK"] == "0" and env["GROUP_WORLD_SIZE"] == "1"
            assert env["ROLE_NAME"] == "trainer"
            assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
            assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True"
            assert env["TORCHELASTIC_RESTART_COUNT"] == "0"
            assert env["TORCHELASTIC_MAX_RESTARTS"] == "2"
            assert env["TORCHELASTIC_RUN_ID"] == "test-run"
            assert env["OMP_NUM_THREADS"] == "1"
            assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
        assert env1["TORCHELASTIC_ERROR_FILE"].endswith(
            os.path.join("attempt_0", "1", "error.json")
        )
        # The agent's own environment is untouched.
        assert "TORCHELASTIC_RUN_ID" not in os.environ
        # The workers' store is live while they run: a raw TCP connect succeeds.
        stream = await anyio.connect_tcp("127.0.0.1", int(env0["MASTER_PORT"]))
        await stream.aclose()
        for r in reports:
            await r.send(0)
    (result,) = results
    assert result.state is WorkerState.SUCCEEDED and not result.is_failed()
    assert result.return_values == {0: None, 1: None}
    assert agent.get_worker_group().state is WorkerState.SUCCEEDED
    assert not any(pid_alive(r.pid) for r in reports)


async def test_failure_restarts_and_spends_budget(tmp_path: Path) -> None:
    rdzv = LocalRendezvous()
    async with open_reporter() as rep, anyio.create_task_group() as tg:
        agent = LocalElasticAgent(_spec(rdzv, rep.args("fail-first", code=3), tmp_path))
        results = start_run(tg, agent)
        # Local rank 1 of attempt 0 may be stopped before it reports.
        second = await rep.next_of_attempt(1)
        first = [r for r in rep.all if r not in second]
        assert {r.env["TORCHELASTIC_RESTART_COUNT"] for r in first} == {"0"}
        for r in second:
            await r.send(0)
    (result,) = results
    assert result.state is WorkerState.SUCCEEDED
    assert agent.remaining_restarts == 1
    assert rdzv.round == 2
    (run_dir,) = (tmp_path / "logs").iterdir()  # torchrun's <run_id>_<random>
    assert run_dir.name.startswith("test-run_")
    attempts = sorted(p.name for p in run_dir.iterdir())
    assert attempts == ["attempt_0", "attempt_1"]  # the restart count; earlier logs are kept
    assert not any(pid_alive(r.pid) for r in first + second)


async def test_budget_exhausted_fails_with_failures(tmp_path: Path) -> None:
    rdzv = LocalRendezvous()
    async with open_reporter() as rep:
        spec = _spec(rdzv, rep.args("exit", code=5), tmp_path, max_restarts=1)
        agent = LocalElasticAgent(spec)
        with anyio.fail_after(60):
            result = await agent.run()
    assert result.is_failed() and result.state is WorkerState.FAILED
    assert agent.get_worker_group().state is WorkerState.FAILED
    assert result.failures and result.return_values == {}
    for rank, failure in result.failures.items():
        assert rank in (0, 1) and failure.exitcode == 5 and failure.local_rank == rank
    assert rdzv.round == 2 and agent.remaining_restarts == 0
    summary = str(ChildFailedError(spec.get_entrypoint_name(), result.failures))
    assert "exitcode" in summary and "5" in summary


async def test_membership_change_restarts_without_spending_budget(tmp_path: Path) -> None:
    rdzv = LocalRendezvous()
    async with open_reporter() as rep, anyio.create_task_group() as tg:
        agent = LocalElasticAgent(_spec(rdzv, rep.args("hold"), tmp_path))
        results = start_run(tg, agent)
        first = await rep.next(2)
        rdzv.change_membership()
        second = await rep.next(2)
        assert {r.env["TORCHELASTIC_RESTART_COUNT"] for r in second} == {"0"}
        assert not any(pid_alive(r.pid) for r in first)
        for r in second:
            await r.send(0)
    assert results[0].state is WorkerState.SUCCEEDED
    assert agent.remaining_restarts == 2 and rdzv.round == 2
    (run_dir,) = (tmp_path / "logs").iterdir()
    attempts = sorted(p.name for p in run_dir.iterdir())
    # Still restart count 0: a second directory for it, the first start's logs kept.
    assert attempts == ["attempt_0", "attempt_0_1"]


async def test_cancellation_stops_workers_and_leaks_nothing(tmp_path: Path) -> None:
    rdzv = LocalRendezvous()
    async with open_reporter() as rep:
        fds_before = open_fds()
        agent = LocalElasticAgent(_spec(rdzv, rep.args("hold"), tmp_path))
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(agent.run)
                reports = await rep.next(2)
                scope.cancel()
        assert scope.cancelled_caught
        assert not any(pid_alive(r.pid) for r in reports)
        assert rdzv.shutdown_calls == 1
        assert not _aelastic_tasks()
        for r in reports:
            await r.wait_closed()
        leaked = open_fds() - fds_before
        # Only the reporter's accepted sockets may remain (closed with the reporter).
        sockets = {str(fd) for fd in leaked if "socket" in _fd_target(fd)}
        assert leaked == sockets and len(sockets) <= 2
    assert agent.get_worker_group().state is WorkerState.STOPPED


def _aelastic_tasks() -> list[asyncio.Task[object]]:
    """Tasks still running code from the aelastic package (there must be none left)."""
    out = []
    for task in asyncio.all_tasks():
        frames = task.get_stack()
        if any("/aelastic/" in f.f_code.co_filename for f in frames):
            out.append(task)
    return out


def _fd_target(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


async def test_worker_ignoring_sigterm_is_killed_after_timeout(tmp_path: Path) -> None:
    rdzv = LocalRendezvous()
    async with open_reporter() as rep:
        spec = _spec(rdzv, rep.args("ignore-term"), tmp_path, shutdown_timeout=0.5)
        agent = LocalElasticAgent(spec)
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(agent.run)
                reports = await rep.next(2)
                started = anyio.current_time()
                tg.cancel_scope.cancel()
        elapsed = anyio.current_time() - started
        assert not any(pid_alive(r.pid) for r in reports)
        assert elapsed >= 0.5  # SIGTERM was ignored: only SIGKILL after the grace ended it


async def test_send_signal_stops_workers_and_raises(tmp_path: Path) -> None:
    rdzv = LocalRendezvous()
    async with open_reporter() as rep:
        agent = LocalElasticAgent(_spec(rdzv, rep.args("hold"), tmp_path))
        raised: list[SignalException] = []
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:

                async def run() -> None:
                    with pytest.raises(SignalException) as info:
                        await agent.run()
                    raised.append(info.value)

                tg.start_soon(run)
                reports = await rep.next(2)
                agent.send_signal(signal.SIGINT)
        assert raised[0].sigval is signal.SIGINT
        assert not any(pid_alive(r.pid) for r in reports)
        assert rdzv.shutdown_calls == 1


async def test_forwarded_non_terminating_signal_reaches_workers(tmp_path: Path) -> None:
    rdzv = LocalRendezvous()
    async with open_reporter() as rep, anyio.create_task_group() as tg:
        agent = LocalElasticAgent(_spec(rdzv, rep.args("hold"), tmp_path, max_restarts=0))
        results = start_run(tg, agent)
        await rep.next(2)
        agent.send_signal(signal.SIGUSR1, terminate=False)  # default action: the worker dies
    (result,) = results
    assert result.is_failed()
    assert {f.signal_name() for f in result.failures.values()} <= {"SIGUSR1"}


async def test_missing_entrypoint_raises_a_clear_error(tmp_path: Path) -> None:
    from aelastic.workers import WorkerStartError

    rdzv = LocalRendezvous()
    agent = LocalElasticAgent(_spec(rdzv, (), tmp_path, entrypoint=str(tmp_path / "nope")))
    with anyio.fail_after(30), pytest.raises(WorkerStartError, match="nope"):
        await agent.run()
    assert rdzv.shutdown_calls == 1


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("local_world_size", 0, "local_world_size"),
        ("max_restarts", -1, "max_restarts"),
        ("entrypoint", None, "entrypoint"),
        ("shutdown_timeout", -1, "shutdown_timeout"),
        ("master_port", 70000, "master_port"),
    ],
)
def test_bad_spec_is_rejected_with_the_field_named(
    tmp_path: Path, field: str, value: object, match: str
) -> None:
    from aelastic.agent._exceptions import AgentConfigError

    with pytest.raises(AgentConfigError, match=match):
        _spec(LocalRendezvous(), (), tmp_path, **{field: value})


async def test_unreapable_workers_stop_the_agent_instead_of_restarting(tmp_path: Path) -> None:
    from aelastic.agent import AgentError

    class StuckAgent(LocalElasticAgent):
        # Seam: a D-state worker cannot be produced on demand; report one after a stop.
        def _unkillable_workers(self, worker_group: object) -> dict[int, int]:
            return {0: 4242}

    rdzv = LocalRendezvous()
    async with open_reporter() as rep:
        agent = StuckAgent(_spec(rdzv, rep.args("exit", code=4), tmp_path, max_restarts=2))
        with anyio.fail_after(30), pytest.raises(AgentError, match="recycle"):
            await agent.run()
    assert rdzv.round == 1 and rdzv.shutdown_calls == 1
    assert agent.get_worker_group().state is WorkerState.UNKNOWN

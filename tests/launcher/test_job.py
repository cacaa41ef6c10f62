"""The job handle: ``open_job`` / ``run_job`` with real worker processes on loopback."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from aelastic import open_job, run_job
from aelastic.agent import SignalException, WorkerState
from aelastic.events import RdzvEvent
from aelastic.events._subscribe import run_id_of
from aelastic.launcher import JobStoppedError
from aelastic.launcher._exceptions import JobSignalError
from aelastic.launcher._job import StateChange
from aelastic.progress._settings import HangSettings
from aelastic.rendezvous import RendezvousTimeoutError

from ._jobs import alive as _alive
from ._jobs import job_config as _config
from ._notify import workers_listener


async def test_transitions_are_pushed_through_a_restart(tmp_path: Path) -> None:
    changes: list[StateChange] = []
    async with workers_listener() as w:
        config = _config(max_restarts=1, log_dir=str(tmp_path))
        with anyio.fail_after(60):
            async with open_job(config, *w.argv("--fail-first")) as job:
                assert job.state is WorkerState.INIT
                async with anyio.create_task_group() as tg:

                    async def collect() -> None:
                        async for change in job.state_changes():
                            changes.append(change)

                    tg.start_soon(collect)
                    assert await job.wait() == {0: None, 1: None}
    states = [c.state for c in changes]
    assert states == [
        WorkerState.INIT,
        WorkerState.HEALTHY,
        WorkerState.FAILED,
        WorkerState.STOPPED,
        WorkerState.HEALTHY,
        WorkerState.SUCCEEDED,
    ]
    assert [c.previous for c in changes[1:]] == states[:-1]
    assert [c.restart_count for c in changes] == [0, 0, 0, 1, 1, 1]
    assert [c.attempt for c in changes] == [-1, 0, 0, 0, 1, 1]
    first_round, second_round = changes[1].round, changes[4].round
    assert first_round is not None and second_round is not None and second_round > first_round
    failure = job.last_failure
    assert failure is not None and failure.exitcode == 5 and failure.local_rank == 0
    assert failure.attempt == 0
    # a late reader gets the whole history, then the iterator ends with the job
    assert [c.state async for c in job.state_changes()] == states


async def test_workers_signals_and_a_terminating_signal(tmp_path: Path) -> None:
    async with workers_listener() as w:
        config = _config(log_dir=str(tmp_path), redirects="3")
        with anyio.fail_after(60):
            async with open_job(config, *w.argv("--wait")) as job:
                pids = await w.ready(2)
                async for change in job.state_changes():
                    if change.state is WorkerState.HEALTHY:
                        break
                workers = job.workers()
                assert {x.local_rank: x.pid for x in workers} == pids
                assert sorted(x.global_rank for x in workers) == [0, 1]
                assert {x.attempt for x in workers} == {0}
                for x in workers:
                    assert x.stdout is not None and x.stderr is not None
                    # <log_dir>/<run_id>_<random>/attempt_0/<local_rank> (torchrun's layout)
                    rank_dir = Path(x.stdout).parent
                    assert rank_dir.name == str(x.local_rank)
                    assert rank_dir.parent.name == "attempt_0"
                    assert rank_dir.parent.parent.parent == tmp_path
                    assert rank_dir.parent.parent.name.startswith(f"{job.run_id}_")
                job.send_signal(signal.SIGUSR1, terminate=False)  # forwarded, the job goes on
                got = {tuple(await w.line()) for _ in range(2)}
                assert got == {("usr1", "0"), ("usr1", "1")}
                assert job.state is WorkerState.HEALTHY
                job.send_signal(signal.SIGTERM)
                with pytest.raises(SignalException) as info:
                    await job.wait()
                assert info.value.sigval == signal.SIGTERM
    assert not any(_alive(pid) for pid in pids.values())


async def test_leaving_the_block_stops_the_job() -> None:
    async with workers_listener() as w:
        with anyio.fail_after(60):
            async with open_job(_config(), *w.argv("--wait")) as job:
                pids = await w.ready(2)
            assert job.done and job.state is WorkerState.STOPPED
            with pytest.raises(JobStoppedError, match="stopped before it finished"):
                await job.wait()
    assert not any(_alive(pid) for pid in pids.values())


async def test_an_error_in_the_block_stops_the_job_and_propagates_unwrapped() -> None:
    async with workers_listener() as w:
        with anyio.fail_after(60), pytest.raises(KeyError, match="boom"):
            async with open_job(_config(1), *w.argv("--wait")):
                pids = await w.ready(1)
                raise KeyError("boom")
    assert not any(_alive(pid) for pid in pids.values())


async def test_run_job_returns_the_handle_once_the_workers_are_up() -> None:
    async with workers_listener() as w:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                job = await tg.start(run_job, _config(), *w.argv("--wait"))
                assert job.state is WorkerState.HEALTHY
                assert all(x.pid is not None for x in job.workers())
                await w.ready(2)
                await w.tell_all("exit 0")
                assert await job.wait() == {0: None, 1: None}


async def test_run_job_raises_from_start_when_the_job_ends_before_its_workers_run() -> None:
    config = _config(rdzv_configs={"join_timeout": 0.2}, min_nodes=2, max_nodes=2)
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            with pytest.raises(RendezvousTimeoutError, match="join_timeout"):
                await tg.start(run_job, config, "/bin/true")


async def test_events_are_scoped_to_their_job() -> None:
    async with workers_listener() as w:
        with anyio.fail_after(60):
            async with (
                open_job(_config(1), *w.argv()) as a,
                open_job(_config(1), *w.argv()) as b,
                a.events() as a_events,
                b.events() as b_events,
            ):
                assert await a.wait() == {0: None} and await b.wait() == {0: None}
    assert a.run_id != b.run_id
    seen_a = [e async for e in a_events]
    seen_b = [e async for e in b_events]
    assert seen_a and seen_b
    assert {run_id_of(e) for e in seen_a} == {a.run_id}
    assert {run_id_of(e) for e in seen_b} == {b.run_id}
    assert "torchelastic.worker.status.SUCCEEDED" in {e.name for e in seen_a}
    assert any(isinstance(e, RdzvEvent) for e in seen_a)  # the rendezvous' own events too


async def test_a_hung_worker_is_the_last_failure_once_it_is_stopped(tmp_path: Path) -> None:
    """The failure is the one the agent reports once it stopped the hung worker (its
    signal exit), never the exit codes of a moment when it still ran (none)."""
    async with workers_listener() as w:
        config = _config(
            max_restarts=1, log_dir=str(tmp_path), hangs=HangSettings(heartbeat_timeout=1.0)
        )
        with anyio.fail_after(60):
            async with open_job(config, *w.argv("--hang-first")) as job:
                failure_at: dict[WorkerState, Any] = {}
                async for change in job.state_changes():
                    failure_at.setdefault(change.state, job.last_failure)
                assert await job.wait() == {0: None, 1: None}
    failure = job.last_failure
    assert failure is not None and failure_at[WorkerState.STOPPED] == failure
    assert failure_at[WorkerState.FAILED] in (None, failure)  # never a half-known failure
    assert failure.local_rank == 0 and failure.attempt == 0 and failure.exitcode < 0
    assert job.restart_count == 1


#: A service that leaves a job's block while the job still waits in its rendezvous.
_LEAVE_WAITING_JOB = """
import anyio, aelastic
async def main():
    config = aelastic.LaunchConfig(min_nodes=2, max_nodes=2, nproc_per_node=1,
                                   rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0")
    for _ in range(3):
        async with aelastic.open_job(config, "/bin/true") as job:
            try:
                job.send_signal(100_000)  # an error raised and handled inside the block
            except ValueError:
                pass
    print("left")
anyio.run(main)
"""


async def test_leaving_a_job_that_waits_in_its_rendezvous_returns() -> None:
    # In its own interpreter: the bug spun the event loop in a callback (an exception
    # that was its own __context__), where no timeout of this test's loop can fire.
    with anyio.fail_after(60):
        done = await anyio.run_process([sys.executable, "-c", _LEAVE_WAITING_JOB], check=False)
    assert done.returncode == 0 and done.stdout.strip() == b"left", done.stderr.decode()


async def test_send_signal_with_a_bad_number_names_the_fix() -> None:
    with anyio.fail_after(60):
        async with open_job(_config(1, min_nodes=2, max_nodes=2), "/bin/true") as job:
            with pytest.raises(JobSignalError, match=r"signal\.SIGTERM"):
                job.send_signal(100_000)
            assert issubclass(JobSignalError, ValueError)
            assert not job.done  # nothing was sent: the job goes on

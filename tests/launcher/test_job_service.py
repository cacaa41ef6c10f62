"""The job handle as a service uses it: stop, final state, late event subscribers.

Real worker processes (job_worker.py) on loopback; nothing sleeps: every wait is on a
worker's line, the job's end or a state transition.
"""

from __future__ import annotations

import os
from typing import Any

import anyio
import pytest

from aelastic.agent import WorkerState
from aelastic.events import RdzvEvent
from aelastic.events._subscribe import run_id_of
from aelastic.launcher import JobStoppedError, LaunchConfig, open_job

from ._notify import workers_listener


def _config(nproc: int = 1, **kw: Any) -> LaunchConfig:
    settings: dict[str, Any] = {
        "min_nodes": 1,
        "max_nodes": 1,
        "nproc_per_node": nproc,
        "rdzv_backend": "c10d",
        "rdzv_endpoint": "127.0.0.1:0",
        "max_restarts": 0,
    }
    return LaunchConfig(**{**settings, **kw})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_stop_waits_until_the_workers_are_gone_and_the_block_goes_on() -> None:
    async with workers_listener() as w:
        with anyio.fail_after(60):
            async with open_job(_config(2, health_port=0), *w.argv("--wait")) as job:
                pids = await w.ready(2)
                await job.stop()
                assert job.done and not any(_alive(pid) for pid in pids.values())
                with pytest.raises(JobStoppedError, match=r"job\.stop\(\) was called"):
                    await job.wait()
                await job.stop()  # a job already stopped: returns at once
                assert job.health_address is not None  # still served inside the block
                stream = await anyio.connect_tcp(*job.health_address)
                await stream.aclose()
    assert [c.state for c in job.history][-2:] == [WorkerState.HEALTHY, WorkerState.STOPPED]


async def test_stop_during_the_first_rendezvous_ends_in_stopped_not_init() -> None:
    config = _config(min_nodes=2, max_nodes=2)  # the second node never comes
    with anyio.fail_after(60):
        async with open_job(config, "/bin/true") as job:
            await job.stop()
    assert [c.state for c in job.history] == [WorkerState.INIT, WorkerState.STOPPED]
    assert job.state is WorkerState.STOPPED


async def test_a_block_left_before_the_first_transition_reports_stopped() -> None:
    with anyio.fail_after(60):
        async with open_job(_config(min_nodes=2, max_nodes=2), "/bin/true") as job:
            pass
    assert job.done and job.state is WorkerState.STOPPED
    assert job.history[-1].state is WorkerState.STOPPED and job.history[-1].previous is not None


async def test_the_final_state_is_in_the_history_after_the_block() -> None:
    """A watcher inside the block is cancelled with it; ``history`` still has the end."""
    async with workers_listener() as w:
        with anyio.fail_after(60):
            seen: list[WorkerState] = []
            config = _config(1, max_restarts=1)
            async with (
                open_job(config, *w.argv("--fail-first")) as job,
                anyio.create_task_group() as tg,
            ):

                async def watch() -> None:
                    async for change in job.state_changes():
                        seen.append(change.state)

                tg.start_soon(watch)
                assert await job.wait() == {0: None}
                tg.cancel_scope.cancel()
    assert [c.state for c in job.history] == [
        WorkerState.INIT,
        WorkerState.HEALTHY,
        WorkerState.FAILED,  # before the restart, as WorkerState's docstring says
        WorkerState.STOPPED,
        WorkerState.HEALTHY,
        WorkerState.SUCCEEDED,
    ]
    assert seen == [c.state for c in job.history][: len(seen)]


async def test_a_late_subscriber_gets_the_earlier_events_then_the_stream_ends() -> None:
    async with workers_listener() as w:
        with anyio.fail_after(60):
            async with open_job(_config(1), *w.argv("--wait")) as job:
                await w.ready(1)
                async with job.events() as during:  # entered after the start
                    await w.tell_all("exit 0")
                    assert await job.wait() == {0: None}
                    seen_during = [e async for e in during]  # ends: the job is done
            async with job.events() as after:  # entered after the block
                seen_after = [e async for e in after]
    for seen in (seen_during, seen_after):
        names = [e.name for e in seen]
        assert {run_id_of(e) for e in seen} == {job.run_id}
        assert any(isinstance(e, RdzvEvent) for e in seen)  # recorded before entering
        assert "torchelastic.worker.status.SUCCEEDED" in names
    assert [e.name for e in seen_after] == [e.name for e in seen_during]

"""The job handle as a service uses it: stop, final state, late event subscribers.

Real worker processes (job_worker.py) on loopback; nothing sleeps: every wait is on a
worker's line, the job's end or a state transition.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import anyio
import pytest

from aelastic import LaunchConfig, open_job
from aelastic.agent import WorkerState
from aelastic.events import RdzvEvent
from aelastic.events._subscribe import run_id_of
from aelastic.health._settings import HealthSettings
from aelastic.launcher import JobStoppedError
from aelastic.launcher._exceptions import LaunchConfigError

from ._jobs import alive as _alive
from ._jobs import job_config
from ._notify import Workers, workers_listener


def _config(nproc: int = 1, **kw: Any) -> LaunchConfig:
    return job_config(nproc, **kw)


async def test_stop_waits_until_the_workers_are_gone_and_the_block_goes_on() -> None:
    async with workers_listener() as w:
        with anyio.fail_after(60):
            async with open_job(
                _config(2, health=HealthSettings(port=0)), *w.argv("--wait")
            ) as job:
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


async def _hello(w: Workers) -> list[str]:
    while True:
        words = await w.line()
        if words[0] == "hello":
            return words[1:]


async def test_per_job_env_and_cwd_reach_the_workers_in_warm_interpreters(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    config = _config(1, max_restarts=1, env={"AELASTIC_JOB_VAR": "job-a"}, cwd=str(work))
    cwd_before = os.getcwd()
    async with workers_listener() as w:
        with anyio.fail_after(60):
            argv = w.argv("--hello", "--wait")
            async with open_job(config, *argv) as job:
                first = await _hello(w)
                pool = job._agent._warm_pool  # pre-started interpreters for the restart
                assert pool is not None
                await pool.wait_ready()
                await w.tell_all("exit 3")
                second = await _hello(w)
                await w.tell_all("exit 0")
                assert await job.wait() == {0: None}
    for restart, (got_restart, _pid, _warm, var, cwd) in enumerate([first, second]):
        assert (got_restart, var, cwd) == (str(restart), "job-a", str(work))
    assert second[2] == "1"  # the restart ran in a warm interpreter
    assert "AELASTIC_JOB_VAR" not in os.environ and os.getcwd() == cwd_before


async def test_warm_workers_off_for_one_job() -> None:
    async with workers_listener() as w:
        with anyio.fail_after(60):
            argv = w.argv("--hello", "--wait")
            async with open_job(_config(2, warm_workers=False), *argv) as job:
                hellos = [await _hello(w), await _hello(w)]
                assert job._agent._warm_pool is None  # no idle interpreter kept
                await w.tell_all("exit 0")
                assert await job.wait() == {0: None, 1: None}
    assert [h[2] for h in hellos] == ["0", "0"] and [h[3] for h in hellos] == ["-", "-"]


def test_env_and_cwd_that_cannot_work_are_named(tmp_path: Path) -> None:
    with pytest.raises(LaunchConfigError, match=r"cwd=.*not a directory"):
        _config(cwd=str(tmp_path / "missing"))
    with pytest.raises(LaunchConfigError, match=r"env=.*mapping of variable names"):
        _config(env={"A": 1})


async def test_log_dir_and_no_empty_temporary_tree_left() -> None:
    with anyio.fail_after(60):
        async with open_job(_config(2), "/bin/true") as job:
            assert await job.wait() == {0: None, 1: None}
    assert job.log_dir is not None and os.path.basename(job.log_dir).startswith(job.run_id)
    root = os.path.dirname(job.log_dir)
    assert os.path.basename(root).startswith("aelastic_") and _tree(root) is None


async def test_a_temporary_log_tree_keeps_what_the_workers_wrote() -> None:
    config = _config(1, redirects="1")  # stdout to a file
    with anyio.fail_after(60):
        async with open_job(config, "/bin/sh", "-c", "echo written") as job:
            assert await job.wait() == {0: None}
    assert job.log_dir is not None
    tree = _tree(job.log_dir)
    shutil.rmtree(os.path.dirname(job.log_dir))
    assert tree is not None
    files, empty_dirs = tree
    assert list(files.values()) == ["written\n"] and not empty_dirs


def _tree(root: str) -> tuple[dict[str, str], list[str]] | None:
    """The files under ``root`` with their text and its empty directories (None: no root)."""
    if not os.path.exists(root):
        return None
    files = {str(p): p.read_text() for p in Path(root).rglob("*") if p.is_file()}
    empty = [str(d) for d in Path(root).rglob("*") if d.is_dir() and not any(d.iterdir())]
    return files, empty

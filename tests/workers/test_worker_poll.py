"""WorkerProcesses.poll_exits: an exit the loop has not delivered yet is seen before a stop."""

from __future__ import annotations

import os
import signal

import pytest

from aelastic.workers import ProcessSpec, open_worker_processes

from .conftest import py

pytestmark = pytest.mark.anyio  # every backend


@pytest.fixture(autouse=True, params=["pidfd", "thread"])
def _watcher(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.param == "pidfd" and not hasattr(os, "pidfd_open"):
        pytest.skip("no pidfd on this platform")
    monkeypatch.setenv("AELASTIC_CHILD_WATCHER", request.param)


async def test_poll_exits_records_an_exit_before_the_loop_delivers_it() -> None:
    specs = [
        ProcessSpec(local_rank=0, args=py("import signal\nsignal.pause()"), env=dict(os.environ)),
        ProcessSpec(local_rank=1, args=py("import sys\nsys.exit(3)"), env=dict(os.environ)),
    ]
    async with open_worker_processes(specs, shutdown_timeout=10) as workers:
        # Block this thread (and so the loop) until rank 1 is a zombie: its pidfd is
        # readable but the loop cannot have delivered the exit.
        os.waitid(os.P_PID, workers.pids[1], os.WEXITED | os.WNOWAIT)  # noqa: ASYNC222
        assert workers.exits == {}
        workers.poll_exits()
        assert set(workers.exits) == {1}
        assert workers.exits[1].exitcode == 3
        assert workers.is_alive(0)
        assert (await workers.wait_for_exit()).local_rank == 1  # delivered once, not lost
        await workers.stop()
    assert workers.exits[0].exitcode == -signal.SIGTERM
    assert workers.exits[1].exitcode == 3

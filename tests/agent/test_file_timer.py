"""torchrun's file-based expiration timer served by the agent, with torch's real client."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from aelastic.agent import LocalElasticAgent, WorkerState
from aelastic.agent._file_timer import FileTimerServer, parse_request

from .conftest import SCRIPTS, LocalRendezvous, local_spec, run_until_event

WORKER = str(SCRIPTS / "file_timer_worker.py")


async def test_worker_with_an_expired_torch_timer_is_killed_and_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHELASTIC_ENABLE_FILE_TIMER", "1")
    monkeypatch.delenv("TORCHELASTIC_TIMER_FILE", raising=False)
    # the warm interpreter imports torch while the first attempt runs: the restarted
    # worker starts without the import (seconds on a loaded machine)
    spec = local_spec(
        LocalRendezvous(),
        ("-u", WORKER),
        tmp_path,
        local_world_size=1,
        max_restarts=1,
        preload=("torch.distributed.elastic.timer",),
    )
    agent = LocalElasticAgent(spec)
    with anyio.fail_after(120):
        name = "aelastic.file_timer.expired"
        result, event = await run_until_event(agent, name, run_id="test-run")
    assert result.state is WorkerState.SUCCEEDED
    assert agent.remaining_restarts == 0  # the killed worker was a failure like any other
    assert event.metadata["scope_ids"] == "stuck_in_collective"
    assert event.metadata["signal"] == signal.SIGKILL


async def test_the_failure_says_the_timer_expired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHELASTIC_ENABLE_FILE_TIMER", "1")
    monkeypatch.delenv("TORCHELASTIC_TIMER_FILE", raising=False)
    spec = local_spec(
        LocalRendezvous(), ("-u", WORKER), tmp_path, local_world_size=1, max_restarts=0
    )
    with anyio.fail_after(120):
        result = await LocalElasticAgent(spec).run()
    assert result.state is WorkerState.FAILED
    (failure,) = result.failures.values()
    assert failure.exitcode == -signal.SIGKILL
    assert "'stuck_in_collective'" in failure.message and "expired" in failure.message
    assert "OOM" not in failure.message


def test_protocol_release_partial_lines_and_garbage() -> None:
    events: list[object] = []
    server = FileTimerServer(lambda name, md: events.append(name))
    line = b'{"version": 1, "pid": 99999999, "scope_id": "a", "expiration_time": 1.0, "signal": 9}'
    server.feed(line[:10])
    assert not server.timers  # a partial line waits for the rest
    server.feed(line[10:] + b"\nnot json\n")
    assert list(server.timers) == [(99999999, "a")]
    release = (
        b'{"version": 1, "pid": 99999999, "scope_id": "a", "expiration_time": -1, "signal": 0}'
    )
    server.feed(release + b"\n")
    assert not server.timers
    server.feed(line + b"\n")
    server.expire(now=2.0)  # the pid does not exist: dropped, nothing signalled
    assert not server.timers and not server.reaped and not events
    with pytest.raises(ValueError, match="not a FileTimerRequest"):
        parse_request(b'{"pid": 1}')


def test_only_the_current_workers_can_be_signalled() -> None:
    """A client may write any pid: 0 (the agent's own process group), -1 (every process)
    or another process's. Only the workers the agent started are signalled."""
    events: list[object] = []
    server = FileTimerServer(lambda name, md: events.append(name))
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    with (
        subprocess.Popen(sleep, start_new_session=True) as worker,
        subprocess.Popen(sleep) as bystander,
    ):
        try:
            server.worker_pids = frozenset({worker.pid})
            for pid, sig in ((0, signal.SIGWINCH), (bystander.pid, signal.SIGTERM)):
                server.feed(_request(pid, sig))
            server.expire(now=2.0)
            assert not server.reaped and not events
            assert bystander.poll() is None  # untouched
            server.feed(_request(worker.pid, signal.SIGTERM))
            server.expire(now=2.0)
            assert list(server.reaped) == [worker.pid]
            assert worker.wait(timeout=30) == -signal.SIGTERM
        finally:
            bystander.kill()
            worker.kill()


def _request(pid: int, sig: int) -> bytes:
    return (
        json.dumps(
            {"version": 1, "pid": pid, "scope_id": "s", "expiration_time": 1.0, "signal": sig}
        ).encode()
        + b"\n"
    )


def test_a_failed_fifo_setup_leaves_nothing_behind(tmp_path: Path) -> None:
    """The second end cannot be opened (no descriptor left): the first end is closed and
    the FIFO removed, not leaked."""
    code = (
        "import os, resource, sys\n"
        "from aelastic.agent._file_timer import _make_fifo\n"
        "probe = os.open(os.devnull, os.O_RDONLY); os.close(probe)\n"
        "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (probe + 1, hard))\n"
        "try:\n"
        "    _make_fifo(sys.argv[1])\n"
        "except OSError as exc:\n"
        "    print('failed', exc.errno)\n"
        "try:\n"
        "    os.fstat(probe)\n"
        "    print('leaked fd')\n"
        "except OSError:\n"
        "    print('closed')\n"
    )
    fifo = tmp_path / "timer"
    out = subprocess.run(
        [sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[:2] == ["failed 24", "closed"]  # EMFILE, then no leaked end
    assert not fifo.exists()


async def test_an_expired_timer_captures_every_workers_stacks_before_the_kill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's ``expires(after=2)`` in local rank 0: the stacks of both workers are
    written before the kill, and the failure says "hung" with the timer's scope."""
    from aelastic.errors import ChildFailedError

    monkeypatch.setenv("TORCHELASTIC_ENABLE_FILE_TIMER", "1")
    monkeypatch.delenv("TORCHELASTIC_TIMER_FILE", raising=False)
    script = str(SCRIPTS / "file_timer_ddp_worker.py")
    spec = local_spec(LocalRendezvous(), ("-u", script), tmp_path, max_restarts=0)
    with anyio.fail_after(120):
        result = await LocalElasticAgent(spec).run()
    assert result.state is WorkerState.FAILED
    (failure,) = result.failures.values()
    assert failure.local_rank == 0 and failure.exitcode == -signal.SIGKILL
    (run_dir,) = (tmp_path / "logs").glob("test-run_*")
    stacks = {rank: run_dir / "attempt_0" / str(rank) / "stacks.txt" for rank in (0, 1)}
    assert "stuck_in_collective" in stacks[0].read_text()
    assert "healthy_peer" in stacks[1].read_text()
    text = str(ChildFailedError("file_timer_ddp_worker.py", result.failures))
    assert "hung in scope 'allreduce_step_7'" in text
    assert f"Stacks of every thread: {stacks[0]}" in text

"""torchrun's file-based expiration timer served by the agent, with torch's real client."""

from __future__ import annotations

import signal
from pathlib import Path

import anyio
import pytest

from aelastic.agent import LocalElasticAgent, WorkerState
from aelastic.agent._file_timer import FileTimerServer, parse_request
from aelastic.events import subscribe

from .conftest import SCRIPTS, LocalRendezvous, local_spec, start_run

WORKER = str(SCRIPTS / "file_timer_worker.py")


async def test_worker_with_an_expired_torch_timer_is_killed_and_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHELASTIC_ENABLE_FILE_TIMER", "1")
    monkeypatch.delenv("TORCHELASTIC_TIMER_FILE", raising=False)
    spec = local_spec(
        LocalRendezvous(), ("-u", WORKER), tmp_path, local_world_size=1, max_restarts=1
    )
    agent = LocalElasticAgent(spec)
    with anyio.fail_after(120):
        async with subscribe() as stream, anyio.create_task_group() as tg:
            results = start_run(tg, agent)
            async for event in stream:
                if event.name == "aelastic.file_timer.expired":
                    break
    (result,) = results
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
    server = FileTimerServer(events.append)
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

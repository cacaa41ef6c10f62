"""The agent's final status event (torch's launch_agent: ``events.record(agent.get_event_
succeeded())`` after ``agent.run()`` returned, ``get_event_failed()`` when it raised).

Exactly one AGENT-source ``torchelastic.worker.status.SUCCEEDED`` or ``...FAILED`` per
run, to the config's ``event_log_handler``, from every launch path; real workers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from aelastic import LaunchConfig, elastic_launch, events, launch, open_job
from aelastic.errors import ChildFailedError
from aelastic.events._dispatch import flush_blocking, unregister_handler
from aelastic.launcher import JobStoppedError, launch_agent
from aelastic.workers import WorkerStartError

_DEST = "agent-status-test"
_PREFIX = "torchelastic.worker.status."


def _config(**kw: Any) -> LaunchConfig:
    settings: dict[str, Any] = {
        "min_nodes": 1,
        "max_nodes": 1,
        "nproc_per_node": 1,
        "rdzv_backend": "c10d",
        "rdzv_endpoint": "127.0.0.1:0",
        "max_restarts": 0,
        "event_log_handler": _DEST,
    }
    return LaunchConfig(**{**settings, **kw})


@pytest.fixture
def received() -> Iterator[list[events.Event]]:
    got: list[events.Event] = []
    events.register_handler(_DEST, got.append)
    yield got
    unregister_handler(_DEST, got.append)


def _agent_status(received: list[events.Event]) -> list[events.Event]:
    assert flush_blocking(timeout=30)
    return [
        e
        for e in received
        if e.source is events.EventSource.AGENT
        and e.name in (_PREFIX + "SUCCEEDED", _PREFIX + "FAILED")
    ]


def _only(received: list[events.Event], state: str) -> events.Event:
    status = _agent_status(received)
    assert [e.name for e in status] == [_PREFIX + state]
    assert status[0].metadata["state"] == state
    return status[0]


async def test_launch_records_succeeded(received: list[events.Event]) -> None:
    with anyio.fail_after(120):
        values = await launch(_config(run_id="ok"), sys.executable, "-c", "pass")
    assert values == {0: None}
    event = _only(received, "SUCCEEDED")
    assert event.metadata["run_id"] == "ok" and event.metadata["raw_error"] is None


async def test_failed_workers_still_record_succeeded(received: list[events.Event]) -> None:
    # torch: "records that agent.run() has succeeded NOT that workers have succeeded"
    with anyio.fail_after(120), pytest.raises(ChildFailedError):
        await launch(_config(), sys.executable, "-c", "raise SystemExit(3)")
    _only(received, "SUCCEEDED")
    # the workers' own events say they failed
    workers = [e for e in received if e.source is events.EventSource.WORKER]
    assert {e.name for e in workers if e.name.endswith("FAILED")} == {_PREFIX + "FAILED"}


async def test_an_agent_that_raises_records_failed(
    received: list[events.Event], tmp_path: Path
) -> None:
    with anyio.fail_after(120), pytest.raises(WorkerStartError):
        await launch(_config(), str(tmp_path / "no-such-binary"))
    event = _only(received, "FAILED")
    assert "WorkerStartError" in str(event.metadata["raw_error"])


async def test_a_stopped_open_job_records_failed(received: list[events.Event]) -> None:
    ready = "import sys, time; print('up', flush=True); time.sleep(600)"
    with anyio.fail_after(120):
        async with open_job(_config(nproc_per_node=1), sys.executable, "-c", ready) as job:
            async for change in job.state_changes():
                if change.state.value == "HEALTHY":
                    break
            await job.stop()
            with pytest.raises(JobStoppedError):
                await job.wait()
    _only(received, "FAILED")


def test_elastic_launch_records_succeeded(received: list[events.Event]) -> None:
    assert elastic_launch(_config(), sys.executable)("-c", "pass") == {0: None}
    _only(received, "SUCCEEDED")


def test_launch_agent_records_succeeded_or_failed(
    received: list[events.Event], tmp_path: Path
) -> None:
    with pytest.raises(ChildFailedError):
        launch_agent(_config(), sys.executable, ["-c", "raise SystemExit(2)"])
    _only(received, "SUCCEEDED")
    received.clear()
    with pytest.raises(WorkerStartError):
        launch_agent(_config(), str(tmp_path / "missing"), [])
    _only(received, "FAILED")


@pytest.mark.parametrize(("code", "rc"), [("pass", 0), ("raise SystemExit(4)", 1)])
def test_cli_records_one_status_event(tmp_path: Path, code: str, rc: int) -> None:
    script = tmp_path / "w.py"
    script.write_text(code + "\n")
    out = tmp_path / "events.jsonl"
    env = {**os.environ, "AELASTIC_EVENTS_FILE": str(out)}
    argv = ["--standalone", "--nproc-per-node", "2", "--event-log-handler", "file", str(script)]
    proc = subprocess.run(
        [sys.executable, "-m", "aelastic", "run", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == rc, proc.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    status = [
        e
        for e in lines
        if e.get("source") == "AGENT" and e["name"] in (_PREFIX + "SUCCEEDED", _PREFIX + "FAILED")
    ]
    assert [e["name"] for e in status] == [_PREFIX + "SUCCEEDED"], lines

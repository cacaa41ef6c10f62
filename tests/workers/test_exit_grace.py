"""A warm worker that ended its script but never exits: bounded by exit_grace, then killed.

Real workers: local rank 1 registers an ``atexit`` handler that blocks forever (a
teardown that deadlocks, like torch's gloo one seen at exit), rank 0 exits at once.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import anyio
import pytest
from agent._shared import LocalRendezvous  # tests/ is on sys.path (rootdir, no __init__)

from aelastic.agent import LocalElasticAgent, WorkerSpec, WorkerState
from aelastic.workers._exit_grace import parse_exit_notice, shutdown_report
from aelastic.workers._warm import WARM_WORKERS_ENV
from aelastic.workers._warm_boot import _exit_status

WORKER = """\
import atexit, os, sys, threading, time
mode = sys.argv[1]
if os.environ["LOCAL_RANK"] == "1":
    if mode == "stuck-in-script":  # its work done, it never ends its script (no CPU)
        threading.Event().wait()
    elif mode == "gil-deadlock":  # the main thread sleeps holding the GIL three threads want
        import ctypes
        def spin():
            while True:
                pass
        for _ in range(3):
            threading.Thread(target=spin, daemon=True).start()
        ctypes.PyDLL(None).sleep(600)  # a PyDLL call keeps the GIL
    elif mode == "busy":  # still computing well after its peer left: never killed
        until = time.monotonic() + 4
        while time.monotonic() < until:
            pass
    else:
        atexit.register(threading.Event().wait)  # the interpreter's shutdown never ends
        sys.exit(int(mode))
"""


def _spec(tmp_path: Path, status: int | str, **kw: object) -> WorkerSpec:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    options: dict[str, object] = dict(
        role="trainer",
        local_world_size=2,
        rdzv_handler=LocalRendezvous("exit-grace"),
        entrypoint=sys.executable,
        args=("-u", str(script), str(status)),
        max_restarts=0,
        shutdown_timeout=5.0,
        log_dir=str(tmp_path / "logs"),
        exit_grace=1.0,
    )
    options.update(kw)
    return WorkerSpec(**options)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _warm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WARM_WORKERS_ENV, "1")


async def test_a_finished_worker_stuck_at_exit_is_killed_and_the_job_succeeds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="aelastic.workers")
    with anyio.fail_after(60):  # without the bound: forever
        result = await LocalElasticAgent(_spec(tmp_path, 0)).run()
    assert result.state is WorkerState.SUCCEEDED, result
    (report,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "worker local_rank=1 (pid" in report
    assert "did not exit within 1 s (--exit-grace) after its script ended with status 0" in report
    assert "stuck in the interpreter's shutdown (" in report and "main thread" in report
    assert "Killed with SIGKILL; counted as exit status 0" in report


async def test_the_killed_worker_counts_with_its_scripts_exit_status(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="aelastic.workers")
    with anyio.fail_after(60):
        result = await LocalElasticAgent(_spec(tmp_path, 3)).run()
    assert result.state is WorkerState.FAILED
    assert sorted(result.failures) == [1]
    assert result.failures[1].exitcode == 3
    assert "counted as exit status 3" in caplog.text


async def test_a_longer_grace_reports_the_wait_before_the_kill(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aelastic.workers import _processes

    monkeypatch.setattr(_processes, "EXIT_WARN_AFTER", 0.5)
    caplog.set_level(logging.WARNING, logger="aelastic.workers")
    with anyio.fail_after(60):
        result = await LocalElasticAgent(_spec(tmp_path, 0, exit_grace=2.0)).run()
    assert result.state is WorkerState.SUCCEEDED
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    (waiting,) = [w for w in warnings if "has not exited" in w]
    assert "local_rank=1" in waiting and "ended its script (status 0)" in waiting
    assert "killing it 2 s after its script ended (--exit-grace)" in waiting


@pytest.mark.parametrize("mode", ["stuck-in-script", "gil-deadlock"])
async def test_a_worker_idle_in_its_script_after_its_peer_succeeded_is_killed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """Rank 0 exited 0; rank 1 stays in its script without working: blocked, or in the
    torch deadlock seen (a destructor joins gloo's thread holding the GIL that thread
    waits for: threads waiting for the GIL wake every 5 ms, ~0.6% of a CPU each, which
    a share of the whole process missed). Warm pool off: the rule needs no word from the
    worker."""
    monkeypatch.setenv(WARM_WORKERS_ENV, "0")
    caplog.set_level(logging.WARNING, logger="aelastic.workers")
    with anyio.fail_after(60):
        result = await LocalElasticAgent(_spec(tmp_path, mode)).run()
    assert result.state is WorkerState.SUCCEEDED
    (report,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "worker local_rank=1 (pid" in report
    assert "used almost no CPU for 1 s (--exit-grace) while every other local worker had" in report
    assert "Killed with SIGKILL; counted as exit status 0" in report
    assert "still runs 1 s after a local peer exited 0" in caplog.text


async def test_a_worker_that_computes_after_its_peer_left_is_not_killed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="aelastic.workers")
    with anyio.fail_after(60):
        result = await LocalElasticAgent(_spec(tmp_path, "busy")).run()
    assert result.state is WorkerState.SUCCEEDED
    assert "Killed with SIGKILL" not in caplog.text


@pytest.mark.parametrize(
    ("data", "status"),
    [(b"exit 0\n", 0), (b"exit 3\n", 3), (b"exit 3", None), (b"", None), (b"exit x\n", None)],
)
def test_parse_exit_notice(data: bytes, status: int | None) -> None:
    assert parse_exit_notice(data) == status


@pytest.mark.parametrize(("code", "status"), [(None, 0), (0, 0), (3, 3), (256, 0), ("bye", 1)])
def test_exit_status_like_the_interpreter(code: object, status: int) -> None:
    assert _exit_status(code) == status


def test_shutdown_report_of_a_process_that_is_gone() -> None:
    assert shutdown_report(2**22 + 1) == "gone"

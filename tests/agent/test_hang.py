"""Hang detection in the agent with real worker processes (aelastic.progress)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

import anyio
import pytest

from aelastic import metrics
from aelastic.agent import LocalElasticAgent, RunResult, WorkerState
from aelastic.events import subscribe
from aelastic.metrics._handlers import MetricData, NullMetricHandler

from .conftest import SCRIPTS, LocalRendezvous, local_spec, run_until_event, start_run

WORKER = str(SCRIPTS / "hang_worker.py")


def _spec(tmp_path: Path, mode: str, hung: int = 1, **kw: object) -> object:
    options: dict[str, object] = dict(
        initial_heartbeat_timeout=30.0, heartbeat_timeout=2.0, max_restarts=1
    )
    options.update(kw)
    return local_spec(LocalRendezvous(), ("-u", WORKER, mode, str(hung)), tmp_path, **options)


def _attempt_dir(tmp_path: Path, attempt: int) -> Path:
    # The agent's own run directory: <log_dir>/<run_id>_<random> (torchrun's layout).
    (run_dir,) = (tmp_path / "logs").glob("test-run_*")
    return run_dir / f"attempt_{attempt}"


def _stacks(tmp_path: Path, attempt: int, rank: int) -> str:
    return (_attempt_dir(tmp_path, attempt) / str(rank) / "stacks.txt").read_text()


@pytest.mark.parametrize(
    ("mode", "spec_kw", "rule"),
    [
        ("heartbeat", {}, "heartbeat"),
        ("section", {"section_timeouts": {"allreduce": 1.0}}, "section"),
        ("initial", {"initial_heartbeat_timeout": 2.5}, "initial"),
        ("out-of-section", {"out_of_section_timeout": 1.0}, "out-of-section"),
    ],
)
async def test_hung_worker_is_restarted_with_its_stacks(
    tmp_path: Path, mode: str, spec_kw: dict[str, object], rule: str
) -> None:
    spec = _spec(tmp_path, mode, **spec_kw)
    agent = LocalElasticAgent(spec)  # type: ignore[arg-type]
    with anyio.fail_after(60):
        result, event = await run_until_event(agent, "aelastic.progress.hang")
    assert result.state is WorkerState.SUCCEEDED
    assert event.metadata["local_rank"] == 1 and event.metadata["global_rank"] == 1
    assert event.metadata["rule"] == rule
    assert event.metadata["section"] == ("allreduce" if mode == "section" else None)
    assert event.metadata["stacks_captured"] == 2
    assert agent.remaining_restarts == 0  # the hang spent the one restart
    hung = _stacks(tmp_path, 0, 1)
    assert "wait_for_a_peer_that_never_comes" in hung
    assert "Current thread" in hung or "Thread 0x" in hung
    assert "healthy_peer" in _stacks(tmp_path, 0, 0)  # the peers' stacks too
    # No hang in attempt 1: no (empty) stacks files left behind.
    assert not list(_attempt_dir(tmp_path, 1).glob("*/stacks.txt"))


async def test_hang_without_restarts_left_fails_naming_the_section(tmp_path: Path) -> None:
    from aelastic.errors import ChildFailedError

    spec = _spec(tmp_path, "section", max_restarts=0, section_timeouts={"allreduce": 1.0})
    agent = LocalElasticAgent(spec)  # type: ignore[arg-type]
    with anyio.fail_after(60):
        result = await agent.run()
    assert result.state is WorkerState.FAILED
    (failure,) = result.failures.values()
    assert failure.local_rank == 1
    text = str(ChildFailedError("hang_worker.py", result.failures))
    assert "hung in section 'allreduce'" in text
    assert "section timeout 1 s" in text
    assert str(_attempt_dir(tmp_path, 0) / "1" / "stacks.txt") in text


async def test_worker_that_never_uses_the_api_is_not_judged(tmp_path: Path) -> None:
    """A worker that never imports aelastic.progress runs past every timeout unharmed."""
    script = tmp_path / "plain.py"
    script.write_text(
        "import sys, time\n"
        "time.sleep(2.5)\n"  # longer than the 1 s timeouts below
        "sys.exit(0)\n"
    )
    spec = local_spec(
        LocalRendezvous(),
        ("-u", str(script)),
        tmp_path,
        initial_heartbeat_timeout=1.0,
        heartbeat_timeout=1.0,
        max_restarts=0,
    )
    agent = LocalElasticAgent(spec)
    with anyio.fail_after(60):
        result = await agent.run()
    assert result.state is WorkerState.SUCCEEDED


async def test_learned_timeouts_tighten_the_next_attempt(tmp_path: Path) -> None:
    """Attempt 0 beats every ~0.2 s then crashes; with x5 learning, attempt 1's hang is
    caught by a learned timeout far below the configured 30 s."""
    # A run id that is not a safe file name: the file must stay inside the log dir.
    run_id = "../team/x"
    spec = local_spec(
        LocalRendezvous(run_id),
        ("-u", WORKER, "learn", "0"),
        tmp_path,
        initial_heartbeat_timeout=30.0,
        heartbeat_timeout=30.0,
        learn_timeouts=5.0,
        max_restarts=2,
        local_world_size=1,
    )
    agent = LocalElasticAgent(spec)
    learned = None
    with anyio.fail_after(60):
        async with subscribe(run_id=run_id) as stream, anyio.create_task_group() as tg:
            results = start_run(tg, agent)
            async for event in stream:
                if event.name == "aelastic.progress.learned_timeouts":
                    learned = event.metadata["heartbeat"]
                if event.name == "aelastic.progress.hang":
                    break
    (result,) = results
    assert result.state is WorkerState.SUCCEEDED
    assert isinstance(learned, float) and 5 * 0.2 <= learned < 30.0
    assert event.metadata["timeout"] == learned
    saved = json.loads((tmp_path / "logs" / ".._team_x" / "learned_timeouts.json").read_text())
    assert not (tmp_path / "team").exists()
    assert saved["heartbeat"] * 5 == pytest.approx(learned)


async def test_stacks_of_fresh_interpreters_without_the_warm_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No warm bootstrap: importing aelastic.progress registers the stacks dump itself."""
    monkeypatch.setenv("AELASTIC_WARM_WORKERS", "0")
    agent = LocalElasticAgent(_spec(tmp_path, "heartbeat"))  # type: ignore[arg-type]
    with anyio.fail_after(60):
        result = await agent.run()
    assert result.state is WorkerState.SUCCEEDED
    assert "wait_for_a_peer_that_never_comes" in _stacks(tmp_path, 0, 1)
    assert "healthy_peer" in _stacks(tmp_path, 0, 0)


async def test_a_worker_that_finished_early_is_not_hung(tmp_path: Path) -> None:
    """Rank 0 exits 0 after one heartbeat; rank 1 goes on past rank 0's 1 s deadline."""
    agent = LocalElasticAgent(_spec(tmp_path, "early-exit", hung=0, heartbeat_timeout=1.0))  # type: ignore[arg-type]
    with anyio.fail_after(60):
        result = await agent.run()
    assert result.state is WorkerState.SUCCEEDED
    assert agent.remaining_restarts == 1  # nothing was restarted


async def test_py_spy_dumps_workers_without_faulthandler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not (shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))):
        pytest.skip("py-spy is not installed (pip install py-spy)")
    monkeypatch.setenv("HANG_WORKER_NO_FAULTHANDLER", "1")
    agent = LocalElasticAgent(_spec(tmp_path, "heartbeat"))  # type: ignore[arg-type]
    with anyio.fail_after(60):
        result = await agent.run()
    assert result.state is WorkerState.SUCCEEDED
    stacks = _stacks(tmp_path, 0, 1)
    assert "wait_for_a_peer_that_never_comes" in stacks
    assert "Python v" in stacks  # py-spy's header: faulthandler did not write it


async def test_warm_workers_register_the_stacks_dump_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under the warm pool the bootstrap registers the dump and takes its variables, so
    importing aelastic.progress registers nothing again (no second open stacks file) and
    the worker's children inherit nothing."""
    monkeypatch.delenv("AELASTIC_WARM_WORKERS", raising=False)
    script = tmp_path / "check_stacks_dump.py"
    script.write_text(
        "import os, signal, sys\n"
        "def handled():\n"
        "    bit = 1 << (int(signal.SIGRTMIN) + 6 - 1)\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('SigCgt:'):\n"
        "            return bool(int(line.split()[1], 16) & bit)\n"
        "registered_before = handled()\n"
        "left = sorted(k for k in os.environ if k.startswith('AELASTIC_STACKS'))\n"
        "from aelastic.progress._worker import attached\n"
        "print(registered_before, left, attached(), file=sys.stderr)\n"
        "sys.exit(0 if registered_before and not left and attached() else 7)\n"
    )
    spec = local_spec(
        LocalRendezvous(),
        ("-u", str(script)),
        tmp_path,
        heartbeat_timeout=30.0,
        max_restarts=0,
        local_world_size=1,
    )
    with anyio.fail_after(60):
        result = await LocalElasticAgent(spec).run()
    assert result.state is WorkerState.SUCCEEDED


async def test_a_ddp_hang_blames_the_least_advanced_rank_and_names_every_hung_one(
    tmp_path: Path,
) -> None:
    """Rank 1 stops inside its step; rank 0 blocks in the gloo all-reduce and passes its
    (shorter, section) deadline first. Both are named, rank 1 as the root cause."""
    from aelastic.errors import ChildFailedError

    spec = local_spec(
        LocalRendezvous(),
        ("-u", str(SCRIPTS / "ddp_hang_worker.py")),
        tmp_path,
        initial_heartbeat_timeout=60.0,
        heartbeat_timeout=2.0,
        section_timeouts={"allreduce": 1.8},
        max_restarts=0,
    )
    agent = LocalElasticAgent(spec)
    with anyio.fail_after(90):
        result, event = await run_until_event(agent, "aelastic.progress.hang")
    assert result.state is WorkerState.FAILED
    assert event.metadata["local_rank"] == 1, [f.message for f in result.failures.values()]
    assert event.metadata["hung_local_ranks"] == "1,0"
    assert sorted(result.failures) == [0, 1]
    error = ChildFailedError("ddp_hang_worker.py", result.failures)
    root_rank, root = error.get_first_failure()
    assert root_rank == 1
    assert "hung in section 'train_step' at step 3" in root.message
    assert "Root cause: this worker" in root.message
    peer = result.failures[0]
    assert "hung in section 'allreduce' at step 3" in peer.message
    assert "Probably waiting on local_rank 1" in peer.message
    for rank, failure in result.failures.items():
        path = _attempt_dir(tmp_path, 0) / str(rank) / "stacks.txt"
        assert f"Stacks of every thread: {path}" in failure.message
    assert "all_reduce" in _stacks(tmp_path, 0, 0)
    assert "ddp_hang_worker.py" in _stacks(tmp_path, 0, 1)


async def test_a_same_step_hang_blames_the_rank_outside_the_collective(tmp_path: Path) -> None:
    """Two hangs in one run, the stopped rank alternating (attempt % 2): both ranks are
    at step 3 and the stopped one has the newer heartbeat; the rank blocked in the
    gloo all-reduce is named as waiting, the other as the root cause, both times."""
    spec = local_spec(
        LocalRendezvous(),
        ("-u", str(SCRIPTS / "same_step_hang_worker.py")),
        tmp_path,
        initial_heartbeat_timeout=60.0,
        heartbeat_timeout=2.0,
        max_restarts=1,
        # the warm interpreters import torch while the first attempt runs: the second
        # starts without the import (seconds on a loaded machine)
        preload=("torch",),
    )
    hangs = []
    with anyio.fail_after(240):
        async with subscribe() as stream, anyio.create_task_group() as tg:
            results = start_run(tg, LocalElasticAgent(spec))
            async for event in stream:
                if event.name == "aelastic.progress.hang":
                    hangs.append(event.metadata)
                    if len(hangs) == 2:
                        break
    (result,) = results
    assert result.state is WorkerState.FAILED
    assert [h["local_rank"] for h in hangs] == [0, 1], hangs
    assert [h["hung_local_ranks"] for h in hangs] == ["0,1", "1,0"]
    assert all(h["step"] == 3 for h in hangs), hangs


HOLD_WORKER = str(SCRIPTS / "exit_hold_worker.py")


class _AgentLooks(metrics.MetricHandler):
    """Sets ``twice_after`` once the hang watch looked at the workers (it puts the
    heartbeat age) twice after ``after_ns`` (monotonic): the second look's clock read
    follows the first's report, so it saw a time past ``after_ns``."""

    def __init__(self) -> None:
        self.after_ns: int | None = None
        self.looks = 0
        self.twice_after = anyio.Event()

    def emit(self, metric_data: MetricData) -> None:
        if metric_data.name != "progress.heartbeat_age_ms" or self.after_ns is None:
            return
        if time.monotonic_ns() > self.after_ns:
            self.looks += 1
            if self.looks >= 2:
                self.twice_after.set()


def _held_in_shutdown(mode: str, tmp_path: Path) -> LocalElasticAgent:
    """An agent of two ``HOLD_WORKER`` ranks in ``mode`` (rank 0 held in its shutdown;
    ``hung``: rank 1 then hangs), 1 s heartbeat deadline, no restart."""
    spec = local_spec(
        LocalRendezvous(),
        ("-u", HOLD_WORKER, mode, str(tmp_path)),
        tmp_path,
        heartbeat_timeout=1.0,
        max_restarts=0,
    )
    return LocalElasticAgent(spec)


async def test_a_worker_held_in_its_shutdown_after_its_last_step_is_not_hung(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 40 item 9: rank 0 ended its script and is held in an atexit handler (a slow
    teardown) past its 1 s heartbeat deadline while rank 1 still runs. The test releases
    it only once the hang watch looked twice after that deadline (a look past it, before
    the fix, reported a hang at once): no stacks captured, rc 0."""
    looks = _AgentLooks()
    metrics.configure(looks, "torchelastic")
    caplog.set_level(logging.INFO, logger="aelastic.agent")
    agent = _held_in_shutdown("clean", tmp_path)
    hangs: list[object] = []
    results: list[RunResult] = []
    try:
        with anyio.fail_after(90):
            async with subscribe() as stream, anyio.create_task_group() as tg:

                async def run() -> None:
                    results.append(await agent.run())
                    looks.twice_after.set()  # ended early: the asserts say why
                    tg.cancel_scope.cancel()

                async def watch_events() -> None:
                    async for event in stream:
                        if event.name == "aelastic.progress.hang":
                            hangs.append(event)
                            looks.twice_after.set()

                tg.start_soon(run)
                tg.start_soon(watch_events)
                step_file = tmp_path / "r0_step"
                while not (step_file.exists() and (tmp_path / "r0_exiting").exists()):  # noqa: ASYNC110 - files of another process
                    await anyio.sleep(0.05)
                looks.after_ns = int(step_file.read_text()) + 1_000_000_000  # its deadline
                await looks.twice_after.wait()
                (tmp_path / "release").touch()
    finally:
        metrics.configure(NullMetricHandler(), "torchelastic")
    assert not hangs
    assert "capturing the stacks" not in caplog.text
    (result,) = results
    assert result.state is WorkerState.SUCCEEDED
    assert agent.remaining_restarts == 0


async def test_a_hung_peer_of_a_worker_held_in_its_shutdown_is_still_caught(
    tmp_path: Path,
) -> None:
    """Rank 0 is held in its shutdown (past its deadline, not hung); rank 1 then hangs
    mid-training: the hang names rank 1 alone, and the job fails."""
    agent = _held_in_shutdown("hung", tmp_path)
    try:
        with anyio.fail_after(90):
            result, event = await run_until_event(agent, "aelastic.progress.hang")
    finally:
        (tmp_path / "release").touch()  # rank 0, if the agent left it (it does not)
    assert (tmp_path / "r0_exiting").exists()  # rank 1 hung only after rank 0 was held
    assert event.metadata["hung_local_ranks"] == "1"
    assert event.metadata["local_rank"] == 1 and event.metadata["rule"] == "heartbeat"
    assert result.state is WorkerState.FAILED

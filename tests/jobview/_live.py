"""A live two-node job (two agents in this process) whose workers make progress steps."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from launcher._notify import Workers, workers_listener

from aelastic import Job, LaunchConfig, open_job
from aelastic.progress._settings import HangSettings
from aelastic.store import Store

STEP_WORKER = str(Path(__file__).parent / "step_worker.py")
STATUS = [sys.executable, "-m", "aelastic", "status"]


@asynccontextmanager
async def two_nodes(tmp: Path, **config: Any) -> AsyncIterator[tuple[Workers, list[Job]]]:
    """Two agents of one job; global rank 1 fails once, so the job restarts once.

    Yields once both workers of the second round have stepped.
    Leaving the block tells the workers to exit 0 and waits for both jobs.
    """
    settings: dict[str, Any] = {
        "min_nodes": 2,
        "max_nodes": 2,
        "nproc_per_node": 1,
        "max_restarts": 1,
        # progress files on (the step of each worker)
        "hangs": HangSettings(heartbeat_timeout=120.0),
        "monitor_interval": 0.1,
        **config,
    }
    async with workers_listener() as w, AsyncExitStack() as stack:
        once = str(tmp / "failed-once")
        argv = (sys.executable, "-u", STEP_WORKER, str(w.port), "--fail-once", once)
        jobs = [
            await stack.enter_async_context(open_job(LaunchConfig(**settings), *argv))
            for _ in range(2)
        ]
        for job in jobs:
            await _second_round(job)
        await stepped(w, jobs)
        yield w, jobs
        await w.tell_all("exit 0")
        for job in jobs:
            await job.wait()


async def _second_round(job: Job) -> None:
    """Return once ``job``'s workers run in a later round than the first they ran in."""
    first: int | None = None
    async for change in job.state_changes():
        if change.state.value != "HEALTHY":
            continue
        if first is None:
            first = change.round
        elif change.round != first:
            return


async def stepped(w: Workers, jobs: list[Job]) -> None:
    """Return once every current worker of ``jobs`` sent a ``stepped`` line from now on."""
    pids = {str(worker.pid) for job in jobs for worker in job.workers()}
    while pids:
        words = await w.line()
        if words[0] == "stepped":
            pids.discard(words[3])


async def publish(jobs: list[Job]) -> None:
    """Every job's status written now (instead of waiting for the next period)."""
    for job in jobs:
        assert job.status_publisher is not None
        assert await job.status_publisher.publish_once()


async def status(*args: str) -> subprocess.CompletedProcess[bytes]:
    """``python -m aelastic status ARGS`` run to its end."""
    return await anyio.run_process([*STATUS, *args], check=False)


async def status_json(*args: str) -> dict[str, Any]:
    done = await status(*args, "--json")
    assert done.returncode == 0, done.stderr.decode()
    view: dict[str, Any] = json.loads(done.stdout)
    return view


async def write_stale_node(store: Store, like: dict[str, Any], name: str, **fields: Any) -> None:
    """A node that published 120 s ago and then stopped (its agent is gone)."""
    doc = {**like, "node": name, "time": time.time() - 120, "state": "HEALTHY", **fields}
    doc = {k: v for k, v in doc.items() if k not in ("step", "steps_per_s", "age_s", "stale")}
    await store.set(f"n/{name}", json.dumps(doc))
    await store.append("nodes", name + "\n")


async def status_follows_progress(w: Workers, jobs: list[Job]) -> None:
    """Return once the status shows, for every node, a step its worker reported after
    the status last changed, with no periodic write to show it: each publisher's
    periodic interval is made an hour, so only the workers' progress can write."""
    publishers = [job.status_publisher for job in jobs]
    assert all(p is not None for p in publishers)
    before = [p.published for p in publishers]  # type: ignore[union-attr]
    for p in publishers:
        p.interval = 3600.0  # type: ignore[union-attr]
    # a periodic wait already begun may still write once: let it
    while True:
        if all(p.published > n for p, n in zip(publishers, before, strict=True)):  # type: ignore[union-attr]
            break
        await anyio.sleep(0.1)
    shown = await _shown(jobs[0])
    reported: dict[str, int] = {}  # pid: a step the worker reported past the shown one
    while len(reported) < len(shown):
        words = await w.line()
        if words[0] == "stepped" and words[3] in shown and int(words[4]) > shown[words[3]]:
            reported[words[3]] = int(words[4])
    while True:
        now = await _shown(jobs[0])
        if all(now[pid] >= step for pid, step in reported.items()):
            return
        await anyio.sleep(0.1)


async def _shown(job: Job) -> dict[str, int]:
    """``{worker pid: step}`` in the job's view as read from the store (-1: none)."""
    assert job.status_publisher is not None
    view = await job.status_publisher.read_view()
    return {
        str(worker["pid"]): worker["step"] if isinstance(worker["step"], int) else -1
        for node in view["nodes"]
        for worker in node["workers"]
    }

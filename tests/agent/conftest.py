"""Agent test helpers: a reporter the workers dial into, and a one-node rendezvous seam."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

from aelastic.agent import LocalElasticAgent, RunResult, WorkerSpec

from ._shared import LocalRendezvous as LocalRendezvous

SCRIPTS = Path(__file__).parent / "scripts"
PROBE = str(SCRIPTS / "probe_worker.py")
DDP = str(SCRIPTS / "ddp_worker.py")


@dataclass
class Report:
    """One worker's hello: pid, env; ``send(code)`` tells a holding worker to exit."""

    pid: int
    env: dict[str, Any]
    stream: anyio.abc.SocketStream
    receive: BufferedByteReceiveStream

    @property
    def rank(self) -> int:
        return int(self.env["RANK"])

    async def send(self, code: int) -> None:
        await self.stream.send(str(code).encode())

    async def wait_closed(self) -> None:
        """Wait until the worker's end of the connection is gone (it exited)."""
        try:
            while await self.receive.receive():
                pass
        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            return


class Reporter:
    """A TCP listener on 127.0.0.1:0 collecting the workers' hellos in arrival order."""

    def __init__(self) -> None:
        self.port = 0
        self.send, self.recv = anyio.create_memory_object_stream[Report](math.inf)
        self.all: list[Report] = []

    def args(self, mode: str = "hold", code: int = 3) -> tuple[str, ...]:
        return ("-u", PROBE, "--report", str(self.port), "--mode", mode, "--code", str(code))

    async def next(self, n: int = 1) -> list[Report]:
        with anyio.fail_after(30):
            return [await self.recv.receive() for _ in range(n)]

    async def next_of_attempt(self, attempt: int, n: int = 2) -> list[Report]:
        """Read hellos until ``n`` workers of restart ``attempt`` have reported.

        Workers of earlier attempts may be stopped before they report: skip theirs.
        """
        got: list[Report] = []
        while len(got) < n:
            (r,) = await self.next()
            if r.env["TORCHELASTIC_RESTART_COUNT"] == str(attempt):
                got.append(r)
        return got

    async def _handle(self, stream: anyio.abc.SocketStream) -> None:
        buffered = BufferedByteReceiveStream(stream)
        try:
            line = await buffered.receive_until(b"\n", 65536)
        except (anyio.IncompleteRead, anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            await stream.aclose()  # a worker stopped before it said hello
            return
        obj = json.loads(line)
        report = Report(obj["pid"], obj["env"], stream, buffered)
        self.all.append(report)
        await self.send.send(report)


@asynccontextmanager
async def open_reporter() -> AsyncIterator[Reporter]:
    """Use inside the test (a task group cannot span a fixture's setup and teardown)."""
    rep = Reporter()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    rep.port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, rep._handle)
        yield rep
        tg.cancel_scope.cancel()
    await listener.aclose()
    for r in rep.all:
        await r.stream.aclose()


def start_run(tg: anyio.abc.TaskGroup, agent: LocalElasticAgent) -> list[RunResult]:
    """Start ``agent.run()`` in ``tg``; its result lands in the returned list."""
    results: list[RunResult] = []

    async def run() -> None:
        results.append(await agent.run())

    tg.start_soon(run)
    return results


async def run_until_event(
    agent: LocalElasticAgent, name: str, *, run_id: str | None = None
) -> tuple[RunResult, Any]:
    """Run ``agent`` to its end; return its result and its first event called ``name``."""
    from aelastic.events import subscribe

    async with subscribe(run_id=run_id) as stream, anyio.create_task_group() as tg:
        results = start_run(tg, agent)
        async for event in stream:
            if event.name == name:
                break
    (result,) = results
    return result, event


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (reads /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as fp:
            state = fp.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


PYTHON = sys.executable


def local_spec(
    rdzv: LocalRendezvous, args: tuple[str, ...], tmp_path: Path, **kw: object
) -> WorkerSpec:
    """A two-worker spec over a one-node rendezvous with short timeouts; ``kw`` overrides."""
    options: dict[str, object] = dict(
        role="trainer",
        local_world_size=2,
        rdzv_handler=rdzv,
        entrypoint=PYTHON,
        args=args,
        max_restarts=2,
        shutdown_timeout=5.0,
        exit_barrier_timeout=5.0,
        log_dir=str(tmp_path / "logs"),
    )
    options.update(kw)
    return WorkerSpec(**options)  # type: ignore[arg-type]


def sigkill_agent(agent: subprocess.Popen[bytes], report: Path) -> list[str]:
    """Wait (up to 60 s) for ``agent``'s worker to write ``report`` (whitespace-separated
    fields, its pid last), then SIGKILL the agent, as a node that dies would, and the
    worker if it outlives it; return the report's fields. Fails when the agent ends
    first; never leaves either process running."""
    worker = -1
    try:
        end = time.monotonic() + 60
        while not report.exists():
            assert agent.poll() is None, "the agent ended before its worker started"
            assert time.monotonic() < end, "no worker started within 60 s"
            time.sleep(0.05)
        fields = report.read_text().split()
        worker = int(fields[-1])
        agent.send_signal(signal.SIGKILL)
        agent.wait(30)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(30)
        if worker > 0 and pid_alive(worker):
            os.kill(worker, signal.SIGKILL)
        if agent.stderr is not None:
            agent.stderr.close()
    return fields

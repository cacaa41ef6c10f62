"""Run ``python -m aelastic run`` processes ("nodes") and wait on their output lines."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

# the endpoints every node must know; tests/ is on sys.path (pytest, the benchmarks)
from _ports import free_port as free_port
from anyio.streams.buffered import BufferedByteReceiveStream

HERE = Path(__file__).parent
WORKER = str(HERE / "node_worker.py")
EXAMPLE = str(HERE.parent.parent / "examples" / "train_ddp.py")
AELASTIC_RUN = [sys.executable, "-m", "aelastic", "run"]


def records(out: Path) -> list[dict[str, Any]]:
    """The JSON records node_worker.py wrote into ``out``."""
    return [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (from ``/proc/<pid>/task/*/children``)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except FileNotFoundError:
            continue
    return out


class Node:
    """One ``aelastic run`` process: collects stdout lines and stderr."""

    def __init__(self, process: anyio.abc.Process, name: str) -> None:
        self.process = process
        self.name = name
        self.lines: list[str] = []
        #: ``time.monotonic()`` at which each of :attr:`lines` arrived
        self.line_times: list[float] = []
        self.stderr = bytearray()
        self._changed = anyio.Event()
        self._stdout_closed = False
        self._stderr_closed = False

    async def _pump_stdout(self) -> None:
        assert self.process.stdout is not None
        stream = BufferedByteReceiveStream(self.process.stdout)
        try:
            while True:
                line = await stream.receive_until(b"\n", 1 << 20)
                self.lines.append(line.decode(errors="replace"))
                self.line_times.append(time.monotonic())
                self._changed.set()
                self._changed = anyio.Event()
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.ClosedResourceError):
            pass
        finally:
            self._stdout_closed = True
            self._changed.set()

    async def _pump_stderr(self) -> None:
        assert self.process.stderr is not None
        try:
            async for chunk in self.process.stderr:
                self.stderr += chunk
                self._changed.set()
                self._changed = anyio.Event()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            pass
        finally:
            self._stderr_closed = True
            self._changed.set()

    async def wait_for_err(self, needle: str) -> None:
        """Return once stderr contains ``needle`` (case-insensitive); fail if stderr closes."""
        while needle.lower() not in self.err.lower():
            if self._stderr_closed:
                raise AssertionError(f"{self.name} closed stderr before {needle!r}: {self.err}")
            await self._changed.wait()

    async def wait_for_line(self, predicate: Callable[[str], bool], count: int = 1) -> None:
        """Return once ``count`` stdout lines satisfy ``predicate``; fail if stdout closes."""
        while sum(1 for line in self.lines if predicate(line)) < count:
            if self._stdout_closed:
                raise AssertionError(
                    f"{self.name} closed its stdout before the line came; stdout={self.lines!r}"
                    f" stderr={self.stderr.decode(errors='replace')}"
                )
            await self._changed.wait()

    async def wait(self) -> int:
        code = await self.process.wait()
        while not self._stdout_closed:
            await self._changed.wait()
        return code

    @property
    def err(self) -> str:
        return self.stderr.decode(errors="replace")


async def wait_all(nodes: Sequence[Node], seconds: float) -> list[int]:
    """The exit codes of ``nodes``; on timeout, fail with every node's output."""
    with anyio.move_on_after(seconds) as scope:
        codes = [await n.wait() for n in nodes]
    if scope.cancelled_caught:
        report = "\n".join(
            f"--- {n.name} (rc={n.process.returncode}) stdout={n.lines!r}\n{n.err}" for n in nodes
        )
        raise AssertionError(f"nodes still running after {seconds} s:\n{report}")
    return codes


class Cluster:
    """Nodes started in one task group; all are killed when the block exits."""

    def __init__(self, tg: anyio.abc.TaskGroup) -> None:
        self._tg = tg
        self.nodes: list[Node] = []

    async def start(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        launcher: Sequence[str] = AELASTIC_RUN,
    ) -> Node:
        """Start ``launcher + argv`` (``python -m aelastic run`` unless told otherwise)."""
        full_env = dict(os.environ)
        full_env.pop("OMP_NUM_THREADS", None)
        full_env.update(env or {})
        process = await anyio.open_process(
            [*launcher, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full_env,
        )
        node = Node(process, f"node{len(self.nodes)}")
        self.nodes.append(node)
        self._tg.start_soon(node._pump_stdout)
        self._tg.start_soon(node._pump_stderr)
        return node


@asynccontextmanager
async def cluster() -> AsyncIterator[Cluster]:
    async with anyio.create_task_group() as tg:
        c = Cluster(tg)
        try:
            yield c
        finally:
            with anyio.CancelScope(shield=True):
                for node in c.nodes:
                    if node.process.returncode is None:
                        node.process.send_signal(signal.SIGTERM)
                for node in c.nodes:
                    with anyio.move_on_after(15):
                        await node.process.wait()
                    if node.process.returncode is None:
                        node.process.kill()
                        await node.process.wait()

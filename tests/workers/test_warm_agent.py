"""The agent's warm pool: a restart hands the workers to interpreters started before the failure."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import pytest
from agent._shared import LocalRendezvous  # tests/ is on sys.path (rootdir, no __init__)
from anyio.streams.buffered import BufferedByteReceiveStream

from aelastic.agent import LocalElasticAgent, RunResult, WorkerSpec, WorkerState
from aelastic.workers._warm import WARM_WORKERS_ENV

WORKER = """\
import json, os, socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
hello = {"pid": os.getpid(), "rc": os.environ["TORCHELASTIC_RESTART_COUNT"],
         "rank": os.environ["RANK"], "main": __name__, "argv": sys.argv}
s.sendall((json.dumps(hello) + "\\n").encode())
code = s.recv(1)
sys.exit(int(code) if code else 0)
"""


class _Hellos:
    def __init__(self) -> None:
        self.port = 0
        self.send, self.recv = anyio.create_memory_object_stream[
            tuple[dict[str, object], anyio.abc.SocketStream]
        ](math.inf)

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        line = await BufferedByteReceiveStream(stream).receive_until(b"\n", 65536)
        await self.send.send((json.loads(line), stream))

    async def next(self) -> tuple[dict[str, object], anyio.abc.SocketStream]:
        with anyio.fail_after(30):
            return await self.recv.receive()


@asynccontextmanager
async def _hellos() -> AsyncIterator[_Hellos]:
    hellos = _Hellos()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    hellos.port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, hellos.handle)
        yield hellos
        tg.cancel_scope.cancel()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fp:
            return fp.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("enabled", [True, False], ids=["warm", "off"])
async def test_restart_runs_in_interpreters_started_before_the_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, enabled: bool
) -> None:
    monkeypatch.delenv("AELASTIC_CHILD_WATCHER", raising=False)
    monkeypatch.setenv(WARM_WORKERS_ENV, "1" if enabled else "0")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    results: list[RunResult] = []
    async with _hellos() as hellos, anyio.create_task_group() as tg:
        spec = WorkerSpec(
            role="trainer",
            local_world_size=2,
            rdzv_handler=LocalRendezvous("warm-run"),
            entrypoint=sys.executable,
            args=("-u", str(script), str(hellos.port)),
            max_restarts=1,
            shutdown_timeout=5.0,
            exit_barrier_timeout=5.0,
            log_dir=str(tmp_path / "logs"),
        )
        agent = LocalElasticAgent(spec)

        async def run() -> None:
            results.append(await agent.run())

        tg.start_soon(run)
        first = [await hellos.next() for _ in range(2)]
        assert {h["rc"] for h, _ in first} == {"0"}
        assert all(h["main"] == "__main__" for h, _ in first)
        pool = agent._warm_pool
        if enabled:
            assert pool is not None
            with anyio.fail_after(20):
                await pool.wait_ready()
            warm_before_failure = set(pool.idle_pids)
            assert len(warm_before_failure) == 2 and all(map(_alive, warm_before_failure))
        else:
            assert pool is None
        rank0 = next(s for h, s in first if h["rank"] == "0")
        await rank0.send(b"3")
        second = [await hellos.next() for _ in range(2)]
        assert {h["rc"] for h, _ in second} == {"1"}
        pids = {int(str(h["pid"])) for h, _ in second}
        if enabled:
            assert pids == warm_before_failure
        assert all(h["argv"] == [str(script), str(hellos.port)] for h, _ in second)
        for _, stream in second:
            await stream.send(b"0")
        for _, stream in first + second:
            await stream.aclose()
    (result,) = results
    assert result.state is WorkerState.SUCCEEDED
    assert agent._warm_pool is None
    if enabled:
        # The pool's idle interpreters are gone with the run.
        leftovers = [p for p in _children() if _is_warm(p)]
        assert not leftovers


def _children() -> list[int]:
    me = str(os.getpid())
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as fp:
                    ppid = fp.read().rsplit(")", 1)[1].split()[1]
            except OSError:
                continue
            if ppid == me:
                out.append(int(name))
    return out


def _is_warm(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fp:
            return b"_warm_boot.py" in fp.read()
    except OSError:
        return False

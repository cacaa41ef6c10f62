"""``ignored_signals``: workers start with those signals ignored, fresh or warm, in every
way a fresh one is spawned, so a scheduler's notice sent to every process of the job
(Slurm's ``--signal=USR1@N``) does not kill them; without it SIGUSR1 keeps its default
action (it kills), as under torchrun."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
from pathlib import Path

import anyio
import anyio.abc
import pytest
from _procfs import ignored_signals  # tests/ is on sys.path

from aelastic.workers import ProcessSpec, open_worker_processes
from aelastic.workers._warm import open_warm_pool, parse_python_argv

PY = sys.executable

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="/proc and pidfd: Linux >= 5.3"),
]


@pytest.fixture
def anyio_backend() -> str:
    """One backend: what is tested is the processes' signal state, not the event loop."""
    return "asyncio"


# Says it is ready (its pid, over a loopback connection) once SIGUSR2 ends it with
# status 0. The test then sends SIGUSR1 and SIGUSR2, in that order: a SIGUSR1 with its
# default action kills the process when it is sent (a fatal signal takes the whole
# process at once), so the SIGUSR2 exit (0) can only come from a worker that ignored it.
SCRIPT = """\
import os, signal, socket, sys
signal.signal(signal.SIGUSR2, lambda *_: os._exit(0))
conn = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30)
conn.sendall(str(os.getpid()).encode() + b"\\n")
while True:
    signal.pause()
"""


async def _signalled(tmp: Path, ignored: frozenset[int], warm: bool) -> tuple[int, bool]:
    """Start the script, send SIGUSR1 then SIGUSR2: ``(exit code, SIGUSR1 in SigIgn)``."""
    script = tmp / "worker.py"
    script.write_text(SCRIPT)
    with anyio.fail_after(60):
        async with contextlib.AsyncExitStack() as stack:
            multi = await stack.enter_async_context(
                await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
            )
            listener = multi.listeners[0]
            port = listener.extra(anyio.abc.SocketAttribute.local_port)
            argv = [PY, "-u", str(script), str(port)]
            entry = parse_python_argv(argv)
            assert entry is not None
            pool = (
                await stack.enter_async_context(open_warm_pool(entry.prefix, 1)) if warm else None
            )
            procs = await stack.enter_async_context(
                open_worker_processes(
                    [ProcessSpec(local_rank=0, args=argv, env=dict(os.environ))],
                    warm_pool=pool,
                    ignored_signals=ignored,
                )
            )
            assert (0 in procs.warm_ranks) is warm
            conn = await stack.enter_async_context(await listener.accept())
            said = b""
            while not said.endswith(b"\n"):
                said += await conn.receive()
            pid = int(said)
            assert pid == procs.pids[0]
            kernel_ignores = signal.SIGUSR1 in ignored_signals(pid)  # ground truth
            os.kill(pid, signal.SIGUSR1)
            os.kill(pid, signal.SIGUSR2)
            exits = await procs.wait_all()
    return exits[0].exitcode, kernel_ignores


@pytest.mark.parametrize("how", ["wrapper", "preexec", "off", "warm"])
@pytest.mark.parametrize("notice", [True, False], ids=["notice-trapped", "torchrun-default"])
async def test_sigusr1_is_ignored_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str, notice: bool
) -> None:
    warm = how == "warm"
    if not warm:  # how a fresh worker is spawned (the death-signal wrapper or not)
        monkeypatch.setenv("AELASTIC_PDEATHSIG", how)
    if how == "wrapper" and not (shutil.which("setpriv") and shutil.which("dash")):
        pytest.skip("the wrapper needs util-linux's setpriv and dash")
    monkeypatch.delenv("AELASTIC_WARM_WORKERS", raising=False)
    monkeypatch.delenv("AELASTIC_CHILD_WATCHER", raising=False)
    ignored = frozenset({signal.SIGUSR1}) if notice else frozenset()
    code, kernel_ignores = await _signalled(tmp_path, ignored, warm)
    assert kernel_ignores is notice
    assert code == (0 if notice else -signal.SIGUSR1)

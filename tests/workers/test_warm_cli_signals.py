"""``aelastic run`` started with SIGINT/SIGHUP/SIGQUIT ignored (``&``, ``nohup``) still
stops its workers at once on a forwarded SIGINT, warm pool on or off (issue 10 item 7).

The launcher's parent ignores the signals and execs it, as a shell does for a background
job; the workers (pre-started by the launcher before it installs its handlers, in the warm
case) must start with SIGINT raising KeyboardInterrupt, as a fresh spawn does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process

from .conftest import REPORT_PRELUDE, Reporter

pytestmark = pytest.mark.skipif(
    not hasattr(os, "pidfd_open"), reason="warm workers need the pidfd watcher (Linux >= 5.3)"
)

# What a shell does for `cmd &` (SIGINT, SIGQUIT) and `nohup cmd` (SIGHUP), then exec.
IGNORING_PARENT = (
    "import os, signal, sys\n"
    "for s in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):\n"
    "    signal.signal(s, signal.SIG_IGN)\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
)

WORKER = (
    REPORT_PRELUDE
    + """
import signal
rank = os.environ["LOCAL_RANK"]
warm = b"_warm_boot" in open("/proc/self/cmdline", "rb").read()
try:  # before "ready": the test may interrupt us the moment it reads that line
    report(f"ready {rank} warm={warm} sigint={signal.getsignal(signal.SIGINT)!r}")
    while True:
        signal.pause()
except KeyboardInterrupt:
    report(f"interrupted {rank}")
    raise
"""
)


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "fresh"])
async def test_forwarded_sigint_stops_workers_of_a_launcher_started_ignoring_it(
    tmp_path: Path, reporter: Reporter, warm: bool
) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = reporter.env(AELASTIC_WARM_WORKERS="1" if warm else "0")
    env.pop("AELASTIC_CHILD_WATCHER", None)
    argv = [sys.executable, "-c", IGNORING_PARENT, "-m", "aelastic", "run", "--standalone"]
    argv += ["--nproc-per-node", "2", "--shutdown-timeout", "60", str(script)]
    async with await anyio.open_process(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
    ) as launcher:
        try:
            err, code = await _interrupt(launcher, reporter, warm)
        finally:
            if launcher.returncode is None:  # a failed assertion: do not wait it out
                launcher.kill()
    assert code == 128 + signal.SIGINT, err.decode(errors="replace")
    assert b"SIGINT" in err


async def _interrupt(launcher: Process, reporter: Reporter, warm: bool) -> tuple[bytes, int]:
    """Wait for both workers, SIGINT the launcher: ``(its stderr, its exit code)``."""
    ready = sorted([await reporter.receive(60), await reporter.receive(60)])
    assert ready == [
        f"ready {r} warm={warm} sigint=<built-in function default_int_handler>" for r in (0, 1)
    ]
    launcher.send_signal(signal.SIGINT)
    interrupted = sorted([await reporter.receive(30), await reporter.receive(30)])
    assert interrupted == ["interrupted 0", "interrupted 1"]
    assert launcher.stderr is not None
    err = b""
    # Bounded well below --shutdown-timeout: a worker ignoring SIGINT would be
    # SIGKILLed only after 60 s, so this fails instead of passing slowly.
    with anyio.fail_after(30):
        async for chunk in launcher.stderr:
            err += chunk
        return err, await launcher.wait()

"""The signal: a process's busy time grows while it computes, not while it sleeps."""

from __future__ import annotations

import os
import subprocess
import sys

from aelastic.stragglers._signal import busy_seconds

WAIT = "print('done', flush=True)\nimport sys\nsys.stdin.read()"
SPIN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n" + WAIT
SLEEP = WAIT


def _run(code: str) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline() == "done\n"
    return child


def test_busy_time_counts_computing_not_blocking() -> None:
    spinner, sleeper = _run(SPIN), _run(SLEEP)
    try:
        spun, slept = busy_seconds(spinner.pid), busy_seconds(sleeper.pid)
        assert spun is not None and slept is not None
        # both started an interpreter; only the spinner computed 0.3 s of CPU on top
        assert spun >= 0.3 and spun > slept + 0.2, (spun, slept)
        # the sleeper is blocked reading its stdin: not busy
        assert busy_seconds(sleeper.pid) == slept
    finally:
        for child in (spinner, sleeper):
            child.kill()
            child.communicate()
    assert busy_seconds(spinner.pid) is None  # reaped: gone


def test_own_process_is_readable() -> None:
    value = busy_seconds(os.getpid())
    assert value is not None and value > 0

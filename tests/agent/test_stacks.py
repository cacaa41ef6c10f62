"""Stack capture of live worker processes (real processes, real signals, real py-spy)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from aelastic.agent._stacks import STACKS_SIGNAL, capture_stacks

# Registers faulthandler on the stacks signal like the worker bootstrap; a second thread
# blocks that signal for good (as a library thread masking every signal does).
WORKER = """
import faulthandler, signal, sys, threading
sig = int(sys.argv[2])
if sys.argv[3] == "faulthandler":
    faulthandler.register(sig, file=open(sys.argv[1], "a"), all_threads=True, chain=False)
ready = threading.Event()
def masked_thread():
    signal.pthread_sigmask(signal.SIG_BLOCK, {sig})
    ready.set()
    threading.Event().wait()
threading.Thread(target=masked_thread, daemon=True).start()
ready.wait()
print("ready", flush=True)
sys.stdin.readline()
"""


@contextmanager
def _worker(stacks: Path, how: str) -> Iterator[int]:
    with subprocess.Popen(
        [sys.executable, "-c", WORKER, str(stacks), str(STACKS_SIGNAL), how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        try:
            assert proc.stdout.readline() == "ready\n"
            yield proc.pid
        finally:
            proc.kill()


async def test_a_thread_that_blocks_the_signal_does_not_fail_the_capture(tmp_path: Path) -> None:
    stacks = tmp_path / "stacks.txt"
    with _worker(stacks, "faulthandler") as pid:
        captured = await capture_stacks({0: (pid, str(stacks))})
    assert captured == {0: "faulthandler"}
    assert "masked_thread" in stacks.read_text()


async def test_an_os_error_for_one_worker_skips_only_that_worker(tmp_path: Path) -> None:
    """py-spy's output cannot be written (no such directory): that worker is skipped, the
    other is captured, and the hang is still reported rather than failing the job."""
    if not (shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))):
        pytest.skip("py-spy is not installed (pip install py-spy)")
    good = tmp_path / "good.txt"
    with _worker(good, "faulthandler") as ok, _worker(tmp_path / "x", "none") as bad:
        unwritable = str(tmp_path / "missing" / "stacks.txt")
        captured = await capture_stacks({0: (ok, str(good)), 1: (bad, unwritable)})
    assert captured == {0: "faulthandler"}

"""A process that used the etcd backend can fork afterwards (issue 31, item 4).

grpc.aio runs a poller thread while a channel object lives; a child forked with it
alive hung or crashed (SIGSEGV) in ``gc.collect()``. Leaving the handler frees every
channel, so nothing of gRPC runs in the parent and the child is safe.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_fork_after_leaving_the_etcd_handler(etcd_endpoint: str, run_id: str) -> None:
    script = Path(__file__).with_name("_fork_after.py")
    done = subprocess.run(
        [sys.executable, str(script), etcd_endpoint, run_id],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    # In the event loop after the handler left, then after anyio.run returned.
    assert done.stdout.splitlines() == ["threads 1", "child 0", "threads 1", "child 0"], (
        done.stdout + done.stderr
    )

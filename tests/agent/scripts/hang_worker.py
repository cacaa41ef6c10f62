"""A worker for the hang-detection tests: one local rank hangs in a chosen way.

``hang_worker.py MODE HUNG_RANK [EXIT_CODE]``; on a restart (TORCHELASTIC_RESTART_COUNT > 0)
every rank heartbeats once and exits 0 unless MODE ends in ``-always``.
Modes: ``heartbeat`` (the hung rank heartbeats, then stops), ``section`` (it
enters section ``allreduce`` and stays), ``initial`` (it never heartbeats),
``none`` (nobody hangs: a few steps, exit 0). The other ranks heartbeat until stopped.
"""

import os
import sys
import threading
import time

from aelastic.progress import heartbeat, section, step

MODE = sys.argv[1]
HUNG_RANK = int(sys.argv[2])
RANK = int(os.environ["LOCAL_RANK"])
RESTART = int(os.environ["TORCHELASTIC_RESTART_COUNT"])


def wait_for_a_peer_that_never_comes() -> None:
    threading.Event().wait()


def healthy_peer() -> None:
    while True:
        heartbeat()
        time.sleep(0.05)


def main() -> None:
    mode = MODE.removesuffix("-always")
    if (RESTART > 0 and not MODE.endswith("-always")) or mode == "none":
        for i in range(3):
            step(RESTART * 10 + i)
        return
    if RANK != HUNG_RANK:
        healthy_peer()
    if mode == "heartbeat":
        step(1)
        heartbeat()
        wait_for_a_peer_that_never_comes()
    elif mode == "section":
        heartbeat()
        with section("allreduce"):
            wait_for_a_peer_that_never_comes()
    elif mode == "initial":
        wait_for_a_peer_that_never_comes()
    raise SystemExit(f"unknown mode {MODE}")


main()

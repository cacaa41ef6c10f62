"""A worker for the hang-detection and restart-policy tests.

``hang_worker.py MODE ARG [STATE_DIR]``. Once the job is "done" (a restart,
TORCHELASTIC_RESTART_COUNT > 0, or with STATE_DIR: a round after the one that hung)
every worker reports a few steps and exits 0, unless MODE ends in ``-always``.

Hang modes (the worker with LOCAL_RANK == ARG hangs; the others heartbeat until
stopped): ``heartbeat`` (heartbeats, then stops), ``section`` (stays in section
``allreduce``), ``initial`` (never heartbeats), ``out-of-section`` (leaves a
section, then never enters another). Other modes: ``none`` (a few steps, exit 0);
``crash`` (step 5, exit 3); ``learn``, ``learn-shared``, ``early-exit`` (see those
functions); ``fail-in-turn`` (ARG is this node's turn: the node whose turn equals the
number of earlier rounds that failed exits 3, the others hold; after two failed rounds
everyone exits 0).
"""

import os
import sys
import threading
import time
from pathlib import Path

from aelastic.progress import heartbeat, section, step

MODE = sys.argv[1]
ARG = int(sys.argv[2])
STATE = Path(sys.argv[3]) if len(sys.argv) > 3 else None
RANK = int(os.environ["LOCAL_RANK"])
RESTART = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
ROUND = os.environ["MASTER_PORT"]  # a fresh workers' store (and port) every round


def wait_for_a_peer_that_never_comes() -> None:
    threading.Event().wait()


def healthy_peer() -> None:
    while True:
        heartbeat()
        time.sleep(0.05)


def done() -> bool:
    if MODE.endswith("-always"):
        return False
    if STATE is None:
        return RESTART > 0
    marker = STATE / "hung"  # holds the round the hang happened in
    return marker.exists() and marker.read_text() != ROUND


def fail_in_turn() -> None:
    assert STATE is not None
    failed = [p for p in STATE.glob("failed_*") if p.name != f"failed_{ROUND}"]
    if len(failed) >= 2:
        return
    if len(failed) == ARG:
        (STATE / f"failed_{ROUND}").touch()
        raise SystemExit(3)
    healthy_peer()


def learn() -> None:
    """Attempt 0: healthy 0.2 s heartbeat intervals, then a crash; attempt 1: a hang."""
    if RESTART == 0:
        for _ in range(5):
            heartbeat()
            time.sleep(0.2)
        raise SystemExit(3)
    if RESTART == 1:
        heartbeat()
        wait_for_a_peer_that_never_comes()


def early_exit() -> None:
    """Rank ARG heartbeats once and exits 0; the others heartbeat for 2.5 s, then exit 0."""
    heartbeat()
    if RANK == ARG:
        return
    end = time.monotonic() + 2.5
    while time.monotonic() < end:
        heartbeat()
        time.sleep(0.05)


def learn_shared() -> None:
    """Two nodes (ARG 0 and 1). Round 1: node 0 heartbeats every 0.3 s then crashes, node 1
    every 0.05 s. Round 2: node 1 hangs after one heartbeat. Round 3: all exit 0."""
    assert STATE is not None
    crashed = STATE / "crashed"
    if done():
        return
    if not crashed.exists() or crashed.read_text() == ROUND:
        if ARG == 0:
            for _ in range(5):
                heartbeat()
                time.sleep(0.3)
            crashed.write_text(ROUND)
            raise SystemExit(3)
        healthy_peer()
    if ARG == 1:
        heartbeat()
        (STATE / "hung").write_text(ROUND)
        wait_for_a_peer_that_never_comes()
    healthy_peer()


def main() -> None:
    if os.environ.get("HANG_WORKER_NO_FAULTHANDLER"):
        import faulthandler  # leave the stacks to py-spy
        import signal

        # The agent's STACKS_SIGNAL (the variable naming it is gone once registered).
        faulthandler.unregister(int(signal.SIGRTMIN) + 6)
    mode = MODE.removesuffix("-always")
    if mode == "learn":
        return learn()
    if mode == "early-exit":
        return early_exit()
    if mode == "learn-shared":
        return learn_shared()
    if mode == "fail-in-turn":
        return fail_in_turn()
    if mode == "none" or done():
        for i in range(3):
            step(RESTART * 10 + i)
        return
    if mode == "crash":
        step(5)
        raise SystemExit(3)
    if RANK != ARG:
        healthy_peer()
    if STATE is not None:
        (STATE / "hung").write_text(ROUND)
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
    elif mode == "out-of-section":
        with section("load"):
            pass
        wait_for_a_peer_that_never_comes()
    raise SystemExit(f"unknown mode {MODE}")


main()

"""A worker that fails on its own, for the failure-report tests.

    failing_worker.py RECORD [--barrier DIR] [--only-rank R] [--first-rank R]

RECORD picks the entry point's decorator: ``torch`` (torch's ``@record``),
``aelastic`` (``aelastic.errors.record``) or ``none`` (a plain script). Every
worker raises ``RuntimeError("rank <RANK> fails on its own")``; with
``--only-rank R`` only global rank R does, the others wait to be stopped.

With ``--barrier DIR`` the local workers fail *together*, deterministically: a
worker's ``atexit`` hook, which runs after ``@record`` wrote its error file and
the traceback was printed, marks ``BARRIER_DIR/<LOCAL_RANK>`` and waits (at most
60 s) until every local worker has marked. So every worker has failed and
written its error file before the first one exits. With ``--first-rank R`` as
well, the others raise only once local rank R has marked and the file clock
has moved on: R's error file is the earliest, by mtime.
"""

from __future__ import annotations

import argparse
import atexit
import os
import time
from collections.abc import Callable
from pathlib import Path


def _wait_for_every_local_worker(barrier: Path) -> None:
    (barrier / os.environ["LOCAL_RANK"]).touch()
    want = int(os.environ["LOCAL_WORLD_SIZE"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if sum(p.name.isdigit() for p in barrier.iterdir()) >= want:
            break
        time.sleep(0.01)


_Main = Callable[[int | None, Path | None], None]


def _decorator(kind: str) -> Callable[[_Main], _Main]:
    if kind == "torch":
        from torch.distributed.elastic.multiprocessing.errors import record as torch_record

        return torch_record
    if kind == "aelastic":
        from aelastic.errors import record

        return record
    return lambda fn: fn


def _wait_until_after(mark: Path) -> None:
    """Return once ``mark`` exists and the file clock has moved past its mtime."""
    deadline = time.monotonic() + 60
    while not mark.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    probe = mark.with_name(f"probe-{os.getpid()}")
    while time.monotonic() < deadline:
        probe.touch()
        if probe.stat().st_mtime_ns > mark.stat().st_mtime_ns:
            break
        time.sleep(0.001)
    probe.unlink()


def main(only_rank: int | None, after: Path | None) -> None:
    rank = int(os.environ["RANK"])
    if only_rank is not None and rank != only_rank:
        time.sleep(120)  # until the agent stops this worker
    if after is not None:
        _wait_until_after(after)
    raise RuntimeError(f"rank {rank} fails on its own")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("record", choices=("torch", "aelastic", "none"))
    parser.add_argument("--barrier", type=Path)
    parser.add_argument("--only-rank", type=int)
    parser.add_argument("--first-rank", type=int)
    ns = parser.parse_args()
    if ns.barrier is not None:
        atexit.register(_wait_for_every_local_worker, ns.barrier)
    after = None
    if ns.first_rank is not None and ns.first_rank != int(os.environ["LOCAL_RANK"]):
        after = ns.barrier / str(ns.first_rank)
    _decorator(ns.record)(main)(ns.only_rank, after)

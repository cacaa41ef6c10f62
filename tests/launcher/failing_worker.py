"""A worker that fails on its own, for the failure-report tests.

    failing_worker.py RECORD [--barrier DIR] [--only-rank R]

RECORD picks the entry point's decorator: ``torch`` (torch's ``@record``),
``aelastic`` (``aelastic.errors.record``) or ``none`` (a plain script). Every
worker raises ``RuntimeError("rank <RANK> fails on its own")``; with
``--only-rank R`` only global rank R does, the others wait to be stopped.

With ``--barrier DIR`` the local workers fail *together*, deterministically: a
worker's ``atexit`` hook, which runs after ``@record`` wrote its error file and
the traceback was printed, marks ``BARRIER_DIR/<LOCAL_RANK>`` and waits (at most
60 s) until every local worker has marked. So every worker has failed and
written its error file before the first one exits.
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
    while len(list(barrier.iterdir())) < want and time.monotonic() < deadline:
        time.sleep(0.01)


def _decorator(kind: str) -> Callable[[Callable[[int | None], None]], Callable[[int | None], None]]:
    if kind == "torch":
        from torch.distributed.elastic.multiprocessing.errors import record as torch_record

        return torch_record
    if kind == "aelastic":
        from aelastic.errors import record

        return record
    return lambda fn: fn


def main(only_rank: int | None) -> None:
    rank = int(os.environ["RANK"])
    if only_rank is not None and rank != only_rank:
        time.sleep(120)  # until the agent stops this worker
    raise RuntimeError(f"rank {rank} fails on its own")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("record", choices=("torch", "aelastic", "none"))
    parser.add_argument("--barrier", type=Path)
    parser.add_argument("--only-rank", type=int)
    ns = parser.parse_args()
    if ns.barrier is not None:
        atexit.register(_wait_for_every_local_worker, ns.barrier)
    _decorator(ns.record)(main)(ns.only_rank)

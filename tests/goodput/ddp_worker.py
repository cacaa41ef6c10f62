"""A gloo DDP worker with known faults, logging each step's end (monotonic ns) to a file.

    ddp_worker.py LOG_DIR

Phase 0 runs steps 0..20, then global rank 1 crashes (exit 3). Phase 1 resumes
after step 10 (a rollback of 10 steps) and runs to step 40, then global rank 0 hangs
(no more steps, no heartbeat) until the agent stops it. Phase 2 resumes after step
30 and runs to step 60. Each step: a DDP forward/backward (an all-reduce) and 30 ms.
The phase follows from the highest step either rank logged (an attempt that a
membership change restarts before its first step repeats its phase). Every line of
``LOG_DIR/rank<r>.log``: ``<phase> <what> <step> <monotonic ns>``.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from aelastic.progress import step

RESUME = {0: 0, 1: 11, 2: 31}
LAST = {0: 20, 1: 40, 2: 60}


def _phase(log_dir: str) -> int:
    done = -1
    for name in ("rank0.log", "rank1.log"):
        try:
            with open(os.path.join(log_dir, name)) as f:
                done = max([done, *(int(line.split()[2]) for line in f if " step " in line)])
        except FileNotFoundError:
            pass
    return 0 if done < LAST[0] else 1 if done < LAST[1] else 2


def main(log_dir: str) -> None:
    rank = int(os.environ["RANK"])
    attempt = _phase(log_dir)
    log = open(os.path.join(log_dir, f"rank{rank}.log"), "a", buffering=1)  # noqa: SIM115

    def write(what: str, value: int) -> None:
        log.write(f"{attempt} {what} {value} {time.monotonic_ns()}\n")

    def on_term(*_: object) -> None:
        write("stopped", -1)
        os._exit(1)

    signal.signal(signal.SIGTERM, on_term)
    dist.init_process_group("gloo")
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    for i in range(RESUME[attempt], LAST[attempt] + 1):
        model(torch.ones(2, 4)).sum().backward()
        time.sleep(0.03)
        step(i)
        write("step", i)
        if attempt == 0 and i == LAST[0] and rank == 1:
            write("crash", i)
            os._exit(3)  # no gloo teardown: the peer is mid-collective
        if attempt == 1 and i == LAST[1] and rank == 0:
            write("hang", i)
            time.sleep(3600)
    dist.barrier()
    log.close()
    os._exit(0)  # gloo's teardown can block at exit on a loaded machine


if __name__ == "__main__":
    main(sys.argv[1])

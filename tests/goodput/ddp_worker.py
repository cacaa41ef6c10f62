"""A gloo DDP worker with known faults, logging each step's end (monotonic ns) to a file.

    ddp_worker.py LOG_DIR

Attempt 0 runs steps 0..20, then global rank 1 crashes (exit 3). Attempt 1 resumes
after step 10 (a rollback of 10 steps) and runs to step 40, then global rank 0 hangs
(no more steps, no heartbeat) until the agent stops it. Attempt 2 resumes after step
30 and runs to step 60. Each step: a DDP forward/backward (an all-reduce) and 30 ms.
Every line of ``LOG_DIR/rank<r>.log``: ``<attempt> <what> <step> <monotonic ns>``.
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


def main(log_dir: str) -> None:
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
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

"""Two gloo ranks at the same step: one stops before its all-reduce, the other blocks in it.

Each step: ``step(i)``, the step's work, then the all-reduce. On attempt ``n`` the rank
``n % 2`` stops at step 3 after the work, just before its all-reduce, with a heartbeat
right before it stops: its latest progress is then *newer* than that of the rank blocked
in the all-reduce, so the oldest heartbeat would blame the blocked rank. Only the stacks
tell them apart: the blocked rank is inside ``torch.distributed``.
"""

import os
import threading
import time

import torch
import torch.distributed as dist

from aelastic.progress import heartbeat, step

dist.init_process_group("gloo")
rank = dist.get_rank()
stuck = int(os.environ["TORCHELASTIC_RESTART_COUNT"]) % 2
dist.all_reduce(torch.ones(1))  # gloo's first collective
for i in range(1, 1_000_000):
    step(i)
    time.sleep(0.05)  # the step's work
    if rank == stuck and i == 3:
        heartbeat()
        threading.Event().wait()  # stops before its all-reduce
    dist.all_reduce(torch.full((4,), float(rank + i)))
os._exit(0)

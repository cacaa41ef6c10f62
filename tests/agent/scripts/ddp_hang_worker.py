"""A real gloo DDP-style loop where local rank 1 stops inside its step 3.

Each step: ``step(i)``, the step's work in section ``train_step``, a heartbeat, then
the gradients' all-reduce in section ``allreduce``. Rank 1 stops inside
``train_step`` of step 3; rank 0 then blocks in the all-reduce of step 3 (both past
their deadline, rank 1 the least advanced: its latest progress, entering step 3, is older than rank
0's, entering the all-reduce after the step's work).
"""

import os
import threading
import time

import torch
import torch.distributed as dist

from aelastic.progress import heartbeat, section, step

dist.init_process_group("gloo")
rank = dist.get_rank()
warm = torch.ones(1)
dist.all_reduce(warm)  # gloo's first collective, outside any judged section
for i in range(1, 1_000_000):
    step(i)
    with section("train_step"):
        if rank == 1 and i == 3:
            threading.Event().wait()  # stops inside its step
        time.sleep(0.05)  # the step's forward and backward: rank 0 gets further than rank 1
        grads = torch.full((4,), float(rank + i))
    heartbeat()
    with section("allreduce"):
        dist.all_reduce(grads)
os._exit(0)

"""The device check's hung worker: in a CUDA synchronize, or in a NCCL collective.

    python -m aelastic run --standalone --nproc-per-node 1 --heartbeat-timeout T ...
        hang_job.py --out FILE --mode cuda-sync|nccl

Heartbeats through a few steps (``aelastic.progress``), then stops heartbeating inside
a function named after the hang, so its stacks name it:

- ``cuda-sync``: ``hung_in_cuda_synchronize``: a GPU kernel that spins for minutes
  (``torch.cuda._sleep``), then ``torch.cuda.synchronize()``.
- ``nccl``: ``hung_in_nccl_all_reduce``: ``init_process_group("nccl")`` (world size 1,
  from aelastic's worker store) and a few all-reduces (the flight recorder's entries),
  then a spinning kernel and an all-reduce queued behind it, and a synchronize: the
  collective is enqueued and never starts.

With ``DEVICE_CHECK_CPU=1``: gloo instead of NCCL, and both hangs wait on an event.
JSON lines in ``--out``: ``ready`` (pid, the process group's seconds), ``hanging``
(the time of the last heartbeat).
"""

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BACKEND, CPU, DEVICE, record

#: About ten minutes of spinning at ~2 GHz: far past the heartbeat deadline.
SPIN_CYCLES = 1_200_000_000_000


def hung_in_cuda_synchronize(torch: object) -> None:
    if CPU:
        threading.Event().wait()
    torch.cuda._sleep(SPIN_CYCLES)  # type: ignore[attr-defined]
    torch.cuda.synchronize()  # type: ignore[attr-defined]


def hung_in_nccl_all_reduce(torch: object, dist: object, tensor: object) -> None:
    if CPU:
        threading.Event().wait()
    torch.cuda._sleep(SPIN_CYCLES)  # type: ignore[attr-defined]
    dist.all_reduce(tensor)  # type: ignore[attr-defined]
    torch.cuda.synchronize()  # type: ignore[attr-defined]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--mode", choices=("cuda-sync", "nccl"), required=True)
    opts = p.parse_args()
    import torch
    import torch.distributed as dist

    from aelastic.progress import heartbeat

    heartbeat()
    tensor = torch.ones(1024, device=DEVICE)
    pg_seconds = None
    if opts.mode == "nccl":
        t = time.perf_counter()
        dist.init_process_group(BACKEND, device_id=None if CPU else torch.device("cuda", 0))
        dist.all_reduce(tensor)
        tensor.sum().item()
        pg_seconds = time.perf_counter() - t
    record(opts.out, event="ready", pid=os.getpid(), pg_seconds=pg_seconds)
    for _ in range(5):
        if opts.mode == "nccl":
            dist.all_reduce(tensor)
        tensor.sum().item()
        heartbeat()
        time.sleep(0.05)
    heartbeat()
    record(opts.out, event="hanging", mode=opts.mode)
    if opts.mode == "nccl":
        hung_in_nccl_all_reduce(torch, dist, tensor)
    else:
        hung_in_cuda_synchronize(torch)


if __name__ == "__main__":
    main()

"""A gloo DDP worker for straggler tests: deterministic work per step, made slower on demand.

    ddp_worker.py --stop-file PATH [--work N] [--pause S] [--onset STEP] [--factor F]
                  [--max-steps N] [--wait-work S] [--time-work] [--slow-rank R]

Each step does ``--work`` small matrix products (plus a DDP forward/backward, whose
gradient all-reduce makes every rank wait for the slowest), then one all-reduce of a
stop flag (set once ``--stop-file`` exists on any rank), and prints
``STEP rank=R group=G step=S``. From step ``--onset``, a worker whose local rank is
listed in ``$STRAGGLER_TEST_SLOW`` (e.g. ``0,1``; set on one node only) does
``--factor`` times the work: deterministic extra work, so the slowdown holds whatever
the machine's load. ``--slow-rank R`` slows global rank R the same way on whichever
node runs it: a slowness of the rank's work (rank 0 evaluating), not of a node.
``--pause`` sleeps that long in every step on every rank, in ten slices between ten
slices of the work: a floor under the step time that leaves the
busy-time ratio of slow to fast ranks as it is (a test that counts steps then counts
seconds too), spread finer than the detection's samples (0.3 s in the tests), whose
median would otherwise swing between a sleeping and a working sample. ``--wait-work S``
adds work that costs no CPU: each step waits S seconds (``--factor`` times S on a slow
rank), as a rank waits for its GPU's kernels, which busy time cannot see;
``--time-work`` registers ``aelastic.stragglers.time_work`` on the DDP model, the signal
for such jobs. Single-threaded (one core per worker).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn

torch.set_num_threads(1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--stop-file", required=True)
    p.add_argument("--work", type=int, default=30)
    p.add_argument("--onset", type=int, default=60)
    p.add_argument("--factor", type=float, default=1.4)
    p.add_argument("--pause", type=float, default=0.0)
    p.add_argument("--max-steps", type=int, default=3000)
    p.add_argument("--wait-work", type=float, default=0.0)
    p.add_argument("--time-work", action="store_true")
    p.add_argument("--slow-rank", type=int, action="append", default=[])
    args = p.parse_args()
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    group = os.environ["GROUP_RANK"]
    slow = str(local) in os.environ.get("STRAGGLER_TEST_SLOW", "").split(",")
    slow = slow or rank in args.slow_rank
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(32, 32))
    if args.time_work:
        from aelastic.stragglers import time_work

        time_work(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 32)
    a = torch.randn(160, 160) / 13
    print(f"READY rank={rank} group={group}", flush=True)
    for step in range(args.max_steps):
        units, wait = args.work, args.wait_work
        if slow and step >= args.onset:
            units, wait = round(units * args.factor), wait * args.factor
        if wait:
            time.sleep(wait)
        b = a
        for unit in range(units):
            b = torch.tanh(b @ a)
            if args.pause and unit % max(1, units // 10) == 0:
                time.sleep(args.pause / 10)
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        stop = torch.tensor([float(os.path.exists(args.stop_file))])
        dist.all_reduce(stop)
        print(f"STEP rank={rank} group={group} step={step}", flush=True)
        if stop.item() > 0:
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""A worker for benchmarks/preemption.py: a small DDP job (gloo, CPU) that appends
``<step> <unix time>`` to ``--progress`` after each step (rank 0) and resumes after a
restart, from aelastic's memory checkpoint (``--mode aelastic``: ``checkpoint.save`` every
step) or from a ``torch.save`` file written every ``--every`` steps (``--mode torch``)."""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("aelastic", "torch"), required=True)
    parser.add_argument("--progress", required=True)
    parser.add_argument("--file", default="", help="--mode torch: the checkpoint file")
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--steps", type=int, default=100000)
    parser.add_argument("--step-seconds", type=float, default=0.02)
    opts = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 1))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    start = 0
    if opts.mode == "aelastic":
        from aelastic import checkpoint

        got = checkpoint.load()
        if got is not None:
            start, state = got
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
    elif os.path.exists(opts.file):
        state = torch.load(opts.file, weights_only=True)
        start = state["step"]
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    if rank == 0:
        with open(opts.progress, "a") as f:
            f.write(f"start {start} {time.time()}\n")
    for step in range(start, opts.steps):
        gen = torch.Generator().manual_seed(step * 10 + rank)
        x = torch.randn(32, 64, generator=gen)
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), x.sum(1, keepdim=True).sin()).backward()
        opt.step()
        done = step + 1
        time.sleep(opts.step_seconds)  # the rest of a real step's compute
        state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": done}
        if opts.mode == "aelastic":
            checkpoint.save(state, step=done)
        elif done % opts.every == 0 and rank == 0:
            torch.save(state, opts.file + ".tmp")
            os.replace(opts.file + ".tmp", opts.file)
        dist.barrier()  # step `done` is saved (aelastic: on every rank) before it counts
        if rank == 0:
            with open(opts.progress, "a") as f:
                f.write(f"{done} {time.time()}\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)

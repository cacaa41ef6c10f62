"""The job of ``benchmarks/goodput.py``: 2-rank gloo DDP, a fault at fixed wall times.

Each step is the real work (forward, backward, gradient all-reduce of a ~8 MiB model,
SGD with momentum: 16 MiB of state with the optimizer's) plus ``--compute-seconds`` of
sleep standing for the accelerator's compute, then a checkpoint:

* ``--checkpoint memory``: every rank ``aelastic.checkpoint.save`` every ``--every``
  steps, ``aelastic.checkpoint.load()`` on start.
* ``--checkpoint disk``: rank 0 ``torch.save`` to ``--path`` (temp file + rename) every
  ``--every`` steps; every rank ``torch.load``s it on start when it exists.

Faults: rank 1 ends with ``os._exit(1)`` before the first step that starts after
``--t0 + k * --fault-every`` (k = 1, 2, ...), the first such time after this worker
started: the faults fall at the same wall times whatever the restarts cost. Every rank
stops once the wall clock passes ``--t0 + --duration`` (agreed by an all-reduce each
step, so the ranks stop after the same step). Rank 0 appends JSON lines to ``--out``:
``{"e": "start", "a": attempt, "from": step, "t": ...}`` when a worker resumed and
finished its first step, ``{"e": "step", "s": step, "t": end, "d": seconds}`` for every
step done (``d``: from the step's start to its end, checkpoint included), and
``{"e": "final", "step": ..., "a": ...}`` at the end. Every rank reports its steps with
``aelastic.progress.step`` and its disk checkpoint's blocking time with
``checkpoint_blocked`` (no-ops under torchrun): the goodput ledger's input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from aelastic import checkpoint, progress


def emit(fd: int, **record: object) -> None:
    os.write(fd, (json.dumps(record) + "\n").encode())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", choices=("memory", "disk"), required=True)
    parser.add_argument("--every", type=int, required=True)
    parser.add_argument("--path", default="")
    parser.add_argument("--t0", type=float, required=True)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--fault-every", type=float, required=True)
    parser.add_argument("--compute-seconds", type=float, required=True)
    parser.add_argument("--out", required=True)
    opts = parser.parse_args()

    begun = time.time()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.manual_seed(1234)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.Tanh(), nn.Linear(1024, 1024))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(32, 1024, generator=gen), torch.randn(32, 1024, generator=gen)

    start = 0
    if opts.checkpoint == "memory":
        resumed = checkpoint.load()
        if resumed is not None:
            start, state = resumed
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
    elif os.path.exists(opts.path):
        loading = time.monotonic_ns()
        state = torch.load(opts.path, weights_only=False)
        progress.checkpoint_blocked("load", time.monotonic_ns() - loading)
        start = int(state["step"])
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    fault = opts.t0 + opts.fault_every
    while fault <= begun:
        fault += opts.fault_every
    deadline = opts.t0 + opts.duration
    out = os.open(opts.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT) if rank == 0 else -1
    step = start
    while True:
        stop = torch.tensor([float(time.time() >= deadline)])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item():
            break
        if rank == 1 and time.time() >= fault:
            sys.stdout.flush()
            os._exit(1)
        began, saved = time.time(), 0.0
        optimizer.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
        time.sleep(opts.compute_seconds)
        step += 1
        if step % opts.every == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            if opts.checkpoint == "memory":
                saving = time.perf_counter()
                checkpoint.save(state, step=step)
                saved = time.perf_counter() - saving
            elif rank == 0:
                saving = time.monotonic_ns()
                torch.save(state, opts.path + ".tmp")
                os.replace(opts.path + ".tmp", opts.path)
                progress.checkpoint_blocked("save", time.monotonic_ns() - saving)
        progress.step(step)
        if rank == 0:
            now = time.time()
            if step == start + 1 and attempt > 0:
                emit(out, e="start", a=attempt, t=now, **{"from": start})
            emit(out, e="step", s=step, t=now, d=now - began, c=saved)
    if rank == 0:
        emit(out, e="final", step=step, a=attempt, t=time.time())
    return 0  # no destroy_process_group: main()'s teardown then hung now and then (gloo, futex)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip finalization: gloo threads can abort or hang it

"""A DDP job (gloo, CPU) that checkpoints with aelastic.checkpoint every few steps.

Deterministic (fixed seed; the batch of step ``s`` on rank ``r`` comes from a generator
seeded with ``(s, r)``), and SGD with momentum so the optimizer's state matters: a run
that crashes and resumes ends with exactly the parameters of one that never crashed.

Rank 0 appends one JSON line to ``--out`` when done: the step it resumed from, the
attempt, and a checksum of the parameters. Faults, on the first attempt only:
``--crash-at-step K`` (rank 0 exits 1 before step K), ``--crash-in-save K`` (rank 0
dies while ``save()`` writes step K), ``--fail-at-step K`` (rank 0 exits 1 before step
K on every attempt: the job fails for good; ``--every 1 --async``: every step saved
with ``save(..., asynchronous=True)``), ``--hold-after-save K`` (a run that did not
resume from step K or later saves step K, prints ``HELD K rank R``, and waits to be
killed), ``--print-pid`` (each rank prints ``PID <pid> rank R`` first). A run that resumes
checks that the next rank's object loads too (``--load-rank R``: rank R's; ``--own-only``:
no check, for a node holding only its own ranks).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from aelastic import checkpoint


class DieWhilePickled:
    """Ends the process from inside ``torch.save`` (a crash in the middle of a save)."""

    def __reduce__(self) -> tuple[object, ...]:
        sys.stdout.flush()
        os._exit(1)


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(16, 8, generator=gen)
    return x, x.sum(dim=1, keepdim=True).sin()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--out", required=True)
    parser.add_argument("--crash-at-step", type=int, default=-1)
    parser.add_argument("--crash-in-save", type=int, default=-1)
    parser.add_argument("--fail-at-step", type=int, default=-1)
    parser.add_argument("--print-saves", action="store_true", help="rank 0: SAVED <step>")
    parser.add_argument("--hold-after-save", type=int, default=-1)
    parser.add_argument("--print-pid", action="store_true", help="PID <pid> rank <rank>")
    parser.add_argument("--own-only", action="store_true")
    parser.add_argument(
        "--async", dest="asynchronous", action="store_true", help="save(asynchronous=True)"
    )
    parser.add_argument("--load-rank", type=int, default=-1)
    parser.add_argument("--print-world", action="store_true", help="--out lines name the world")
    opts = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    first = attempt == 0 and rank == 0
    if opts.print_pid:
        print("PID", os.getpid(), "rank", rank, flush=True)
    torch.manual_seed(1234)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)

    if opts.print_saves and rank == 0:
        print("DIR", os.environ["AELASTIC_CHECKPOINT_DIR"], flush=True)
    start = 0
    resumed = checkpoint.load()
    if resumed is not None:
        start, state = resumed
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        # a rank the saving world did not have (the job grew) reads rank % that world's
        saved_world = int(os.environ["AELASTIC_CHECKPOINT_WORLD_SIZE"])
        source = rank if rank < saved_world else rank % saved_world
        assert state["rank"] == source and state["step"] == start, (state["rank"], state["step"])
        if not opts.own_only:
            peer = opts.load_rank  # load(rank=): another rank's object
            if peer < 0:
                peer = (rank + 1) % dist.get_world_size()
            other = checkpoint.load(rank=peer)
            assert other is not None and other[0] == start and other[1]["rank"] == peer, other

    for step in range(start, opts.steps):
        if (step == opts.crash_at_step and first) or (step == opts.fail_at_step and rank == 0):
            sys.stdout.flush()
            os._exit(1)
        x, y = batch(step, rank)
        optimizer.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
        done = step + 1
        if done % opts.every == 0:
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "rank": rank,
                "step": done,
            }
            if done == opts.crash_in_save and first:
                state["boom"] = DieWhilePickled()
            checkpoint.save(state, step=done, asynchronous=opts.asynchronous)
            if opts.asynchronous:
                checkpoint.wait()  # before the barrier: step done counts as saved below
            dist.barrier()
            if opts.print_saves and rank == 0:
                print("SAVED", done, flush=True)
            if done == opts.hold_after_save and start < done:  # not after resuming there
                print("HELD", done, "rank", rank, flush=True)
                while True:
                    signal.pause()  # until the test kills this node

    vec = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    digest = hashlib.sha256(bytes(vec.view(torch.uint8).tolist())).hexdigest()[:16]
    if rank == 0:
        world = dist.get_world_size()
        line = {"start": start, "attempt": attempt, "checksum": digest}
        if opts.print_world:
            line["world"] = world
        with open(opts.out, "a") as f:
            f.write(json.dumps(line) + "\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip finalization: gloo threads can abort it (see examples/train_ddp.py)

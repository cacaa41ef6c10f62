"""A tiny DDP training job (gloo, CPU) that checkpoints and resumes: run it under aelastic.

    python -m aelastic run --standalone --nproc-per-node 2 --max-restarts 1 \\
        examples/train_ddp.py --steps 40 --checkpoint "$(mktemp -d)/ckpt.bin" --crash-at-step 25

Everything is deterministic: a fixed seed builds the model, and the batch of step ``s``
on rank ``r`` is drawn from a generator seeded with ``(s, r)``. So a run that crashes
and resumes from its last checkpoint ends with exactly the parameters of a run that
never crashed; the last line, ``FINAL step=... checksum=...``, lets you compare.

The checkpoint is the flat float32 parameter vector plus a JSON header (step, world
size), written by rank 0 to ``PATH.tmp`` and renamed over ``PATH`` (atomic), so a crash
never leaves a torn checkpoint. No pickle: ``torch.load`` is not needed to read it.
SGD without momentum keeps the optimizer stateless, so the parameters are the whole state.

``--memory-checkpoint`` keeps the checkpoint in the agent's memory instead, with
aelastic's own API (docs/checkpoints.md): every rank calls
``aelastic.checkpoint.save({"model": state_dict}, step=...)`` every ``--checkpoint-every``
steps, and on start ``aelastic.checkpoint.load()`` returns the newest step every rank
completed (None on a first start), so a restarted group resumes without touching shared
storage (add ``--checkpoint-dir`` to the launcher to also keep it on disk).

``--crash-at-step K`` makes rank 0 exit with status 1 just before step K, only on the
first attempt (``TORCHELASTIC_RESTART_COUNT == 0``): the launcher restarts the group,
the group resumes from the checkpoint and finishes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from typing import NoReturn

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

MAGIC = b"AELCKPT1"


def build_model() -> nn.Module:
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))


def batch(step: int, rank: int, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(size, 8, generator=gen)
    y = x.sum(dim=1, keepdim=True).sin()
    return x, y


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()


def param_bytes(model: nn.Module) -> bytes:
    """The float32 parameter vector as raw bytes (no numpy: torch's CPU wheel lacks it)."""
    return bytes(flat_params(model).view(torch.uint8).tolist())


def save_checkpoint(path: str, model: nn.Module, step: int, world_size: int) -> None:
    header = json.dumps({"step": step, "world_size": world_size}).encode()
    payload = param_bytes(model)
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(MAGIC + len(header).to_bytes(4, "little") + header + payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: str, model: nn.Module) -> int:
    """Load ``path`` into ``model``; return the step to continue from (0 if none)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return 0
    if not data.startswith(MAGIC):
        raise SystemExit(f"{path} is not a train_ddp.py checkpoint")
    hlen = int.from_bytes(data[8:12], "little")
    header = json.loads(data[12 : 12 + hlen])
    vec = torch.frombuffer(bytearray(data[12 + hlen :]), dtype=torch.float32)
    torch.nn.utils.vector_to_parameters(vec, model.parameters())
    return int(header["step"])


def save_memory_checkpoint(model: nn.Module, step: int) -> None:
    """This rank's state into the agent's memory (``aelastic run`` only)."""
    from aelastic import checkpoint

    checkpoint.save({"model": model.state_dict()}, step=step)


def load_memory_checkpoint(model: nn.Module) -> int:
    """Load the newest step every rank saved into ``model``; the step (0 if none)."""
    from aelastic import checkpoint

    resumed = checkpoint.load()
    if resumed is None:
        return 0
    step, state = resumed
    model.load_state_dict(state["model"])
    return step


def checksum(model: nn.Module) -> str:
    return hashlib.sha256(param_bytes(model)).hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint", default="", help="checkpoint path (resume if present)")
    parser.add_argument(
        "--memory-checkpoint",
        action="store_true",
        help="checkpoint into the agent's memory (aelastic.checkpoint) instead of a file",
    )
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--crash-at-step", type=int, default=-1)
    opts = parser.parse_args(argv)
    if opts.memory_checkpoint and opts.checkpoint:
        parser.error("--memory-checkpoint and --checkpoint PATH: choose one of them")

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    model = build_model()
    if opts.memory_checkpoint:
        start = load_memory_checkpoint(model)
    else:
        start = load_checkpoint(opts.checkpoint, model) if opts.checkpoint else 0
    if start >= opts.steps:
        if rank == 0:
            where = "the memory checkpoint" if opts.memory_checkpoint else opts.checkpoint
            print(
                f"{where} already holds step {start} >= --steps {opts.steps}: "
                "this run already finished; delete the checkpoint or raise --steps to train",
                flush=True,
            )
        dist.destroy_process_group()
        return 0
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=opts.lr)
    if rank == 0:
        print(f"attempt={attempt} world_size={world} resuming_from_step={start}", flush=True)

    loss = torch.zeros(())
    for step in range(start, opts.steps):
        if step == opts.crash_at_step and attempt == 0 and rank == 0:
            print(f"crashing on purpose at step {step}", flush=True)
            sys.stdout.flush()
            os._exit(1)
        x, y = batch(step, rank)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        optimizer.step()
        done = step + 1
        if opts.memory_checkpoint and done % opts.checkpoint_every == 0:
            save_memory_checkpoint(model, done)  # every rank saves its own
        elif opts.checkpoint and done % opts.checkpoint_every == 0:
            if rank == 0:
                save_checkpoint(opts.checkpoint, model, done, world)
            dist.barrier()

    if rank == 0:
        print(f"FINAL step={opts.steps} loss={loss.item():.6f} checksum={checksum(model)}")
    dist.destroy_process_group()
    exit_now(0)  # here, while `ddp` still holds the process group


def exit_now(code: int) -> NoReturn:
    """Leave without freeing anything: everything is done and saved.

    Freeing the last reference to a gloo process group (DDP's, when main()'s locals go)
    joins gloo's threads while holding the GIL; a gloo thread that still needs the GIL to
    drop its last work item then waits forever (seen in 4 of 38 runs). Interpreter
    finalization is skipped too: gloo's C++ threads can still hold Python objects there
    and abort the process ("terminate called without an active exception", SIGABRT;
    pytorch PR #179291; 1 of 7 suite runs on a loaded 2-core machine, any launcher).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())

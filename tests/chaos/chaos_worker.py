"""A small gloo training job for the chaos trials: checkpoints every step, resumes, reports.

    chaos_worker.py OUT_DIR STEPS [STEP_SECONDS]

Each worker writes ``OUT_DIR/pids/<pid>-<ppid>`` and prints ``BOOT pid=P`` first (the orphan
check; the start-up trials strike then), then joins
the process group, resumes from ``OUT_DIR/ckpt.json`` when it exists (it must parse: a torn
checkpoint is a lost one), and runs ``STEPS`` steps of one all_reduce each. Rank 0 writes
the checkpoint after every step (temp file + rename). Lines on stdout, one write each:
``READY rank=R world=W from=S`` once the group is formed, ``STEP s world=W`` (rank 0) after
each step, ``FINAL world=W step=S`` (rank 0) at the end, and ``OUT_DIR/final.json`` holds
the same. The resume points go to ``OUT_DIR/resumes.jsonl`` (rank 0), so a trial can check
that no run ever started from an older step than one already saved.
"""

from __future__ import annotations

import json
import os
import sys
import time


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _atomic_write(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _load(path: str) -> int:
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return 0
    return int(json.loads(text)["step"])  # a torn file raises: the trial sees the failure


def main(argv: list[str]) -> int:
    out, steps = argv[0], int(argv[1])
    step_seconds = float(argv[2]) if len(argv) > 2 else 0.05
    os.makedirs(os.path.join(out, "pids"), exist_ok=True)
    open(os.path.join(out, "pids", f"{os.getpid()}-{os.getppid()}"), "w").close()
    _say(f"BOOT pid={os.getpid()}")

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ckpt = os.path.join(out, "ckpt.json")
    start = _load(ckpt)
    # every rank must resume from the same step: rank 0's reading wins
    agreed = torch.tensor([start])
    dist.broadcast(agreed, 0)
    start = int(agreed.item())
    if rank == 0:
        with open(os.path.join(out, "resumes.jsonl"), "a") as f:
            f.write(json.dumps({"from": start, "world": world}) + "\n")
    _say(f"READY rank={rank} world={world} from={start}")
    for step in range(start, steps):
        t = torch.ones(1)
        dist.all_reduce(t)
        if int(t.item()) != world:
            raise RuntimeError(f"all_reduce gave {t.item()} in a world of {world}")
        time.sleep(step_seconds)
        if rank == 0:
            _atomic_write(ckpt, json.dumps({"step": step + 1, "world": world}))
            _say(f"STEP {step + 1} world={world}")
    dist.barrier()
    if rank == 0:
        _atomic_write(os.path.join(out, "final.json"), json.dumps({"world": world, "step": steps}))
        _say(f"FINAL world={world} step={steps}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    # gloo's threads can abort interpreter finalization; the result is already written
    os._exit(code)

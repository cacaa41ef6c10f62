"""Checkpoint save/load: aelastic.checkpoint vs torch.save / torch.load vs DCP async_save.

    python benchmarks/checkpoint.py [--sizes-mib 128,1024] [--repeats 3]

One process plays one rank (RANK=0, WORLD_SIZE=1) of a state of N MiB (8 float32
tensors, a model-like state_dict) and measures, side by side in one run:

* **save, blocking**: ``aelastic.checkpoint.save`` into an agent-style directory in
  ``/dev/shm`` (steady state: after two saves, as in training, so it reuses the pages
  of the step it drops; the first save is reported too), ``torch.save`` to a local
  file (the disk's page cache, no fsync, what most scripts do) and
  ``torch.distributed.checkpoint.async_save`` (gloo, world 1): the time until each
  call returns. DCP's background write is awaited before the next round.
* **load after a restart**: a fresh interpreter (torch imported first, not timed)
  runs ``aelastic.checkpoint.load()`` with the environment the agent gives a restarted
  worker, vs ``torch.load`` of the local file, then copies both into preallocated
  parameters (``load_state_dict``-like).
* **persist**: the agent's background copy of the newest step to a disk directory
  (``Checkpoints.persist``: one thread, sendfile, fsync) vs the largest event-loop
  stall a 1 ms ticker sees meanwhile.

Medians over ``--repeats``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import anyio
import torch

from aelastic import checkpoint
from aelastic.checkpoint import _layout as L
from aelastic.checkpoint._agent import Checkpoints

LOAD = """\
import os, sys, time, torch
from aelastic import checkpoint
size, path = int(sys.argv[1]), sys.argv[2]
params = {f"w{i}": torch.zeros(size // 8) for i in range(8)}  # pages touched
t0 = time.perf_counter(); step, obj = checkpoint.load(); t1 = time.perf_counter()
for k, v in obj.items(): params[k].copy_(v)
t2 = time.perf_counter()
ref = torch.load(path, weights_only=False); t3 = time.perf_counter()
for k, v in ref.items(): params[k].copy_(v)
t4 = time.perf_counter()
print(t1 - t0, t2 - t0, t3 - t2, t4 - t2)
"""


_steps = itertools.count()


def state(mib: int) -> dict[str, torch.Tensor]:
    n = mib * (1 << 20) // 4
    return {f"w{i}": torch.randn(n // 8) for i in range(8)}


def timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def dcp_group() -> None:
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)


def bench_size(mib: int, repeats: int, scratch: str, memory: str) -> dict[str, float]:
    import torch.distributed.checkpoint as dcp

    sd = state(mib)
    os.environ.update({L.DIR_ENV: memory, "RANK": "0", "WORLD_SIZE": "1"})
    local = os.path.join(scratch, "torch_save.pt")
    ours, torch_save, dcp_async = [], [], []
    # steps continue across sizes: one process, one rank, steps never go back
    first = timed(lambda: checkpoint.save(sd, step=next(_steps)))
    checkpoint.save(sd, step=next(_steps))
    for r in range(repeats):
        newest = next(_steps)
        ours.append(timed(lambda s=newest: checkpoint.save(sd, step=s)))  # type: ignore[misc]
        torch_save.append(timed(lambda: torch.save(sd, local)))
        target = os.path.join(scratch, f"dcp_{r}")
        start = time.perf_counter()
        future = dcp.async_save(sd, checkpoint_id=target)
        dcp_async.append(time.perf_counter() - start)
        future.result()
        shutil.rmtree(target, ignore_errors=True)
    env = {**os.environ, L.STEP_ENV: str(newest), L.WORLD_ENV: "1"}
    loads = [
        [
            float(x)
            for x in subprocess.check_output(
                [sys.executable, "-c", LOAD, str(mib * (1 << 20) // 4), local], env=env, text=True
            ).split()
        ]
        for _ in range(repeats)
    ]
    stall, persist = anyio.run(persist_stall, memory, os.path.join(scratch, "disk"))
    return {
        "save_first": first,
        "save": statistics.median(ours),
        "torch_save": statistics.median(torch_save),
        "dcp_async_save": statistics.median(dcp_async),
        "load": statistics.median(x[0] for x in loads),
        "load_copy": statistics.median(x[1] for x in loads),
        "torch_load": statistics.median(x[2] for x in loads),
        "torch_load_copy": statistics.median(x[3] for x in loads),
        "persist": persist,
        "persist_loop_stall": stall,
    }


async def persist_stall(memory: str, disk: str) -> tuple[float, float]:
    """(largest 1 ms-ticker lateness, seconds) while the agent copies the newest step."""
    cp = Checkpoints(memory, disk, lambda name, md: None)
    cp.local_ranks = (0,)
    worst = 0.0
    done = anyio.Event()

    async def tick() -> None:
        nonlocal worst
        while not done.is_set():
            start = time.perf_counter()
            await anyio.sleep(0.001)
            worst = max(worst, time.perf_counter() - start - 0.001)

    async with anyio.create_task_group() as tg:
        tg.start_soon(tick)
        start = time.perf_counter()
        await cp.persist()
        took = time.perf_counter() - start
        done.set()
    assert cp.persisted_step is not None
    return worst, took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", default="128,1024")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scratch", default=None, help="local directory for torch.save/DCP")
    opts = parser.parse_args()
    dcp_group()
    print(f"load average {os.getloadavg()[0]:.2f}; torch {torch.__version__}", flush=True)
    results = {}
    for mib in (int(x) for x in opts.sizes_mib.split(",")):
        scratch = tempfile.mkdtemp(prefix="ckpt_bench_", dir=opts.scratch or "/var/tmp")
        memory = tempfile.mkdtemp(prefix="ckpt_bench_", dir="/dev/shm")
        try:
            r = bench_size(mib, opts.repeats, scratch, memory)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            shutil.rmtree(memory, ignore_errors=True)
        results[mib] = r
        ms = {k: f"{v * 1e3:.0f} ms" for k, v in r.items()}
        print(f"\n{mib} MiB per rank (median of {opts.repeats})")
        print(
            f"  save blocking: aelastic {ms['save']} (first save {ms['save_first']})"
            f" | torch.save {ms['torch_save']} | DCP async_save {ms['dcp_async_save']}"
            f" -> {r['save'] / r['torch_save']:.2f}x torch.save,"
            f" {r['save'] / r['dcp_async_save']:.2f}x async_save"
        )
        print(
            f"  load after restart: aelastic {ms['load']} (+copy into params {ms['load_copy']})"
            f" | torch.load {ms['torch_load']} (+copy {ms['torch_load_copy']})"
            f" -> {r['load'] / r['torch_load']:.2f}x"
        )
        print(
            f"  persist to disk (background): {ms['persist']},"
            f" largest loop stall meanwhile {r['persist_loop_stall'] * 1e3:.1f} ms"
        )
    print(f"\nload average {os.getloadavg()[0]:.2f}")
    print(json.dumps(results))
    os._exit(0)  # skip finalization with a gloo group up


if __name__ == "__main__":
    main()

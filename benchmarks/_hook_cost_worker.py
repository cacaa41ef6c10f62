"""The per-iteration cost of ``aelastic.stragglers.time_work`` in one process (gloo, world 1).

    python benchmarks/_hook_cost_worker.py [--iterations 300] [--rounds 5]
        [--device cpu|cuda] [--hidden 512] [--bucket-mb 1]

A DDP model of 8 Linear(hidden, hidden) layers in ``--bucket-mb`` buckets (gloo on the CPU,
NCCL at world size 1 with ``--device cuda``: the device check's); each iteration a
forward, backward (DDP all-reduces every bucket) and ``zero_grad``. Three variants
each timed per iteration: no hook (DDP's built-in all-reduce),
torch's ``allreduce_hook`` (what ``time_work`` wraps: the cost of a Python hook) and
``time_work``, writing into a real progress file as in an agent's worker, one iteration
of each in turn. Prints one JSON line: the median seconds per iteration of each variant.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--iterations", type=int, default=300)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--bucket-mb", type=float, default=1.0)
    args = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="hook-cost-")
    path = os.path.join(tmp, "w.progress")
    with open(path, "wb") as fp:  # what the agent creates: SIZE zero bytes
        fp.truncate(4096)
    os.environ["AELASTIC_PROGRESS_FILE"] = path  # aelastic.progress attaches on import
    import struct

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from aelastic.progress import _layout
    from aelastic.stragglers import time_work

    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(tmp, "store"), 1)
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=0, world_size=1)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def model(variant: str) -> nn.Module:
        torch.manual_seed(0)
        layers = nn.Sequential(*(nn.Linear(args.hidden, args.hidden) for _ in range(8)))
        ddp = nn.parallel.DistributedDataParallel(
            layers.to(args.device), bucket_cap_mb=args.bucket_mb
        )
        if variant == "python_hook":
            ddp.register_comm_hook(None, allreduce_hook)
        elif variant == "time_work":
            time_work(ddp)
        return ddp

    x = torch.randn(16, args.hidden, device=args.device)
    variants = {v: model(v) for v in ("none", "python_hook", "time_work")}
    times: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(args.rounds * args.iterations):
        for name, ddp in variants.items():  # round-robin: the machine's drift hits all alike
            t0 = time.perf_counter()
            ddp(x).sum().backward()
            ddp.zero_grad()
            sync()  # the GPU's time too (the hook itself never waits for the GPU)
            times[name].append(time.perf_counter() - t0)
    with open(path, "rb") as fp:
        slots = struct.unpack(f"{_layout.SLOTS}q", fp.read(_layout.SLOTS * 8))
    work, span = slots[_layout.WORK_NS], slots[_layout.WORK_SPAN_NS]
    print(
        json.dumps(
            {
                "median_s": {v: statistics.median(t) for v, t in times.items()},
                "buckets": len(variants["none"].reducer._get_zeros_like_grad_buckets()),
                "timed_seconds": span / 1e9,
                "work_fraction": work / span if span else None,
            }
        ),
        flush=True,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

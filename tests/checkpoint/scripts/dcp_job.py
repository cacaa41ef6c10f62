"""One rank of a gloo job that saves or loads a DTensor-sharded state through DCP.

``save --steps N``: every step ``s`` (1..N) saves ``{"w": full * s}`` (``full`` a 16x4
``arange``, sharded by rows over the world) and ``{"step": s}`` with
``dcp.save(..., storage_writer=MemoryWriter(step=s))`` (``--async``: ``dcp.async_save``).
``load``: loads through ``MemoryReader`` into a state sharded over this (other) world
and prints one JSON line per rank: the reader's step, and whether the shard equals
``full * step``. Run with the environment the agent gives workers; ``--cases FILE``
(a JSON object, label -> that environment's ``AELASTIC_CHECKPOINT_*`` variables): one
load per label, in one process group, each with only its label's variables set and
its line holding ``"case": label`` (the loads of several tests for one start-up).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import Future
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_loader import load
from torch.distributed.checkpoint.state_dict_saver import async_save, save
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from aelastic import checkpoint


def load_line(mesh: DeviceMesh, full: torch.Tensor) -> dict[str, Any]:
    """Load through a new MemoryReader (the environment's step) into a fresh state."""
    reader = checkpoint.MemoryReader()
    state: dict[str, Any] = {"w": distribute_tensor(torch.zeros(16, 4), mesh, [Shard(0)])}
    state["step"] = 0
    if reader.step is not None:
        load(state, storage_reader=reader)
    expected = distribute_tensor(full * (reader.step or 0), mesh, [Shard(0)])
    same = torch.equal(state["w"].to_local(), expected.to_local())
    return {"rank": dist.get_rank(), "step": reader.step, "same": same, "saved": state["step"]}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("save", "load"))
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--async", dest="asynchronous", action="store_true")
    parser.add_argument("--cases", help="load: a JSON file, label -> checkpoint environment")
    opts = parser.parse_args()
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    full = torch.arange(64, dtype=torch.float32).reshape(16, 4)
    if opts.mode == "save":
        for step in range(1, opts.steps + 1):
            state: dict[str, Any] = {"w": distribute_tensor(full * step, mesh, [Shard(0)])}
            state["step"] = step
            writer = checkpoint.MemoryWriter(step=step)
            if opts.asynchronous:
                future = async_save(state, storage_writer=writer)
                assert isinstance(future, Future)
                future.result()
            else:
                save(state, storage_writer=writer)
        dist.barrier()
    elif opts.cases is None:
        print(json.dumps(load_line(mesh, full)), flush=True)
    else:
        with open(opts.cases) as f:
            cases: dict[str, dict[str, str]] = json.load(f)
        for label, env in cases.items():
            for name in [n for n in os.environ if n.startswith("AELASTIC_CHECKPOINT_")]:
                del os.environ[name]
            os.environ.update(env)
            print(json.dumps({"case": label, **load_line(mesh, full)}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # skip finalization: gloo threads can abort it (see examples/train_ddp.py)

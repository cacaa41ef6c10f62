"""The fault campaign's training job: gloo on CPU, bit-exact whatever the world size.

    campaign_worker.py OUT_DIR CONTROL_DIR --steps N [--step-seconds X] [--work U] [--dcp]

Every step ``s`` (0-based, completing step ``s + 1``) trains a tiny float64 model on a
global batch of :data:`BATCH` samples drawn from a generator seeded with ``s``. Rank
``r`` of ``W`` (``W`` divides :data:`BATCH`) takes the samples ``[r*B/W, (r+1)*B/W)``,
computes each one's gradient alone (batch of one: the same arithmetic on any rank),
quantizes it to a multiple of ``2**-20`` within ``+-2**10`` (so every sum of them is
exact in float64, in any order), sums its shard and all-reduces the sum over gloo (the
all-reduce DDP does, written out), divides by ``B`` and takes an SGD step with
momentum. The result is bit-identical to :func:`train` run in one process without
interruption: the campaign's ground truth, which the launcher never computed.

After every step each rank saves ``{"params", "momentum", "step"}`` with
``aelastic.checkpoint.save`` (``--dcp``: ``torch.distributed.checkpoint`` through
``MemoryWriter``), waits at a barrier (so every rank saved it), reports the step to
``aelastic.progress`` and prints it: a printed step is a step every rank saved. Start:
``checkpoint.load()`` (``--dcp``: ``MemoryReader``).

Lines on stdout (one ``write`` each, ``t=`` is ``time.monotonic()``, one clock per host):

* ``READY rank=R world=W from=S attempt=A gen=G node=N group=GR pid=P t=T`` per rank once
  the group formed and the checkpoint is loaded (``gen``: a token rank 0 draws and
  broadcasts, one per world started; ``from``: the step resumed from, 0 for none);
* ``STEP s rank=R world=W from=S attempt=A gen=G t=T`` per rank after each step;
* ``DIVERGED ...`` if the ranks of a world resumed from different steps or parameters;
* ``FINAL step=N world=W gen=G`` (rank 0) after ``OUT_DIR/final.json`` is written:
  ``{"step", "world", "params": <hex of the float64 bytes>, "sha256"}``.

Each process writes ``OUT_DIR/pids/<pid>-<ppid>`` first (the orphan check) and
``OUT_DIR/progress/<pid>`` with its ``AELASTIC_PROGRESS_FILE`` (the leftover check).

Faults, from files in ``CONTROL_DIR`` looked at before each step: ``crash_<rank>`` (the
rank that removes it first exits 1), ``hang_<rank>`` (removed likewise; that rank then
blocks forever, no more heartbeats), ``slow_<node>`` (every rank of the agent whose
``AELASTIC_NODE_ID`` is ``<node>`` does ``--slow-factor`` times the CPU work per step,
while the file exists: a straggler as busy time sees one), ``hold`` (while it exists,
every rank waits before the last step doing idle steps, slowed likewise, that change
nothing: the job cannot end before the test saw what it waits for).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import sys
import time
from typing import Any

import torch

#: The global batch: every world size that divides it trains the same model.
BATCH = 60
#: Model: x (4) -> tanh(W1 x + b1) (8) -> w2 . h + b2 (1), float64, flattened.
IN, HIDDEN = 4, 8
SIZE = IN * HIDDEN + HIDDEN + HIDDEN + 1
LR, MOMENTUM = 0.05, 0.9
#: Quantization of each per-sample gradient: a multiple of 2**-QBITS within +-2**10.
QBITS = 20
QMAX = float(2**10)


def initial_state() -> dict[str, Any]:
    gen = torch.Generator().manual_seed(20260036)
    params = torch.randn(SIZE, dtype=torch.float64, generator=gen) * 0.5
    return {"params": params, "momentum": torch.zeros(SIZE, dtype=torch.float64), "step": 0}


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of step ``step`` (0-based): the same on every rank and world."""
    gen = torch.Generator().manual_seed(1_000_003 + step)
    x = torch.randn(BATCH, IN, dtype=torch.float64, generator=gen)
    return x, torch.sin(x.sum(dim=1))


def _loss(params: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    w1 = params[: IN * HIDDEN].view(HIDDEN, IN)
    b1 = params[IN * HIDDEN : IN * HIDDEN + HIDDEN]
    w2 = params[IN * HIDDEN + HIDDEN : IN * HIDDEN + 2 * HIDDEN]
    b2 = params[-1]
    h = torch.tanh(w1 @ x + b1)
    return (w2 @ h + b2 - y) ** 2


def shard_sum(params: torch.Tensor, step: int, lo: int, hi: int) -> torch.Tensor:
    """The sum of the quantized per-sample gradients of samples ``[lo, hi)`` of ``step``."""
    x, y = batch(step)
    total = torch.zeros(SIZE, dtype=torch.float64)
    for i in range(lo, hi):
        p = params.detach().clone().requires_grad_(True)
        (g,) = torch.autograd.grad(_loss(p, x[i], y[i]), p)
        scaled = torch.round(g * float(2**QBITS)) / float(2**QBITS)
        total += torch.clamp(scaled, -QMAX, QMAX)
    return total


def apply(state: dict[str, Any], total: torch.Tensor) -> None:
    """SGD with momentum on the global sum of gradients ``total`` (elementwise: exact)."""
    grad = total / float(BATCH)
    momentum = state["momentum"] * MOMENTUM + grad
    state["momentum"] = momentum
    state["params"] = state["params"] - momentum * LR
    state["step"] += 1


def train(steps: int) -> dict[str, Any]:
    """The uninterrupted single-process run: the ground truth."""
    torch.set_num_threads(1)
    state = initial_state()
    for step in range(steps):
        apply(state, shard_sum(state["params"], step, 0, BATCH))
    return state


def params_hex(params: torch.Tensor) -> str:
    return params.detach().contiguous().numpy().tobytes().hex()


def _say(line: str) -> None:
    os.write(1, (line + "\n").encode())  # one write: lines of several workers never mix


def _spin(units: int) -> None:
    """Deterministic CPU work (busy time, as the straggler detector measures it)."""
    n = 0
    for i in range(units * 10_000):
        n += i
    if n < 0:  # pragma: no cover - keeps the loop from being optimised away
        print(n)


def _claim(path: str) -> bool:
    """Take a one-shot control file: True for the one process whose unlink succeeded."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def _load(dcp: bool) -> tuple[int, dict[str, Any]] | None:
    from aelastic import checkpoint

    if not dcp:
        resumed = checkpoint.load()
        if resumed is None:
            return None
        step, state = resumed
        if int(state["step"]) != step:
            raise RuntimeError(f"checkpoint of step {step} holds step {state['step']}")
        return step, {
            "params": state["params"].to(torch.float64).clone(),
            "momentum": state["momentum"].to(torch.float64).clone(),
            "step": int(state["step"]),
        }
    import torch.distributed.checkpoint as dcp_api

    reader = checkpoint.MemoryReader()
    if reader.step is None:
        return None
    sd = {
        "params": torch.zeros(SIZE, dtype=torch.float64),
        "momentum": torch.zeros(SIZE, dtype=torch.float64),
        "step": torch.zeros((), dtype=torch.int64),
    }
    dcp_api.load(sd, storage_reader=reader)
    if int(sd["step"]) != reader.step:
        raise RuntimeError(f"checkpoint of step {reader.step} holds step {int(sd['step'])}")
    return int(reader.step), {
        "params": sd["params"],
        "momentum": sd["momentum"],
        "step": int(sd["step"]),
    }


def _save(state: dict[str, Any], dcp: bool) -> None:
    from aelastic import checkpoint

    step = int(state["step"])
    if not dcp:
        checkpoint.save(state, step=step)
        return
    import torch.distributed.checkpoint as dcp_api

    sd = {
        "params": state["params"],
        "momentum": state["momentum"],
        "step": torch.tensor(step, dtype=torch.int64),
    }
    dcp_api.save(sd, storage_writer=checkpoint.MemoryWriter(step=step))


def _hold(control: str, slow_file: str, opts: argparse.Namespace) -> None:
    """Before the last step, while ``CONTROL_DIR/hold`` exists on any rank: idle steps
    (the step's CPU work, slowed as a real step would be, a pause and a heartbeat; the
    state untouched), so the job cannot end before what the test waits for has happened
    while a straggler stays one. The ranks decide together (an all-reduce of the flag),
    so they leave the loop at the same idle step."""
    import torch.distributed as dist

    from aelastic import progress

    while True:
        flag = torch.tensor([float(os.path.exists(os.path.join(control, "hold")))])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() == 0:
            return
        _spin(opts.work * (opts.slow_factor if os.path.exists(slow_file) else 1))
        time.sleep(opts.step_seconds)
        progress.heartbeat()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("control")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--step-seconds", type=float, default=0.2)
    parser.add_argument("--work", type=int, default=60, help="CPU work units (0.5 ms) per step")
    parser.add_argument("--slow-factor", type=int, default=5)
    parser.add_argument("--dcp", action="store_true")
    opts = parser.parse_args(argv)

    out, control = opts.out, opts.control
    os.makedirs(os.path.join(out, "pids"), exist_ok=True)
    os.makedirs(os.path.join(out, "progress"), exist_ok=True)
    open(os.path.join(out, "pids", f"{os.getpid()}-{os.getppid()}"), "w").close()
    with open(os.path.join(out, "progress", str(os.getpid())), "w") as f:
        f.write(os.environ.get("AELASTIC_PROGRESS_FILE", ""))

    import torch.distributed as dist

    from aelastic import progress

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    if BATCH % world:
        raise SystemExit(f"world size {world} does not divide the batch of {BATCH}")
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    node = os.environ.get("AELASTIC_NODE_ID", "?")
    group = os.environ.get("GROUP_RANK", "?")
    token = torch.tensor([random.getrandbits(62) if rank == 0 else 0], dtype=torch.int64)
    dist.broadcast(token, 0)
    gen = f"{int(token.item()):x}"

    resumed = _load(opts.dcp)
    start, state = (0, initial_state()) if resumed is None else resumed
    # every rank must resume from the same step with the same parameters
    check = torch.tensor([start, -start], dtype=torch.int64)
    dist.all_reduce(check, op=dist.ReduceOp.MAX)
    reference = state["params"].clone()
    dist.broadcast(reference, 0)
    if (
        int(check[0]) != start
        or int(-check[1]) != start
        or not torch.equal(reference, state["params"])
    ):
        _say(
            f"DIVERGED rank={rank} gen={gen} from={start} max={int(check[0])} min={-int(check[1])}"
        )
    tag = f"world={world} from={start} attempt={attempt} gen={gen}"
    _say(
        f"READY rank={rank} {tag} node={node} group={group} pid={os.getpid()} "
        f"t={time.monotonic():.6f}"
    )
    per = BATCH // world
    slow_file = os.path.join(control, f"slow_{node}")
    for step in range(start, opts.steps):
        if _claim(os.path.join(control, f"crash_{rank}")):
            _say(f"CRASH rank={rank} gen={gen} step={step}")
            os._exit(1)
        if _claim(os.path.join(control, f"hang_{rank}")):
            _say(f"HANG rank={rank} gen={gen} step={step}")
            while True:
                signal.pause()  # until the agent, having seen no heartbeat, stops it
        if step == opts.steps - 1:
            _hold(control, slow_file, opts)
        _spin(opts.work * (opts.slow_factor if os.path.exists(slow_file) else 1))
        total = shard_sum(state["params"], step, rank * per, (rank + 1) * per)
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        apply(state, total)
        time.sleep(opts.step_seconds)
        _save(state, opts.dcp)
        dist.barrier()  # every rank saved step + 1: only now is it printed
        progress.step(step + 1)
        _say(f"STEP {step + 1} rank={rank} {tag} t={time.monotonic():.6f}")
    dist.barrier()
    if rank == 0:
        final = {
            "step": int(state["step"]),
            "world": world,
            "params": params_hex(state["params"]),
            "sha256": hashlib.sha256(bytes.fromhex(params_hex(state["params"]))).hexdigest(),
        }
        path = os.path.join(out, "final.json")
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(json.dumps(final))
        os.replace(tmp, path)
        _say(f"FINAL step={final['step']} world={world} gen={gen}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    # gloo's threads can abort interpreter finalization; the result is already written
    os._exit(code)

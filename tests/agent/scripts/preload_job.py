"""A gloo DDP training job that crashes once and resumes: the ``--preload`` tests and benchmark.

An MLP trained with AdamW; rank 0 saves model and optimizer state (``torch.save``)
every ``--checkpoint-every`` steps; on the first attempt rank ``--crash-rank``
records the time and leaves by ``os._exit(1)`` just before step ``--crash-at``.
Deterministic: the same seed builds the model and step ``s`` on rank ``r`` draws
its batch from seed ``(s, r)``, so a resumed run ends with an uninterrupted run's
parameters.

Appends JSON lines to ``--out`` (one ``O_APPEND`` write each):
``{"event": "top", ...}`` before anything else is imported (which of torch,
colorsys and wave were already in ``sys.modules``, whether CUDA was initialised;
then the script imports the ``--import`` modules and sets the ``--set-env``
variable, before ``import torch``),
``{"event": "crash", "t": ...}``, ``{"event": "step", ...}`` after the first
step of each attempt (``t``: wall clock), and ``{"event": "final", ...}`` on rank 0
(checksum of the parameters, ``torch.get_num_threads()``, the variable read back).
"""

import sys

# First: nothing of this script imported yet. Which of these did the launcher preload?
PRELOADED = sorted(m for m in ("colorsys", "torch", "wave") if m in sys.modules)
# A preloaded torch must not have initialised CUDA in the idle interpreter.
CUDA_AT_TOP = "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402


def record(path: str, **fields: object) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, (json.dumps(fields) + "\n").encode())
    finally:
        os.close(fd)


def begin(preloaded: list[str]) -> tuple[argparse.Namespace, int, int]:
    """Parse the options, record the ``top`` event: ``(options, attempt, rank)``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--crash-at", type=int, default=25)
    parser.add_argument("--crash-rank", type=int, default=1)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="compute per step")
    parser.add_argument("--spin", action="store_true", help="compute busies the CPU")
    parser.add_argument("--import", dest="imports", default="", help="modules to import")
    parser.add_argument("--set-env", default="", help="NAME=VALUE set before import torch")
    opts = parser.parse_args()
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank = int(os.environ["RANK"])
    top = {"attempt": attempt, "rank": rank, "pid": os.getpid(), "preloaded": PRELOADED}
    top["cuda_initialized"] = CUDA_AT_TOP
    record(opts.out, event="top", t=time.time(), **top)
    return opts, attempt, rank


def simulate_compute(opts: argparse.Namespace) -> None:
    """``--step-seconds`` of a real model's compute: sleep, or with ``--spin`` a busy loop."""
    if opts.spin:
        until = time.monotonic() + opts.step_seconds
        while time.monotonic() < until:
            pass
    elif opts.step_seconds:
        time.sleep(opts.step_seconds)


def main() -> int:
    opts, attempt, rank = begin(PRELOADED)
    for module in filter(None, opts.imports.split(",")):
        with contextlib.suppress(RuntimeError):  # a module that raises on import
            __import__(module)
    name, _, value = opts.set_env.partition("=")
    if name:
        os.environ[name] = value

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    record(opts.out, event="init", attempt=attempt, rank=rank, t=time.time())
    torch.manual_seed(1234)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 1),
    )  # fmt: skip
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    start = 0
    if os.path.exists(opts.checkpoint):
        state = torch.load(opts.checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    ddp = DistributedDataParallel(model)
    for step in range(start, opts.steps):
        if attempt == 0 and rank == opts.crash_rank and step == opts.crash_at:
            record(opts.out, event="crash", rank=rank, t=time.time())
            os._exit(1)
        gen = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(32, 16, generator=gen)
        loss = torch.nn.functional.mse_loss(ddp(x), x.sum(dim=1, keepdim=True).sin())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == start:  # the first step of this attempt (before the simulated compute)
            record(opts.out, event="step", attempt=attempt, rank=rank, step=step, t=time.time())
        simulate_compute(opts)
        if (step + 1) % opts.checkpoint_every == 0:
            if rank == 0:
                tmp = opts.checkpoint + ".tmp"
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
                torch.save({**state, "step": step + 1}, tmp)
                os.replace(tmp, opts.checkpoint)
            dist.barrier()
    if rank == 0:
        params = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
        record(
            opts.out,
            event="final",
            attempt=attempt,
            params=hashlib.sha256(bytes(params.view(torch.uint8).tolist())).hexdigest(),
            threads=torch.get_num_threads(),
            env=os.environ.get(name) if name else None,
        )
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # Skip interpreter finalization (gloo's threads; see ddp_worker.py).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

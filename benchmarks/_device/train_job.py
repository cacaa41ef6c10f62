"""The device check's training job: one GPU, an MLP of a few hundred MB, AdamW, a crash.

    <launcher> ... train_job.py --out FILE --ckpt FILE [--steps 12] [--crash-at 6]
                                [--every 5] [--hidden 4096] [--layers 4]

Rank 0 only (one GPU). Each attempt: ``init_process_group`` (NCCL; gloo with
``DEVICE_CHECK_CPU=1``) from the launcher's environment (aelastic's worker store or
torchrun's), resume from the newest checkpoint, train. Checkpoints every ``--every``
steps: ``aelastic.checkpoint.save`` under aelastic (memory the agent owns), else
``torch.save`` to ``--ckpt`` (give it a tmpfs path: memory too). Attempt 0 leaves by
``os._exit(1)`` just before step ``--crash-at``. Attempt 1, after its first step,
records ``resumed`` and waits (at most 60 s) for ``<out>.release`` so that the check can
look at the idle interpreters meanwhile.

JSON lines in ``--out`` (``t``: wall clock): ``top`` (first statement: was torch
preloaded, was CUDA initialised), ``cuda`` (first CUDA call's seconds),
``pg`` (``init_process_group`` plus one all-reduce, seconds), ``crash``, ``step``
(the first of each attempt, after a device synchronize), ``resumed``, ``final``.
"""

import sys
import time

T0 = time.time()
PRELOADED = "torch" in sys.modules
CUDA_AT_TOP = PRELOADED and bool(sys.modules["torch"].cuda.is_initialized())

import argparse  # noqa: E402
import os  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BACKEND, DEVICE, record  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--ckpt", required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--crash-at", type=int, default=6)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--layers", type=int, default=4)
    opts = p.parse_args()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    out = opts.out
    record(out, event="top", t=T0, attempt=attempt, pid=os.getpid(), preloaded=PRELOADED,
           cuda_at_top=CUDA_AT_TOP)  # fmt: skip

    import torch
    import torch.distributed as dist

    t = time.perf_counter()
    probe = torch.ones(1, device=DEVICE)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    record(out, event="cuda", attempt=attempt, seconds=time.perf_counter() - t,
           ok=probe.item() == 1.0)  # fmt: skip

    t = time.perf_counter()
    dist.init_process_group(BACKEND)
    one = torch.ones(1, device=DEVICE)
    dist.all_reduce(one)
    record(out, event="pg", attempt=attempt, seconds=time.perf_counter() - t,
           store=os.environ.get("TORCHELASTIC_USE_AGENT_STORE"), ok=one.item() == 1.0)  # fmt: skip

    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(opts.layers):
        layers += [torch.nn.Linear(opts.hidden, opts.hidden), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(DEVICE)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)

    under_aelastic = "AELASTIC_CHECKPOINT_DIR" in os.environ
    start = 0
    if under_aelastic:
        from aelastic import checkpoint

        resumed = checkpoint.load()
    else:
        resumed = torch.load(opts.ckpt, weights_only=False) if os.path.exists(opts.ckpt) else None
    if resumed is not None:
        start, state = resumed
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])

    for step in range(start, opts.steps):
        if attempt == 0 and step == opts.crash_at:
            record(out, event="crash", attempt=attempt, step=step)
            os._exit(1)
        torch.manual_seed(step)
        x = torch.randn(64, opts.hidden, device=DEVICE)
        loss = model(x).square().mean()
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        dist.all_reduce(loss.detach())
        loss_value = loss.item()  # synchronizes the device
        if step == start:
            record(out, event="step", attempt=attempt, step=step, loss=loss_value)
            if attempt == 1:
                record(out, event="resumed", attempt=attempt, step=step)
                release = f"{out}.release"
                deadline = time.monotonic() + 60
                while not os.path.exists(release) and time.monotonic() < deadline:
                    time.sleep(0.05)
        if (step + 1) % opts.every == 0:
            state = {"model": model.state_dict(), "optim": optim.state_dict()}
            if under_aelastic:
                checkpoint.save(state, step=step + 1)
            else:
                torch.save((step + 1, state), f"{opts.ckpt}.tmp")
                os.replace(f"{opts.ckpt}.tmp", opts.ckpt)
    record(out, event="final", attempt=attempt, step=opts.steps)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

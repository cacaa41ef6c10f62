"""The device check's checkpoint job: ``aelastic.checkpoint.save`` of CUDA state, timed.

    python -m aelastic run --standalone --nproc-per-node 1 --max-restarts 1 \\
        ckpt_job.py --out FILE --tmp DIR [--hidden 4096] [--layers 4] [--repeats 3]

Attempt 0 builds the MLP and AdamW state on the GPU (one step, so the optimizer's
moments exist) and times, best of ``--repeats`` (seconds the caller is blocked):

- ``aelastic``: ``aelastic.checkpoint.save(state, step=i)``;
- ``torch_save``: ``torch.save(state, <--tmp>/state.pt)`` (give it tmpfs: the same medium);
- ``pinned_floor``: copying every tensor into pinned host buffers allocated beforehand
  (``copy_(non_blocking=True)`` then one synchronize): the device-to-host floor;
- ``pageable_copy``: ``t.cpu()`` of every tensor (the copy torch.save itself makes).

then leaves with exit code 1. Attempt 1 loads the checkpoint twice, as is and with
``map_location="cuda"``, and records the devices of the restored tensors.
JSON lines in ``--out``: ``save`` (bytes and the four times), ``load`` (devices).
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import CPU, DEVICE, record


def tensors(obj: object) -> list:
    """Every tensor in nested dicts, lists and tuples."""
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensors(v)]
    return []


def best(fn: object, repeats: int) -> float:
    import torch

    times = []
    for i in range(repeats):
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn(i)  # type: ignore[operator]
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--tmp", required=True)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    opts = p.parse_args()
    import torch

    from aelastic import checkpoint

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt > 0:
        step, state = checkpoint.load()  # type: ignore[misc]
        as_is = sorted({str(t.device) for t in tensors(state)})
        _, state = checkpoint.load(map_location=DEVICE)  # type: ignore[misc]
        mapped = sorted({str(t.device) for t in tensors(state)})
        record(opts.out, event="load", step=step, devices=as_is, mapped_devices=mapped)
        return

    layers: list[torch.nn.Module] = []
    for _ in range(opts.layers):
        layers += [torch.nn.Linear(opts.hidden, opts.hidden), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(DEVICE)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(8, opts.hidden, device=DEVICE)).sum().backward()
    optim.step()
    state = {"model": model.state_dict(), "optim": optim.state_dict()}
    flat = [t for t in tensors(state) if t.device.type == DEVICE]
    nbytes = sum(t.numel() * t.element_size() for t in flat)

    def pinned_floor() -> float | None:
        if CPU:
            return None
        bufs = [torch.empty_like(t, device="cpu").pin_memory() for t in flat]

        def copy(_: int) -> None:
            for buf, t in zip(bufs, flat, strict=True):
                buf.copy_(t, non_blocking=True)
            torch.cuda.synchronize()

        return best(copy, opts.repeats)

    path = os.path.join(opts.tmp, "state.pt")
    times = {
        "aelastic": best(lambda i: checkpoint.save(state, step=i + 1), opts.repeats),
        "torch_save": best(lambda i: torch.save(state, path), opts.repeats),
        "pinned_floor": pinned_floor(),
        "pageable_copy": best(lambda i: [t.cpu() for t in flat], opts.repeats),
    }
    os.remove(path)
    record(opts.out, event="save", bytes=nbytes, tensors=len(flat), **times)
    sys.exit(1)  # the restart loads it


if __name__ == "__main__":
    main()

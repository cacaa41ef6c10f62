"""The event loop's largest stall during a service's first ``open_job`` (issue 20).

    python benchmarks/first_job_stall.py [--repeats 5] [--backend asyncio]

Each run is a fresh interpreter that imports only ``aelastic.launcher`` (as a service
does at start-up), starts a ticker task (a 1 ms sleep in a loop, recording the longest
gap between two wake-ups), then opens one job of one no-op worker (``/bin/true``,
c10d on 127.0.0.1) and waits for it. Measured twice, side by side: as shipped (the
job's modules are imported in a worker thread first) and with that pre-import turned
off (the modules are imported on the loop, as before issue 20). torch has no
counterpart (torchrun is no library). Prints the median of the largest gaps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

RUN = r"""
import json, sys, time
import anyio
from aelastic.launcher import LaunchConfig, open_job
import aelastic.launcher._job as job_module

if sys.argv[2] == "off":
    async def on_the_loop(names=()):
        import importlib
        for name in names:
            importlib.import_module(name)
    job_module.import_off_loop = on_the_loop

async def main():
    worst = 0.0
    done = anyio.Event()

    async def ticker():
        nonlocal worst
        last = time.perf_counter()
        while not done.is_set():
            await anyio.sleep(0.001)
            now = time.perf_counter()
            worst = max(worst, now - last)
            last = now

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, run_id="stall",
                          rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0")
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await anyio.sleep(0.05)
        worst = 0.0
        async with open_job(config, "/bin/true") as job:
            await job.wait()
        done.set()
    print(json.dumps({"worst_ms": worst * 1e3}))

anyio.run(main, backend=sys.argv[1])
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backend", default="asyncio", choices=("asyncio", "trio"))
    args = parser.parse_args()
    print(f"load average {os.getloadavg()}; backend {args.backend}")
    worst: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(args.repeats):
        for mode in ("on", "off"):  # alternating: same load for both
            out = subprocess.run(
                [sys.executable, "-c", RUN, args.backend, mode],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            worst[mode].append(json.loads(out.splitlines()[-1])["worst_ms"])
    for mode, label in (("on", "imports in a thread (shipped)"), ("off", "imports on the loop")):
        values = sorted(worst[mode])
        print(
            f"  {label:32s} largest loop stall: median {statistics.median(values):6.1f} ms"
            f"  (min {values[0]:.1f}, max {values[-1]:.1f}) over {len(values)} first jobs"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

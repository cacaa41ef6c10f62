"""Event-loop stalls of an embedding service while a job with 8 workers runs and restarts.

    python benchmarks/loop_stall.py [--nproc 8] [--restarts 3] [--repeats 3]
                                    [--baseline DIR] [--modes launch,workers] [--nice N]

Each measurement runs in a fresh interpreter: one event loop (asyncio, uvloop or trio)
hosts a ticker task, which sleeps 1 ms in a loop and records how late it wakes up, next
to the job. The largest lateness is the longest the loop was blocked (a stall).

- ``launch``: the whole job through ``aelastic.launch`` (standalone c10d rendezvous, the
  workers' store, ``--max-restarts``): rank 0 of every attempt but the last exits 3
  after 0.6 s, the others wait to be stopped; the last attempt exits 0.
The wall-clock lateness counts every reason the loop thread did not run, including the
kernel giving the CPU to another process on a loaded machine; ``cpu`` is the CPU time the
loop thread itself spent within one tick (work that held the loop, whatever else ran),
which a loaded machine does not inflate much. Blocking waits that use no CPU (a vfork
waiting for its child's exec) show only in the wall-clock figure.

- ``workers``: only the worker layer the agent drives on a restart (``open_warm_pool``
  and ``open_worker_processes``), the same failing pattern, no rendezvous or store.

Before the measured job, each interpreter runs a one-worker job without restarts: what a
service pays once, on its first job (lazy imports, about 40-60 ms of CPU at the first
``launch`` on these machines), is not counted. Workers start in warm interpreters and the
pool refills 0.25 s after each start, inside
the 0.6 s window, so every refill of ``nproc`` interpreters falls into the measurement.

``--baseline DIR`` also runs each measurement with the aelastic source tree at ``DIR``
(for instance ``git archive <commit> | tar -x -C DIR``), side by side in the same run,
so a change is compared with what it replaced under the same load. A tree or a backend
that cannot run a mode is reported as such, not as a number.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

PY = sys.executable
HERE = os.path.dirname(os.path.abspath(__file__))
BACKENDS = ("asyncio", "uvloop", "trio")

WORKER = """\
import os, signal, sys, time
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", os.environ.get("BENCH_ATTEMPT", "0")))
last = int(os.environ["BENCH_RESTARTS"])
if os.environ.get("LOCAL_RANK", "0") == "0":
    time.sleep(0.6)
    sys.exit(0 if attempt >= last else 3)
if attempt >= last:
    time.sleep(0.6)
    sys.exit(0)
signal.pause()
"""

# Runs in the measured interpreter: prints one JSON line with the stalls in ms.
PROBE = """\
import json, os, sys, time
import anyio
import aelastic.launcher, aelastic.workers, aelastic.rendezvous  # imports are not the job's
from aelastic.workers import ProcessSpec, open_warm_pool, open_worker_processes
from aelastic.launcher import LaunchConfig, launch

backend, mode, nproc, restarts, worker, nice = sys.argv[1:7]
nproc, restarts = int(nproc), int(restarts)
if int(nice):
    os.nice(-int(nice))  # this process and its workers before the machine's other load
TICK = 0.001

async def ticker(lates, busy, stop):
    while not stop.is_set():
        t0, c0 = time.perf_counter(), time.thread_time()
        await anyio.sleep(TICK)
        lates.append(max(0.0, time.perf_counter() - t0 - TICK))
        busy.append(time.thread_time() - c0)

async def launch_job(nproc, restarts):
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0", max_restarts=restarts, monitor_interval=0.1,
    )
    os.environ["BENCH_RESTARTS"] = str(restarts)
    await launch(config, sys.executable, "-u", worker)

async def workers_job(nproc, restarts):
    os.environ["BENCH_RESTARTS"] = str(restarts)
    argv = [sys.executable, "-u", worker]
    async with open_warm_pool(tuple(argv[:2]), nproc) as pool:
        for attempt in range(restarts + 1):
            env = {**os.environ, "BENCH_ATTEMPT": str(attempt)}
            specs = [
                ProcessSpec(r, argv, {**env, "LOCAL_RANK": str(r)}) for r in range(nproc)
            ]
            async with open_worker_processes(specs, warm_pool=pool) as procs:
                await procs.wait_for_exit()

async def main():
    lates, busy = [], []
    stop = anyio.Event()
    job = launch_job if mode == "launch" else workers_job
    await job(1, 0)  # a first job loads what a service loads once (lazy imports, caches)
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker, lates, busy, stop)
        await anyio.sleep(0.05)
        lates.clear()  # start-up of the loop itself is not the job's doing
        busy.clear()
        await job(nproc, restarts)
        stop.set()
    lates.sort()
    print(json.dumps({
        "max_ms": lates[-1] * 1000,
        "p99_ms": lates[int(len(lates) * 0.99)] * 1000,
        "cpu_max_ms": max(busy) * 1000,
        "ticks": len(lates),
    }))

if backend == "trio":
    anyio.run(main, backend="trio")
else:
    anyio.run(main, backend_options={"use_uvloop": backend == "uvloop"})
"""


def _measure(
    tree: str | None, backend: str, mode: str, nproc: int, restarts: int, nice: int, d: str
) -> dict[str, float] | str:
    env = {**os.environ, "BENCH_RESTARTS": str(restarts), "OMP_NUM_THREADS": "1"}
    env.pop("AELASTIC_WARM_WORKERS", None)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [tree, env.get("PYTHONPATH")]))
    worker = os.path.join(d, "worker.py")
    cmd = [PY, "-c", PROBE, backend, mode, str(nproc), str(restarts), worker, str(nice)]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, timeout=300, cwd=d)
    except subprocess.TimeoutExpired:
        return "timed out"
    lines = done.stdout.decode().strip().splitlines()
    if done.returncode != 0 or not lines:
        errors = [ln.strip(" |") for ln in done.stderr.decode().splitlines() if "Error" in ln]
        return f"failed: {(errors or ['?'])[-1][:100]}"
    result: dict[str, float] = json.loads(lines[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=8)
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", default=None, help="another aelastic source tree")
    parser.add_argument("--modes", default="launch,workers")
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="raise the measured process's priority by N (root): a shared, loaded machine"
        " then preempts it less, so the figures show the job's own stalls",
    )
    opts = parser.parse_args()
    trees: dict[str, str | None] = {"this tree": None}
    if opts.baseline:
        trees["baseline"] = os.path.abspath(opts.baseline)
    modes = [m for m in opts.modes.split(",") if m]
    samples: dict[tuple[str, str, str], list[dict[str, float] | str]] = {}
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "worker.py"), "w") as f:
            f.write(WORKER)
        for i in range(opts.repeats):
            for mode in modes:
                for backend in BACKENDS:
                    for label, tree in trees.items():
                        key = (mode, backend, label)
                        got = _measure(tree, backend, mode, opts.nproc, opts.restarts, opts.nice, d)
                        samples.setdefault(key, []).append(got)
                        shown = (
                            got
                            if isinstance(got, str)
                            else f"max {got['max_ms']:.1f} ms, cpu {got['cpu_max_ms']:.1f} ms"
                        )
                        print(f"run {i + 1}/{opts.repeats} {mode:7s} {backend:7s} {label}: {shown}")
    load = os.getloadavg()[0]
    print(
        f"\nlargest loop stall, median over {opts.repeats} runs (nproc={opts.nproc},"
        f" {opts.restarts} restarts, nice -{opts.nice}, load avg {load:.1f}):"
    )
    for (mode, backend, label), runs in samples.items():
        numbers = [r for r in runs if not isinstance(r, str)]
        if not numbers:
            print(f"  {mode:7s} {backend:7s} {label:9s}: {runs[0]}")
            continue
        worst = statistics.median(r["max_ms"] for r in numbers)
        p99 = statistics.median(r["p99_ms"] for r in numbers)
        cpu = statistics.median(r["cpu_max_ms"] for r in numbers)
        print(
            f"  {mode:7s} {backend:7s} {label:9s}: max {worst:6.1f} ms   p99 {p99:5.1f} ms"
            f"   cpu max {cpu:5.1f} ms   ({len(numbers)}/{len(runs)} runs)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Worker process supervision: aelastic.workers vs torch's multiprocessing context.

Three figures, each the median of several rounds with 4 workers:

- ``start``: time to start the 4 processes (until every pid is known);
- ``fail->teardown``: from the moment one worker exits with code 1 (it writes
  ``time.time()`` just before ``os._exit``) until the supervisor has noticed it
  and stopped and reaped the 3 others. torch's agent notices by polling
  ``pcontext.wait(0)`` every ``monitor_interval`` (torchrun's default 0.1 s),
  and its ``wait`` tears the group down; aelastic awaits the exit, then ``stop()``;
- ``stop``: stopping 4 running workers (SIGTERM honoured) until all are reaped.

Each side runs in its own interpreter so torch's import does not weigh on
aelastic's fork. Run: ``python benchmarks/worker_processes.py [--rounds 10]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

N = 4
SLEEPER = "import signal\nsignal.pause()\n"
FAILER = (
    "import os, sys, time\n"
    "time.sleep(0.5)\n"
    "with open(sys.argv[1], 'w') as f: f.write(repr(time.time()))\n"
    "os._exit(1)\n"
)
MONITOR_INTERVAL = 0.1  # torchrun's --monitor-interval default


def _argv(rank: int, failing_file: str | None) -> list[str]:
    if failing_file is not None and rank == 0:
        return [sys.executable, "-c", FAILER, failing_file]
    return [sys.executable, "-c", SLEEPER]


def side_aelastic(rounds: int) -> dict[str, list[float]]:
    import anyio

    from aelastic.workers import ProcessSpec, open_worker_processes

    out: dict[str, list[float]] = {"start": [], "fail->teardown": [], "stop": []}

    async def main() -> None:
        tmp = tempfile.mkdtemp(prefix="aebench")
        env = dict(os.environ)
        for i in range(rounds):
            # start + stop
            specs = [ProcessSpec(r, _argv(r, None), env) for r in range(N)]
            t0 = time.perf_counter()
            async with open_worker_processes(specs) as w:
                out["start"].append(time.perf_counter() - t0)
                await anyio.sleep(0.5)  # let the interpreters come up
                t1 = time.perf_counter()
                await w.stop()
                out["stop"].append(time.perf_counter() - t1)
            # failure -> teardown
            marker = os.path.join(tmp, f"exit{i}")
            specs = [ProcessSpec(r, _argv(r, marker), env) for r in range(N)]
            async with open_worker_processes(specs) as w:
                await w.wait_for_exit()
                await w.stop()
                done = time.time()
            exited = float(await anyio.Path(marker).read_text())
            out["fail->teardown"].append(done - exited)

    anyio.run(main)
    return out


def side_torch(rounds: int) -> dict[str, list[float]]:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes

    out: dict[str, list[float]] = {"start": [], "fail->teardown": [], "stop": []}
    tmp = tempfile.mkdtemp(prefix="tbench")
    env = {k: v for k, v in os.environ.items()}

    def start(name: str, failing_file: str | None):  # type: ignore[no-untyped-def]
        return start_processes(
            name=name,
            entrypoint=sys.executable,
            args={r: tuple(_argv(r, failing_file)[1:]) for r in range(N)},
            envs={r: dict(env) for r in range(N)},
            logs_specs=DefaultLogsSpecs(log_dir=os.path.join(tmp, name)),
        )

    for i in range(rounds):
        t0 = time.perf_counter()
        pc = start(f"s{i}", None)
        out["start"].append(time.perf_counter() - t0)
        time.sleep(0.5)
        t1 = time.perf_counter()
        pc.close(signal.SIGTERM, timeout=30)
        out["stop"].append(time.perf_counter() - t1)

        marker = os.path.join(tmp, f"exit{i}")
        pc = start(f"f{i}", marker)
        while True:  # the agent's loop: sleep(monitor_interval), then poll
            time.sleep(MONITOR_INTERVAL)
            result = pc.wait(0)
            if result is not None:
                break
        pc.close()
        done = time.time()
        with open(marker) as f:
            out["fail->teardown"].append(done - float(f.read()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--side", choices=["aelastic", "torch"])
    ns = parser.parse_args()
    if ns.side:
        fn = side_aelastic if ns.side == "aelastic" else side_torch
        print(json.dumps(fn(ns.rounds)))
        return
    results = {}
    for side in ("aelastic", "torch"):
        done = subprocess.run(
            [sys.executable, __file__, "--side", side, "--rounds", str(ns.rounds)],
            capture_output=True,
            text=True,
            check=True,
        )
        results[side] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{N} workers, median of {ns.rounds} rounds (ms)")
    print(f"{'phase':<16}{'aelastic':>10}{'torch':>10}{'ratio':>8}")
    for phase in ("start", "fail->teardown", "stop"):
        a = statistics.median(results["aelastic"][phase]) * 1000
        t = statistics.median(results["torch"][phase]) * 1000
        print(f"{phase:<16}{a:>10.1f}{t:>10.1f}{a / t:>8.2f}")


if __name__ == "__main__":
    main()

"""Hang detection: a rank stops heartbeating; aelastic vs NVIDIA's ft_launcher (NVRx).

    python benchmarks/hang_detection.py [--repeats 5] [--nvrx] [--nvrx-venv DIR]
        [--fast-interval 0.1] [--cpu-seconds 20] [--aelastic-python PY]

Same job for every launcher, interleaved run by run so they share the machine's load
(commands and observables: ``benchmarks/_hang_runner.py``, the worker:
``benchmarks/_hang_worker.py``). Columns: ``aelastic``; with ``--nvrx`` also ``nvrx``
(ft_launcher as shipped: its rank monitors check the deadline every 5 s) and ``nvrx
(check every 0.1 s)`` (``--ft-workload-check-interval``, NVRx at its best).

Per run, from the hung rank's last heartbeat: the launcher decides the rank hung, a
healthy peer gets SIGTERM, every restarted worker is running; a heartbeat call's cost
in a worker with a live launcher; whether aelastic's ``stacks.txt`` of the hung rank
names the hung function. Then, unless ``--cpu-seconds 0``, the launcher's CPU with 8
workers heartbeating every 10 ms, over ``--cpu-seconds`` of steady state
(``/proc/<pid>/stat`` utime+stime of the launcher and of its helper processes, e.g.
NVRx's rank monitors; not of the workers).

NVRx 0.7.0 runs from its own venv (``--nvrx-venv``, default ``$NVRX_VENV`` or
``/work/nvrx-venv``), built on first use by ``benchmarks/nvrx_setup.sh`` (2-5 min).
Benchmark only: it is never a dependency of aelastic. A failed run raises with the
launcher's output tail; nothing here can hang (every wait is bounded).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _hang_runner import (
    DEFAULT_NVRX_VENV,
    Launcher,
    aelastic_launcher,
    hang_run,
    nvrx_launcher,
    open_steady,
    summary,
)

#: Bound on 8 workers starting (NVRx's import torch, under load).
STEADY_START_TIMEOUT = 240.0


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if ppid == pid:
                out.append(int(entry))
    return out


def launcher_cpu(launcher: Launcher, nproc: int, seconds: float) -> float:
    """Percent of one core used by the launcher (and its non-worker helpers) in steady state."""
    hz = os.sysconf("SC_CLK_TCK")
    with tempfile.TemporaryDirectory(prefix="hang-cpu-") as d:
        proc = open_steady(launcher, seconds + STEADY_START_TIMEOUT, d)
        try:
            deadline = time.monotonic() + STEADY_START_TIMEOUT
            while len(ready := [n for n in os.listdir(d) if n.startswith("ready_")]) < nproc:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"{launcher.name}: the {nproc} workers did not start")
                time.sleep(0.2)
            time.sleep(1.0)  # the last worker's first beats
            workers = {int(n.removeprefix("ready_")) for n in ready}
            helpers = [proc.pid] + [p for p in _children(proc.pid) if p not in workers]
            before = sum(_cpu_ticks(p) for p in helpers)
            t = time.monotonic()
            time.sleep(seconds)
            after = sum(_cpu_ticks(p) for p in helpers)
            return 100.0 * (after - before) / hz / (time.monotonic() - t)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _cell(res: dict[str, Any], key: str, unit: str) -> str:
    values = [r[key] for r in res["runs"]]
    return f"{res[key]:.3f} {unit} ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=2.0, help="heartbeat timeout, s")
    parser.add_argument("--nvrx", action="store_true", help="add the two NVRx columns")
    parser.add_argument("--nvrx-venv", type=Path, default=DEFAULT_NVRX_VENV)
    parser.add_argument("--fast-interval", type=float, default=0.1)
    parser.add_argument("--cpu-seconds", type=float, default=20.0)
    parser.add_argument("--aelastic-python", default=sys.executable)
    args = parser.parse_args()

    def launchers(nproc: int) -> list[Launcher]:
        out = [aelastic_launcher(nproc, args.timeout, python=args.aelastic_python)]
        if args.nvrx:
            for interval in (None, args.fast_interval):
                out.append(
                    nvrx_launcher(nproc, args.timeout, check_interval=interval, venv=args.nvrx_venv)
                )
        return out

    kinds = launchers(args.nproc)
    runs: dict[str, list[dict[str, float]]] = {k.name: [] for k in kinds}
    load_before = os.getloadavg()[0]
    for i in range(args.repeats):  # interleaved, so that every launcher shares the load
        for kind in kinds:
            r = hang_run(kind, args.nproc)
            runs[kind.name].append(r)
            print(f"run {i} {kind.name}: " + ", ".join(f"{k}={v:.4f}" for k, v in r.items()))
    results = [summary(kind, runs[kind.name]) for kind in kinds]
    print()
    for res in results:
        print(f"{res['launcher']}: {res['command']}")
    print(f"load average (1 min): {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    print()
    print(
        f"| from the last heartbeat (median of {args.repeats}; min-max) | "
        + " | ".join(r["launcher"] for r in results)
        + " |"
    )
    print("|---|" + "---|" * len(results))
    for key, label, unit in (
        ("detect_s", "launcher decides the rank hung", "s"),
        ("peer_stopped_s", "a healthy peer gets SIGTERM (group stopping)", "s"),
        ("recover_s", "restarted workers running (last one's first statement)", "s"),
        ("beat_us", "heartbeat call, in a worker (best of 5 batches)", "us"),
    ):
        print(f"| {label} | " + " | ".join(_cell(res, key, unit) for res in results) + " |")
    stacks = [r["stacks"] for r in runs["aelastic"]]
    print(
        "| hung ranks whose stacks name the hung function | "
        f"{sum(stacks):.0f}/{len(stacks)} |" + " no stack capture |" * (len(results) - 1)
    )
    if args.cpu_seconds > 0:
        cpu = [launcher_cpu(k, 8, args.cpu_seconds) for k in launchers(8)]
        print(
            f"| launcher CPU, 8 workers heartbeating every 10 ms ({args.cpu_seconds:g} s) | "
            + " | ".join(f"{c:.2f}% of a core" for c in cpu)
            + " |"
        )


if __name__ == "__main__":
    main()

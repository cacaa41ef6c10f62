"""A fault in one of three torchft replica groups: what it costs the others, and itself.

Three (``--groups``) replica groups of one worker each (``tests/replicas/ft_worker.py``:
torchft Manager, gloo, a 4x2 linear model, ~50 ms steps); group 1's worker exits 1 at step
``--crash-at``. Launched three ways, side by side in one run:

* ``torchrun``: torchft's documented launch, one ``torchrun`` per group
  (``--max_restarts``) and a Lighthouse started by hand with torchft's README options
  (``torchft_lighthouse --min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms 10000``);
* ``aelastic-per-group``: the same with ``python -m aelastic run --preload auto`` per group;
* ``aelastic``: one ``python -m aelastic run --replica-groups 3 --preload auto``.

Per run, from the workers' step records: the healthy groups' longest stall (largest
gap between two steps from one second before the crash on) split into the wait for
the quorum and the step; the failed group's crash -> restarted interpreter running,
crash -> back in the quorum, crash -> first step. Medians over ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "tests" / "replicas" / "ft_worker.py")
TORCHFT_README_LIGHTHOUSE = ["--min_replicas", "1", "--quorum_tick_ms", "100",
                             "--join_timeout_ms", "10000"]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(mode: str, out: Path, groups: int, steps: int, crash_at: int) -> None:
    env = {**os.environ, "FT_LOG_DIR": str(out), "FT_STEPS": str(steps),
           "FT_CRASH": f"1:{crash_at}", "PYTHONPATH": str(ROOT)}  # fmt: skip
    logs = open(out / "launch.log", "w")  # noqa: SIM115 - closed below
    if mode == "aelastic":
        argv = [sys.executable, "-m", "aelastic", "run", "--replica-groups", str(groups),
                "--max-restarts", "2", "--preload", "auto", WORKER]  # fmt: skip
        subprocess.run(argv, env=env, stdout=logs, stderr=logs, check=True, timeout=300)
        logs.close()
        return
    port = free_port()
    binary = shutil.which("torchft_lighthouse") or str(
        Path(sys.executable).with_name("torchft_lighthouse")
    )
    lighthouse = subprocess.Popen(
        [binary, "--bind", f"127.0.0.1:{port}", *TORCHFT_README_LIGHTHOUSE],
        stdout=logs, stderr=logs,
    )  # fmt: skip
    procs = []
    try:
        for group in range(groups):
            genv = {**env, "REPLICA_GROUP_ID": str(group), "NUM_REPLICA_GROUPS": str(groups),
                    "TORCHFT_LIGHTHOUSE": f"http://127.0.0.1:{port}"}  # fmt: skip
            if mode == "torchrun":
                argv = [sys.executable, "-m", "torch.distributed.run",
                        f"--master_port={free_port()}", "--nnodes=1", "--nproc_per_node=1",
                        "--max_restarts=2", WORKER]  # fmt: skip
            else:
                argv = [sys.executable, "-m", "aelastic", "run", "--standalone", "--max-restarts",
                        "2", "--preload", "auto", WORKER]  # fmt: skip
            procs.append(subprocess.Popen(argv, env=genv, stdout=logs, stderr=logs))
        for p in procs:
            if p.wait(timeout=300) != 0:
                raise RuntimeError(f"{mode}: a group failed, see {out / 'launch.log'}")
    finally:
        for p in procs:
            p.kill()
        lighthouse.kill()
        lighthouse.wait()
        logs.close()


def measure(out: Path, groups: int) -> dict[str, float]:
    records = {g: [json.loads(x) for x in (out / f"steps-rg{g}.jsonl").read_text().splitlines()]
               for g in range(groups)}  # fmt: skip
    crash = next(r["t"] for r in records[1] if r.get("crash"))
    stall = (0.0, 0.0, 0.0)
    for group in (g for g in range(groups) if g != 1):
        steps = [r for r in records[group] if "participants" in r and r["t"] >= crash - 1]
        for a, b in itertools.pairwise(steps):
            if b["t"] - a["t"] > stall[0]:
                stall = (b["t"] - a["t"], b["q"] - a["t"], b["t"] - b["q"])
    normal = statistics.median(
        b["t"] - a["t"]
        for a, b in itertools.pairwise(records[0])
        if "participants" in a and "participants" in b
    )
    again = [r for r in records[1] if r.get("attempt", 0) >= 1]
    start = next(r["t"] for r in again if r.get("start"))
    back = next(r["t"] for r in again if r.get("quorum"))
    first = next(r["t"] for r in again if "participants" in r)
    return {
        "step": normal,
        "stall": stall[0],
        "stall_quorum": stall[1],
        "stall_step": stall[2],
        "crash_to_start": start - crash,
        "crash_to_quorum": back - crash,
        "crash_to_step": first - crash,
    }


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--groups", type=int, default=3, help="replica groups (>= 2)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--crash-at", type=int, default=15)
    parser.add_argument("--modes", default="torchrun,aelastic-per-group,aelastic")
    parser.add_argument("--keep", default="", help="keep each run's records under this dir")
    args = parser.parse_args()
    modes = args.modes.split(",")
    print(f"load average before: {loadavg()}")
    results: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for i in range(args.repeat):
        for mode in modes:  # interleaved: the machine's load falls on every mode alike
            with tempfile.TemporaryDirectory(prefix=f"rg-{mode}-") as d:
                if args.keep:
                    d = os.path.join(args.keep, f"{mode}-{i}")
                    os.makedirs(d)
                t0 = time.time()
                run(mode, Path(d), args.groups, args.steps, args.crash_at)
                m = measure(Path(d), args.groups)
                results[mode].append(m)
                shown = " ".join(f"{k}={v * 1000:.0f}ms" for k, v in m.items())
                print(
                    f"run {i} {mode:<19} {shown} (whole run {time.time() - t0:.1f} s)", flush=True
                )
    print(f"load average after: {loadavg()}")
    print("\nmedians (ms):")
    keys: list[str] = list(next(iter(results.values()))[0])
    print(f"| mode | {' | '.join(keys)} |")
    print(f"|---|{'---|' * len(keys)}")
    for mode, runs in results.items():
        cells: list[Any] = [f"{statistics.median(r[k] for r in runs) * 1000:.0f}" for k in keys]
        print(f"| {mode} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()

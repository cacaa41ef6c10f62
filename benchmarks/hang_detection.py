"""Hang detection: a rank stops heartbeating; aelastic vs NVIDIA's ft_launcher (NVRx).

    python benchmarks/hang_detection.py [--repeats 5] [--nvrx PATH[:PATH]] [--cpu-seconds 10]

Same job for both launchers, interleaved run by run so they share the machine's load::

    python -m aelastic run --standalone --nproc-per-node 2 --max-restarts 1 \\
        --heartbeat-timeout 2 --initial-heartbeat-timeout 60 worker.py
    ft_launcher --standalone --nproc-per-node 2 --max-restarts 1 \\
        --ft-rank-heartbeat-timeout 2 --ft-initial-rank-heartbeat-timeout 60 worker.py

The worker writes its start time first thing, heartbeats every 50 ms
(``aelastic.progress.heartbeat()`` / ``RankMonitorClient.send_heartbeat()``), and on
the first attempt rank 1 writes the time of its last heartbeat and then waits forever
in ``hung_in_allreduce()``. Restarted workers exit 0 (rank 0 first times 5 batches
of 20 000 heartbeats for aelastic, of 400 for NVRx, and keeps the best batch: the
per-call cost with a live agent).

Measured per run: last heartbeat -> detection (aelastic: the ``aelastic.progress.hang``
event's ``detected_at``; NVRx: its rank monitor's "Did not get subsequent heartbeat"
log line, millisecond resolution), last heartbeat -> every restarted worker running,
and whether ``attempt_0/1/stacks.txt`` names ``hung_in_allreduce`` (aelastic).
Then the agent's CPU with 8 workers heartbeating every 10 ms, over ``--cpu-seconds``
of steady state (``/proc/<pid>/stat`` utime+stime of the launcher and of its helper
processes, not of the workers).

NVRx 0.7.0 ships a cp312-only wheel; ``--nvrx`` takes a PYTHONPATH where it was
unpacked (``pip download nvidia-resiliency-ext==0.7.0 --no-deps --python-version 3.12
--only-binary=:all: --platform manylinux_2_39_x86_64``, unzip, drop
``nvrx_cupti_module*.so``, ``pip install --target`` its other dependencies). Benchmark
only: it is never a dependency of aelastic.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime

PY = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKER = """\
import os, sys, threading, time
t0 = time.time()
d, kind = os.environ["BENCH_DIR"], os.environ["BENCH_KIND"]
rank = int(os.environ["LOCAL_RANK"])
restarted = os.path.exists(os.path.join(d, "hung"))
with open(os.path.join(d, f"start_{int(restarted)}_{rank}"), "w") as f:
    f.write(repr(t0))
with open(os.path.join(d, f"pid_{os.getpid()}"), "w") as f:
    f.write("")
if kind == "nvrx":
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
    client = RankMonitorClient()
    client.init_workload_monitoring()
    beat = client.send_heartbeat
else:
    from aelastic.progress import heartbeat as beat
steady = float(os.environ.get("BENCH_STEADY", "0"))
if steady:
    end = time.time() + steady
    while time.time() < end:
        beat()
        time.sleep(0.01)
    sys.exit(0)
if restarted:
    if rank == 0:
        n = 400 if kind == "nvrx" else 20000
        costs = []
        for _ in range(5):  # best batch of 5: the machine is shared
            t = time.perf_counter()
            for _ in range(n):
                beat()
            costs.append((time.perf_counter() - t) / n)
        cost = min(costs)
        with open(os.path.join(d, "beat_cost"), "w") as f:
            f.write(repr(cost))
    sys.exit(0)

def hung_in_allreduce():
    threading.Event().wait()

for _ in range(10):
    beat()
    time.sleep(0.05)
if rank == 1:
    beat()
    last = time.time()
    with open(os.path.join(d, "hung"), "w") as f:
        f.write(repr(last))
    hung_in_allreduce()
while True:
    beat()
    time.sleep(0.05)
"""

NVRX_LAUNCH = (
    "import sys; from nvidia_resiliency_ext.fault_tolerance.launcher import main;"
    " sys.argv[0] = 'ft_launcher'; sys.exit(main())"
)


def _read(path: str) -> float:
    with open(path) as f:
        return float(f.read())


def _cmd(kind: str, nproc: int, log_dir: str, extra: list[str]) -> list[str]:
    if kind == "aelastic":
        return [
            PY, "-m", "aelastic", "run", "--standalone", "--nproc-per-node", str(nproc),
            "--max-restarts", "1", "--heartbeat-timeout", "2",
            "--initial-heartbeat-timeout", "60", "--log-dir", log_dir,
            "--event-log-handler", "file", *extra,
        ]  # fmt: skip
    if kind == "nvrx-0.1":  # its rank monitors check every 0.1 s instead of every 5 s
        extra = ["--ft-workload-check-interval", "0.1", *extra]
    return [
        PY, "-c", NVRX_LAUNCH, "--standalone", "--nproc-per-node", str(nproc),
        "--max-restarts", "1", "--ft-rank-heartbeat-timeout", "2",
        "--ft-initial-rank-heartbeat-timeout", "60", *extra,
    ]  # fmt: skip


def _env(kind: str, d: str, nvrx_path: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AELASTIC_", "PET_"))}
    nvrx = kind.startswith("nvrx")
    env.update(
        BENCH_DIR=d,
        BENCH_KIND="nvrx" if nvrx else kind,
        AELASTIC_EVENTS_FILE=os.path.join(d, "events.jsonl"),
    )
    paths = [ROOT] + ([nvrx_path] if nvrx and nvrx_path else [])
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    return env


def _nvrx_detected(log: str) -> float:
    for line in log.splitlines():
        if "Did not get subsequent heartbeat" in line:
            stamp = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})", line)
            if stamp:
                return datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    raise RuntimeError("NVRx logged no missed heartbeat:\n" + log[-3000:])


def _aelastic_detected(d: str) -> float:
    with open(os.path.join(d, "events.jsonl")) as f:
        for line in f:
            event = json.loads(line)
            if event["name"] == "aelastic.progress.hang":
                return float(event["metadata"]["detected_at"])
    raise RuntimeError("no aelastic.progress.hang event")


def one_hang(kind: str, nvrx_path: str | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        logs = os.path.join(d, "logs")
        proc = subprocess.run(
            [*_cmd(kind, 2, logs, []), script],
            env=_env(kind, d, nvrx_path),
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{kind} exited {proc.returncode}: {proc.stderr[-3000:]}")
        last = _read(os.path.join(d, "hung"))
        if kind == "aelastic":
            detected = _aelastic_detected(d)
        else:
            detected = _nvrx_detected(proc.stderr + proc.stdout)
        running = max(_read(os.path.join(d, f"start_1_{r}")) for r in (0, 1))
        out = {
            "detect_s": detected - last,
            "recover_s": running - last,
            "beat_us": _read(os.path.join(d, "beat_cost")) * 1e6,
        }
        if kind == "aelastic":
            stacks = [
                os.path.join(root, "stacks.txt")
                for root, _dirs, files in os.walk(logs)
                if root.endswith(os.path.join("attempt_0", "1")) and "stacks.txt" in files
            ]
            found = False
            if stacks:
                with open(stacks[0]) as f:
                    found = "hung_in_allreduce" in f.read()
            out["stacks"] = 1.0 if found else 0.0
        return out


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


def agent_cpu(kind: str, nvrx_path: str | None, seconds: float) -> float:
    """Percent of one core used by the launcher (and its non-worker helpers) in steady state."""
    hz = os.sysconf("SC_CLK_TCK")
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        env = {**_env(kind, d, nvrx_path), "BENCH_STEADY": str(seconds + 60)}
        proc = subprocess.Popen(
            [*_cmd(kind, 8, os.path.join(d, "logs"), []), script],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            deadline = time.time() + 240
            while sum(1 for n in os.listdir(d) if n.startswith("start_0_")) < 8:
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"{kind}: the 8 workers did not start")
                time.sleep(0.2)
            time.sleep(5.0)  # let every worker finish importing and reach its loop
            workers = {int(n[4:]) for n in os.listdir(d) if n.startswith("pid_")}
            helpers = [proc.pid] + [p for p in _children(proc.pid) if p not in workers]
            before = sum(_cpu_ticks(p) for p in helpers)
            t = time.time()
            time.sleep(seconds)
            after = sum(_cpu_ticks(p) for p in helpers)
            return 100.0 * (after - before) / hz / (time.time() - t)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--nvrx", default=None, help="PYTHONPATH holding nvidia_resiliency_ext")
    parser.add_argument("--cpu-seconds", type=float, default=20.0)
    args = parser.parse_args()
    kinds = ["aelastic"] + (["nvrx", "nvrx-0.1"] if args.nvrx else [])
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    for i in range(args.repeats):
        for kind in kinds:
            r = one_hang(kind, args.nvrx)
            runs[kind].append(r)
            print(f"run {i} {kind}: " + ", ".join(f"{k}={v:.4f}" for k, v in r.items()))
    print()
    print("| measurement (median; min-max) | " + " | ".join(kinds) + " |")
    print("|---|" + "---|" * len(kinds))
    for key, label, unit, scale in (
        ("detect_s", "last heartbeat -> hang detected", "s", 1.0),
        ("recover_s", "last heartbeat -> restarted workers running", "s", 1.0),
        ("beat_us", "heartbeat call, in a worker", "us", 1.0),
    ):
        cells = []
        for kind in kinds:
            values = [r[key] * scale for r in runs[kind]]
            cells.append(
                f"{statistics.median(values):.3f} {unit} ({min(values):.3f}-{max(values):.3f})"
            )
        print(f"| {label} | " + " | ".join(cells) + " |")
    stacks = [r["stacks"] for r in runs["aelastic"]]
    share = 100 * sum(stacks) / len(stacks)
    print(f"| hung ranks whose stacks name the hung function | {share:.0f}% |")
    cpu = {kind: agent_cpu(kind, args.nvrx, args.cpu_seconds) for kind in kinds}
    # The rank monitors of NVRx are the launcher's children: counted as its helpers.
    print(
        "| launcher CPU, 8 workers heartbeating every 10 ms | "
        + " | ".join(f"{cpu[k]:.2f}% of a core" for k in kinds)
        + " |"
    )


if __name__ == "__main__":
    main()

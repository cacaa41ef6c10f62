"""Worker output through the agent: aelastic vs torchrun with ``--tee 3``, fast and stalled console.

    python benchmarks/output_throughput.py [--mb 4] [--repeats 2] [--stall-timeout 60]

Both launchers run the same job: ``--standalone --nproc-per-node 9 --tee 3 --log-dir TMP``;
local ranks 0-7 print ``--mb`` MB of 100-byte lines each as fast as they can (64 KB writes),
local rank 8 prints nothing and probes the agent's workers' store (``TCPStore.add``
every 5 ms) until the printers are done: its worst round trip bounds how long the agent's
event loop was held (torchrun's store is a C++ thread, so there it only shows the machine).

Measured per launcher:

* fast console: the launcher's stdout is a pipe drained by a thread here. Wall time,
  MB/s forwarded to the console, the agent process's own CPU (``/proc/<pid>/stat``
  utime+stime read at exit before reaping, so workers are not counted) per MB, minus a
  run where the workers print nothing.
* stalled console: the same, with the launcher's stdout a pipe nobody reads. Whether the
  launcher exits (and when), whether the log files are complete.
* SIGTERM under a stalled console: the workers print, then wait; once all printed,
  SIGTERM the launcher and time its exit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

PRINTERS = 8
WORKER = r"""
import json, os, signal, sys, time
mb, marks, mode = float(sys.argv[1]), sys.argv[2], sys.argv[3]
rank = int(os.environ["LOCAL_RANK"])
if rank == 8:
    from datetime import timedelta
    from torch.distributed import TCPStore
    store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                     is_master=False, timeout=timedelta(seconds=60), wait_for_workers=False)
    store.add("probe", 1)
    with open(os.path.join(marks, "ready"), "w") as f:
        f.write(repr(time.time()))
    times = []
    while len([f for f in os.listdir(marks) if f.startswith("done-")]) < 8:
        t = time.perf_counter()
        store.add("probe", 1)
        times.append(time.perf_counter() - t)
        time.sleep(0.005)
    with open(os.path.join(marks, "probe.json"), "w") as f:
        f.write(json.dumps({"max": max(times or [0]), "n": len(times)}))
    if mode == "hold":
        signal.pause()
    sys.exit(0)
while not os.path.exists(os.path.join(marks, "ready")):
    time.sleep(0.005)
block = (b"y" * 99 + b"\n") * 655
out = sys.stdout.buffer
for _ in range(int(mb * 1e6 // len(block))):
    out.write(block)
out.flush()
with open(os.path.join(marks, f"done-{rank}"), "w") as f:
    f.write(repr(time.time()))
if mode == "hold":
    signal.pause()
"""

LAUNCHERS: dict[str, list[str]] = {
    "aelastic": [sys.executable, "-m", "aelastic", "run"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
}


@dataclass
class Run:
    wall: float | None  # None: did not exit in time
    cpu: float | None  # the agent process's own CPU seconds
    console_bytes: int
    log_bytes: int
    expected_log_bytes: int
    probe_max: float | None
    rc: int | None
    printing: float | None  # s from the printers' start until the last one finished
    forwarding: float | None  # s from the printers' start until the last console byte
    sigterm_exit: float | None = None


def _self_cpu_at_exit(pid: int, timeout: float) -> float | None:
    """Wait (without reaping) for ``pid`` to exit; its own utime+stime in seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        if info is not None:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        time.sleep(0.01)
    return None


def run_once(launcher: str, mb: float, stalled: bool, mode: str, timeout: float) -> Run:
    tmp = tempfile.mkdtemp(prefix="outbench_")
    marks, logs = os.path.join(tmp, "marks"), os.path.join(tmp, "logs")
    os.makedirs(marks)
    script = os.path.join(tmp, "worker.py")
    with open(script, "w") as f:
        f.write(WORKER)
    r, w = os.pipe()
    got = [0]
    last = [0.0]

    def drain() -> None:
        while True:
            data = os.read(r, 1 << 16)
            if not data:
                return
            got[0] += len(data)
            last[0] = time.time()

    reader = None if stalled else threading.Thread(target=drain, daemon=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    argv = [*LAUNCHERS[launcher], "--standalone", "--nproc-per-node", str(PRINTERS + 1)]
    argv += ["--tee", "3", "--log-dir", logs, script, str(mb), marks, mode]
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=w, stderr=subprocess.DEVNULL, env=env)
    os.close(w)
    if reader is not None:
        reader.start()
    sigterm_exit = None
    if mode == "hold":
        deadline = time.monotonic() + timeout
        while not os.path.exists(os.path.join(marks, "probe.json")):
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        cpu = _self_cpu_at_exit(proc.pid, timeout)
        if cpu is not None:
            sigterm_exit = time.monotonic() - sent
    else:
        cpu = _self_cpu_at_exit(proc.pid, timeout)
    wall = time.monotonic() - start if cpu is not None else None
    if cpu is None:
        proc.kill()
    rc = proc.wait()
    if reader is not None:
        reader.join(10)
    os.close(r)
    log_bytes = 0
    for root, _, files in os.walk(logs):
        log_bytes += sum(os.path.getsize(os.path.join(root, n)) for n in files if n == "stdout.log")
    probe = printing = forwarding = None
    try:
        with open(os.path.join(marks, "probe.json")) as f:
            probe = float(json.load(f)["max"])
        with open(os.path.join(marks, "ready")) as f:
            ready = float(f.read())
        done = []
        for rank in range(PRINTERS):
            with open(os.path.join(marks, f"done-{rank}")) as f:
                done.append(float(f.read()))
        printing = max(done) - ready
        forwarding = last[0] - ready if last[0] else None
    except (OSError, ValueError):
        pass
    shutil.rmtree(tmp, ignore_errors=True)
    return Run(
        wall,
        cpu,
        got[0],
        log_bytes,
        PRINTERS * int(mb * 1e6 // 65500) * 65500,
        probe,
        rc if wall is not None else None,
        printing,
        forwarding,
        sigterm_exit,
    )


def _med(values: list[float | None]) -> float | None:
    good = [v for v in values if v is not None]
    return statistics.median(good) if len(good) == len(values) and good else None


def _fmt(value: float | None, unit: str = "", digits: int = 2) -> str:
    return "did not exit" if value is None else f"{value:.{digits}f}{unit}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=4.0, help="MB printed by each of 8 workers")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--stall-timeout", type=float, default=60.0)
    args = parser.parse_args()
    rows: dict[str, dict[str, object]] = {}
    for name in LAUNCHERS:
        base, fast, stall = [], [], []
        for _ in range(args.repeats):
            base.append(run_once(name, 0, False, "exit", 120))
            fast.append(run_once(name, args.mb, False, "exit", 300))
        stall.append(run_once(name, args.mb, True, "exit", args.stall_timeout))
        term = run_once(name, args.mb, True, "hold", args.stall_timeout)
        total_mb = fast[0].expected_log_bytes / 1e6
        cpu_fast = _med([r.cpu for r in fast])
        cpu_base = _med([r.cpu for r in base])
        console_mb = statistics.median(r.console_bytes for r in fast) / 1e6
        fwd = _med([r.forwarding for r in fast])
        rows[name] = {
            "MB printed by the 8 workers": f"{total_mb:.1f}",
            "fast console: s until the workers printed everything": _fmt(
                _med([r.printing for r in fast]), "", 2
            ),
            "fast console: s until the last byte reached the console": _fmt(fwd, "", 2),
            "fast console: MB/s forwarded to the console": (
                f"{console_mb / fwd:.1f}" if fwd else "-"
            ),
            "fast console: agent CPU ms per MB (net of a no-output run)": (
                f"{1000 * (cpu_fast - cpu_base) / total_mb:.1f}"
                if cpu_fast is not None and cpu_base is not None
                else "-"
            ),
            "fast console: agent CPU s, whole run (no-output run)": (
                f"{_fmt(cpu_fast)} ({_fmt(cpu_base)})"
            ),
            "fast console: worst store round trip during the flood, ms": _fmt(
                _med([None if r.probe_max is None else 1000 * r.probe_max for r in fast]), "", 1
            ),
            "fast console: log files complete": str(
                all(r.log_bytes == r.expected_log_bytes for r in fast)
            ),
            "stalled console: s until the workers printed everything": _fmt(
                stall[0].printing, "", 2
            ),
            "stalled console: launcher exit code (s from start)": (
                f"{stall[0].rc} ({_fmt(stall[0].wall)})" if stall[0].wall else "did not exit"
            ),
            "stalled console: log files complete": str(
                stall[0].log_bytes == stall[0].expected_log_bytes
            ),
            "stalled console: SIGTERM -> launcher exit, s": _fmt(term.sigterm_exit, "", 3),
        }
        print(name, json.dumps(rows[name], indent=1), flush=True)
    print()
    print("| measurement | aelastic | torchrun |")
    print("|---|---|---|")
    for key in rows["aelastic"]:
        print(f"| {key} | {rows['aelastic'][key]} | {rows['torchrun'][key]} |")


if __name__ == "__main__":
    main()

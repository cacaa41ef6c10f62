"""Straggler detection (``aelastic.stragglers``): delay, false reports, cost, exclusion.

    python benchmarks/stragglers.py [--only delay,false,cost,exclude,hook] [--false-seconds 120]
                                    [--signal busy|work]

Every job is 2 ``aelastic run`` agents x 2 gloo DDP workers on this machine
(``tests/stragglers/ddp_worker.py``: deterministic matrix work per step, made
``--factor`` times larger on the slow node's ranks from ``--onset``); the slow node is
node ``b``. Windows: the defaults unless said (``--straggler-window 10
--straggler-min-duration 20``), warm-up shortened to 20 s so runs stay short.

* delay: seconds and steps from the onset (the slow rank's step ``onset`` printed) to the
  ``straggler:`` line, for 10%, 25%, 50% more work on one rank;
* false: ``straggler:`` lines of an even job run next to a CPU hog for ``--false-seconds``;
* cost: the agent's read of one worker's busy time (``busy_seconds``), per call; the worker
  itself runs nothing for the signal;
* hook: the worker's cost of ``time_work`` (the DDP hook that times own work, GPU jobs'
  signal) per iteration, against DDP's built-in all-reduce and torch's Python
  ``allreduce_hook`` in the same process (``benchmarks/_hook_cost_worker.py``);
* ``--signal work``: the delay runs' extra work is a wait that costs no CPU (as a rank
  waits for its GPU), 50 ms per step, measured through ``time_work``;
* exclude: rank 0's steps/s before the onset, while slow, and after the spare replaced the
  excluded node, against the same job left running with its straggler (``report``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "tests" / "stragglers" / "ddp_worker.py")
FAST = "keep_alive_interval=0.2,heartbeat_timeout=1,last_call_timeout=0.5,join_timeout=60"
STEP = re.compile(r"STEP rank=(\d+) group=(\d+) step=(\d+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Agent:
    """One ``aelastic run``; its stdout/stderr lines with their ``time.monotonic()``."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        full = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "aelastic", "run", *argv],
            env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
        self.out: list[tuple[float, str]] = []
        self.err: list[tuple[float, str]] = []
        for stream, sink in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=self._pump, args=(stream, sink), daemon=True).start()

    @staticmethod
    def _pump(stream: object, sink: list[tuple[float, str]]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            sink.append((time.monotonic(), line.rstrip("\n")))

    def steps(self) -> list[tuple[float, int, int, int]]:
        """(time, global rank, group rank, step) of every STEP line."""
        out = []
        for t, line in list(self.out):
            m = STEP.search(line)
            if m:
                out.append((t, int(m.group(1)), int(m.group(2)), int(m.group(3))))
        return out

    def first_err(self, needle: str) -> float | None:
        return next((t for t, line in list(self.err) if needle in line), None)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def job(
    run: str, port: int, stop: Path, name: str, slow: str, flags: list[str], worker: list[str]
) -> Agent:
    """One agent of the 2-node job ``run``; ``slow``: its slow local ranks (``0,1``)."""
    argv = [
        "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run,
        "--rdzv-conf", f"{FAST},is_host={int(name == 'a')}", "--local-addr", "127.0.0.1",
        "--max-restarts", "3", "--straggler-warmup", "20", *flags,
        WORKER, "--stop-file", str(stop), "--work", "100", *worker,
    ]  # fmt: skip
    env = {"AELASTIC_NODE_ID": name, "STRAGGLER_TEST_SLOW": slow, "OMP_NUM_THREADS": "1"}
    return Agent(argv, env)


def wait_for(predicate: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def finish(stop: Path, agents: list[Agent]) -> None:
    stop.touch()
    wait_for(lambda: all(a.proc.poll() is not None for a in agents), 30)
    for agent in agents:
        agent.stop()


def rate(agent: Agent, t0: float, t1: float) -> float | None:
    """Steps per second of the lowest global rank ``agent`` printed, between t0 and t1."""
    steps = agent.steps()
    if not steps:
        return None
    low = min(r for _, r, _, _ in steps)
    inside = [(t, s) for t, r, _, s in steps if r == low and t0 <= t <= t1]
    if len(inside) < 2 or inside[-1][0] == inside[0][0]:
        return None
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def onset_time(agent: Agent, rank: int, onset: int, seconds: float) -> float | None:
    def seen() -> bool:
        return any(r == rank and s >= onset for _, r, _, s in agent.steps())

    if not wait_for(seen, seconds):
        return None
    return min(t for t, r, _, s in agent.steps() if r == rank and s >= onset)


#: ``--signal work``: each step waits 50 ms (``factor`` x on the slow rank), no CPU work
WAIT_WORK = ["--work", "0", "--wait-work", "0.05", "--time-work"]


def delay(
    factor: float, threshold: float, tmp: Path, onset: int = 200, signal: str = "busy"
) -> str:
    port, stop = free_port(), tmp / f"stop-delay-{factor}-{threshold}-{signal}"
    run = f"delay{int(factor * 100)}{int(threshold * 100)}{signal}"
    flags = ["--straggler-threshold", str(threshold)]
    worker = ["--onset", str(onset), "--factor", str(factor)]
    if signal == "work":
        worker += WAIT_WORK
    a = job(run, port, stop, "a", "", flags, worker)
    b = job(run, port, stop, "b", "1", flags, worker)
    what = f"{factor:.2f}x work on rank 3, threshold {threshold:g}, signal {signal}"
    try:
        t_onset = onset_time(b, 3, onset, 300)
        if t_onset is None:
            return f"{what}: onset never reached"
        wait_for(lambda: b.first_err("straggler:") is not None, 120)
        seen = b.first_err("straggler:")
        if seen is None:
            return f"{what}: not reported within 120 s of the onset"
        step = max(s for t, r, _, s in b.steps() if r == 3 and t <= seen)
        line = next(line for _, line in b.err if "straggler:" in line)
        score = re.search(r"global ranks ([\d,]+) scores ([\d.,]+)", line)
        named = f"ranks {score.group(1)} score {score.group(2)}" if score else line
        before = rate(b, t_onset - 20, t_onset)
        return (
            f"{what}: reported {seen - t_onset:.1f} s, {step - onset} steps after the onset"
            f" ({named}; {before or 0:.2f} steps/s before the onset)"
        )
    finally:
        finish(stop, [a, b])


def false_reports(tmp: Path, seconds: float) -> str:
    port, stop = free_port(), tmp / "stop-false"
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    a = job("false", port, stop, "a", "", [], [])
    b = job("false", port, stop, "b", "", [], [])
    try:
        started = onset_time(a, 0, 0, 300)
        if started is None:
            return "even job: never stepped"
        time.sleep(seconds)
        lines = [line for agent in (a, b) for _, line in agent.err if "straggler:" in line]
        steps = max(s for _, _, _, s in a.steps())
        return (
            f"even job + 1 CPU hog, {seconds:.0f} s of steps ({steps} steps, the first 20 s"
            f" warm-up): {len(lines)} straggler report(s)" + (f": {lines}" if lines else "")
        )
    finally:
        hog.kill()
        hog.wait()
        finish(stop, [a, b])


def cost(tmp: Path) -> str:
    from aelastic.stragglers._signal import busy_seconds

    code = "import torch, time\ntorch.set_num_threads(4)\nprint('up', flush=True)\ntime.sleep(600)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "up\n"
        threads = len(os.listdir(f"/proc/{child.pid}/task"))
        n = 2000
        t0 = time.perf_counter()
        for _ in range(n):
            busy_seconds(child.pid)
        per = (time.perf_counter() - t0) / n
    finally:
        child.kill()
        child.wait()
    return (
        f"busy_seconds() of a torch process with {threads} threads: {per * 1e6:.0f} us per call"
        f" in the agent, once per rank per sample (1 s with the default window); in the"
        f" worker: 0 (nothing runs there). Per 50 ms step of a rank: {per / 20 * 1e6:.1f} us"
        f" of the agent's time, {per / 20 / 0.05 * 100:.3f}% of the step"
    )


def hook_cost() -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "_hook_cost_worker.py")],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    found = json.loads(done.stdout.splitlines()[-1])
    median = found["median_s"]
    mine = median["time_work"] - median["python_hook"]
    total = median["time_work"] - median["none"]
    return (
        f"time_work per iteration ({found['buckets']} buckets, 1 process, gloo): medians"
        f" {median['none'] * 1e3:.3f} ms (built-in all-reduce) / {median['python_hook'] * 1e3:.3f}"
        f" ms (torch's allreduce_hook) / {median['time_work'] * 1e3:.3f} ms (time_work); the"
        f" timer's own cost {mine * 1e6:.0f} us ({mine / 0.05 * 100:.2f}% of a 50 ms step),"
        f" with the Python hook in place of the built-in {total * 1e6:.0f} us"
        f" ({total / 0.05 * 100:.2f}%);"
        f" work fraction {found['work_fraction']:.3f} over {found['timed_seconds']:.1f} s timed"
    )


def exclusion(tmp: Path, action: str, onset: int = 200, factor: float = 1.5) -> str:
    port, stop = free_port(), tmp / f"stop-{action}"
    run = f"ex{action}"
    flags = ["--straggler-action", action, "--straggler-timeout", "10"]
    flags += ["--exclude-node-cooldown", "600"]
    worker = ["--onset", str(onset), "--factor", str(factor)]
    a = job(run, port, stop, "a", "", flags, worker)
    b = job(run, port, stop, "b", "0,1", flags, worker)
    agents = [a, b]
    try:
        t_onset = onset_time(a, 0, onset, 300)
        if t_onset is None:
            return f"{action}: onset never reached"
        spare = job(run, port, stop, "spare", "", flags, worker)
        agents.append(spare)
        if action == "exclude":
            if not wait_for(lambda: b.first_err("excluding this node") is not None, 180):
                return "exclude: the slow node was never excluded"
            excluded = b.first_err("excluding this node") or 0.0
            back = onset_time(spare, 2, 0, 180)
            if back is None:
                return "exclude: the spare never stepped"
            time.sleep(30)
            after = rate(a, back + 5, time.monotonic())
            return (
                f"exclude: before {rate(a, t_onset - 20, t_onset) or 0:.2f} steps/s, while slow"
                f" {rate(a, t_onset + 3, excluded) or 0:.2f}, excluded {excluded - t_onset:.0f} s"
                f" after the onset, spare stepping {back - excluded:.0f} s later, after"
                f" {after or 0:.2f} steps/s"
            )
        time.sleep(60)
        return (
            f"left running (report): before {rate(a, t_onset - 20, t_onset) or 0:.2f} steps/s,"
            f" with the straggler {rate(a, t_onset + 3, time.monotonic()) or 0:.2f} steps/s"
        )
    finally:
        finish(stop, agents)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument(
        "--only", default="cost,hook,delay,false,exclude", help="report: left running only"
    )
    p.add_argument("--signal", choices=("busy", "work"), default="busy", help="delay runs' signal")
    p.add_argument("--false-seconds", type=float, default=120.0)
    p.add_argument(
        "--delays",
        default="1.1:0.75,1.1:0.9,1.25:0.75,1.5:0.75",
        help="factor:threshold pairs of the delay runs",
    )
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="stragglers-"))
    parts = args.only.split(",")
    print(f"load before: {Path('/proc/loadavg').read_text().strip()}", flush=True)
    if "cost" in parts:
        print(cost(tmp), flush=True)
    if "hook" in parts:
        print(hook_cost(), flush=True)
    if "delay" in parts:
        for pair in args.delays.split(","):
            factor, threshold = (float(x) for x in pair.split(":"))
            print(delay(factor, threshold, tmp, signal=args.signal), flush=True)
    if "false" in parts:
        print(false_reports(tmp, args.false_seconds), flush=True)
    if "exclude" in parts:
        print(exclusion(tmp, "exclude"), flush=True)
    if "exclude" in parts or "report" in parts:
        print(exclusion(tmp, "report"), flush=True)
    print(f"load after: {Path('/proc/loadavg').read_text().strip()}", flush=True)


if __name__ == "__main__":
    main()

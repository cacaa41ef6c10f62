"""The first start with ``--preload``: the launch to the first training step, 2-worker gloo DDP.

    python benchmarks/first_start_preload.py [--repeats 3] [--preload torch]

The job is ``tests/agent/scripts/preload_job.py`` without a crash (``--steps 1``), run
with ``python -m aelastic run --standalone --nproc-per-node 2 --preload <MODULES>``
and without ``--preload``, interleaved. Measured: the wall clock from the launcher's
start to the later of the two ranks' first completed step, and whether the first
workers found torch imported at their first line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time

from _job_process import start_job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "tests", "agent", "scripts", "preload_job.py")


def run_once(preload: str) -> tuple[float | None, list[bool]]:
    with tempfile.TemporaryDirectory(prefix="first_start_") as d:
        out = os.path.join(d, "out.jsonl")
        argv = [sys.executable, "-m", "aelastic", "run", "--standalone", "--nproc-per-node", "2"]
        argv += ["--preload", preload] if preload else []
        argv += [JOB, "--out", out, "--checkpoint", os.path.join(d, "c"), "--steps", "1"]
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
        start = time.time()
        proc = start_job(argv, env, os.path.join(d, "stderr.log"))
        try:
            proc.wait(120)
        except Exception:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        with open(out) as f:
            events = [json.loads(line) for line in f if line.endswith("\n")]
    steps = [float(e["t"]) for e in events if e["event"] == "step"]
    tops = [("torch" in e["preloaded"]) for e in events if e["event"] == "top"]
    return (max(steps) - start if len(steps) == 2 else None), tops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--preload", default="torch")
    opts = parser.parse_args()
    results: dict[str, list[float]] = {opts.preload: [], "": []}
    for i in range(opts.repeats):
        for preload in results:
            seconds, tops = run_once(preload)
            print(f"run {i} preload={preload or '-'}: {seconds} s, torch preloaded {tops}")
            if seconds is not None:
                results[preload].append(seconds)
    print(f"load average: {os.getloadavg()}")
    for preload, secs in results.items():
        if secs:
            print(f"--preload {preload or '-':8} median {statistics.median(secs):.3f} s {secs}")


if __name__ == "__main__":
    main()

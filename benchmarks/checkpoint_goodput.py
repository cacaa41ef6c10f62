"""What checkpointing every step costs: the goodput job with and without saves, no faults.

    python benchmarks/checkpoint_goodput.py [--duration 20] [--pairs 2] [--compute-seconds 0.1]

Runs ``benchmarks/_goodput_worker.py`` (2-rank gloo DDP, 16 MiB of model and optimizer
state per rank, ``--compute-seconds`` of sleep standing for the accelerator's compute)
under ``python -m aelastic run`` with no fault, alternately:

* ``every-step``: ``aelastic.checkpoint.save`` of the whole state every step;
* ``none``: the same job that never saves (``--every`` larger than any step count).

Prints the steps each run completed in ``--duration`` seconds and the cost of the saves:
``1 - steps(every-step) / steps(none)`` over the sums of all pairs (the runs of a pair
are back to back, so they share the machine's load).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

PY = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "benchmarks", "_goodput_worker.py")
RUN = [PY, "-m", "aelastic", "run", "--standalone", "--nproc-per-node", "2"]
NEVER = str(1 << 40)


def _done(out: str) -> int:
    try:
        with open(out) as f:
            return sum('"step"' in line for line in f)
    except FileNotFoundError:
        return 0


def steps(every: str, opts: argparse.Namespace) -> int:
    """Steps the job completed between ``t0`` (launch + ``--warmup``) and ``t0 +
    --duration`` by this process's clock, saving every ``every`` steps (the steps
    before ``t0`` fall in the launch's warm-up, whose length varies with the load)."""
    with tempfile.TemporaryDirectory(prefix="ckpt_goodput_") as d:
        out = os.path.join(d, "out.jsonl")
        t0 = time.time() + opts.warmup
        job = [JOB, "--out", out, "--t0", repr(t0)]
        job += ["--duration", str(opts.duration), "--fault-every", "1e9"]
        job += ["--compute-seconds", str(opts.compute_seconds)]
        job += ["--checkpoint", "memory", "--every", every]
        proc = subprocess.Popen([*RUN, *job])
        time.sleep(max(0.0, t0 - time.time()))  # a benchmark's clock, not a synchronization
        first = _done(out)
        time.sleep(max(0.0, t0 + opts.duration - time.time()))
        last = _done(out)
        assert proc.wait(timeout=300) == 0
    if first == 0:
        raise SystemExit(f"the job had not started its steps {opts.warmup} s after launch")
    return last - first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--compute-seconds", type=float, default=0.1)
    parser.add_argument(
        "--warmup", type=float, default=30.0, help="seconds for the launch before t0"
    )
    opts = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
    runs: dict[str, list[int]] = {"every-step": [], "none": []}
    for i in range(opts.pairs):
        order = ("every-step", "none") if i % 2 == 0 else ("none", "every-step")
        for name in order:
            runs[name].append(steps("1" if name == "every-step" else NEVER, opts))
            print(f"  {name}: {runs[name][-1]} steps in {opts.duration:.0f} s", flush=True)
    cost = 1 - sum(runs["every-step"]) / sum(runs["none"])
    print(
        f"every-step saves cost {cost * 100:.1f}% of step throughput"
        f" ({sum(runs['every-step'])} vs {sum(runs['none'])} steps over {opts.pairs} pairs)"
    )
    print(f"load average {os.getloadavg()[0]:.2f}")
    print(json.dumps({**runs, "cost": cost}))


if __name__ == "__main__":
    main()

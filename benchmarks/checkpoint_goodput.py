"""What checkpointing every step costs: the goodput job with and without saves, no faults.

    python benchmarks/checkpoint_goodput.py [--duration 20] [--pairs 2] [--compute-seconds 0.1]

Runs ``benchmarks/_goodput_worker.py`` (2-rank gloo DDP, 16 MiB of model and optimizer
state per rank, ``--compute-seconds`` of sleep standing for the accelerator's compute)
under ``python -m aelastic run`` with no fault, alternately:

* ``every-step``: ``aelastic.checkpoint.save`` of the whole state every step;
* ``none``: the same job that never saves (``--every`` larger than any step count).

Prints the steps each run completed in ``--duration`` seconds and the cost of the saves:
``1 - steps(every-step) / steps(none)`` over the sums of all pairs (the runs of a pair
are back to back, so they share the machine's load); and, measured inside each
every-step run, the share of its steps' time that rank 0 spent inside
``checkpoint.save`` (the same cost, attributed step by step: no second run's load in it).
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


def _records(out: str) -> list[dict[str, float]]:
    """Rank 0's step records so far (a line being written is left for later)."""
    try:
        with open(out) as f:
            lines = f.read().split("\n")[:-1]
    except FileNotFoundError:
        return []
    return [r for r in map(json.loads, lines) if r.get("e") == "step"]


def steps(every: str, opts: argparse.Namespace) -> tuple[int, float]:
    """Steps the job completed between ``t0`` (launch + ``--warmup``) and ``t0 +
    --duration`` by this process's clock, saving every ``every`` steps (the steps
    before ``t0`` fall in the launch's warm-up, whose length varies with the load), and
    the share of those steps' time rank 0 spent inside ``checkpoint.save``."""
    with tempfile.TemporaryDirectory(prefix="ckpt_goodput_") as d:
        out = os.path.join(d, "out.jsonl")
        t0 = time.time() + opts.warmup
        job = [JOB, "--out", out, "--t0", repr(t0)]
        job += ["--duration", str(opts.duration), "--fault-every", "1e9"]
        job += ["--compute-seconds", str(opts.compute_seconds)]
        job += ["--checkpoint", "memory", "--every", every]
        proc = subprocess.Popen([*RUN, *job])
        time.sleep(max(0.0, t0 - time.time()))  # a benchmark's clock, not a synchronization
        first = len(_records(out))
        time.sleep(max(0.0, t0 + opts.duration - time.time()))
        window = _records(out)[first:]
        assert proc.wait(timeout=300) == 0
    if first == 0:
        raise SystemExit(f"the job had not started its steps {opts.warmup} s after launch")
    spent = sum(r["d"] for r in window)
    return len(window), sum(r.get("c", 0.0) for r in window) / spent if spent else 0.0


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
    shares: list[float] = []
    for i in range(opts.pairs):
        order = ("every-step", "none") if i % 2 == 0 else ("none", "every-step")
        for name in order:
            done, share = steps("1" if name == "every-step" else NEVER, opts)
            runs[name].append(done)
            if name == "every-step":
                shares.append(share)
            print(
                f"  {name}: {done} steps in {opts.duration:.0f} s"
                f" ({share * 100:.2f}% of their time inside checkpoint.save)",
                flush=True,
            )
    cost = 1 - sum(runs["every-step"]) / sum(runs["none"])
    print(
        f"every-step saves cost {cost * 100:.1f}% of step throughput"
        f" ({sum(runs['every-step'])} vs {sum(runs['none'])} steps over {opts.pairs} pairs);"
        f" inside the every-step runs, save took {min(shares) * 100:.2f}-"
        f"{max(shares) * 100:.2f}% of the steps' time"
    )
    print(f"load average {os.getloadavg()[0]:.2f}")
    print(json.dumps({**runs, "cost": cost, "save_share": shares}))


if __name__ == "__main__":
    main()

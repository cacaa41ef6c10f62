"""Steps lost and seconds from a preemption signal to the restarted job's next step:
aelastic (memory checkpoint every step, persisted to ``--checkpoint-dir`` on the signal)
against torchrun (``torch.save`` every ``--every`` steps, resumed from that file).

    python benchmarks/preemption.py --repeats 3

Both jobs are standalone (2 workers, gloo on CPU; each step 20 ms of sleep plus a small
model) and receive the same signal (SIGTERM, what Slurm sends at a requeue or a
preemption) to the launcher once rank 0 reports step ``--at`` (varied per repeat, so the
signal falls at different points of torchrun's checkpoint interval); the same command is
then started again, as a requeued job would be. "lost" = the newest step completed before
the stop minus the step the restarted job resumed from; "seconds" = from the signal to the
restarted job's first completed step. The launchers alternate in one run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
WORKER = str(HERE / "_preempt_worker.py")


def _steps(progress: Path) -> tuple[list[int], list[tuple[int, float]]]:
    """(the start lines' steps, [(step, time)] of completed steps), in file order."""
    starts, steps = [], []
    if progress.exists():
        for line in progress.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == "start":
                starts.append(int(parts[1]))
            elif len(parts) == 2:
                steps.append((int(parts[0]), float(parts[1])))
    return starts, steps


def _wait(what: str, done, seconds: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} did not happen within {seconds} s")
        time.sleep(0.01)


def once(launcher: str, at: int, every: int, root: Path) -> tuple[int, float, int]:
    """One preemption and restart; returns (steps lost, seconds, the first job's exit)."""
    progress = root / "progress"
    if launcher == "aelastic":
        head = [sys.executable, "-m", "aelastic", "run", "--checkpoint-dir", str(root / "ckpt")]
        extra = ["--mode", "aelastic"]
    else:
        head = [sys.executable, "-m", "torch.distributed.run"]
        extra = ["--mode", "torch", "--file", str(root / "ckpt.pt"), "--every", str(every)]
    argv = [*head, "--standalone", "--nproc-per-node", "2", WORKER, "--progress", str(progress)]
    argv += extra
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LOGLEVEL": "ERROR"}
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": env}
    first = subprocess.Popen(argv, **quiet)  # type: ignore[call-overload]
    _wait("step --at", lambda: any(s >= at for s, _ in _steps(progress)[1]), 300)
    sent = time.time()
    first.send_signal(signal.SIGTERM)
    code = first.wait(timeout=120)
    reached = max(s for s, _ in _steps(progress)[1])
    count = len(_steps(progress)[1])
    second = subprocess.Popen(argv, **quiet)  # type: ignore[call-overload]
    try:
        _wait("the restarted job's step", lambda: len(_steps(progress)[1]) > count, 300)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=120)
    starts, steps = _steps(progress)
    return reached - starts[-1], steps[count][1] - sent, code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--every", type=int, default=50)
    opts = parser.parse_args()
    results: dict[str, list[tuple[int, float, int]]] = {"aelastic": [], "torchrun": []}
    for i in range(opts.repeats):
        at = 2 * opts.every + (17 + 13 * i) % opts.every  # a different point of the interval
        for launcher in ("aelastic", "torchrun") if i % 2 == 0 else ("torchrun", "aelastic"):
            root = Path(tempfile.mkdtemp(prefix="aelastic_preempt_bench_"))
            try:
                lost, seconds, code = once(launcher, at, opts.every, root)
            finally:
                shutil.rmtree(root, ignore_errors=True)
            results[launcher].append((lost, seconds, code))
            print(f"{launcher:9s} at={at:4d} lost={lost:3d} steps  {seconds:6.2f} s  exit {code}")
    for launcher, rows in results.items():
        lost = [r[0] for r in rows]
        secs = [r[1] for r in rows]
        print(
            f"{launcher:9s} steps lost median {statistics.median(lost)} (max {max(lost)}), "
            f"signal to next step median {statistics.median(secs):.2f} s "
            f"(min {min(secs):.2f}, max {max(secs):.2f}); exits {sorted({r[2] for r in rows})}"
        )


if __name__ == "__main__":
    main()

"""Goodput with a fault every F seconds: checkpoint every step in memory vs every 50 on disk.

    python benchmarks/goodput.py [--duration 60] [--fault-every 30] [--compute-seconds 0.08]
                                 [--disk-every 50] [--only NAME ...]

A 2-worker gloo DDP job (``_goodput_worker.py``: an MLP of 8 MiB, 16 MiB of state with
SGD's momentum; each step the real forward/backward/all-reduce plus
``--compute-seconds`` of sleep standing for the accelerator) runs for ``--duration``
seconds of wall time from the launch; the worker of rank 1 exits with ``os._exit(1)``
every ``--fault-every`` seconds (fixed wall times from the launch, whatever the restarts
cost). Launchers, one after the other (all ``--standalone --nproc-per-node 2
--max-restarts 100``)::

    aelastic-memory  python -m aelastic run --preload auto ...   aelastic.checkpoint.save
                                                                  every step
    torchrun-disk    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 python -m torch.distributed.run
                     ...   torch.save (rank 0, local file) every --disk-every steps
    aelastic-disk    python -m aelastic run --preload auto ...   the same disk checkpoint
                     (separates the launcher's share from the checkpoint's)

Reported per launcher: the final step (training progress kept at the end of the wall
time: every step after the last rollback), the steps run in all (lost = run - final),
the faults, and the goodput: final step x ``--compute-seconds`` / wall time (the share of
the wall time the accelerator spent on steps that were kept). Ratios are to
torchrun-disk.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from _job_process import start_job

PY = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "benchmarks", "_goodput_worker.py")
COMMON = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "100"]
AELASTIC = [PY, "-m", "aelastic", "run", *COMMON, "--preload", "auto"]
TORCHRUN = [PY, "-m", "torch.distributed.run", *COMMON]
LAUNCHERS = ("aelastic-memory", "torchrun-disk", "aelastic-disk")


def run_once(name: str, opts: argparse.Namespace) -> dict[str, object]:
    argv = TORCHRUN if name.startswith("torchrun") else AELASTIC
    memory = name.endswith("memory")
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    env.pop("OMP_NUM_THREADS", None)
    with tempfile.TemporaryDirectory(prefix="goodput_") as d:
        out = os.path.join(d, "out.jsonl")
        t0 = time.time()
        job = [JOB, "--out", out, "--t0", repr(t0), "--duration", str(opts.duration)]
        job += ["--fault-every", str(opts.fault_every)]
        job += ["--compute-seconds", str(opts.compute_seconds)]
        job += ["--checkpoint", "memory", "--every", "1"] if memory else []
        job += [] if memory else ["--checkpoint", "disk", "--every", str(opts.disk_every)]
        job += [] if memory else ["--path", os.path.join(d, "ckpt.pt")]
        err_path = os.path.join(d, "stderr.log")
        proc = start_job([*argv, *job], env, err_path)
        try:
            code = proc.wait(timeout=opts.duration + 120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its workers
            code = proc.wait()
        wall = time.time() - t0
        with open(out) as f:
            events = [json.loads(line) for line in f if line.endswith("\n")]
        with open(err_path, "rb") as f:
            err = f.read().decode(errors="replace").strip().splitlines()
    final = [e for e in events if e["e"] == "final"]
    starts = [e for e in events if e["e"] == "start"]
    result: dict[str, object] = {
        "code": code,
        "wall": wall,
        "run": sum(e["e"] == "step" for e in events),
        "restarts": len(starts),
        "resumed_from": [e["from"] for e in starts],
    }
    if final and code == 0:
        result["final"] = int(final[0]["step"])
        result["goodput"] = result["final"] * opts.compute_seconds / opts.duration
    else:
        result["error"] = err[-3:]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0, help="wall seconds per run")
    parser.add_argument("--fault-every", type=float, default=30.0)
    parser.add_argument("--compute-seconds", type=float, default=0.08)
    parser.add_argument("--disk-every", type=int, default=50)
    parser.add_argument("--only", nargs="*", default=list(LAUNCHERS), choices=LAUNCHERS)
    opts = parser.parse_args()
    print(f"load average at the start: {os.getloadavg()}", flush=True)
    results = {}
    for name in opts.only:
        results[name] = run_once(name, opts)
        print(f"{name}: {results[name]}", flush=True)
    print(f"load average at the end: {os.getloadavg()}")
    head = f"{'final step':>10} {'run':>6} {'lost':>6} {'faults':>6} {'goodput':>8}"
    print(f"\n{'launcher':16} {head}")
    base = results.get("torchrun-disk", {}).get("final")
    for name, r in results.items():
        if "final" not in r:
            print(f"{name:16} failed: {r}")
            continue
        final, run = int(r["final"]), int(r["run"])  # type: ignore[call-overload]
        ratio = f"  {final / base:.2f}x torchrun-disk" if base else ""
        print(
            f"{name:16} {final:10} {run:6} {run - final:6} {r['restarts']:>6}"
            f" {float(r['goodput']):8.1%}{ratio}"  # type: ignore[arg-type]
        )


if __name__ == "__main__":
    main()

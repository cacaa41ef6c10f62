"""Goodput per fault: crash to the first training step after the restart, 2-worker gloo DDP.

    python benchmarks/restart_to_step.py [--repeats 3] [--step-seconds 0.2] [--spin]
                                         [--crash-at 25] [--lightning] [--only NAME ...]

The job (``tests/agent/scripts/preload_job.py``): an MLP trained with AdamW, rank 0
``torch.save``s model and optimizer every 10 steps, rank 1 leaves by ``os._exit(1)``
just before step 25 on the first attempt; the group restarts, loads the checkpoint
of step 20 and trains to step 40. ``--crash-at 4 --step-seconds 0.25`` is the early
crash (1 s of steps after the first): the restart then starts from step 0, while the
idle interpreters are still importing what the first workers imported. Each step
stands for ``--step-seconds`` of compute: sleep (a GPU job's CPU is mostly idle), or
with ``--spin`` a busy loop on the CPU (the idle interpreters' low-priority preload
then competes with the workers). Measured: the wall clock from the crash record to
the later of the two ranks' first completed step of attempt 1 (one host, one clock). Launchers, run
interleaved so they share the machine's load (all with ``--standalone
--nproc-per-node 2 --max-restarts 1``)::

    aelastic-preload   python -m aelastic run ... --preload auto
    aelastic           python -m aelastic run ...
    torchrun-noshare   TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 python -m torch.distributed.run ...
    torchrun           python -m torch.distributed.run ...

``--lightning`` runs the same job as a Lightning ``Trainer`` (``_lightning_job.py``;
needs ``pip install lightning``, which leaves torch as it is).

Also: whether each restarted worker found torch already imported, and the resident
memory of aelastic's idle warm interpreters after the restart (``/proc``: the
launcher's ``_warm_boot.py`` descendants that are not workers, sampled every 0.5 s
from attempt 1's first step to the end; the largest sample, per interpreter).
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

from _device.common import descendants
from _job_process import start_job

PY = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "tests", "agent", "scripts", "preload_job.py")
LIGHTNING_JOB = os.path.join(ROOT, "benchmarks", "_lightning_job.py")
COMMON = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1"]
LAUNCHERS: dict[str, tuple[list[str], dict[str, str]]] = {
    "aelastic-preload": ([PY, "-m", "aelastic", "run", *COMMON, "--preload", "auto"], {}),
    "aelastic": ([PY, "-m", "aelastic", "run", *COMMON], {}),
    "torchrun-noshare": (
        [PY, "-m", "torch.distributed.run", *COMMON],
        {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
    ),
    "torchrun": ([PY, "-m", "torch.distributed.run", *COMMON], {}),
}


def _events(path: str) -> list[dict[str, object]]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]
    except FileNotFoundError:
        return []


def _idle_rss_mib(launcher_pid: int, workers: set[int]) -> list[float]:
    """RSS of the launcher's idle warm interpreters (workers keep the bootstrap's cmdline)."""
    sizes = []
    page = os.sysconf("SC_PAGE_SIZE")
    for pid in descendants(launcher_pid):
        if pid in workers:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"_warm_boot.py" not in f.read():
                    continue
            with open(f"/proc/{pid}/statm") as f:
                sizes.append(int(f.read().split()[1]) * page / 2**20)
        except (OSError, ValueError, IndexError):
            continue
    return sizes


def run_once(
    name: str, script: str, step_seconds: float, spin: bool, hang_after: float, crash_at: int = 25
) -> dict[str, object]:
    argv, extra_env = LAUNCHERS[name]
    with tempfile.TemporaryDirectory(prefix="restart_to_step_") as d:
        out = os.path.join(d, "out.jsonl")
        job = [script, "--out", out, "--checkpoint", os.path.join(d, "ckpt")]
        job += ["--steps", "40", "--checkpoint-every", "10", "--crash-at", str(crash_at)]
        job += ["--step-seconds", str(step_seconds)] + (["--spin"] if spin else [])
        env = {**os.environ, **extra_env}
        env.pop("OMP_NUM_THREADS", None)
        t0 = time.monotonic()
        err_path = os.path.join(d, "stderr.log")
        proc = start_job([*argv, *job], env, err_path)
        rss: list[float] = []
        next_sample = 0.0
        crashed_at = None
        hung = False
        while proc.poll() is None and time.monotonic() - t0 < 300:
            events = _events(out)
            steps = [e for e in events if e["event"] == "step" and e["attempt"] == 1]
            if crashed_at is None and any(e["event"] == "crash" for e in events):
                crashed_at = time.monotonic()
            if crashed_at is not None and not steps and time.monotonic() - crashed_at > hang_after:
                hung = True  # torchrun's restart without a training step (#135712)
                break
            if len(steps) == 2 and time.monotonic() >= next_sample:
                workers = {int(e["pid"]) for e in events if e["event"] == "top"}  # type: ignore[call-overload]
                sample = _idle_rss_mib(proc.pid, workers)
                if sum(sample) > sum(rss):
                    rss = sample
                next_sample = time.monotonic() + 0.5
            time.sleep(0.05)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its workers
        proc.wait()
        with open(err_path, "rb") as f:
            err = f.read().decode(errors="replace")
        events = _events(out)
    crash = [float(e["t"]) for e in events if e["event"] == "crash"]  # type: ignore[arg-type]
    firsts = [float(e["t"]) for e in events if e["event"] == "step" and e["attempt"] == 1]  # type: ignore[arg-type]
    tops = [e for e in events if e["event"] == "top" and e["attempt"] == 1]
    finished = any(e["event"] == "final" for e in events) and proc.returncode == 0
    result: dict[str, object] = {"ok": finished, "code": proc.returncode, "rss": rss}
    if hung:
        result["hung"] = f"no training step {hang_after:.0f} s after the crash; killed"
    if crash and len(firsts) == 2:
        result["seconds"] = max(firsts) - crash[0]
    result["torch_preloaded"] = [("torch" in e["preloaded"]) for e in tops]  # type: ignore[operator]
    if not finished:
        result["error"] = err.strip().splitlines()[-1:] if err.strip() else []
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--step-seconds", type=float, default=0.2)
    parser.add_argument("--spin", action="store_true", help="steps busy the CPU (not sleep)")
    parser.add_argument(
        "--lightning", action="store_true", help="the same job as a Lightning Trainer"
    )
    parser.add_argument("--hang-after", type=float, default=30.0, help="seconds; then killed")
    parser.add_argument("--crash-at", type=int, default=25, help="step; 4: the early crash")
    parser.add_argument("--only", nargs="*", default=list(LAUNCHERS), choices=list(LAUNCHERS))
    opts = parser.parse_args()
    results: dict[str, list[dict[str, object]]] = {n: [] for n in opts.only}
    for i in range(opts.repeats):
        for name in opts.only:
            script = LIGHTNING_JOB if opts.lightning else JOB
            r = run_once(name, script, opts.step_seconds, opts.spin, opts.hang_after, opts.crash_at)
            results[name].append(r)
            print(f"run {i} {name}: {r}", flush=True)
    print(f"\nload average: {os.getloadavg()}")
    print(f"{'launcher':18} {'ok':>5} {'median s':>9} {'min s':>7} {'max s':>7}  idle RSS/worker")
    medians: dict[str, float] = {}
    for name, runs in results.items():
        secs = [float(r["seconds"]) for r in runs if r.get("ok") and "seconds" in r]  # type: ignore[arg-type]
        rss = [x for r in runs for x in r["rss"]]  # type: ignore[attr-defined]
        ok = f"{sum(bool(r['ok']) for r in runs)}/{len(runs)}"
        rss_text = f"{statistics.median(rss):.0f} MiB" if rss else "-"
        if secs:
            medians[name] = statistics.median(secs)
            print(
                f"{name:18} {ok:>5} {medians[name]:9.3f} {min(secs):7.3f} {max(secs):7.3f}"
                f"  {rss_text}"
            )
        else:
            print(f"{name:18} {ok:>5} {'-':>9} {'-':>7} {'-':>7}  {rss_text}")
    base = medians.get("torchrun-noshare")
    if base:
        for name, value in medians.items():
            print(f"ratio {name} / torchrun-noshare: {value / base:.3f}x")


if __name__ == "__main__":
    main()

"""Agent footprint: the launcher process's peak RSS for the same small job, aelastic vs torchrun.

    python benchmarks/agent_footprint.py [--repeats 5] [--nproc 2]

Same job for both, run alternately::

    python -m aelastic run          --standalone --nproc-per-node 2 worker.py
    python -m torch.distributed.run --standalone --nproc-per-node 2 worker.py

The torch-free worker sleeps 1 s and exits 0, so the agent reaches its steady state
(rendezvous done, workers watched) before the job ends. The launcher's peak RSS is
``VmHWM`` from ``/proc/<pid>/status``, sampled every 20 ms while it runs (the
high-water mark only grows, so the last sample is the peak of the launcher process
alone, workers excluded). ``ru_maxrss`` from ``wait4`` (the launcher or its largest
waited-for descendant) is printed as a cross-check. Prints medians and the ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

PY = sys.executable
WORKER = "import time\ntime.sleep(1.0)\n"


def _vm_hwm_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def _measure(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(VmHWM MiB of the launcher process, ru_maxrss MiB from wait4) of one run."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    while True:
        sample = _vm_hwm_kib(proc.pid)
        if sample is not None:
            peak = max(peak, sample)
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        time.sleep(0.02)
    assert proc.stderr is not None
    err = proc.stderr.read()
    proc.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code
    if code != 0:
        raise RuntimeError(f"{cmd} exited {code}: {err.decode()[-2000:]}")
    return peak / 1024, usage.ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2)
    opts = parser.parse_args()
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as d:
        worker = os.path.join(d, "worker.py")
        with open(worker, "w") as f:
            f.write(WORKER)
        flags = ["--standalone", "--nproc-per-node", str(opts.nproc)]
        launchers = {
            "aelastic": [PY, "-m", "aelastic", "run", *flags, worker],
            "torchrun": [PY, "-m", "torch.distributed.run", *flags, worker],
        }
        hwm: dict[str, list[float]] = {k: [] for k in launchers}
        maxrss: dict[str, list[float]] = {k: [] for k in launchers}
        for i in range(opts.repeats):
            for name, cmd in launchers.items():
                a, b = _measure(cmd, env)
                hwm[name].append(a)
                maxrss[name].append(b)
            print(
                f"run {i + 1}/{opts.repeats}: "
                + ", ".join(f"{k} VmHWM {v[-1]:.1f} MiB" for k, v in hwm.items()),
                flush=True,
            )
    med = {k: statistics.median(v) for k, v in hwm.items()}
    print(f"\nmedian of {opts.repeats} (nproc={opts.nproc}):")
    for name in launchers:
        print(
            f"  {name:9s} launcher peak RSS (VmHWM): {med[name]:6.1f} MiB"
            f"   ru_maxrss: {statistics.median(maxrss[name]):6.1f} MiB"
        )
    print(f"  ratio aelastic/torchrun: {med['aelastic'] / med['torchrun']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

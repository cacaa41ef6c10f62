"""Last call after a restart: a worker's failure to the next round's workers running,
aelastic vs torchrun, on a ``--nnodes 2:3`` job with two nodes (issue 40 item 5).

    python benchmarks/last_call.py [--repeats 1]

Two agents on one host, c10d over 127.0.0.1, the same flags for both launchers and
torch's default ``last_call_timeout`` (30 s)::

    <launcher> --nnodes 2:3 --nproc-per-node 1 --rdzv-backend c10d
               --rdzv-endpoint 127.0.0.1:PORT --rdzv-id ID --rdzv-conf is_host=1|0
               --max-restarts 1 --monitor-interval 0.1 _last_call_worker.py OUT

The torch-free worker appends its start time to ``OUT/<node>.log``. Node b's first
worker fails at once (exit 1); node a's waits to be stopped; every second worker exits
0. Latency = the later of the two second starts minus b's first start (one clock, one
host). The first round waits the whole last call under both launchers (a third node
could still come); that wait is not measured. Runs alternate between the launchers;
prints each run, the medians and their ratio.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "_last_call_worker.py")
LAUNCHERS = {
    "aelastic": [sys.executable, "-m", "aelastic", "run"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _starts(out: Path, node: str) -> list[float]:
    path = out / f"{node}.log"
    return [float(v) for v in path.read_text().split()] if path.exists() else []


def one_run(name: str, run_id: str) -> float:
    """Seconds from b's worker failing to both second workers running (one job)."""
    with tempfile.TemporaryDirectory(prefix="aelastic-lastcall-") as tmp:
        out = Path(tmp)
        common = [
            *LAUNCHERS[name], "--nnodes", "2:3", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_port()}",
            "--rdzv-id", run_id, "--max-restarts", "1", "--monitor-interval", "0.1",
        ]  # fmt: skip
        env = {**os.environ, "LOGLEVEL": "WARNING"}
        procs = []
        for node, host in (("a", 1), ("b", 0)):
            cmd = [*common, "--rdzv-conf", f"is_host={host}", WORKER, str(out), node]
            log = open(out / f"{node}.agent", "wb")  # noqa: SIM115 - closed below
            procs.append((subprocess.Popen(cmd, stdout=log, stderr=log, env=env), log))
        try:
            for proc, _ in procs:
                rc = proc.wait(timeout=300)
                if rc != 0:
                    agent = (out / "a.agent").read_text() + (out / "b.agent").read_text()
                    raise SystemExit(f"{name}: an agent exited {rc}:\n{agent[-3000:]}")
        finally:
            for proc, log in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                log.close()
        a, b = _starts(out, "a"), _starts(out, "b")
        if len(a) != 2 or len(b) != 2:
            raise SystemExit(f"{name}: expected two starts per node, got a={a} b={b}")
        return max(a[1], b[1]) - b[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    opts = parser.parse_args()
    got: dict[str, list[float]] = {n: [] for n in LAUNCHERS}
    for i in range(opts.repeats):
        for name in LAUNCHERS:
            t0 = time.monotonic()
            latency = one_run(name, f"lastcall{i}{name[0]}")
            got[name].append(latency)
            print(
                f"run {i + 1} {name:9s}: failure -> next round's workers {latency:6.2f} s "
                f"(job {time.monotonic() - t0:.0f} s, load avg {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    med = {n: statistics.median(v) for n, v in got.items()}
    print(f"\nmedian of {opts.repeats} (load avg {os.getloadavg()[0]:.1f}):")
    for n, v in med.items():
        print(f"  {n:9s} {v:6.2f} s")
    print(f"  ratio aelastic/torchrun: {med['aelastic'] / med['torchrun']:.3f}")


if __name__ == "__main__":
    main()

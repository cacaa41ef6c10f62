"""Restart latency: a worker's failure to all restarted local workers running, aelastic vs torchrun.

    python benchmarks/restart_latency.py [--repeats 7] [--nproc 2] [--status-load]
                                         [--baseline DIR]

Same job for both launchers, interleaved run by run so they share the machine's load::

    python -m aelastic run              --standalone --nproc-per-node 2 --max-restarts 1 worker.py
    python -m torch.distributed.run     --standalone --nproc-per-node 2 --max-restarts 1 worker.py

The torch-free worker writes its start time first thing. On attempt 0
(``TORCHELASTIC_RESTART_COUNT=0``) rank 0 waits 0.5 s, writes the failure time and
exits 3 while the other ranks sleep; attempt 1 exits 0 at once. Latency = the latest
start time of attempt 1's workers minus the failure time (the same clock, one host).

Also measured: the **floor**, the time from spawning ``nproc`` Python interpreters
directly to their first statement. Every launcher pays it on a restart, so
``latency - floor`` is the launcher's own share. Prints medians and ratios.

``--status-load`` adds ``aelastic+status``: the same job with ``--health-port`` while a
client thread requests ``/status`` back to back for the whole run (the job handle's
state stream and the endpoint under load, on the restart path). ``--baseline DIR``
adds ``aelastic@base``: another aelastic source tree (e.g. ``git archive main``
unpacked in DIR), run with DIR as its working directory.
"""

from __future__ import annotations

import argparse
import glob
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

PY = sys.executable

WORKER = """\
import os, sys, time
t = time.time()
d = os.environ["BENCH_DIR"]
rc, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
with open(os.path.join(d, f"start_{rc}_{rank}"), "w") as f:
    f.write(repr(t))
if rc == "0":
    if rank == "0":
        time.sleep(0.5)
        with open(os.path.join(d, "fail"), "w") as f:
            f.write(repr(time.time()))
        sys.exit(3)
    time.sleep(600)
"""

FLOOR = """\
import os, time
t = time.time()
with open(os.path.join(os.environ["BENCH_DIR"], "floor_" + os.environ["RANK"]), "w") as f:
    f.write(repr(t))
"""


def _read(path: str) -> float:
    with open(path) as f:
        return float(f.read())


def _clear(d: str) -> None:
    for p in glob.glob(os.path.join(d, "*_*")) + glob.glob(os.path.join(d, "fail")):
        os.unlink(p)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _StatusLoad:
    """A thread requesting ``/status`` on ``port`` back to back until stopped."""

    def __init__(self, port: int) -> None:
        self.port, self.answered = port, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        url = f"http://127.0.0.1:{self.port}/status"
        while not self._stop.is_set():
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    r.read()
                self.answered += 1
            except OSError:  # not listening yet, or already gone
                self._stop.wait(0.001)

    def __enter__(self) -> _StatusLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _restart_ms(
    cmd: list[str], d: str, nproc: int, env: dict[str, str], cwd: str | None = None
) -> float:
    _clear(d)
    proc = subprocess.run(
        cmd, env={**env, "BENCH_DIR": d}, cwd=cwd, capture_output=True, timeout=120
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} exited {proc.returncode}: {proc.stderr.decode()[-2000:]}")
    starts = [_read(os.path.join(d, f"start_1_{r}")) for r in range(nproc)]
    return (max(starts) - _read(os.path.join(d, "fail"))) * 1000.0


def _floor_ms(script: str, d: str, nproc: int, env: dict[str, str]) -> float:
    _clear(d)
    t0 = time.time()
    procs = [
        subprocess.Popen([PY, "-u", script], env={**env, "BENCH_DIR": d, "RANK": str(r)})
        for r in range(nproc)
    ]
    for p in procs:
        p.wait()
    return (max(_read(os.path.join(d, f"floor_{r}")) for r in range(nproc)) - t0) * 1000.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--status-load", action="store_true")
    parser.add_argument("--baseline", help="another aelastic source tree to time alongside")
    opts = parser.parse_args()
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # both launchers would warn and set it
    with tempfile.TemporaryDirectory() as d:
        worker = os.path.join(d, "worker.py")
        floor_script = os.path.join(d, "floor.py")
        with open(worker, "w") as f:
            f.write(WORKER)
        with open(floor_script, "w") as f:
            f.write(FLOOR)
        flags = ["--standalone", "--nproc-per-node", str(opts.nproc), "--max-restarts", "1"]
        launchers = {
            "aelastic": [PY, "-m", "aelastic", "run", *flags, worker],
            "torchrun": [PY, "-m", "torch.distributed.run", *flags, worker],
        }
        if opts.baseline:
            launchers["aelastic@base"] = launchers["aelastic"]
        port = _free_port()
        if opts.status_load:
            launchers["aelastic+status"] = [
                *launchers["aelastic"][:4],
                "--health-port",
                str(port),
                *launchers["aelastic"][4:],
            ]
        cwds = {"aelastic@base": opts.baseline}
        answered = 0
        samples: dict[str, list[float]] = {name: [] for name in [*launchers, "floor"]}
        for i in range(opts.repeats):
            for name, cmd in launchers.items():
                if name == "aelastic+status":
                    with _StatusLoad(port) as load:
                        samples[name].append(_restart_ms(cmd, d, opts.nproc, env))
                    answered += load.answered
                else:
                    samples[name].append(_restart_ms(cmd, d, opts.nproc, env, cwds.get(name)))
            samples["floor"].append(_floor_ms(floor_script, d, opts.nproc, env))
            print(
                f"run {i + 1}/{opts.repeats}: "
                + ", ".join(f"{k} {v[-1]:.1f} ms" for k, v in samples.items()),
                flush=True,
            )
    med = {k: statistics.median(v) for k, v in samples.items()}
    floor = med["floor"]
    print(f"\nmedian of {opts.repeats} (nproc={opts.nproc}, load avg {os.getloadavg()[0]:.1f}):")
    for name in launchers:
        print(
            f"  {name:9s} failure -> restarted workers running: {med[name]:7.1f} ms"
            f"  (above the {floor:.1f} ms spawn floor: {med[name] - floor:7.1f} ms)"
        )
    print(f"  ratio aelastic/torchrun: {med['aelastic'] / med['torchrun']:.3f}")
    for extra in ("aelastic@base", "aelastic+status"):
        if extra in med:
            print(f"  ratio {extra}/torchrun: {med[extra] / med['torchrun']:.3f}")
    if opts.status_load:
        print(f"  /status answered {answered} times during the aelastic+status runs")
    own_a, own_t = med["aelastic"] - floor, med["torchrun"] - floor
    if own_t > 0:
        print(f"  ratio of launcher shares (floor removed): {max(own_a, 0.0) / own_t:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

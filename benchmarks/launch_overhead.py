"""Launch overhead: ``--standalone --nproc-per-node 2`` of a no-op script, aelastic vs torchrun.

    python benchmarks/launch_overhead.py [--repeats 7] [--nproc 2] [--baseline DIR]

Each launcher runs as a fresh process; the wall time covers the whole command (start,
rendezvous, two workers, exit) and the peak RSS is ``ru_maxrss`` from ``os.wait4`` of
that process (the launcher's own, or a waited-for worker's if larger; the no-op workers
are far smaller than either launcher). Also timed: starting the same two Python
processes directly, the floor any launcher pays. Prints medians and ratios.
``--baseline DIR`` also times another aelastic source tree (e.g. ``git archive main``
unpacked in DIR) as ``aelastic@base``, run with DIR as its working directory.

Bytecode: a source checkout run with ``PYTHONDONTWRITEBYTECODE=1`` recompiles every
aelastic module on every start (an installed wheel ships or caches ``.pyc`` files, as
torch's site-packages does). By default both launchers therefore run with the variable
removed and ``PYTHONPYCACHEPREFIX`` pointing at a private temp dir (warmed by one
untimed run), so neither writes into the checkout; ``--no-bytecode-cache`` keeps the
environment as it is.
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


def _measure(cmd: list[str], env: dict[str, str], cwd: str | None = None) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one run of ``cmd``; raises if it fails."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} exited {proc.returncode}: {err.decode()[-2000:]}")
    return wall, usage.ru_maxrss / 1024


def _direct(script: str, nproc: int) -> tuple[float, float]:
    start = time.perf_counter()
    procs = [subprocess.Popen([PY, "-u", script]) for _ in range(nproc)]
    for p in procs:
        p.wait()
    return time.perf_counter() - start, 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--no-bytecode-cache", action="store_true")
    parser.add_argument("--baseline", help="another aelastic source tree to time alongside")
    opts = parser.parse_args()

    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # both launchers would warn and set it
    with tempfile.TemporaryDirectory() as tmp:
        if not opts.no_bytecode_cache:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = os.path.join(tmp, "pycache")
        script = os.path.join(tmp, "noop.py")
        with open(script, "w") as f:
            f.write("pass\n")
        flags = ["--standalone", "--nproc-per-node", str(opts.nproc)]
        launchers = {
            "aelastic": [PY, "-m", "aelastic", "run", *flags, script],
            "torchrun": [PY, "-m", "torch.distributed.run", *flags, script],
        }
        help_cmds = {
            "aelastic --help": [PY, "-m", "aelastic", "run", "--help"],
            "torchrun --help": [PY, "-m", "torch.distributed.run", "--help"],
        }
        if opts.baseline:
            launchers["aelastic@base"] = launchers["aelastic"]
        cwds = {"aelastic@base": opts.baseline}
        commands = {**launchers, **help_cmds}
        for name, cmd in commands.items():
            _measure(cmd, env, cwds.get(name))  # warm the page cache
        _direct(script, opts.nproc)
        # alternate the commands run by run, so load changes hit every one alike
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        direct_runs: list[float] = []
        for _ in range(opts.repeats):
            for name, cmd in commands.items():
                runs[name].append(_measure(cmd, env, cwds.get(name)))
            direct_runs.append(_direct(script, opts.nproc)[0])
        results = {
            name: (statistics.median(w for w, _ in rs), max(r for _, r in rs))
            for name, rs in runs.items()
        }
        direct = statistics.median(direct_runs)

    print(f"launch overhead: --standalone --nproc-per-node {opts.nproc} of a no-op script")
    cache = "off (as the environment says)" if opts.no_bytecode_cache else "on (private prefix)"
    print(
        f"median of {opts.repeats} runs; python {sys.version.split()[0]}, {os.cpu_count()} CPUs;"
        f" bytecode cache {cache}; load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'command':<18} {'wall s':>8} {'peak RSS MiB':>13}")
    for name, (wall, rss) in results.items():
        print(f"{name:<18} {wall:8.3f} {rss:13.1f}")
    print(f"{'2 pythons direct':<18} {direct:8.3f} {'-':>13}")
    a_wall, a_rss = results["aelastic"]
    t_wall, t_rss = results["torchrun"]
    paired = statistics.median(
        a / t for (a, _), (t, _) in zip(runs["aelastic"], runs["torchrun"], strict=True)
    )
    print(
        f"ratio aelastic/torchrun wall: {a_wall / t_wall:.3f}x of medians, {paired:.3f}x "
        "median of paired runs  (target <= 0.1x)"
    )
    print(f"ratio aelastic/torchrun peak RSS: {a_rss / t_rss:.3f}x")
    if opts.baseline:
        base = statistics.median(
            b / t for (b, _), (t, _) in zip(runs["aelastic@base"], runs["torchrun"], strict=True)
        )
        print(f"ratio aelastic@base/torchrun wall: {base:.3f}x median of paired runs")
        own = statistics.median(
            a / b for (a, _), (b, _) in zip(runs["aelastic"], runs["aelastic@base"], strict=True)
        )
        print(f"ratio aelastic/aelastic@base wall: {own:.3f}x median of paired runs")
    print(f"aelastic overhead over direct start: {a_wall - direct:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

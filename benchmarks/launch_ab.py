"""A/B of the no-op launch: this tree against another aelastic source tree, wall and CPU.

    python benchmarks/launch_ab.py --baseline DIR [--pairs 100] [--nproc 2]

``launch_overhead.py`` runs its commands in a fixed order, which biases a comparison of
two aelastic trees by more than a few-ms change (an identical copy as ``--baseline``
measured 0.51x there). This script alternates which tree goes first in each pair and also
counts CPU (user + system of the launcher and every process it waited for, from
``RUSAGE_CHILDREN``), which load disturbs less than wall time. Run it with DIR an
identical copy of this tree for a control: its ratios show the noise.

Both trees run ``python -m aelastic run --standalone --nproc-per-node N <no-op>`` with
their own directory as the working directory and a private bytecode cache (warmed by one
untimed run each). Prints the medians and the medians of the paired ratios.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(cmd: list[str], cwd: str, env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s) of one launch; raises CalledProcessError if it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="the other aelastic source tree")
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--nproc", type=int, default=2)
    opts = parser.parse_args()
    trees = {"this": HERE, "base": os.path.abspath(opts.baseline)}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.setdefault("OMP_NUM_THREADS", "1")
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        env["PYTHONPYCACHEPREFIX"] = os.path.join(tmp, "pycache")
        script = os.path.join(tmp, "noop.py")
        with open(script, "w") as f:
            f.write("pass\n")
        flags = ["--standalone", "--nproc-per-node", str(opts.nproc)]
        cmd = [sys.executable, "-m", "aelastic", "run", *flags, script]
        for tree in trees.values():
            _run(cmd, tree, env)  # warm the bytecode and page caches
        for i in range(opts.pairs):
            order = list(trees.items()) if i % 2 else list(reversed(trees.items()))
            for name, tree in order:
                runs[name].append(_run(cmd, tree, env))
    print(f"no-op launch A/B, --nproc-per-node {opts.nproc}: {opts.pairs} alternating pairs")
    print(f"load average {os.getloadavg()[0]:.1f}; base {trees['base']}")
    for name, rs in runs.items():
        wall = statistics.median(w for w, _ in rs)
        cpu = statistics.median(c for _, c in rs)
        print(f"{name:<5} wall median {wall * 1000:6.1f} ms   CPU median {cpu * 1000:6.1f} ms")
    pairs = list(zip(runs["this"], runs["base"], strict=True))
    wall_ratio = statistics.median(t[0] / b[0] for t, b in pairs)
    cpu_ratio = statistics.median(t[1] / b[1] for t, b in pairs)
    print(f"paired this/base: wall {wall_ratio:.3f}x, CPU {cpu_ratio:.3f}x (median of ratios)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

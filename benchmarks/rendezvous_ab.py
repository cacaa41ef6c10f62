"""Two versions of aelastic's rendezvous at N nodes, runs interleaved: before/after a change.

    git archive <base-commit> aelastic | tar -x -C /tmp/base   # the version to compare with
    python benchmarks/rendezvous_ab.py --nodes 64 --rounds 10 /tmp/base .

Each directory must hold an ``aelastic`` package. Every round runs ``rendezvous_scale.py``'s
aelastic case (N handlers on one event loop, one in-process StoreServer) three times per
directory, each directory in a fresh interpreter, directories alternating, so that the
load of a shared machine falls on both alike. Printed per directory: the median and
minimum rendezvous seconds, the median connect seconds, and the median CPU seconds of
the interpreter per run (connect, rendezvous and teardown: the least noisy figure).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

_CHILD = r"""
import json, sys, time
src, n, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# The tree under test, not the installed (editable) aelastic.
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path[:0] = [src, sys.argv[4]]
import anyio, aelastic
assert aelastic.__file__.startswith(src), aelastic.__file__
import rendezvous_scale
out = []
for _ in range(runs):
    cpu = time.process_time()
    r = anyio.run(rendezvous_scale.aelastic_case, n, None)
    out.append((r.connect_s, r.rendezvous_s, time.process_time() - cpu))
print(json.dumps(out))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs=2, help="two directories, each holding an aelastic package")
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    here = str(Path(__file__).resolve().parent)
    dirs = [os.path.abspath(d) for d in args.dirs]
    runs: dict[str, list[tuple[float, float, float]]] = {d: [] for d in dirs}
    print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    for _ in range(args.rounds):
        for d in dirs:
            cmd = [sys.executable, "-c", _CHILD, d, str(args.nodes), "3", here]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs[d] += [tuple(x) for x in json.loads(proc.stdout.splitlines()[-1])]
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    for d, v in runs.items():
        connect, rdzv, cpu = (list(x) for x in zip(*v, strict=True))
        print(
            f"{d}: {len(v)} runs, rendezvous median {statistics.median(rdzv) * 1e3:.1f} ms "
            f"(min {min(rdzv) * 1e3:.1f}), connect median {statistics.median(connect) * 1e3:.1f}"
            f" ms, CPU per run median {statistics.median(cpu) * 1e3:.1f} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

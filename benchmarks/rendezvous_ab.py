"""Two versions of aelastic's rendezvous at N nodes, runs interleaved: before/after a change.

    git worktree add --detach /tmp/base <base-commit>   # the version to compare with
    python benchmarks/rendezvous_ab.py --nodes 64 --rounds 10 /tmp/base .

Each directory must hold an ``aelastic`` package. Every round runs ``rendezvous_scale.py``'s
aelastic case (N handlers on one event loop, one in-process StoreServer) three times per
directory, each directory in a fresh interpreter, directories alternating, so that the
load of a shared machine falls on both alike. Printed per directory: the median and
minimum rendezvous seconds, the median connect seconds, and the median CPU seconds of
the interpreter per run (connect, rendezvous and teardown) and of its rendezvous window
(the least noisy figures on a loaded machine: CPU the others take is not counted); then
the ratio of the two medians (first directory / second) and the median of the per-round
ratios, and the ratio of the rendezvous window's CPU medians. ``rendezvous_scale.py
--base DIR`` runs the same comparison.
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
    out.append((r.connect_s, r.rendezvous_s, time.process_time() - cpu, r.rendezvous_cpu_s))
print(json.dumps(out))
"""

#: One run: (connect seconds, rendezvous seconds, CPU seconds of the interpreter, CPU
#: seconds of the rendezvous window).
Run = tuple[float, float, float, float]


def alternate(dirs: list[str], nodes: int, rounds: int, per_child: int = 3) -> dict[str, list[Run]]:
    """``rounds`` rounds; in each, every directory in turn runs ``per_child`` rendezvous
    of ``nodes`` nodes in a fresh interpreter. Prints one line per round (with the load)."""
    here = str(Path(__file__).resolve().parent)
    runs: dict[str, list[Run]] = {d: [] for d in dirs}
    print(f"N={nodes}: load average at start {os.getloadavg()[0]:.2f}", flush=True)
    for i in range(rounds):
        medians = []
        for d in dirs:
            cmd = [sys.executable, "-c", _CHILD, d, str(nodes), str(per_child), here]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
            got: list[Run] = [tuple(x) for x in json.loads(proc.stdout.splitlines()[-1])]
            runs[d] += got
            medians.append(statistics.median(r[1] for r in got))
        shown = "  ".join(f"{m:.3f} s" for m in medians)
        print(
            f"round {i + 1}/{rounds}: rendezvous medians {shown}  load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
    return runs


def summarize(runs: dict[str, list[Run]], per_child: int = 3) -> None:
    """Print each directory's medians, then first/second ratios (of medians, per round)."""
    for d, v in runs.items():
        connect, rdzv, cpu, rcpu = (list(x) for x in zip(*v, strict=True))
        print(
            f"{d}: {len(v)} runs, rendezvous median {statistics.median(rdzv) * 1e3:.1f} ms "
            f"(min {min(rdzv) * 1e3:.1f}), connect median {statistics.median(connect) * 1e3:.1f}"
            f" ms, CPU per run median {statistics.median(cpu) * 1e3:.1f} ms, of which the "
            f"rendezvous window {statistics.median(rcpu) * 1e3:.1f} ms"
        )
    if len(runs) == 2:
        (a, va), (b, vb) = runs.items()
        ra, rb = [r[1] for r in va], [r[1] for r in vb]
        rounds = [
            statistics.median(ra[i : i + per_child]) / statistics.median(rb[i : i + per_child])
            for i in range(0, len(ra), per_child)
        ]
        print(
            f"rendezvous {a} / {b}: {statistics.median(ra) / statistics.median(rb):.2f}x of the "
            f"medians; per-round ratios median {statistics.median(rounds):.2f}x "
            f"(range {min(rounds):.2f}-{max(rounds):.2f}x); CPU of the rendezvous window "
            f"{statistics.median(r[3] for r in va) / statistics.median(r[3] for r in vb):.2f}x"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs=2, help="two directories, each holding an aelastic package")
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    runs = alternate([os.path.abspath(d) for d in args.dirs], args.nodes, args.rounds)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    summarize(runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

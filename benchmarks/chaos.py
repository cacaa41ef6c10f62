"""Chaos table: every fault kind of the chaos suite, aelastic and torchrun side by side.

    python benchmarks/chaos.py [--trials 3] [--seed 1] [--only aelastic|torchrun] [--faults K,...]

Each trial is the suite's (``tests/chaos/_harness.py``): three launcher processes
(``--nnodes 2:3 --max-restarts 3``, c10d on 127.0.0.1, one gloo worker each, checkpoint
every step), one fault, every launcher awaited within 90 s. Trials alternate between the
launchers so both share the machine's load. Per fault and launcher it prints the outcomes,
how many trials broke a property (hang, orphan, lost checkpoint, unclear error), and the
median times from the fault until the survivors' old workers were gone (``reacted``) and
until rank 0 of a new world was running (``recovered``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from chaos._harness import FAULTS, TORCHRUN
from chaos._table import run_table
from launcher._nodes import AELASTIC_RUN

LAUNCHERS = {"aelastic": AELASTIC_RUN, "torchrun": TORCHRUN}


async def _main(opts: argparse.Namespace) -> None:
    launchers = {n: c for n, c in LAUNCHERS.items() if opts.only in (None, n)}
    faults = [f for i, f in enumerate(FAULTS) if not opts.faults or str(i) in opts.faults]
    await run_table(faults, launchers, trials=opts.trials, seed=opts.seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", choices=sorted(LAUNCHERS))
    parser.add_argument("--faults", type=lambda s: s.split(","), default=[])
    anyio.run(_main, parser.parse_args())


if __name__ == "__main__":
    main()

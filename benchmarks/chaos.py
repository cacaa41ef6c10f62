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
import statistics
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from chaos._harness import FAULTS, TORCHRUN, TrialResult, run_trial
from launcher._nodes import AELASTIC_RUN

LAUNCHERS = {"aelastic": AELASTIC_RUN, "torchrun": TORCHRUN}


def _median(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{statistics.median(known):.2f} s" if known else "-"


async def _main(opts: argparse.Namespace) -> None:
    launchers = [opts.only] if opts.only else list(LAUNCHERS)
    faults = [f for i, f in enumerate(FAULTS) if not opts.faults or str(i) in opts.faults]
    results: dict[tuple[str, str], list[TrialResult]] = defaultdict(list)
    for trial in range(opts.trials):
        for index, fault in enumerate(faults):
            for name in launchers:
                seed = opts.seed + 1000 * trial + index
                with tempfile.TemporaryDirectory() as tmp:
                    result = await run_trial(fault, seed, Path(tmp), launcher=LAUNCHERS[name])
                results[(fault.name, name)].append(result)
                print(
                    f"[{trial}] {name:8} {fault.name:34} {result.outcome:20} codes={result.codes}"
                    f" reacted={result.reacted_after} problems={len(result.problems())}",
                    flush=True,
                )
    print()
    print("| fault | launcher | outcomes | broke a property | reacted | recovered |")
    print("|---|---|---|---|---|---|")
    for fault in faults:
        for name in launchers:
            rs = results[(fault.name, name)]
            outcomes = ", ".join(f"{n}x {o}" for o, n in Counter(r.outcome for r in rs).items())
            broken = sum(1 for r in rs if r.problems())
            print(
                f"| {fault.name} | {name} | {outcomes} | {broken}/{len(rs)} |"
                f" {_median([r.reacted_after for r in rs])} |"
                f" {_median([r.recovered_after for r in rs])} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", choices=sorted(LAUNCHERS))
    parser.add_argument("--faults", type=lambda s: s.split(","), default=[])
    anyio.run(_main, parser.parse_args())


if __name__ == "__main__":
    main()

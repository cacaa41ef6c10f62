"""Run chaos trials for several launchers and print the side-by-side table (benchmarks).

Used by ``benchmarks/chaos.py`` (every fault kind) and ``benchmarks/node_loss.py`` (agent
losses with torch's default heartbeat). Trials alternate between the launchers so both share
the machine's load.
"""

from __future__ import annotations

import statistics
import tempfile
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

from ._harness import CONF, Fault, TrialResult, run_trial


def _stats(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    return f"{statistics.median(known):.2f} s (max {max(known):.2f})"


async def run_table(
    faults: Sequence[Fault],
    launchers: Mapping[str, Sequence[str]],
    *,
    trials: int,
    seed: int,
    conf: str = CONF,
) -> dict[tuple[str, str], list[TrialResult]]:
    """Run ``trials`` rounds of every fault under every launcher (rendezvous settings
    ``conf``), print a line per trial and then the markdown table; return the results by
    ``(fault name, launcher name)``."""
    results: dict[tuple[str, str], list[TrialResult]] = defaultdict(list)
    for trial in range(trials):
        for index, fault in enumerate(faults):
            for name, command in launchers.items():
                with tempfile.TemporaryDirectory() as tmp:
                    result = await run_trial(
                        fault, seed + 1000 * trial + index, Path(tmp), launcher=command, conf=conf
                    )
                results[(fault.name, name)].append(result)
                print(
                    f"[{trial}] {name:8} {fault.name:34} {result.outcome:20} codes={result.codes}"
                    f" reacted={result.reacted_after} recovered={result.recovered_after}"
                    f" problems={len(result.problems())}",
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
                f" {_stats([r.reacted_after for r in rs])} |"
                f" {_stats([r.recovered_after for r in rs])} |"
            )
    return results

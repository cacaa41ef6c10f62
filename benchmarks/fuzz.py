"""Long-mode fuzzing of aelastic's listeners on 127.0.0.1 (issue 37).

    python benchmarks/fuzz.py --target store|http|peer --seconds N --seed S

Each target runs one seeded fuzzer against a real server for ``N`` seconds and prints
its counts (cases by kind, by outcome, the process's memory growth) as JSON; it fails
with the seed and the case when a property does not hold (the server kept a connection
past its bound, stopped answering a valid client, logged a failed connection task, or
grew by more than 256 MiB). The CI tests run the same fuzzers for a few seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def _store(seed: int, seconds: float) -> Awaitable[dict[str, int]]:
    from store import _fuzz

    return _fuzz.run(seed, seconds=seconds)


def _http(seed: int, seconds: float) -> Awaitable[dict[str, int]]:
    from health import _fuzz

    return _fuzz.run(seed, seconds=seconds)


def _peer(seed: int, seconds: float) -> Awaitable[dict[str, int]]:
    from checkpoint import _fuzz

    return _fuzz.run(seed, seconds=seconds)


#: target -> (seed, seconds) -> the fuzzer's counts
TARGETS: dict[str, Callable[[int, float], Awaitable[dict[str, int]]]] = {
    "store": _store,
    "http": _http,
    "peer": _peer,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=sorted(TARGETS), required=True)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.monotonic()
    counts = anyio.run(TARGETS[args.target], args.seed, args.seconds)
    wall = round(time.monotonic() - start, 1)
    result: dict[str, object] = {"target": args.target, "seed": args.seed, **counts, "wall_s": wall}
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

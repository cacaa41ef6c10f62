"""What the seeded fuzzers of the listeners share (``tests/health/_fuzz.py``,
``tests/store/_fuzz.py``, ``tests/checkpoint/_fuzz.py``, run by their tests for a few
cases and by ``benchmarks/fuzz.py`` for minutes): the loop that runs cases for a count
or for a time, with a check of the server every few cases, and the bound on the
process's memory growth.

A case that times out (the server kept its connection open past the fuzzer's bound)
becomes an AssertionError naming the seed, the case and what it sent; any other error
of a case or a check propagates as it is.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable

#: The most the fuzzing process may grow (its peak resident memory over its start).
RSS_BOUND = 256 * 2**20

#: One case, given its number: what it sends (for the error), and the work that sends it
#: and returns the count keys it adds to (its kind, its outcome).
Case = Callable[[int], tuple[str, Awaitable[Iterable[str]]]]


def rss() -> int:
    """This process's resident memory in bytes (Linux's ``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


class Memory:
    """The process's memory at the start and its peak over the samples taken since."""

    def __init__(self) -> None:
        self.start = self.peak = rss()

    def sample(self) -> None:
        self.peak = max(self.peak, rss())

    def check(self, seed: int, counts: dict[str, int]) -> None:
        """Record the growth in ``counts["rss_growth_kib"]``; AssertionError when it is
        :data:`RSS_BOUND` or more."""
        growth = max(self.peak, rss()) - self.start
        counts["rss_growth_kib"] = growth // 1024
        assert growth < RSS_BOUND, f"seed {seed}: the process grew by {growth} bytes"


async def run_cases(
    seed: int,
    one: Case,
    check: Callable[[int], Awaitable[None]],
    *,
    every: int,
    bound: float,
    cases: int | None = None,
    seconds: float | None = None,
    counts: dict[str, int] | None = None,
    memory: Memory | None = None,
) -> dict[str, int]:
    """Run ``one(i)`` for ``i = 0, 1, ...`` until ``cases`` ran or ``seconds`` passed,
    then ``check(i)`` (and a memory sample) after every ``every``-th case; return the
    counts of the keys each case returned, and ``"cases"``. ``bound`` is the fuzzer's
    close bound, named in the error of a case that timed out."""
    counts = {} if counts is None else counts
    end = None if seconds is None else time.monotonic() + seconds
    i = 0
    while (cases is None or i < cases) and (end is None or time.monotonic() < end):
        what, pending = one(i)
        try:
            keys = await pending
        except TimeoutError:
            raise AssertionError(
                f"seed {seed}, case {i} ({what}): the server kept the connection open over"
                f" {bound} s"
            ) from None
        for key in keys:
            counts[key] = counts.get(key, 0) + 1
        if i % every == 0:
            await check(i)
            if memory is not None:
                memory.sample()
        i += 1
    counts["cases"] = i
    return counts

"""The per-rank signal on Linux: a worker's busy time, read by the agent from ``/proc``.

A rank's *busy time* is the time its threads ran on a CPU plus the time they waited
for one (runnable, on the run queue): ``/proc/<pid>/task/<tid>/schedstat`` fields 1
and 2 summed over its threads. A rank blocked in a gloo collective sleeps (gloo waits
on a condition variable: measured, see ``docs/stragglers.md``) and adds neither, so
the rank everyone waits for is the one with the most busy time per step; a rank
slowed by a noisy neighbour on its own node waits on the run queue and counts as busy
too. Nothing runs in the worker and the training script is unchanged. Without
schedstat (a kernel built without ``CONFIG_SCHED_INFO``), ``utime + stime`` from
``/proc/<pid>/stat`` (CPU only, 10 ms ticks).
"""

from __future__ import annotations

import os

__all__ = ("busy_seconds",)

_TICK = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


def busy_seconds(pid: int) -> float | None:
    """Seconds ``pid``'s threads ran or waited to run so far; None when it is gone (or
    ``/proc`` cannot tell). Costs one ``listdir`` and one small read per thread."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    total = 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as fp:
                fields = fp.read().split()
            total += int(fields[0]) + int(fields[1])
        except (OSError, ValueError, IndexError):
            continue  # a thread that just ended
    if total:
        return total / 1e9
    return _cpu_seconds(pid)


def _cpu_seconds(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fp:
            rest = fp.read().rpartition(b")")[2].split()
        return (int(rest[11]) + int(rest[12])) * _TICK
    except (OSError, ValueError, IndexError):
        return None

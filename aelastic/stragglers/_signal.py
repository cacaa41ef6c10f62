"""The per-rank signal on Linux: a worker's busy time, read by the agent from ``/proc``.

A rank's *busy time* is the time its threads ran on a CPU: ``/proc/<pid>/task/<tid>/schedstat``
field 1 (nanoseconds) summed over its threads. A rank blocked in a gloo collective
sleeps (gloo waits on a condition variable: measured, see ``docs/stragglers.md``) and
adds nothing, so the rank everyone waits for is the one with the most busy time per
step. Time spent runnable but waiting for a CPU (schedstat field 2) is left out: on a
shared machine it follows the scheduler's whims more than the rank's work (measured:
with it, an even job under load 20 on 2 cores had a rank score 0.62 for seconds).
Nothing runs in the worker and the training script is unchanged. Without schedstat (a
kernel built without ``CONFIG_SCHED_INFO``), ``utime + stime`` from ``/proc/<pid>/stat``
(10 ms ticks).
"""

from __future__ import annotations

import os

from ..workers import thread_busy_seconds

__all__ = ("busy_seconds",)

_TICK = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


def busy_seconds(pid: int) -> float | None:
    """Seconds ``pid``'s threads ran on a CPU so far; None when it is gone (or ``/proc``
    cannot tell). Costs one ``listdir`` and one small read per thread."""
    threads = thread_busy_seconds(pid)
    if threads is None:
        return None
    total = sum(threads.values())
    if total:
        return total
    return _cpu_seconds(pid)  # schedstat all zero: a kernel without CONFIG_SCHED_INFO


def _cpu_seconds(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fp:
            rest = fp.read().rpartition(b")")[2].split()
        return (int(rest[11]) + int(rest[12])) * _TICK
    except (OSError, ValueError, IndexError):
        return None

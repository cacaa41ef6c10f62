"""The per-rank signal on Linux: a worker's busy time, read by the agent from ``/proc``.

A rank's *busy time* is the time its threads ran on a CPU: ``/proc/<pid>/task/<tid>/schedstat``
field 1 (nanoseconds) summed over its threads. A rank blocked in a gloo collective
sleeps (gloo waits on a condition variable; it does not spin) and adds nothing, so the
rank everyone waits for is the one with the most busy time per step. Measured with 4
gloo DDP ranks on a 2-core machine, rank 0 doing twice the matrix work of the others,
over the same 2.3 s of wall time: process CPU 0.95 s for rank 0 against 0.54-0.62 s for
the waiting ranks (main thread: 0.66 s against 0.40-0.41 s). In a synchronous job every
rank takes the same number of steps in the same wall time, so a rank's busy rate (busy
seconds per second) is proportional to its own work per step: no step counter is needed.

Time spent runnable but waiting for a CPU (schedstat field 2) is left out: on a shared
machine it follows the scheduler's whims more than the rank's work (measured: with it,
an even job under load 20 on 2 cores had a rank score 0.62 for seconds, and 1.10x work
scored 0.73). So a node slowed only by CPU contention from other processes is
not found; one that does more work per step, or runs on a slower or throttled CPU, is.
Nothing runs in the worker and the training script is unchanged. Without schedstat (a
kernel built without ``CONFIG_SCHED_INFO``), ``utime + stime`` from ``/proc/<pid>/stat``
(10 ms ticks).
"""

from __future__ import annotations

import os

from ..workers._procfs import thread_busy_seconds

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

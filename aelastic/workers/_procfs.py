"""Process state from ``/proc`` (Linux): workers stuck in uninterruptible sleep, and the
time each thread of a worker ran on a CPU."""

from __future__ import annotations

import os

__all__ = ("process_state", "thread_busy_seconds")

_TICK = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


def process_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` from ``/proc/<pid>/stat`` (``"R"``, ``"S"``, ``"D"``...).

    ``"D"`` is uninterruptible sleep: such a process ignores even SIGKILL until
    the kernel call returns (a hung GPU driver, NCCL, RDMA or network file
    system). Returns None when the process is gone or ``/proc`` is unavailable.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as fp:
            stat = fp.read()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: the state follows the last ")".
    _, _, rest = stat.rpartition(b")")
    fields = rest.split()
    return fields[0].decode() if fields else None


def thread_busy_seconds(pid: int) -> dict[str, float] | None:
    """``{tid: seconds}`` each thread of ``pid`` ran on a CPU so far; None when it is gone.

    From ``/proc/<pid>/task/<tid>/schedstat`` field 1 (nanoseconds; time waiting for a
    CPU is left out), or ``utime + stime`` of the thread's ``stat`` (clock ticks) on a
    kernel without schedstat. A thread that ends while it is read is left out. Costs one
    ``listdir`` and one small read per thread; never raises.
    """
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    busy: dict[str, float] = {}
    for tid in tids:
        task = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{task}/schedstat", "rb") as fp:
                busy[tid] = int(fp.read().split()[0]) / 1e9
            continue
        except (OSError, ValueError, IndexError):
            pass
        try:
            with open(f"{task}/stat", "rb") as fp:
                rest = fp.read().rpartition(b")")[2].split()
            busy[tid] = (int(rest[11]) + int(rest[12])) * _TICK
        except (OSError, ValueError, IndexError):
            continue
    return busy

"""A worker whose script ended but whose interpreter does not exit: bounded, then killed.

A warm worker (``_warm_boot.py``) keeps its control socket after the hand-off and,
the moment its script ends (returns, ``sys.exit``, an uncaught exception), writes
``exit <status>\\n`` into it, before the interpreter's shutdown (``threading``'s
join of non-daemon threads, ``atexit`` handlers, module teardown, destructors such
as a process group's) begins. :func:`receive_exit_notice` reads it;
:func:`shutdown_report` says what the worker waits on while it is still there.
The timer itself runs in :class:`~aelastic.workers._processes.WorkerProcesses`: after
``exit_grace`` seconds it kills the worker and counts the exit status its script
ended with (its work is done; a shutdown that deadlocks, such as torch's gloo
teardown, must not keep a finished job waiting). Fresh spawns send nothing: the
bound applies to warm workers only.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Mapping

import anyio

from ._procfs import process_state

__all__ = (
    "DEFAULT_EXIT_GRACE",
    "EXIT_WARN_AFTER",
    "IDLE_THREAD_SHARE",
    "busiest_thread_seconds",
    "receive_exit_notice",
    "shutdown_report",
)

#: Seconds a worker whose script ended may take to exit before it is killed.
DEFAULT_EXIT_GRACE = 60.0
#: Seconds after its script ended when a worker still there is reported (at most the grace).
EXIT_WARN_AFTER = 10.0
#: Idle: no thread of the worker ran more than this share of one CPU over a window. Not
#: zero: a thread waiting for the GIL wakes every switch interval (5 ms), measured at
#: 0.6% of one CPU per waiting thread. Per thread, not per process: a deadlock with a few
#: such threads (torch's gloo teardown) added up to more than the 0.5% of one CPU for
#: the whole process this rule first used, and went unnoticed.
IDLE_THREAD_SHARE = 0.02
_NOTICE = b"exit "


def parse_exit_notice(data: bytes) -> int | None:
    """The exit status in ``b"exit <status>\\n"``; None for anything else."""
    if not data.startswith(_NOTICE) or not data.endswith(b"\n"):
        return None
    try:
        return int(data[len(_NOTICE) : -1])
    except ValueError:
        return None


async def receive_exit_notice(sock: socket.socket) -> int | None:
    """Wait for the worker's ``exit <status>`` line; None at end of stream or on garbage.

    Never raises for a socket error (None). Cancellation: stops waiting at once.
    """
    data = b""
    while not data.endswith(b"\n") and len(data) < 64:
        await anyio.wait_readable(sock)
        try:
            chunk = sock.recv(64 - len(data), socket.MSG_DONTWAIT)
        except BlockingIOError:
            continue
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return parse_exit_notice(data)


def shutdown_report(pid: int) -> str:
    """What the process waits on, from ``/proc``: its threads and the main thread's wait.

    For example ``"4 threads; main thread sleeping in futex_wait_queue"``. Never raises.
    """
    try:
        threads = len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return "gone"
    wchan = ""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/wchan") as f:
        wchan = f.read().strip()
    doing = "running" if process_state(pid) == "R" else "sleeping"
    where = f" in {wchan}" if wchan and wchan != "0" and doing == "sleeping" else ""
    return f"{threads} thread{'s' if threads != 1 else ''}; main thread {doing}{where}"


def busiest_thread_seconds(before: Mapping[str, float], after: Mapping[str, float]) -> float:
    """The most CPU seconds one thread used between two :func:`thread_busy_seconds` reads
    (a thread that started in between counts from zero; 0.0 without threads)."""
    return max((busy - before.get(tid, 0.0) for tid, busy in after.items()), default=0.0)

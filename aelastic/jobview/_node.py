"""One node's status document, built from a :class:`aelastic.Job`'s live values.

Plain functions: nothing awaits, nothing blocks (the workers' progress is read from
shared memory). The document is compact JSON, bounded in size: its history is a
:class:`~aelastic.jobview._history.History`.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from typing import TYPE_CHECKING, Any

from ._history import History

if TYPE_CHECKING:
    from ._source import NodeSource

__all__ = ("FORMAT", "describe_exit", "new_node_id", "node_status", "worker_rows")

#: Version of the status document (``"v"``); readers skip versions they do not know.
FORMAT = 1

_agents = itertools.count()


def new_node_id() -> str:
    """A node id unique per agent: ``<host>:<pid>``, then ``<host>:<pid>.<n>`` for the
    n-th further agent of the same process."""
    n = next(_agents)
    base = f"{socket.gethostname()}:{os.getpid()}"
    return base if n == 0 else f"{base}.{n}"


def _failure(job: NodeSource) -> dict[str, Any] | None:
    failure = job.last_failure
    if failure is None:
        return None
    return {
        "global_rank": failure.global_rank,
        "local_rank": failure.local_rank,
        "pid": failure.pid,
        "exitcode": failure.exitcode,
        "attempt": failure.attempt,
        "time": round(failure.timestamp, 1),
        "message": describe_exit(failure.exitcode),
    }


def describe_exit(code: int) -> str:
    """``exited 3`` or ``killed by SIGKILL``."""
    if code < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited {code}"


def _hang(job: NodeSource) -> dict[str, Any] | None:
    hang = job.last_hang
    if hang is None:
        return None
    return {
        "global_rank": hang.global_rank,
        "local_rank": hang.local_rank,
        "rule": hang.rule,
        "section": hang.section,
        "step": hang.step,
        "time": round(hang.detected_at, 1),
    }


def worker_rows(job: NodeSource) -> list[dict[str, Any]]:
    """The local workers: ranks, pid, last ``aelastic.progress`` step and heartbeat age
    (None when the worker reports nothing: it does not use ``aelastic.progress``)."""
    mono = time.monotonic_ns()
    progress = job.progress()
    rows = []
    for w in job.workers():
        snap = progress.get(w.local_rank)
        rows.append(
            {
                "global_rank": w.global_rank,
                "local_rank": w.local_rank,
                "pid": w.pid,
                "step": snap.step if snap is not None and snap.attached else None,
                "heartbeat_age_ms": (mono - snap.last_beat_ns) // 1_000_000
                if snap is not None and snap.beats
                else None,
            }
        )
    return rows


def node_status(
    job: NodeSource,
    node: str,
    history: History,
    interval: float,
    now: float | None = None,
    workers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The status document of ``job``'s node ``node`` (see the README's ``status --json``)."""
    wall = time.time() if now is None else now
    return {
        "v": FORMAT,
        "node": node,
        "host": job.node,
        "pid": os.getpid(),
        "run_id": job.run_id,
        "role": job.role,
        "state": job.state.value,
        "round": job.round,
        "group_rank": job.group_rank,
        "restart_count": job.restart_count,
        "restarts_left": job.remaining_restarts,
        "max_restarts": job.config.max_restarts,
        "workers": worker_rows(job) if workers is None else workers,
        "last_failure": _failure(job),
        "hangs": job.hang_count,
        "last_hang": _hang(job),
        "stragglers": job.straggler_status(),
        "history": history.to_json(),
        "goodput": job.goodput(),
        "interval": interval,  # the reader's staleness bound is 3 of them
        "time": round(wall, 2),
    }

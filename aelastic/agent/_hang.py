"""Hang detection for one round of workers: progress files, deadlines, and the report.

The agent creates one :class:`~aelastic.progress.ProgressFile` per worker and
passes its path (and the stacks file and signal) in the worker's environment.
:meth:`RoundProgress.wait_for_hang` then sleeps until the earliest deadline of any
worker (see :func:`~aelastic.agent._policy.progress_deadline`), reads the shared
memory once, and either re-arms on the new earliest deadline or returns the
:class:`Hang`. Nothing polls: a heartbeating worker costs the agent one look per
timeout interval, and a worker that never attaches one look per shortest timeout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import tempfile
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from ..errors import ProcessFailure
from ..metrics import put_metric
from ..progress import ProgressFile, ProgressSnapshot, ProgressTimeouts, _layout
from ._policy import ProgressDeadline, progress_deadline
from ._stacks import STACKS_SIGNAL, capture_stacks

__all__ = (
    "Hang",
    "RoundProgress",
    "hang_failure",
    "progress_directory",
    "report_hang",
    "stacks_files",
)

log = logging.getLogger("aelastic.agent")


@dataclass(frozen=True)
class Hang:
    """A worker that missed its progress deadline."""

    local_rank: int
    pid: int
    deadline: ProgressDeadline
    snapshot: ProgressSnapshot
    #: ``time.monotonic_ns()`` when the agent noticed.
    detected_ns: int
    stacks_file: str | None
    #: ``{local_rank: "faulthandler" | "py-spy"}`` of the workers whose stacks were written.
    stacks_captured: Mapping[int, str] | None = None
    #: ``time.time()`` when the agent noticed (for logs and benchmarks across processes).
    detected_at: float = 0.0

    def describe(self) -> str:
        d = self.deadline
        where = f" in section {d.section!r}" if d.section else " outside any section"
        late = (self.detected_ns - d.at_ns) / 1e6
        what = {
            "initial": "no heartbeat since it started",
            "heartbeat": "no heartbeat",
            "section": "stuck",
            "out-of-section": "no section entered",
        }[d.rule]
        return (
            f"local_rank {self.local_rank} (pid {self.pid}) hung{where}: {what} for {d.timeout:g} s"
            f" ({d.rule} timeout {d.timeout:g} s; noticed {late:.1f} ms after the deadline)"
        )


class RoundProgress:
    """The progress files of one round's workers (one attempt).

    ``RoundProgress(directory, attempt, local_ranks, stacks_files, timeouts)`` creates
    the files; :meth:`env` is what each worker needs in its environment; call
    :meth:`started` right after the workers started; :meth:`close` unmaps the files.
    """

    def __init__(
        self,
        directory: str,
        attempt: int,
        stacks_files: Mapping[int, str],
        timeouts: ProgressTimeouts,
    ) -> None:
        self.timeouts = timeouts
        self.stacks_files = dict(stacks_files)
        self.files: dict[int, ProgressFile] = {}
        self.pids: dict[int, int] = {}
        self.started_ns = time.monotonic_ns()
        try:
            for rank in stacks_files:
                path = os.path.join(directory, f"attempt_{attempt}_{rank}.progress")
                self.files[rank] = ProgressFile(path)
        except BaseException:
            self.close()
            raise

    def env(self, local_rank: int) -> dict[str, str]:
        return {
            _layout.FILE_ENV: self.files[local_rank].path,
            _layout.STACKS_FILE_ENV: self.stacks_files[local_rank],
            _layout.STACKS_SIGNAL_ENV: str(STACKS_SIGNAL),
        }

    def started(self, pids: Mapping[int, int]) -> None:
        """The workers run now (their initial timeout counts from here)."""
        self.pids = dict(pids)
        self.started_ns = time.monotonic_ns()

    def snapshots(self) -> dict[int, ProgressSnapshot]:
        return {rank: f.snapshot() for rank, f in self.files.items()}

    async def wait_for_hang(self, exited: Callable[[], Collection[int]] = tuple) -> Hang:
        """Return the first worker found past its deadline; sleeps until deadlines only.

        ``exited()`` names the local ranks that already exited (never judged: a worker
        that finished early is not hung). Cancellation: stops waiting at once.
        """
        recheck = int(self.timeouts.shortest() * 1e9)
        while True:
            now = time.monotonic_ns()
            wake = now + recheck
            oldest = -1
            gone = exited()
            for rank, progress in self.files.items():
                if rank in gone:
                    continue
                snap = progress.snapshot()
                deadline = progress_deadline(snap, self.timeouts, self.started_ns)
                if deadline is None:
                    continue
                if deadline.at_ns <= now:
                    stacks = self.stacks_files.get(rank)
                    pid = self.pids.get(rank, -1)
                    return Hang(rank, pid, deadline, snap, now, stacks, None, time.time())
                if snap.beats:
                    # Lateness: how much of its heartbeat timeout the worker used up.
                    oldest = max(oldest, (now - snap.last_beat_ns) // 1_000_000)
                wake = min(wake, deadline.at_ns)
            if oldest >= 0:
                put_metric("progress.heartbeat_age_ms", oldest)
            await anyio.sleep(max(0.0, (wake - time.monotonic_ns()) / 1e9))

    def close(self) -> None:
        """Unmap the files and remove the stacks files nothing was written to."""
        for progress in self.files.values():
            progress.close()
        for path in self.stacks_files.values():
            with contextlib.suppress(OSError):
                if os.stat(path).st_size == 0:
                    os.remove(path)


def stacks_files(
    progress_dir: str, attempt: int, attempt_dir: str | None, local_ranks: list[int]
) -> dict[int, str]:
    """``{local_rank: attempt_<n>/<local_rank>/stacks.txt}`` (in ``progress_dir`` without logs)."""
    if attempt_dir is None:
        return {
            r: os.path.join(progress_dir, f"attempt_{attempt}_{r}.stacks.txt") for r in local_ranks
        }
    out = {}
    for rank in local_ranks:
        rank_dir = os.path.join(attempt_dir, str(rank))
        os.makedirs(rank_dir, exist_ok=True)
        out[rank] = os.path.join(rank_dir, "stacks.txt")
    return out


def progress_directory() -> str:
    """Where progress files go: ``/dev/shm`` when usable (pure memory), else the temp dir."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()


def hang_failure(hang: Hang, exitcode: int) -> ProcessFailure:
    """The :class:`ProcessFailure` of a hung worker, its message saying "hung" and where."""
    failure = ProcessFailure(
        local_rank=hang.local_rank,
        pid=hang.pid,
        exitcode=exitcode,
        error_file=None,
        exit_time=time.time(),
    )
    stacks = (
        f"Stacks of every thread: {hang.stacks_file}"
        if hang.stacks_captured and hang.local_rank in hang.stacks_captured
        else "No stacks could be captured (no faulthandler registered, py-spy not installed)."
    )
    failure.message = f"worker {hang.describe()}; the agent stopped it. {stacks}"
    failure.error_file_data = {
        "message": failure.message,
        "errorTraits": {"category": "hang", "retryability": "True"},
    }
    return failure


async def report_hang(
    hang: Hang,
    progress: RoundProgress,
    emit: Callable[[str, Mapping[str, Any]], None],
) -> Hang:
    """Capture every local worker's stacks (before anything is stopped), log and record.

    Returns ``hang`` with ``stacks_captured`` filled in. Records the
    ``aelastic.progress.hang`` event through ``emit(name, metadata)`` (the agent stamps
    the time, run id, host and ranks) and the ``progress.hangs`` /
    ``progress.stacks_captured`` metrics.

    Bounded by the capture's own timeouts (1 s per worker, py-spy 5 s). Errors: none
    raised for a worker that is gone or cannot be dumped (it is left out of
    ``stacks_captured``). Cancellation: stops waiting for the dumps; nothing is recorded.
    """
    log.error("%s; capturing the stacks of every local worker", hang.describe())
    targets = {
        rank: (pid, progress.stacks_files[rank])
        for rank, pid in progress.pids.items()
        if rank in progress.stacks_files
    }
    captured = await capture_stacks(targets)
    hang = dataclasses.replace(hang, stacks_captured=captured)
    put_metric("progress.hangs", 1)
    put_metric("progress.stacks_captured", len(captured))
    d = hang.deadline
    emit(
        "aelastic.progress.hang",
        {
            "local_rank": hang.local_rank,
            "pid": hang.pid,
            "rule": d.rule,
            "section": d.section,
            "timeout": d.timeout,
            "late_ms": round((hang.detected_ns - d.at_ns) / 1e6, 3),
            "detected_at": hang.detected_at,
            "stacks_file": hang.stacks_file,
            "stacks_captured": len(captured),
            "step": hang.snapshot.step,
        },
    )
    log.error(
        "stacks written for local ranks %s (%s)",
        sorted(captured),
        ", ".join(sorted({progress.stacks_files[r] for r in captured})) or "none",
    )
    return hang

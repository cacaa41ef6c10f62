"""Hang detection for one round of workers: progress files, deadlines, and the report.

The agent creates one :class:`~aelastic.progress._reader.ProgressFile` per worker and
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
import signal
import tempfile
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

import anyio

from .._dataclass import dataclass
from .._owned_dirs import claim, release, sweep_abandoned
from .._stacks_dump import STACKS_FILE_ENV, STACKS_SIGNAL_ENV
from ..errors import ProcessFailure
from ..metrics import put_metric
from ..progress._layout import FILE_ENV
from ..progress._reader import ProgressFile, ProgressSnapshot
from ..progress._timeouts import ProgressTimeouts
from ._blame import Suspect, blame_order, in_collective
from ._flight_recorder import flight_recorder_env, remove_trigger, written_dumps
from ._policy import ProgressDeadline, progress_deadline
from ._stacks import STACKS_SIGNAL, capture_stacks

__all__ = (
    "PROGRESS_DIR_PREFIX",
    "PROGRESS_ROOT_ENV",
    "Hang",
    "ProgressDirectory",
    "RoundProgress",
    "blame_grace",
    "hang_failures",
    "last_progress_ns",
    "open_progress_directory",
    "progress_directory",
    "reblame",
    "remove_empty_files",
    "report_hang",
    "stacks_env",
    "stacks_files",
    "sweep_progress_directories",
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
    #: The other workers past their deadline, least advanced first (``peers`` empty).
    #: In a collective they usually wait on this one, the root cause.
    peers: tuple[Hang, ...] = ()

    @property
    def workers(self) -> tuple[Hang, ...]:
        """Every worker past its deadline, the root cause (least advanced) first."""
        return (self, *self.peers)

    def describe_worker(self) -> str:
        """This worker alone: rank, pid, section, step, rule and lateness."""
        d = self.deadline
        where = f" in section {d.section!r}" if d.section else " outside any section"
        late = (self.detected_ns - d.at_ns) / 1e6
        what = {
            "initial": "no heartbeat since it started",
            "heartbeat": "no heartbeat",
            "section": "stuck",
            "out-of-section": "no section entered",
        }[d.rule]
        step = f" at step {self.snapshot.step}" if self.snapshot.step >= 0 else ""
        return (
            f"local_rank {self.local_rank} (pid {self.pid}) hung{where}{step}:"
            f" {what} for {d.timeout:g} s ({d.rule} timeout"
            f" {d.timeout:g} s; noticed {late:.1f} ms after the deadline)"
        )

    def describe(self) -> str:
        """The root cause, then every other worker past its deadline."""
        if not self.peers:
            return self.describe_worker()
        others = "; ".join(p.describe_worker() for p in self.peers)
        return (
            f"{self.describe_worker()}; root cause: the least advanced of"
            f" {len(self.peers) + 1} workers past their deadline (lowest step, then outside"
            f" a collective, then oldest heartbeat); also past their deadline: {others}"
        )


class RoundProgress:
    """The progress files of one round's workers (one attempt).

    ``RoundProgress(directory, attempt, local_ranks, stacks_files, timeouts)`` creates
    the files; :meth:`env` is what each worker needs in its environment; call
    :meth:`started` right after the workers started; :meth:`close` unmaps the files.
    ``dump_stacks=False`` (steps only, for the goodput ledger): the workers are not asked
    to dump their stacks on our signal.
    """

    def __init__(
        self,
        directory: str,
        attempt: int,
        stacks_files: Mapping[int, str],
        timeouts: ProgressTimeouts,
        dump_stacks: bool = True,
    ) -> None:
        self.timeouts = timeouts
        self.dump_stacks = dump_stacks
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
        env = {FILE_ENV: self.files[local_rank].path}
        if self.dump_stacks:
            env.update(stacks_env(self.stacks_files[local_rank]))
        return env

    def started(self, pids: Mapping[int, int]) -> None:
        """The workers run now (their initial timeout counts from here)."""
        self.pids = dict(pids)
        self.started_ns = time.monotonic_ns()

    def snapshots(self) -> dict[int, ProgressSnapshot]:
        return {rank: f.snapshot() for rank, f in self.files.items()}

    async def wait_for_hang(self, exited: Callable[[], Collection[int]] = tuple) -> Hang:
        """Return the workers past their deadline; sleeps until deadlines only.

        Once a deadline passed, the workers whose own deadline follows within
        :func:`blame_grace` of it are waited for (in a collective the peers of a hung
        worker stop too, a moment later), then every worker past its deadline is
        returned, the least advanced (lowest step, then oldest heartbeat) as the root
        cause and the others as its ``peers``. ``exited()`` names the local ranks that
        already exited (never judged: a worker that finished early is not hung).
        Cancellation: stops waiting at once.
        """
        recheck = int(self.timeouts.shortest() * 1e9)
        collect_until: int | None = None
        while True:
            now = time.monotonic_ns()
            wake = now + recheck
            oldest = -1
            gone = exited()
            past: dict[int, tuple[ProgressSnapshot, ProgressDeadline]] = {}
            ahead: list[int] = []
            for rank, progress in self.files.items():
                if rank in gone:
                    continue
                snap = progress.snapshot()
                deadline = progress_deadline(snap, self.timeouts, self.started_ns)
                if deadline is None:
                    continue
                if deadline.at_ns <= now:
                    past[rank] = (snap, deadline)
                    continue
                ahead.append(deadline.at_ns)
                if snap.beats:
                    # Lateness: how much of its heartbeat timeout the worker used up.
                    oldest = max(oldest, (now - snap.last_beat_ns) // 1_000_000)
                wake = min(wake, deadline.at_ns)
            if past:
                if collect_until is None:
                    first = min(past.values(), key=lambda p: p[1].at_ns)[1]
                    collect_until = first.at_ns + blame_grace(first.timeout)
                soon = [at for at in ahead if at <= collect_until]
                if not soon:
                    return self._hang(past, now)
                wake = max(soon)
            else:
                collect_until = None  # the late worker moved on: not a hang after all
            if oldest >= 0:
                put_metric("progress.heartbeat_age_ms", oldest)
            await anyio.sleep(max(0.0, (wake - time.monotonic_ns()) / 1e9))

    def _hang(
        self, past: Mapping[int, tuple[ProgressSnapshot, ProgressDeadline]], now: int
    ) -> Hang:
        at = time.time()
        hung = [
            Hang(rank, self.pids.get(rank, -1), d, snap, now, self.stacks_files.get(rank), None, at)
            for rank, (snap, d) in past.items()
        ]
        return _ordered(hung, {})

    def close(self) -> None:
        """Unmap the files and remove the stacks files nothing was written to."""
        for progress in self.files.values():
            progress.close()
        remove_empty_files(self.stacks_files.values())


def _ordered(hung: Iterable[Hang], stacks: Mapping[int, str | None]) -> Hang:
    """The root cause (see :func:`~aelastic.agent._blame.blame_order`) with the others as peers."""
    by_rank = {h.local_rank: h for h in hung}
    order = blame_order(
        [
            Suspect(
                h.local_rank,
                h.snapshot.step,
                last_progress_ns(h.snapshot),
                in_collective(stacks.get(h.local_rank)),
            )
            for h in by_rank.values()
        ]
    )
    root, *peers = (dataclasses.replace(by_rank[r], peers=()) for r in order)
    return dataclasses.replace(root, peers=tuple(peers))


def reblame(hang: Hang, stacks: Mapping[int, str | None]) -> Hang:
    """``hang`` reordered with what the workers' stacks say (``{local_rank: text}``).

    At the same step a worker inside a collective waits on one that is not: that one
    becomes the root cause (:func:`~aelastic.agent._blame.blame_order`). Keeps
    ``stacks_captured``.
    """
    return dataclasses.replace(_ordered(hang.workers, stacks), stacks_captured=hang.stacks_captured)


def _read_stacks(path: str | None) -> str | None:
    """The first 256 KiB of a stacks file (None: none, or unreadable); a small local read."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return f.read(256 * 1024).decode(errors="replace")
    except OSError:
        return None


def stacks_env(path: str) -> dict[str, str]:
    """A worker's environment asking it to dump its stacks to ``path`` on our signal.

    Also creates the worker's flight recorder trigger next to ``path`` and names it
    (:func:`~aelastic.agent._flight_recorder.flight_recorder_env`).
    """
    return {
        STACKS_FILE_ENV: path,
        STACKS_SIGNAL_ENV: str(STACKS_SIGNAL),
        **flight_recorder_env(path),
    }


def remove_empty_files(paths: Iterable[str]) -> None:
    """Remove the (stacks) files nothing was written to, and their flight recorder
    triggers; never raises."""
    for path in paths:
        remove_trigger(path)
        with contextlib.suppress(OSError):
            if os.stat(path).st_size == 0:
                os.remove(path)


def blame_grace(timeout: float) -> int:
    """How long (ns) after a first deadline the workers due right after it are waited for.

    A quarter of the first deadline's timeout, at most 1 s: a collective's peers stop
    within one step of the hung worker, while a healthy worker's deadline lies a
    whole timeout ahead of its latest heartbeat.
    """
    return int(min(1.0, 0.25 * timeout) * 1e9)


def last_progress_ns(snapshot: ProgressSnapshot) -> int:
    """The latest sign of progress: heartbeat, section entry or exit (monotonic ns)."""
    return max(snapshot.last_beat_ns, snapshot.section_ns, snapshot.section_exit_ns)


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


#: Where the agent puts its progress directory instead of ``/dev/shm`` (tests: a private root).
PROGRESS_ROOT_ENV = "AELASTIC_PROGRESS_ROOT"
#: The name of every agent's progress directory, ``aelastic_progress_<random>``.
PROGRESS_DIR_PREFIX = "aelastic_progress_"


def progress_directory() -> str:
    """Where progress directories go: ``$AELASTIC_PROGRESS_ROOT`` (created), else
    ``/dev/shm`` when usable (pure memory), else the temp dir."""
    chosen = os.environ.get(PROGRESS_ROOT_ENV)
    if chosen:
        os.makedirs(chosen, exist_ok=True)
        return chosen
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()


def sweep_progress_directories() -> list[str]:
    """Remove the progress directories whose agent died (SIGKILL, the OOM killer); their
    paths. Blocking (a listing of the root, a few system calls per directory); never raises.
    A live agent's directory, and one made before directories had an owner, stay."""
    try:
        root = progress_directory()
    except OSError:
        return []
    return sweep_abandoned(root, PROGRESS_DIR_PREFIX)


def open_progress_directory() -> ProgressDirectory:
    """Free what killed agents left (:func:`sweep_progress_directories`, logged), then
    claim this agent's :class:`ProgressDirectory`. Blocking: run it in a thread."""
    freed = sweep_progress_directories()
    if freed:
        log.warning("removed progress directories that killed agents left behind: %s", freed)
    return ProgressDirectory()


class ProgressDirectory:
    """This agent's progress directory, locked while it lives (:mod:`aelastic._owned_dirs`):
    if the agent is killed, the next agent's :func:`sweep_progress_directories` frees it.

    Creating it costs a few system calls on tmpfs (``OSError`` if it cannot be made);
    :meth:`cleanup` removes it with its files and drops the lock (idempotent, never raises).
    """

    def __init__(self) -> None:
        self.name, self._lock = claim(progress_directory(), PROGRESS_DIR_PREFIX)

    def cleanup(self) -> None:
        if self._lock >= 0:
            lock, self._lock = self._lock, -1
            release(self.name, lock)


def hang_failures(hang: Hang, exitcodes: Mapping[int, int]) -> dict[int, ProcessFailure]:
    """``{local_rank: ProcessFailure}`` of every hung worker, each saying "hung" and where.

    The root cause gets the earliest failure time (so a summary shows it as the root
    cause), the others follow in blame order, each naming the root cause.
    ``exitcodes``: the stopped workers' exit codes (SIGKILL when missing).
    """
    root = hang.local_rank
    failures = {}
    now = time.time()
    for order, worker in enumerate(hang.workers):
        failure = ProcessFailure(
            local_rank=worker.local_rank,
            pid=worker.pid,
            exitcode=exitcodes.get(worker.local_rank, -signal.SIGKILL),
            error_file=None,
            exit_time=now + order * 1e-6,
        )
        stacks = (
            f"Stacks of every thread: {worker.stacks_file}"
            if hang.stacks_captured and worker.local_rank in hang.stacks_captured
            else "No stacks could be captured (no faulthandler registered, py-spy not installed)."
        )
        dumps = written_dumps(worker.stacks_file) if worker.stacks_file else []
        if dumps:
            stacks += f" torch's flight recorder: {', '.join(dumps)}"
        blame = (
            ""
            if not hang.peers
            else " Root cause: this worker, the least advanced past its deadline."
            if worker.local_rank == root
            else f" Probably waiting on local_rank {root}, the least advanced (root cause)."
        )
        stopped = f"worker {worker.describe_worker()}; the agent stopped it."
        failure.message = f"{stopped}{blame} {stacks}"
        failure.error_file_data = {
            "message": failure.message,
            "errorTraits": {"category": "hang", "retryability": "True"},
        }
        failures[worker.local_rank] = failure
    return failures


async def report_hang(
    hang: Hang,
    progress: RoundProgress,
    emit: Callable[[str, Mapping[str, Any]], None],
) -> Hang:
    """Capture every local worker's stacks (before anything is stopped), log and record.

    Returns ``hang`` with ``stacks_captured`` filled in and its root cause decided again
    with the stacks (:func:`reblame`: at the same step, the worker outside a collective).
    Records the ``aelastic.progress.hang`` event (naming that root cause) through
    ``emit(name, metadata)`` (the agent stamps the time, run id, host and ranks) and the
    ``progress.hangs`` / ``progress.stacks_captured`` metrics.

    Bounded by the capture's own timeouts (1 s per worker, py-spy 5 s). Errors: none
    raised for a worker that is gone or cannot be dumped (it is left out of
    ``stacks_captured``). Cancellation: stops waiting for the dumps; nothing is recorded.
    """
    log.error(
        "local rank(s) %s past their progress deadline; capturing the stacks of every local worker",
        ",".join(str(w.local_rank) for w in hang.workers),
    )
    targets = {
        rank: (pid, progress.stacks_files[rank])
        for rank, pid in progress.pids.items()
        if rank in progress.stacks_files
    }
    captured = await capture_stacks(targets)
    texts = {w.local_rank: _read_stacks(w.stacks_file) for w in hang.workers}
    hang = reblame(dataclasses.replace(hang, stacks_captured=captured), texts)
    log.error("%s", hang.describe())
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
            "hung_local_ranks": ",".join(str(w.local_rank) for w in hang.workers),
        },
    )
    log.error(
        "stacks written for local ranks %s (%s)",
        sorted(captured),
        ", ".join(sorted({progress.stacks_files[r] for r in captured})) or "none",
    )
    return hang

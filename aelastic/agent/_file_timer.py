"""torchrun's file-based expiration timer, served on the agent's event loop.

With ``TORCHELASTIC_ENABLE_FILE_TIMER=1`` in the agent's environment, the agent
creates a FIFO (``TORCHELASTIC_TIMER_FILE`` if set, else a fresh temp path), passes
its path to the workers as ``TORCHELASTIC_TIMER_FILE`` and serves torch's protocol
(``torch.distributed.elastic.timer.FileTimerClient``): each request is one JSON line
``{"version": 1, "pid", "scope_id", "expiration_time" (time.time() seconds; < 0:
release), "signal"}`` written by a client that opens the FIFO non-blocking. When a
timer expires, the worker ``pid`` gets its ``signal`` (the first expired timer with a
signal > 0, in expiration order) and all its timers are dropped, as in torch.

Before a worker is signalled, ``before_kill(pid, scopes)`` (the agent's) captures the
stacks of every local worker, as for a heartbeat hang (pytorch #122694): the
expiry's failure then says "hung" with the timer's scope and where the stacks are.

Differences from torch's ``FileTimerServer``: no watchdog thread and no 0.1 s polling
(the FIFO is read when readable, expiries are slept to), and the agent does not
SIGKILL itself after reaping a worker: the worker's death is a failure like any
other (restart within ``max_restarts``). Torch is never imported.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager, suppress
from typing import Any

import anyio

from .._dataclass import dataclass
from .._features import FILE_TIMER_ENV
from ..errors import ProcessFailure
from ..errors._failure import NOT_AVAILABLE
from ..metrics import put_metric

__all__ = (
    "ENABLE_ENV",
    "TIMER_FILE_ENV",
    "FileTimerServer",
    "explain_expired",
    "serve_file_timer",
)

log = logging.getLogger("aelastic.agent")

ENABLE_ENV = FILE_TIMER_ENV
TIMER_FILE_ENV = "TORCHELASTIC_TIMER_FILE"
#: torch's limit: a request must fit in one atomic pipe write.
_MAX_LINE = 4096


@dataclass(frozen=True)
class TimerRequest:
    pid: int
    scope_id: str
    expiration_time: float
    signal: int


def parse_request(line: bytes) -> TimerRequest:
    """One JSON line of torch's ``FileTimerRequest``; ValueError when malformed."""
    try:
        obj = json.loads(line)
        return TimerRequest(
            int(obj["pid"]), str(obj["scope_id"]), float(obj["expiration_time"]), int(obj["signal"])
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a FileTimerRequest: {line[:200]!r} ({exc})") from None


#: ``before_kill(pid, scopes)``: awaited before an expired worker is signalled; returns
#: where that worker's stacks were written (None: not captured).
BeforeKill = Callable[[int, list[str]], Awaitable[str | None]]


@dataclass(frozen=True)
class Expiry:
    """A worker whose timers expired: signal it with ``signal`` (scopes in expiry order)."""

    pid: int
    scopes: list[str]
    signal: int


class FileTimerServer:
    """The timers of every local worker; fed by :meth:`feed`, expired by :meth:`run_expiry`.

    ``emit(name, metadata)`` records an agent event (the agent stamps its identity);
    ``before_kill`` (optional) is awaited before each expired worker is signalled.
    Only the current workers can be signalled: the agent sets :attr:`worker_pids` when
    it starts them, and a timer of any other pid (0 or -1 would hit the agent's process
    group or every process; another process; a worker of an earlier round) is dropped.
    A process in a worker's process group (each worker leads its own) counts as that
    worker, like a child of a shell entrypoint.
    """

    def __init__(
        self,
        emit: Callable[[str, Mapping[str, Any]], None],
        before_kill: BeforeKill | None = None,
    ) -> None:
        self.timers: dict[tuple[int, str], TimerRequest] = {}
        self._emit = emit
        self._before_kill = before_kill
        #: ``{pid: stacks file}`` of the reaped workers whose stacks were captured.
        self.stacks: dict[int, str] = {}
        self._changed = anyio.Event()
        self._partial = b""
        #: ``{pid: [scope_id, ...]}`` of the workers this server signalled.
        self.reaped: dict[int, list[str]] = {}
        #: The FIFO's path (set by :func:`serve_file_timer`).
        self.path = ""
        #: The pids of the running workers (set by the agent each round).
        self.worker_pids: frozenset[int] = frozenset()

    def feed(self, data: bytes) -> None:
        """Register the complete request lines in ``data`` (a partial line waits)."""
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > _MAX_LINE:
            log.warning("file timer: dropping an over-long request line")
            self._partial = b""
        for line in lines:
            if not line.strip():
                continue
            try:
                request = parse_request(line)
            except ValueError as exc:
                log.warning("file timer: %s", exc)
                continue
            key = (request.pid, request.scope_id)
            if request.pid <= 0:
                log.warning("file timer: ignoring a request for pid %s", request.pid)
                continue
            if request.expiration_time < 0:
                self.timers.pop(key, None)
            else:
                self.timers[key] = request
        self._changed.set()

    def take_expired(self, now: float) -> list[Expiry]:
        """Drop the timers of every worker with an expired timer (torch's rules); return
        the current workers to signal."""
        expired: dict[int, list[TimerRequest]] = {}
        for request in self.timers.values():
            if request.expiration_time <= now:
                expired.setdefault(request.pid, []).append(request)
        due = []
        for pid, requests in expired.items():
            requests.sort(key=lambda r: r.expiration_time)
            scopes = [r.scope_id for r in requests]
            signalled = next((r for r in requests if r.signal > 0), None)
            for key in [k for k in self.timers if k[0] == pid]:
                del self.timers[key]
            if signalled is None:
                log.info("file timer: %s expired for pid %s (no signal: not reaped)", scopes, pid)
            elif not self._is_worker(pid):
                log.warning(
                    "file timer: %s expired for pid %s, which is not a current worker:"
                    " not signalled",
                    scopes,
                    pid,
                )
            else:
                due.append(Expiry(pid, scopes, signalled.signal))
        return due

    def expire(self, now: float) -> None:
        """Signal every worker with an expired timer at once (no stacks captured)."""
        for expiry in self.take_expired(now):
            self.kill(expiry)

    def kill(self, expiry: Expiry) -> None:
        """Signal one expired worker and record it; a worker already gone is skipped."""
        pid, scopes = expiry.pid, expiry.scopes
        try:
            os.kill(pid, expiry.signal)
        except ProcessLookupError:
            return
        except OSError as exc:
            log.error("file timer: could not signal pid %s: %s", pid, exc)
            return
        self.reaped[pid] = scopes
        log.error(
            "file timer: scope(s) %s of worker pid %s expired; sent signal %s",
            scopes,
            pid,
            expiry.signal,
        )
        put_metric("file_timer.expired", 1)
        self._emit(
            "aelastic.file_timer.expired",
            {
                "pid": pid,
                "scope_ids": ",".join(scopes),
                "signal": expiry.signal,
                "stacks_file": self.stacks.get(pid),
            },
        )

    async def _expire_capturing(self, now: float) -> None:
        """Capture the stacks (``before_kill``), then signal each expired worker."""
        for expiry in self.take_expired(now):
            if self._before_kill is not None:
                stacks = await self._before_kill(expiry.pid, expiry.scopes)
                if stacks is not None:
                    self.stacks[expiry.pid] = stacks
            self.kill(expiry)

    def _is_worker(self, pid: int) -> bool:
        if pid <= 0:
            return False
        if pid in self.worker_pids:
            return True
        try:
            return os.getpgid(pid) in self.worker_pids
        except OSError:  # gone
            return False

    async def run_expiry(self) -> None:
        """Sleep until the earliest expiration (or a new request), expire, repeat. Forever."""
        while True:
            self._changed = anyio.Event()
            if self.timers:
                soonest = min(r.expiration_time for r in self.timers.values())
                delay = soonest - time.time()
                if delay <= 0:
                    await self._expire_capturing(time.time())
                    continue
                with anyio.move_on_after(delay):
                    await self._changed.wait()
            else:
                await self._changed.wait()


async def _read_fifo(fd: int, server: FileTimerServer) -> None:
    while True:
        await anyio.wait_readable(fd)
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            continue
        if data:
            server.feed(data)


def _make_fifo(path: str | None) -> tuple[str, int, int]:
    """A fresh FIFO (replacing a stale file, as torch does) and both of our ends of it.

    Our own writer end keeps the FIFO from reporting end-of-file between clients.
    A handful of metadata calls on a local file system: done once per run. Raises
    OSError; then nothing is left behind (no open end, no FIFO).
    """
    if not path:
        import uuid  # off the launch path: only when the timer is enabled

        path = os.path.join(tempfile.gettempdir(), f"watchdog_timer_{uuid.uuid4()}")
    if os.path.lexists(path):
        os.remove(path)
    os.mkfifo(path, 0o600)
    read_fd = -1
    try:
        read_fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        write_fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except BaseException:
        if read_fd >= 0:
            os.close(read_fd)
        with suppress(OSError):
            os.remove(path)
        raise
    return path, read_fd, write_fd


def explain_expired(failures: Iterable[ProcessFailure], server: FileTimerServer) -> None:
    """Say "hung: expiration timer expired" in the failures of workers ``server`` killed.

    Without it a SIGKILLed worker reads like an OOM kill. The message names the
    timer's scope(s) and where the worker's stacks were written. Failures with an
    error file (the worker recorded its own error) are left as they are.
    """
    for failure in failures:
        scopes = server.reaped.get(failure.pid)
        if scopes is None or failure.error_file != NOT_AVAILABLE:
            continue
        path = server.stacks.get(failure.pid)
        stacks = (
            f"Stacks of every thread: {path}"
            if path is not None
            else "No stacks could be captured (no faulthandler registered, py-spy not installed)."
        )
        failure.message = (
            f"worker hung in scope {', '.join(repr(s) for s in scopes)}: its expiration"
            " timer(s) (torch.distributed.elastic.timer, TORCHELASTIC_ENABLE_FILE_TIMER=1)"
            f" expired; the agent killed it with {failure.signal_name()}. {stacks}"
        )
        failure.error_file_data = {
            "message": failure.message,
            "errorTraits": {"category": "hang", "retryability": "True"},
        }


@asynccontextmanager
async def serve_file_timer(
    emit: Callable[[str, Mapping[str, Any]], None],
    path: str | None = None,
    before_kill: BeforeKill | None = None,
) -> AsyncIterator[FileTimerServer]:
    """Create the FIFO, serve torch's timer protocol until the block exits.

    Yields the server (``server.path`` is the FIFO's path). ``before_kill``: see
    :class:`FileTimerServer`.

    Cancellation-safe: leaving the block stops serving, closes the FIFO and removes it.

    Raises:
        OSError: the FIFO cannot be created at ``path``.
    """
    path, read_fd, write_fd = _make_fifo(path)
    server = FileTimerServer(emit, before_kill)
    server.path = path
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_read_fifo, read_fd, server)
            tg.start_soon(server.run_expiry)
            log.info("serving torch's file timer at %s", path)
            try:
                yield server
            finally:
                tg.cancel_scope.cancel()
    finally:
        os.close(write_fd)
        os.close(read_fd)
        with suppress(OSError):
            os.remove(path)

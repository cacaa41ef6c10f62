"""Console writers: worker lines reach the agent's stdout/stderr without ever blocking the loop.

A console (the launcher's stdout or stderr) may be a pipe nobody reads fast enough: a
log collector falling behind, a ``| less`` left open. A blocking write there would
freeze the agent's event loop, and with it signals, the rendezvous and the reading of
every worker's pipe (so the workers would block too and their log files stop).

Here :meth:`ConsoleWriter.write` only appends to a bounded in-memory queue; one daemon
thread per console (``aelastic-console-stdout``/``-stderr``, started on demand, gone
after a second idle) does the blocking writes. When the queue would exceed its bound
the *oldest* queued chunks are dropped (each chunk is whole prefixed lines, so no line
is cut), counted, and reported once per stall: a warning when dropping starts, one
with the total when the console has caught up again (or at interpreter exit), and an
``aelastic.console.dropped`` event. Log files never go through here, so they stay
complete.

The stream is looked up at write time (``sys.stdout``/``sys.stderr``), so an embedding
application's redirection applies; with a real file descriptor the thread writes it with
``os.write`` (never holding the Python stream's buffer lock, so the loop's own prints do
not wait behind a stalled write), else through the stream's ``write``.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import os
import select
import sys
import threading
import time
from typing import IO, Any, Literal

import anyio
import anyio.to_thread

from ..events import Event, EventSource, record

__all__ = ("ConsoleName", "ConsoleWriter", "console_writer", "wait_consoles_written")

log = logging.getLogger("aelastic.workers")

ConsoleName = Literal["stdout", "stderr"]

#: Bytes a console may hold queued before the oldest are dropped.
DEFAULT_LIMIT = 4 << 20
#: A console that took no byte for this long is stalled: waiting for it gives up.
STALL_AFTER = 0.25
#: How long the writer thread waits for more before it ends.
_LINGER = 1.0
#: Most bytes handed to one ``os.write`` (a pipe's buffer: progress stays visible).
_MAX_WRITE = 1 << 16
#: How long interpreter exit waits for the consoles to take what is queued.
_EXIT_TIMEOUT = 5.0


class ConsoleWriter:
    """The bounded queue of one console and the thread that writes it.

    ``enqueued`` and ``done`` count bytes ever queued and ever written or dropped;
    ``dropped`` counts the dropped ones. Thread-safe; :meth:`write` never blocks.
    """

    def __init__(self, name: ConsoleName, limit: int = DEFAULT_LIMIT) -> None:
        self.name: ConsoleName = name
        self.limit = limit
        self.enqueued = 0
        self.done = 0
        self.dropped = 0
        self._queue: collections.deque[bytes] = collections.deque()
        self._queued = 0
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._busy_since: float | None = None  # a write in progress started then
        self._inflight = 0  # bytes of that write
        self._unreported = 0  # dropped bytes not yet in a summary
        self._warned = False
        self._broken: object = None  # the stream a write failed on: skipped while current

    def write(self, data: bytes) -> int:
        """Queue ``data``; returns the ``enqueued`` mark to wait for with :meth:`wait_done`.

        Never blocks, never raises: over the bound, the oldest queued chunks go.
        """
        with self._cond:
            self.enqueued += len(data)
            if self._broken is not None and self._broken is self._stream():
                self.done += len(data)
                return self.enqueued
            self._queue.append(data)
            self._queued += len(data)
            while self._queued > self.limit and len(self._queue) > 1:
                self._drop(self._queue.popleft())
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"aelastic-console-{self.name}", daemon=True
                )
                self._thread.start()
            else:
                self._cond.notify_all()
            return self.enqueued

    def _drop(self, chunk: bytes) -> None:
        # Called with the lock held.
        self._queued -= len(chunk)
        self.done += len(chunk)
        self.dropped += len(chunk)
        self._unreported += len(chunk)
        self._cond.notify_all()

    def stalled(self) -> bool:
        """True while one write has been waiting on the console for ``STALL_AFTER``."""
        with self._cond:
            return self._stalled_locked()

    def _stalled_locked(self) -> bool:
        busy = self._busy_since
        return busy is not None and time.monotonic() - busy >= STALL_AFTER

    def wait_done(self, mark: int, timeout: float) -> bool:
        """Block up to ``timeout`` until ``done >= mark`` or the console is stalled.

        True when there is nothing left to wait for (written, dropped, or stalled).
        For threads and exit handlers; the loop uses :func:`wait_consoles_written`.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.done < mark and not self._stalled_locked():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, STALL_AFTER / 2))
            return True

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._queue:
                    self._report_locked()  # releases the lock meanwhile: look again
                    if not self._queue:
                        self._cond.wait(_LINGER)
                    if not self._queue:
                        self._thread = None
                        return
                chunks: list[bytes] = []
                size = 0
                while self._queue and (not chunks or size + len(self._queue[0]) <= _MAX_WRITE):
                    chunk = self._queue.popleft()
                    chunks.append(chunk)
                    size += len(chunk)
                self._queued -= size
                self._busy_since = time.monotonic()
                self._inflight = size
                warn = self._unreported and not self._warned
                self._warned = self._warned or bool(warn)
            if warn:
                log.warning(
                    "the console (%s) is not keeping up with the workers' output: dropping the"
                    " oldest lines queued for it (the log files stay complete)",
                    self.name,
                )
            broken = self._write(b"".join(chunks))
            with self._cond:
                self._busy_since = None
                self._inflight = 0
                self.done += size
                if broken is not None:  # skip this stream until sys.std* changes
                    self._broken = broken
                    self.done += self._queued
                    self._queue.clear()
                    self._queued = 0
                self._cond.notify_all()

    def _report_locked(self) -> None:
        if not self._unreported:
            return
        dropped, self._unreported, self._warned = self._unreported, 0, False
        # Logging and recording may take the console's own lock: not under ours.
        self._cond.release()
        try:
            report_dropped(self.name, dropped)
        finally:
            self._cond.acquire()

    def report(self) -> None:
        """Report the dropped bytes not reported yet, counting what is still queued or
        in a stalled write as dropped (at exit: it will never show)."""
        with self._cond:
            lost = self._queued
            self.dropped += lost + self._inflight
            self._unreported += lost + self._inflight
            self._queue.clear()
            self.done += lost
            self._queued = 0
            self._report_locked()

    def _stream(self) -> IO[Any] | None:
        return sys.stdout if self.name == "stdout" else sys.stderr

    def _write(self, data: bytes) -> object:
        """Write ``data`` to the console as it is now; the stream if that failed, else None."""
        stream = self._stream()
        if stream is None:  # pythonw, or a daemon that closed its console
            return None
        try:
            try:
                fd = stream.fileno()
            except (OSError, ValueError, AttributeError):
                fd = -1  # no descriptor: a StringIO, a capture, a GUI console
            if fd >= 0:
                _write_fd(fd, data)
            else:
                buffer = getattr(stream, "buffer", None)
                if buffer is not None:
                    buffer.write(data)
                    buffer.flush()
                else:
                    stream.write(data.decode(errors="replace"))
                    stream.flush()
        except (OSError, ValueError, AttributeError) as exc:
            log.error(
                "cannot write worker output to the %s console (%s); the log files only, until"
                " sys.%s changes",
                self.name,
                exc,
                self.name,
            )
            return stream
        return None


def _write_fd(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:  # someone made the descriptor non-blocking
            select.select([], [fd], [], 1.0)
            continue
        view = view[written:]


def report_dropped(name: ConsoleName, dropped: int) -> None:
    """Log and record (``aelastic.console.dropped``) that ``dropped`` bytes never showed."""
    log.warning(
        "%d bytes of worker output were dropped from the console (%s) because it was not"
        " keeping up; the log files have them",
        dropped,
        name,
    )
    with contextlib.suppress(Exception):
        record(
            Event(
                "aelastic.console.dropped",
                source=EventSource.AGENT,
                metadata={"console": name, "dropped_bytes": dropped},
            )
        )


_writers: dict[str, ConsoleWriter] = {}
_writers_lock = threading.Lock()


def console_writer(name: ConsoleName) -> ConsoleWriter:
    """The process-wide writer of console ``name``."""
    writer = _writers.get(name)
    if writer is None:
        with _writers_lock:
            writer = _writers.setdefault(name, ConsoleWriter(name))
    return writer


async def wait_consoles_written() -> None:
    """Wait until what was queued for the consoles so far is written, dropped or stalled.

    Returns at once for a stalled console (its lines stay queued and may be dropped
    later). Cancellation returns at once (the helper thread ends within
    ``STALL_AFTER``); the caller bounds the wait.
    """
    for writer in list(_writers.values()):
        mark = writer.enqueued
        while not await anyio.to_thread.run_sync(
            writer.wait_done, mark, STALL_AFTER, abandon_on_cancel=True
        ):
            pass


def _exit_flush() -> None:
    for writer in list(_writers.values()):
        writer.wait_done(writer.enqueued, _EXIT_TIMEOUT)
        writer.report()


def _after_fork_in_child() -> None:
    # The parent's writer threads do not exist here, and a lock may have been held.
    global _writers_lock
    _writers.clear()
    _writers_lock = threading.Lock()


atexit.register(_exit_flush)
os.register_at_fork(after_in_child=_after_fork_in_child)

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

__all__ = (
    "ConsoleLogHandler",
    "ConsoleName",
    "ConsoleWriter",
    "console_writer",
    "wait_consoles_written",
)

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

    ``enqueued`` counts bytes ever queued, ``done`` those written, dropped or
    skipped, ``dropped`` those dropped because the console was too slow.
    :meth:`write` (the loop's side) never blocks and takes no lock in the steady
    state: it appends to a deque and drops from its head, and the writer thread
    pops from it; each counter has one thread that writes it. A lock is taken
    only to start the thread, and an event is set only to wake an idle one.
    """

    def __init__(self, name: ConsoleName, limit: int = DEFAULT_LIMIT) -> None:
        self.name: ConsoleName = name
        self.limit = limit
        # written by the loop's side (write) only
        self.enqueued = 0
        self.dropped = 0
        self._skipped = 0
        # written by the writer thread only
        self._handed = 0  # popped by the writer
        self._written = 0  # written, or discarded because the stream failed
        self._reported = 0  # dropped bytes already reported
        self._warned_at = -1  # _reported when the last "not keeping up" warning went out
        self._busy_since: float | None = None  # a write in progress started then
        self._inflight = 0  # bytes of that write
        self._queue: collections.deque[bytes] = collections.deque()
        self._wake = threading.Event()
        self._life = threading.Lock()  # guards starting and ending the thread
        self._thread: threading.Thread | None = None
        self._progress = threading.Condition(threading.Lock())  # for wait_done
        self._broken: object = None  # the stream a write failed on: skipped while current

    @property
    def done(self) -> int:
        return self._written + self.dropped + self._skipped

    def write(self, data: bytes) -> int:
        """Queue ``data``; returns the ``enqueued`` mark to wait for with :meth:`wait_done`.

        Never blocks, never raises: over the bound, the oldest queued chunks go.
        """
        self.enqueued += len(data)
        if self._broken is not None and self._broken is self._stream():
            self._skipped += len(data)
            return self.enqueued
        queue = self._queue
        queue.append(data)
        excess = self.enqueued - self._skipped - self.dropped - self._handed - self.limit
        while excess > 0 and len(queue) > 1:
            try:
                chunk = queue.popleft()
            except IndexError:  # the writer took it meanwhile
                break
            self.dropped += len(chunk)
            excess -= len(chunk)
        if self._thread is None:
            with self._life:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name=f"aelastic-console-{self.name}", daemon=True
                    )
                    self._thread.start()
        elif not self._wake.is_set():
            self._wake.set()
        return self.enqueued

    def stalled(self) -> bool:
        """True while one write has been waiting on the console for ``STALL_AFTER``."""
        busy = self._busy_since
        return busy is not None and time.monotonic() - busy >= STALL_AFTER

    def wait_done(self, mark: int, timeout: float) -> bool:
        """Block up to ``timeout`` until ``done >= mark`` or the console is stalled.

        True when there is nothing left to wait for (written, dropped, or stalled).
        For threads and exit handlers; the loop uses :func:`wait_consoles_written`.
        """
        deadline = time.monotonic() + timeout
        with self._progress:
            while self.done < mark and not self.stalled():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._progress.wait(min(left, STALL_AFTER / 2))
            return True

    def _run(self) -> None:
        queue = self._queue
        while True:
            self._wake.clear()
            if not queue:
                self._report()
                if not queue:
                    self._wake.wait(_LINGER)
                if not queue:
                    with self._life:
                        # End, unless a write came meanwhile: it saw this thread alive.
                        self._thread = None
                        if not queue:
                            return
                        self._thread = threading.current_thread()
                continue
            chunks: list[bytes] = []
            size = 0
            while size < _MAX_WRITE:
                try:
                    chunk = queue.popleft()
                except IndexError:
                    break
                chunks.append(chunk)
                size += len(chunk)
            if not chunks:
                continue
            self._handed += size
            self._inflight = size
            self._busy_since = time.monotonic()
            if self.dropped > self._reported and not self._warned_since_report():
                log.warning(
                    "the console (%s) is not keeping up with the workers' output: dropping the"
                    " oldest lines queued for it (the log files stay complete)",
                    self.name,
                )
            broken = self._write(b"".join(chunks))
            self._busy_since = None
            self._inflight = 0
            with self._progress:
                self._written += size
                if broken is not None:  # skip this stream until sys.std* changes
                    self._broken = broken
                    while True:
                        try:
                            chunk = queue.popleft()
                        except IndexError:
                            break
                        self._handed += len(chunk)
                        self._written += len(chunk)
                self._progress.notify_all()

    def _warned_since_report(self) -> bool:
        # One warning per stall: until the dropped bytes are reported.
        if self._warned_at == self._reported:
            return True
        self._warned_at = self._reported
        return False

    def _report(self, at_exit: bool = False) -> None:
        dropped = self.dropped - self._reported
        if dropped > 0:
            self._reported += dropped
            report_dropped(self.name, dropped, at_exit)

    def report(self) -> None:
        """Report the dropped bytes not reported yet, counting what is still queued or
        in a stalled write as dropped (at exit: it will never show). Never blocks."""
        lost = self._inflight
        while True:
            try:
                lost += len(self._queue.popleft())
            except IndexError:
                break
        self.dropped += lost
        self._report(at_exit=True)

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


def report_dropped(name: ConsoleName, dropped: int, at_exit: bool = False) -> None:
    """Log and record (``aelastic.console.dropped``) that ``dropped`` bytes never showed.

    At exit the warning goes through the stderr :class:`ConsoleWriter` (formatted
    like the root logger's first handler would) instead of ``logging``: stderr may
    be the very pipe that stalled, and exit must not wait on it.
    """
    message = (
        "%d bytes of worker output were dropped from the console (%s) because it was not"
        " keeping up; the log files have them"
    )
    if not at_exit:
        log.warning(message, dropped, name)
    elif log.isEnabledFor(logging.WARNING):
        args = (dropped, name)
        entry = log.makeRecord(log.name, logging.WARNING, __file__, 0, message, args, None)
        handler = next((h for h in logging.getLogger().handlers if h.formatter), None)
        text = handler.format(entry) if handler is not None else entry.getMessage()
        console_writer("stderr").write(text.encode(errors="replace") + b"\n")
    with contextlib.suppress(Exception):
        record(
            Event(
                "aelastic.console.dropped",
                source=EventSource.AGENT,
                metadata={"console": name, "dropped_bytes": dropped},
            )
        )


class ConsoleLogHandler(logging.Handler):
    """A ``logging`` handler that writes through the console's :class:`ConsoleWriter`.

    ``emit`` never blocks (the record joins the same bounded queue as the workers'
    lines on that console, so their order is kept); for the agent's own logging when
    its stderr may stall. Records dropped with a stalled console are counted like
    worker lines.
    """

    def __init__(self, console: ConsoleName = "stderr", level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.console: ConsoleName = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:
            self.handleError(record)
            return
        console_writer(self.console).write(text.encode(errors="replace") + b"\n")


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
    # stdout first: its report goes to stderr, which is waited for last. Each wait
    # ends at once on a stalled console, so exit never hangs on one.
    for name in ("stdout", "stderr"):
        writer = _writers.get(name)
        if writer is not None:
            writer.wait_done(writer.enqueued, _EXIT_TIMEOUT)
            writer.report()
    stderr = _writers.get("stderr")
    if stderr is not None:
        stderr.wait_done(stderr.enqueued, _EXIT_TIMEOUT)


def _after_fork_in_child() -> None:
    # The parent's writer threads do not exist here, and a lock may have been held.
    global _writers_lock
    _writers.clear()
    _writers_lock = threading.Lock()


atexit.register(_exit_flush)
os.register_at_fork(after_in_child=_after_fork_in_child)

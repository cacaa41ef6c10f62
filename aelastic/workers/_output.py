"""Worker output that passes through the agent: log file bytes and prefixed console lines."""

from __future__ import annotations

import logging
import os

from ._console import ConsoleName, console_writer

__all__ = ("ConsoleName", "Sink")

log = logging.getLogger("aelastic.workers")

#: A console line longer than this is flushed even without a newline.
_MAX_PENDING = 1 << 16


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class Sink:
    """Where one piped stream of one worker goes: a log file and/or the console.

    The file gets the bytes as they come (one bounded ``os.write`` per chunk
    read from the pipe, to the page cache); the console gets whole lines with
    the prefix (a partial last line is flushed at end of stream or past 64 KiB)
    through the process-wide :class:`~._console.ConsoleWriter`, which never
    blocks: a stalled console drops its oldest queued lines (counted and
    reported), never the file's bytes, and never holds up the pipe. With
    ``copy_fd`` and ``needles`` (``--duplicate-std*-filters``), each console
    line containing any needle is also appended, prefixed, to ``copy_fd``. A
    write error disables that destination with one log message; nothing here
    raises into the loop. Callers wait for the console with
    :func:`~._console.wait_consoles_written` (bounded, gives up on a stall).
    """

    def __init__(
        self,
        file_fd: int | None,
        console: ConsoleName | None,
        prefix: bytes,
        copy_fd: int | None = None,
        needles: tuple[bytes, ...] = (),
    ) -> None:
        self.file_fd = file_fd
        self.console = console
        self.prefix = prefix
        self.copy_fd = copy_fd if needles else None
        self.needles = needles
        self._pending = b""

    def feed(self, data: bytes) -> None:
        if self.file_fd is not None:
            try:
                _write_all(self.file_fd, data)
            except OSError as exc:
                log.error("cannot write worker output to its log file (%s); dropping it", exc)
                self.file_fd = None
        if self.console is None and self.copy_fd is None:
            return
        pending = self._pending + data if self._pending else data
        head, sep, tail = pending.rpartition(b"\n")
        if sep:
            self._pending = tail
            self._emit(head)
        else:
            self._pending = pending
        if len(self._pending) > _MAX_PENDING:
            line, self._pending = self._pending, b""
            self._emit(line)

    def finish(self) -> None:
        if self._pending:
            line, self._pending = self._pending, b""
            self._emit(line)

    def _emit(self, lines: bytes) -> None:
        """Send ``lines`` (newline-separated, without the last newline) on, prefixed."""
        if self.copy_fd is not None:
            self._copy(lines.split(b"\n"))
        if self.console is None:
            return
        prefix = self.prefix
        # One C-level pass per chunk, not one Python step per line: a 256 KiB read of
        # short lines costs well under a millisecond of the loop.
        data = prefix + lines.replace(b"\n", b"\n" + prefix) + b"\n" if prefix else lines + b"\n"
        console_writer(self.console).write(data)

    def _copy(self, lines: list[bytes]) -> None:
        assert self.copy_fd is not None
        needles, prefix = self.needles, self.prefix
        data = b"".join(prefix + line + b"\n" for line in lines if any(n in line for n in needles))
        if not data:
            return
        try:
            _write_all(self.copy_fd, data)
        except OSError as exc:
            log.error("cannot write filtered worker output (%s); dropping it", exc)
            self.copy_fd = None

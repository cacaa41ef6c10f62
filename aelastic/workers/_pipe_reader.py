"""Read a worker's output pipe on any anyio backend and hand the bytes to its Sink.

The agent owns the read end of each piped worker stream (non-blocking); one task
per pipe waits with :func:`anyio.wait_readable` and reads with ``os.read``, at
most :data:`CHUNK` bytes per turn of the event loop, so a worker printing as
fast as it can never monopolises the loop, and the pipe is emptied as fast as
the loop turns, so a worker never blocks on its output while the agent runs.
"""

from __future__ import annotations

import logging
import os
from typing import Protocol

import anyio
import anyio.lowlevel

__all__ = ("CHUNK", "OutputPipe", "Feedable")

log = logging.getLogger("aelastic.workers")

#: The most bytes read from one pipe per turn of the event loop.
CHUNK = 1 << 16


class Feedable(Protocol):
    """What a pipe's bytes go to (:class:`~._output.Sink`): both calls never block or raise."""

    def feed(self, data: bytes) -> None: ...

    def finish(self) -> None: ...


class OutputPipe:
    """One worker stream piped into the agent: the pipe, and its reader's end.

    :meth:`open` makes the pipe (``(self, write_end)``; the caller hands
    ``write_end`` to the child and closes its own copy), :meth:`pump` is the
    reader task, :meth:`close` releases the read end once the task is over.
    """

    def __init__(self, read_fd: int, sink: Feedable) -> None:
        self.fd = read_fd
        self.sink = sink
        self.done = anyio.Event()

    @classmethod
    def open(cls, sink: Feedable) -> tuple[OutputPipe, int]:
        """A new pipe feeding ``sink``: ``(pipe, write end)``; both ends close-on-exec."""
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        os.set_blocking(write_fd, True)  # the worker's stdout/stderr: blocking, as usual
        return cls(read_fd, sink), write_fd

    async def pump(self) -> None:
        """Feed the sink until end of stream; then ``sink.finish()`` and set :attr:`done`.

        Never raises; on cancellation the sink is finished (a partial last line
        is flushed) and ``done`` set as well.
        """
        sink: Feedable | None = self.sink
        try:
            while True:
                try:
                    data = os.read(self.fd, CHUNK)
                except BlockingIOError:
                    await anyio.wait_readable(self.fd)
                    continue
                except OSError as exc:
                    log.error("cannot read worker output (%s); stopping this stream", exc)
                    break
                if not data:
                    break
                if sink is not None:
                    try:
                        sink.feed(data)
                    except Exception:  # keep draining: the worker must never block on us
                        log.exception("worker output sink failed; discarding this stream")
                        sink = None
                await anyio.lowlevel.checkpoint()
        finally:
            if sink is not None:
                try:
                    sink.finish()
                except Exception:
                    log.exception("worker output sink failed at end of stream")
            self.done.set()

    def close(self) -> None:
        """Close the read end (after :meth:`pump` ended or was cancelled); idempotent."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

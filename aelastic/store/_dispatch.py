"""One task that reads every idle connection of a store server, through one epoll.

``anyio.wait_readable`` registers and removes the socket with the event loop on
every call, and a task per connection costs a task switch per request; together
they were most of the server's user-space CPU per request. A connection that is
*idle* (no partial request, no request over many keys in progress, its answers
not piling up) therefore has no task: its socket sits in the :class:`Dispatcher`'s
own epoll, registered once, and the dispatcher's single task calls the
connection's synchronous ``readable()`` for each socket that epoll reports. The
dispatcher waits on the epoll's descriptor with :func:`anyio.wait_readable`, which
every anyio backend supports, and only when no socket is ready.

A connection leaves the dispatcher (``readable()`` calls :meth:`Dispatcher.forget`)
for anything that needs to await: it then runs in a task of its own until it is
idle again and comes back with :meth:`Dispatcher.adopt`. Work between two
checkpoints is bounded: at most :data:`BATCH` sockets, one ``recv`` each, then
the task yields.

Only where :mod:`select` has ``epoll`` (Linux); elsewhere :func:`open_dispatcher`
returns ``None`` and every connection runs in a task of its own.
"""

from __future__ import annotations

import contextlib
import select
from typing import Protocol

import anyio
import anyio.lowlevel

__all__ = ("BATCH", "Dispatcher", "Readable", "open_dispatcher")

#: Sockets served between two checkpoints of the dispatcher's task.
BATCH = 32


class Readable(Protocol):
    """What the dispatcher needs of a connection."""

    def readable(self) -> None:
        """Read and serve what arrived; must not raise (a failure closes the connection)."""


class Dispatcher:
    """Serves the readable sockets of idle connections from one task (see the module).

    :meth:`adopt` and :meth:`forget` are synchronous; :meth:`run` is the task, which
    returns when :meth:`close` is called. Not thread-safe: one event loop.
    """

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._conns: dict[int, Readable] = {}

    def __len__(self) -> int:
        return len(self._conns)

    def adopt(self, conn: Readable, fd: int) -> None:
        """Serve ``conn`` (socket ``fd``) from the dispatcher's task until :meth:`forget`."""
        self._epoll.register(fd, select.EPOLLIN)
        self._conns[fd] = conn

    def forget(self, fd: int) -> None:
        """Stop serving socket ``fd`` (before it is closed, or handed to a task of its own)."""
        if self._conns.pop(fd, None) is not None:
            # OSError/ValueError: the epoll is closed (the server stopped)
            with contextlib.suppress(OSError, ValueError):
                self._epoll.unregister(fd)

    def close(self) -> None:
        """End :meth:`run` (idempotent); the connections' sockets are the server's to close."""
        self._conns.clear()
        if not self._epoll.closed:
            anyio.notify_closing(self._epoll)
            self._epoll.close()

    async def run(self) -> None:
        """Serve readable sockets until :meth:`close`; cancellable at every await."""
        epoll = self._epoll
        conns = self._conns
        try:
            while True:
                events = epoll.poll(0, BATCH)
                if not events:
                    await anyio.wait_readable(epoll)
                    continue
                for fd, _ in events:
                    conn = conns.get(fd)  # None: forgotten earlier in this batch
                    if conn is not None:
                        conn.readable()
                # other tasks (and the connections' peers) run; under load the next
                # requests arrive meanwhile, so the next poll rarely has to wait
                await anyio.lowlevel.checkpoint()
        except (anyio.ClosedResourceError, ValueError, OSError):
            if not epoll.closed:
                raise
            # closed by close(): the server stopped


def open_dispatcher() -> Dispatcher | None:
    """A new :class:`Dispatcher`, or ``None`` where epoll is not available."""
    if not hasattr(select, "epoll"):
        return None
    return Dispatcher()

"""Wake-ups that any thread may fire and that a task awaits in its own event loop.

A recorder can run in any thread (a worker thread, the dispatcher thread, a foreign event
loop, plain synchronous code); the task it must wake lives in one event loop. Setting from
the loop's own thread is a direct call; from any other thread it is scheduled on that loop
with the backend's thread-safe entry point (``call_soon_threadsafe`` for asyncio, the trio
token's ``run_sync_soon`` for trio). A set that arrives after the loop closed is ignored:
nobody is left to wake.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

import anyio
import sniffio

__all__ = ("Signal", "AsyncWaiter", "ThreadWaiter", "Waiter")


class Signal:
    """A re-armable, thread-safe wake-up for one waiting task.

    Must be created inside a running event loop (asyncio or trio): that loop is the one
    :meth:`wait` runs in and the one :meth:`set` schedules onto.
    """

    __slots__ = ("_event", "_schedule", "_thread")

    def __init__(self) -> None:
        self._thread = threading.get_ident()
        self._event = anyio.Event()
        self._schedule: Callable[[Callable[[], object]], Any]
        try:
            self._schedule = asyncio.get_running_loop().call_soon_threadsafe
        except RuntimeError:
            if sniffio.current_async_library() != "trio":  # raises outside any loop
                raise
            import trio  # type: ignore[import-untyped,unused-ignore]

            self._schedule = trio.lowlevel.current_trio_token().run_sync_soon

    def set(self) -> None:
        """Wake the waiter; callable from any thread, never blocks."""
        if threading.get_ident() == self._thread:
            self._event.set()
            return
        # RuntimeError: the loop is closed (trio: RunFinishedError), nobody waits any more
        with contextlib.suppress(RuntimeError):
            self._schedule(self._fire)

    def _fire(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        """Wait until :meth:`set` was called since the last :meth:`clear`."""
        await self._event.wait()

    def clear(self) -> None:
        """Re-arm after a wake-up (a set racing with this call wakes the next wait)."""
        if self._event.is_set():
            self._event = anyio.Event()


class Waiter:
    """Completion of one hand-off: the dispatcher calls :meth:`done` with handler errors."""

    __slots__ = ("errors",)

    def __init__(self) -> None:
        self.errors: list[BaseException] = []

    def done(self, errors: list[BaseException]) -> None:
        raise NotImplementedError


class AsyncWaiter(Waiter):
    """A waiter awaited by a task (created inside its event loop)."""

    __slots__ = ("_done", "_signal")

    def __init__(self) -> None:
        super().__init__()
        self._signal = Signal()
        self._done = False

    def done(self, errors: list[BaseException]) -> None:
        self.errors.extend(errors)
        self._done = True
        self._signal.set()

    async def wait(self) -> None:
        while not self._done:
            await self._signal.wait()
            self._signal.clear()


class ThreadWaiter(Waiter):
    """A waiter a synchronous caller blocks on."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        super().__init__()
        self._event = threading.Event()

    def done(self, errors: list[BaseException]) -> None:
        self.errors.extend(errors)
        self._event.set()

    def wait(self, timeout: float | None) -> bool:
        return self._event.wait(timeout)

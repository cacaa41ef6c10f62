"""Subscriptions: an async iterator over every event recorded after subscribing."""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

import anyio

from ._dispatch import registry
from ._signal import Signal

__all__ = ("EventStream", "Overflow", "subscribe")

Overflow = Literal["drop_oldest", "drop_newest"]


class EventStream:
    """The events a subscriber receives, in recording order; ``async for`` over it.

    The buffer holds at most ``max_buffer`` events. A recorder never waits for a
    subscriber: when the buffer is full, ``overflow="drop_oldest"`` (default) discards the
    oldest buffered event to make room, ``"drop_newest"`` discards the new one. Either way
    :attr:`dropped` counts the discarded events, so a consumer can tell it saw a gap.

    Iteration ends after the ``subscribe()`` block exits (:meth:`close`). Cancelling a
    waiting ``__anext__`` loses nothing: the next call returns the next event.
    """

    def __init__(self, destination: str | None, max_buffer: int, overflow: Overflow) -> None:
        self.destination = destination
        self.max_buffer = max_buffer
        self.overflow: Overflow = overflow
        #: number of events discarded because the buffer was full
        self.dropped = 0
        self._drop_oldest = overflow == "drop_oldest"
        # drop_oldest: the deque's maxlen discards the oldest atomically, even when the
        # consumer pops concurrently from another thread
        self._buffer: collections.deque[Any] = collections.deque(
            maxlen=max_buffer if self._drop_oldest else None
        )
        self._waiting = False
        self._closed = False
        self._signal = Signal()

    def push(self, event: Any, destination: str) -> None:
        """Deliver ``event`` (called by recorders, from any thread; never blocks)."""
        buffer = self._buffer
        if len(buffer) >= self.max_buffer:
            self.dropped += 1
            if not self._drop_oldest:
                return
        buffer.append(event)
        if self._waiting:
            self._waiting = False
            self._signal.set()

    def __len__(self) -> int:
        """The number of buffered events."""
        return len(self._buffer)

    def receive_nowait(self) -> Any:
        """Return the next buffered event; raise ``anyio.WouldBlock`` when there is none."""
        if self._buffer:
            return self._buffer.popleft()
        if self._closed:
            raise anyio.EndOfStream
        raise anyio.WouldBlock

    async def receive(self) -> Any:
        """Return the next event, waiting for one; ``anyio.EndOfStream`` once closed."""
        buffer = self._buffer
        while True:
            if buffer:
                return buffer.popleft()
            if self._closed:
                raise anyio.EndOfStream
            self._waiting = True
            if buffer:  # pushed between the check and the flag: do not sleep
                self._waiting = False
                continue
            await self._signal.wait()
            self._signal.clear()

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    def close(self) -> None:
        """Stop receiving; buffered events can still be read, then iteration ends."""
        self._closed = True
        self._signal.set()


def _attach(stream: EventStream) -> None:
    with registry.lock:
        if stream.destination is None:
            registry.global_subscribers = (*registry.global_subscribers, stream)
            for dest in registry.destinations.values():
                dest.set_subscribers((*dest.subscribers, stream))
        else:
            dest = registry.ensure(stream.destination)
            dest.set_subscribers((*dest.subscribers, stream))


def _detach(stream: EventStream) -> None:
    with registry.lock:
        registry.global_subscribers = tuple(
            s for s in registry.global_subscribers if s is not stream
        )
        for dest in registry.destinations.values():
            if stream in dest.subscribers:
                dest.set_subscribers(tuple(s for s in dest.subscribers if s is not stream))


@asynccontextmanager
async def subscribe(
    destination: str | None = None,
    *,
    max_buffer: int = 10_000,
    overflow: Overflow = "drop_oldest",
) -> AsyncIterator[EventStream]:
    """Receive every event recorded to ``destination`` (all when ``None``) from now on.

    ``async with events.subscribe() as stream: async for event in stream: ...``.
    Events recorded from any thread or loop are delivered through this task's own loop.
    See :class:`EventStream` for the overflow policy. Leaving the block (also by
    cancellation) unsubscribes.
    """
    if not isinstance(max_buffer, int) or max_buffer <= 0:
        raise ValueError(f"max_buffer must be a positive int, got {max_buffer!r}")
    if overflow not in ("drop_oldest", "drop_newest"):
        raise ValueError(f"overflow must be 'drop_oldest' or 'drop_newest', got {overflow!r}")
    stream = EventStream(destination, max_buffer, overflow)
    _attach(stream)
    try:
        yield stream
    finally:
        _detach(stream)
        stream.close()

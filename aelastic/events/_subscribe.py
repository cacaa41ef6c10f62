"""Subscriptions: an anyio object stream of the events recorded after subscribing."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, Literal

import anyio
import sniffio
from anyio.abc import ObjectReceiveStream

from ._dispatch import registry
from ._exceptions import EventsError
from ._signal import Signal

__all__ = ("EventStream", "Overflow", "run_id_of", "subscribe")

Overflow = Literal["drop_oldest", "drop_newest"]


def run_id_of(event: Any) -> str | None:
    """The run id an event belongs to: ``RdzvEvent.run_id`` or ``Event.metadata["run_id"]``."""
    run_id = getattr(event, "run_id", None)
    if run_id is None:
        metadata = getattr(event, "metadata", None)
        if isinstance(metadata, dict):
            run_id = metadata.get("run_id")
    return None if run_id is None else str(run_id)


class EventStream(ObjectReceiveStream[Any]):
    """The events a subscriber receives, in recording order; ``async for`` over it.

    An anyio ``ObjectReceiveStream``: ``await stream.receive()``, ``async for``,
    ``await stream.aclose()`` (or ``async with``). With a ``run_id`` only the events of
    that job arrive (``RdzvEvent.run_id``, or ``run_id`` in an ``Event``'s metadata).

    The buffer holds at most ``max_buffer`` events. A recorder never waits for a
    subscriber: when the buffer is full, ``overflow="drop_oldest"`` (default) discards the
    oldest buffered event to make room, ``"drop_newest"`` discards the new one. Either way
    :attr:`dropped` counts the discarded events, so a consumer can tell it saw a gap.

    The subscription starts when the stream is entered (``async with``) or first read
    (``receive``, ``receive_nowait``, ``async for``), not when it is made: a stream
    that is never used buffers nothing and holds no place in the registry.
    Iteration ends once the stream is closed (:meth:`aclose`, leaving the ``async
    with`` block): what was buffered is still returned first. Cancelling a waiting
    ``receive`` loses nothing: the next call returns the next event.

    ``attach``/``detach`` replace the registry as the source (called once each, with
    the stream, where it would subscribe and unsubscribe): a stream fed by :meth:`push`
    from elsewhere, such as a job's backlog (:meth:`aelastic.Job.events`).
    """

    def __init__(
        self,
        destination: str | None,
        max_buffer: int,
        overflow: Overflow,
        run_id: str | None = None,
        *,
        attach: Callable[[EventStream], None] | None = None,
        detach: Callable[[EventStream], None] | None = None,
    ) -> None:
        self.destination = destination
        self.run_id = run_id
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
        self._attached = False
        self._closed = False
        self._signal = Signal()
        self._source_attach = _attach if attach is None else attach
        self._source_detach = _detach if detach is None else detach

    def _attach(self) -> None:
        """Start the subscription (once; never after :meth:`close`)."""
        if not self._attached and not self._closed:
            self._attached = True
            self._source_attach(self)

    async def __aenter__(self) -> EventStream:
        """Start the subscription: events recorded from here on are delivered."""
        self._attach()
        return self

    def push(self, event: Any, destination: str) -> None:
        """Deliver ``event`` (called by recorders, from any thread; never blocks)."""
        if self.run_id is not None and run_id_of(event) != self.run_id:
            return
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
        self._attach()
        if self._buffer:
            return self._buffer.popleft()
        if self._closed:
            raise anyio.EndOfStream
        raise anyio.WouldBlock

    async def receive(self) -> Any:
        """Return the next event, waiting for one; ``anyio.EndOfStream`` once closed."""
        self._attach()
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

    def close(self) -> None:
        """Unsubscribe now (synchronous :meth:`aclose`); buffered events can still be read."""
        if self._attached and not self._closed:
            self._source_detach(self)
        self._closed = True
        self._signal.set()

    async def aclose(self) -> None:
        """Unsubscribe; buffered events can still be read, then iteration ends. Never blocks."""
        self.close()


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


def subscribe(
    destination: str | None = None,
    *,
    run_id: str | None = None,
    max_buffer: int = 10_000,
    overflow: Overflow = "drop_oldest",
) -> EventStream:
    """Receive every event recorded to ``destination`` (all when ``None``) from now on.

    ``async with events.subscribe() as stream: async for event in stream: ...``.
    ``run_id`` keeps only one job's events (``job.events()`` does this for a
    :class:`aelastic.Job`). Events recorded from any thread or loop are delivered
    through the receiving task's own loop (asyncio or trio). See :class:`EventStream`
    for the overflow policy. The subscription starts when the stream is entered or
    first read (a stream made and never used costs nothing); leaving the block or
    ``await stream.aclose()`` (also on cancellation) ends it.

    Raises:
        ValueError: ``max_buffer`` is not a positive int or ``overflow`` is unknown.
        EventsError: called outside a running event loop.
    """
    if not isinstance(max_buffer, int) or max_buffer <= 0:
        raise ValueError(f"max_buffer must be a positive int, got {max_buffer!r}")
    if overflow not in ("drop_oldest", "drop_newest"):
        raise ValueError(f"overflow must be 'drop_oldest' or 'drop_newest', got {overflow!r}")
    try:
        stream = EventStream(destination, max_buffer, overflow, run_id)
    except sniffio.AsyncLibraryNotFoundError:
        raise EventsError(
            "events.subscribe() was called outside a running event loop; call it from "
            "async code (the events are delivered through that loop)"
        ) from None
    return stream

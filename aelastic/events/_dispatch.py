"""The one machinery behind every events API: destinations, hand-off and dispatch.

Design
------
A *destination* is a name (``null``, ``console``, ``dynamic_rendezvous``, ``file``,
``store``, any custom one; legacy event types are destinations too) with a list of
handlers and a set of subscribers.

:func:`record` does no I/O on the caller's path. It

1. appends the event to the buffer of each subscriber of the destination (a bounded
   deque; a wake-up is scheduled on the subscriber's loop only when it is waiting), and
2. when the destination has a handler that does something (anything but
   ``logging.NullHandler``/``NullEventHandler``), appends it to the destination's bounded
   queue and, only if that queue's drainer is idle, wakes it.

A destination with only null handlers and no subscriber costs one dict lookup and two
attribute reads (the null fast path).

Queues are drained by one daemon thread, ``aelastic-events``, which runs its own asyncio
loop (started on first use, restarted in a forked child). Each destination has one
drainer task, so a slow destination never delays another, and each handler sees a
destination's events in recording order. Handlers run there:

* ``logging.Handler``: through the destination's stdlib logger
  (``aelastic-events-<destination>``, non-propagating, level from ``LOGLEVEL``);
* synchronous callables / ``record`` methods: called in the dispatcher thread;
* ``async def`` handlers: awaited on the event loop that was running when they were
  registered (their *home* loop, asyncio or trio: a store client belongs to the loop that
  opened it), entered from a short-lived thread with ``anyio.from_thread.run`` and the
  loop's token; handlers registered outside any loop run on the dispatcher's loop. If the
  home loop has stopped, the handler fails (logged, counted).

This works the same whether :func:`record` is called from synchronous code with no loop,
from a worker thread, or from inside a running loop: the caller only appends to a deque.

When a queue is full (``AELASTIC_EVENTS_QUEUE_SIZE``, default 100000 per destination)
:func:`record` drops the new event, counts it (:func:`statistics`) and warns once, rather
than block. :func:`arecord` and flushes are never dropped. At interpreter exit pending
events are flushed for up to ``AELASTIC_EVENTS_EXIT_FLUSH_TIMEOUT`` seconds (default 5).

The thread can be stopped: :func:`shutdown` / :func:`shutdown_blocking` flush, cancel the
drainers and join it, bounded by a timeout; the next record that needs it starts a new one.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import contextvars
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import anyio
import anyio.from_thread
import anyio.lowlevel
from anyio.lowlevel import EventLoopToken

from .._dataclass import dataclass
from ._adapters import Handler, HandlerLike, run_each, run_on, same_handler
from ._exceptions import EventHandlerError, EventsError, UnknownDestinationError
from ._signal import AsyncWaiter, Signal, ThreadWaiter, Waiter

__all__ = (
    "DestinationStatistics",
    "EventLike",
    "arecord",
    "check_destination",
    "destination",
    "flush",
    "flush_blocking",
    "record",
    "register_handler",
    "registry",
    "shutdown",
    "shutdown_blocking",
    "statistics",
    "unregister_handler",
)

log = logging.getLogger("aelastic.events")

_BATCH = 512
#: Bound of :func:`shutdown` (flush and thread stop together), in seconds.
_SHUTDOWN_TIMEOUT = 5.0


class EventLike(Protocol):
    """Anything recordable: ``Event``, ``RdzvEvent``, ``legacy.Event``."""

    def serialize(self) -> str: ...


def _queue_size() -> int:
    raw = os.environ.get("AELASTIC_EVENTS_QUEUE_SIZE", "100000")
    try:
        size = int(raw)
    except ValueError:
        size = 0
    if size <= 0:
        raise EventsError(
            f"AELASTIC_EVENTS_QUEUE_SIZE={raw!r} is not a positive integer; unset it or set "
            "it to the number of events a destination may buffer"
        )
    return size


def _message(event: Any) -> str:
    serialize = getattr(event, "serialize", None)
    return serialize() if serialize is not None else str(event)


@dataclass(frozen=True)
class DestinationStatistics:
    """Counters of one destination (see :func:`statistics`)."""

    name: str
    handlers: int
    subscribers: int
    queued: int
    processed: int
    dropped: int
    handler_errors: int


class Destination:
    """One destination: its handlers, subscribers, queue and stdlib logger."""

    def __init__(self, name: str, capacity: int) -> None:
        self.name = name
        self.capacity = capacity
        self.handlers: tuple[Handler, ...] = ()
        #: the destination's own handler: the built-in one, replaced (not added to) by
        #: legacy ``configure()`` and ``configure_file()``
        self.primary: Handler | None = None
        self.subscribers: tuple[Any, ...] = ()
        #: True when some handler does real work (the queue is used)
        self.dispatch = False
        #: True when a record must do anything at all (dispatch or a subscriber)
        self.active = False
        self.logger = logging.getLogger(f"aelastic-events-{name}")
        self.logger.setLevel(os.environ.get("LOGLEVEL", "INFO"))
        self.logger.propagate = False
        self.queue: collections.deque[tuple[Any, Waiter | None]] = collections.deque()
        self.idle = True
        self.running = False
        self.wakeup: Signal | None = None
        self.processed = 0
        self.dropped = 0
        self.handler_errors = 0
        self._warned = False

    # -- configuration (any thread; rebuilds immutable tuples read by the fast path) --
    def _refresh(self) -> None:
        handlers = list(self.handlers)
        if self.primary is not None:
            handlers.append(self.primary)
        self.dispatch = any(not h.is_null for h in handlers)
        self.active = self.dispatch or bool(self.subscribers)

    def all_handlers(self) -> tuple[Handler, ...]:
        return (self.primary, *self.handlers) if self.primary is not None else self.handlers

    def add(self, handler: Handler) -> None:
        if handler.via_logger:
            self.logger.addHandler(handler.original)
        self.handlers = (*self.handlers, handler)
        self._refresh()

    def remove(self, original: HandlerLike) -> bool:
        kept = tuple(h for h in self.handlers if not same_handler(h.original, original))
        found = len(kept) != len(self.handlers)
        if isinstance(original, logging.Handler):
            self.logger.removeHandler(original)
        if self.primary is not None and same_handler(self.primary.original, original):
            self.primary, found = None, True
        self.handlers = kept
        self._refresh()
        return found

    def set_primary(self, handler: Handler | None) -> Handler | None:
        """Replace the destination's own handler; return the previous one."""
        old, self.primary = self.primary, handler
        if old is not None and old.via_logger:
            self.logger.removeHandler(old.original)
        if handler is not None and handler.via_logger:
            self.logger.addHandler(handler.original)
        self._refresh()
        return old

    def set_subscribers(self, subscribers: tuple[Any, ...]) -> None:
        self.subscribers = subscribers
        self._refresh()

    # -- hand-off (any thread, never blocks) --
    def put(self, event: Any, waiter: Waiter | None) -> None:
        queue = self.queue
        if waiter is None and len(queue) >= self.capacity:
            self.dropped += 1
            if not self._warned:
                self._warned = True
                log.warning(
                    "events destination %r: queue full (%d events), dropping new events; "
                    "its handlers are too slow. Raise AELASTIC_EVENTS_QUEUE_SIZE or use a "
                    "faster handler",
                    self.name,
                    self.capacity,
                )
            return
        queue.append((event, waiter))
        if self.idle:
            self.idle = False
            _dispatcher.wake(self)

    def statistics(self) -> DestinationStatistics:
        return DestinationStatistics(
            name=self.name,
            handlers=sum(1 for h in self.all_handlers() if not h.is_null),
            subscribers=len(self.subscribers),
            queued=len(self.queue),
            processed=self.processed,
            dropped=self.dropped,
            handler_errors=self.handler_errors,
        )

    # -- the drainer (dispatcher loop) --
    async def drain(self) -> None:
        queue = self.queue
        while True:
            while queue:
                batch = [queue.popleft() for _ in range(min(len(queue), _BATCH))]
                await self._process(batch)
            self.idle = True
            if queue:  # a put raced with us going idle: it saw idle False, nobody woke us
                self.idle = False
                continue
            assert self.wakeup is not None
            await self.wakeup.wait()
            self.wakeup.clear()

    async def _process(self, batch: list[tuple[Any, Waiter | None]]) -> None:
        items = [(i, event) for i, (event, _) in enumerate(batch) if event is not _FLUSH]
        failures: dict[int, list[BaseException]] = {}
        if items:
            logged = False
            for handler in self.all_handlers():
                if handler.is_null:
                    continue
                if handler.via_logger:  # one pass through the logger serves them all
                    if logged:
                        continue
                    logged = True
                try:
                    errors = await self._run(handler, items)
                except Exception as batch_exc:  # the whole batch failed (dead loop, file)
                    errors = {i: batch_exc for i, _ in items}
                for i, exc in errors.items():
                    self._failed(handler, exc)
                    failures.setdefault(i, []).append(exc)
            self.processed += len(items)
        for i, (_, waiter) in enumerate(batch):
            if waiter is not None:
                waiter.done(failures.get(i, []))

    def _failed(self, handler: Handler, exc: BaseException) -> None:
        self.handler_errors += 1
        log.error(
            "events destination %r: handler %r failed: %r",
            self.name,
            handler.original,
            exc,
            exc_info=exc,
        )

    async def _run(self, handler: Handler, items: list[tuple[int, Any]]) -> dict[int, Exception]:
        """Run ``handler`` on every event of ``items``; return the failures by index."""
        if handler.via_logger:
            logger = self.logger
            if logger.isEnabledFor(logging.INFO):
                for _, event in items:
                    logger.handle(
                        logger.makeRecord(
                            logger.name, logging.INFO, __file__, 0, _message(event), (), None
                        )
                    )
            return {}
        if handler.batch is not None:
            handler.batch([event for _, event in items])
            return {}
        home = handler.home
        if handler.is_async and home is not None and home != _dispatcher.token:
            return await run_on(home, handler.call, items)
        return await run_each(handler.call, items)


class _FlushMarker:
    def serialize(self) -> str:  # pragma: no cover - never handed to a handler
        return "{}"


_FLUSH = _FlushMarker()


class _Dispatcher:
    """The daemon thread and the asyncio loop on which queues are drained."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pending: list[Destination] = []
        self._spawn: Signal | None = None
        self._ready = threading.Event()
        self._scope: anyio.CancelScope | None = None
        self._context = contextvars.Context()
        #: the dispatcher loop's anyio token (async handlers homed there run in place)
        self.token: EventLoopToken | None = None

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def wake(self, dest: Destination) -> None:
        """Start ``dest``'s drainer or wake it; any thread."""
        loop = self._loop
        if loop is None:
            loop = self._start()
        if threading.current_thread() is self._thread:
            self._wake_in_loop(dest)
        else:
            try:  # in the dispatcher's own context, not the caller's (which may say trio)
                loop.call_soon_threadsafe(self._wake_in_loop, dest, context=self._context)
            except RuntimeError:  # the loop is closed
                if self._loop is loop:  # not by stop(): interpreter shutdown; next record retries
                    dest.idle = True
                # else stop() closed it after we read it: its registry pass restarts every
                # destination with queued events (ours: queued before we read the loop), so
                # the state is the pass's; marking it idle here would contradict it

    def _wake_in_loop(self, dest: Destination) -> None:
        if dest.running:
            assert dest.wakeup is not None
            dest.wakeup.set()
        else:
            dest.running = True
            dest.wakeup = Signal()
            self._pending.append(dest)
            assert self._spawn is not None
            self._spawn.set()

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._ready.clear()
                thread = threading.Thread(target=self._main, name="aelastic-events", daemon=True)
                self._thread = thread
                thread.start()
                self._ready.wait()
            assert self._loop is not None
            return self._loop

    def _main(self) -> None:
        anyio.run(self._serve, backend="asyncio")

    async def _serve(self) -> None:
        self._spawn = Signal()
        self._context = contextvars.copy_context()
        self.token = anyio.lowlevel.current_token()
        async with anyio.create_task_group() as tg:
            self._scope = tg.cancel_scope
            self._loop = asyncio.get_running_loop()
            self._ready.set()
            while True:
                await self._spawn.wait()
                self._spawn.clear()
                pending, self._pending = self._pending, []
                for dest in pending:
                    tg.start_soon(dest.drain, name=f"aelastic-events-{dest.name}")

    def stop(self, timeout: float) -> bool:
        """Stop the loop and join the thread within ``timeout`` s; return whether it ended.

        Drainers are cancelled (events still queued stay queued). A record racing with
        the stop starts a fresh dispatcher for its event: either it reads the cleared
        loop and starts one, or it read the old loop, and then its event was queued
        before the pass below, which restarts every destination with queued events.
        """
        with self._lock:
            thread, loop, scope = self._thread, self._loop, self._scope
            if thread is None or loop is None or scope is None:
                return True
            with contextlib.suppress(RuntimeError):  # RuntimeError: the loop already closed
                loop.call_soon_threadsafe(scope.cancel, context=self._context)
            thread.join(timeout)
            if thread.is_alive():
                return False
            self._loop = self._thread = self._scope = self.token = None
            self._pending = []
            self._spawn = None
        restart = []
        with registry.lock:
            for dest in registry.destinations.values():
                dest.running, dest.wakeup, dest.idle = False, None, True
                if dest.queue:
                    restart.append(dest)
        for dest in restart:
            dest.idle = False
            self.wake(dest)
        return True

    def reset_after_fork(self) -> None:
        self._lock = threading.Lock()
        self._loop = None
        self._thread = None
        self._pending = []
        self._spawn = None
        self._scope = None
        self.token = None
        self._ready = threading.Event()


class _Registry:
    """Every destination by name, plus the subscribers to all destinations."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.destinations: dict[str, Destination] = {}
        self.global_subscribers: tuple[Any, ...] = ()
        self.capacity = _queue_size()
        #: built-in destinations created on first use: name -> installs their handlers
        self.factories: dict[str, Callable[[Destination], None]] = {}

    def get(self, name: str) -> Destination:
        dest = self.destinations.get(name)
        if dest is not None:
            return dest
        with self.lock:
            dest = self.destinations.get(name)
            if dest is not None:
                return dest
            factory = self.factories.get(name)
            if factory is None:
                known = ", ".join(repr(n) for n in sorted({*self.destinations, *self.factories}))
                raise UnknownDestinationError(
                    f"unknown events destination {name!r} (known: {known}); register one "
                    f"with aelastic.events.register_handler({name!r}, handler)"
                )
            return self._create(name, factory)

    def ensure(self, name: str, *, builtin: bool = True) -> Destination:
        """Return ``name``'s destination, creating it if needed (without its built-in
        handler when ``builtin`` is false)."""
        dest = self.destinations.get(name)
        if dest is not None:
            return dest
        with self.lock:
            if name in self.destinations:
                return self.destinations[name]
            return self._create(name, self.factories.get(name) if builtin else None)

    def _create(self, name: str, factory: Callable[[Destination], None] | None) -> Destination:
        dest = Destination(name, self.capacity)
        if factory is not None:
            factory(dest)
        dest.set_subscribers(self.global_subscribers)
        self.destinations[name] = dest
        return dest

    def reset_after_fork(self) -> None:
        self.lock = threading.RLock()
        self.global_subscribers = ()
        for dest in self.destinations.values():
            dest.queue.clear()
            dest.idle = True
            dest.running = False
            dest.wakeup = None
            dest.set_subscribers(())


_dispatcher = _Dispatcher()
registry = _Registry()


def destination(name: str) -> Destination:
    """Return the destination ``name`` (raises :class:`UnknownDestinationError`)."""
    return registry.get(name)


def check_destination(name: str) -> None:
    """Raise :class:`UnknownDestinationError` unless ``name`` is a destination (a built-in
    one or one given to :func:`register_handler`); what a launcher checks its settings with."""
    registry.get(name)


def record(event: EventLike, destination: str = "null") -> None:
    """Record ``event`` to ``destination``; returns at once, never blocks, never does I/O.

    The event reaches the destination's subscribers immediately and its handlers soon
    after, in the dispatcher thread (see the module documentation). Raises
    :class:`UnknownDestinationError` for a destination nobody registered.
    """
    dest = registry.destinations.get(destination) or registry.get(destination)
    if not dest.active:
        return
    for subscriber in dest.subscribers:
        subscriber.push(event, destination)
    if dest.dispatch:
        dest.put(event, None)


async def arecord(event: EventLike, destination: str = "null") -> None:
    """Record ``event`` and wait until every handler of ``destination`` processed it.

    Raises :class:`EventHandlerError` (the first failure as ``__cause__``) when a handler
    failed. Cancelling the wait does not withdraw the event: it is processed anyway.
    Do not await it from a handler of the same destination (that would wait on itself).
    """
    dest = registry.destinations.get(destination) or registry.get(destination)
    for subscriber in dest.subscribers:
        subscriber.push(event, destination)
    if not dest.dispatch:
        return
    waiter = AsyncWaiter()
    dest.put(event, waiter)
    await waiter.wait()
    if waiter.errors:
        raise EventHandlerError(
            f"{len(waiter.errors)} handler(s) of events destination {destination!r} failed "
            f"on {getattr(event, 'name', event)!r}: {waiter.errors[0]!r}"
        ) from waiter.errors[0]


def _flushable(names: Iterable[str] | None) -> list[Destination]:
    with registry.lock:
        dests = list(registry.destinations.values())
    if names is not None:
        wanted = set(names)
        dests = [d for d in dests if d.name in wanted]
    return [d for d in dests if d.running or d.queue]


async def flush(destinations: Iterable[str] | None = None) -> None:
    """Wait until every event recorded before this call was processed by its handlers.

    ``destinations`` limits the wait to those destinations (default: all). Handler
    failures were already logged; they are not raised here. Cancellation-safe.
    """
    waiters = []
    for dest in _flushable(destinations):
        waiter = AsyncWaiter()
        dest.put(_FLUSH, waiter)
        waiters.append(waiter)
    for waiter in waiters:
        await waiter.wait()


def flush_blocking(timeout: float | None = None) -> bool:
    """Synchronous :func:`flush`: block this thread until processed or ``timeout`` expires.

    Returns whether everything was processed in time. Never call it from the event loop
    that runs an async handler (it would wait on itself) nor from a handler.
    """
    if threading.current_thread() is _dispatcher.thread:
        raise EventsError("flush_blocking() called from an events handler: it would deadlock")
    waiters = []
    for dest in _flushable(None):
        waiter = ThreadWaiter()
        dest.put(_FLUSH, waiter)
        waiters.append(waiter)
    deadline = None if timeout is None else time.monotonic() + timeout
    for waiter in waiters:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not waiter.wait(remaining):
            return False
    return True


def register_handler(destination: str, handler: HandlerLike) -> HandlerLike:
    """Add ``handler`` to ``destination`` (created if new); return ``handler``.

    ``handler`` is a ``logging.Handler``, an object with a ``record(event)`` method, or a
    callable taking the event; ``record``/the callable may be ``async def``: it then runs
    on the asyncio event loop that is running now (or on the dispatcher's loop when none
    is, and under trio). Synchronous handlers run in the dispatcher thread. Logging
    handlers are attached to the destination's logger ``aelastic-events-<destination>``.
    """
    entry = Handler(handler)
    with registry.lock:
        registry.ensure(destination).add(entry)
    return handler


def unregister_handler(destination: str, handler: HandlerLike) -> bool:
    """Remove ``handler`` from ``destination``; return whether it was registered."""
    with registry.lock:
        dest = registry.destinations.get(destination)
        return dest.remove(handler) if dest is not None else False


def statistics() -> dict[str, DestinationStatistics]:
    """Return the counters of every destination created so far, by name."""
    with registry.lock:
        return {name: dest.statistics() for name, dest in registry.destinations.items()}


def shutdown_blocking(timeout: float = _SHUTDOWN_TIMEOUT) -> bool:
    """Flush every destination, then stop the ``aelastic-events`` thread; block at most
    ``timeout`` seconds in all. Return whether everything was delivered and the thread
    ended.

    Handlers and subscriptions stay registered: the next :func:`record` that needs a
    handler starts a fresh thread. Events still queued when the time is up stay queued
    (delivered by that next thread). Runs at interpreter exit with
    ``AELASTIC_EVENTS_EXIT_FLUSH_TIMEOUT`` (default 5 s). Never call it from a handler
    nor from an event loop that runs an async handler (use :func:`shutdown` there).
    """
    if threading.current_thread() is _dispatcher.thread:
        raise EventsError("events.shutdown() called from an events handler: it would deadlock")
    deadline = time.monotonic() + max(0.0, timeout)
    flushed = flush_blocking(timeout)
    return _dispatcher.stop(max(0.0, deadline - time.monotonic())) and flushed


async def shutdown() -> bool:
    """:func:`shutdown_blocking` (5 s bound) from async code, without blocking the loop.

    Waits in a worker thread (so async handlers homed on this loop can still run). For
    a shorter wait, put it in ``anyio.move_on_after``: cancelling abandons the wait
    while the stop goes on in that thread, still bounded.
    """
    import anyio.to_thread

    return await anyio.to_thread.run_sync(
        shutdown_blocking, _SHUTDOWN_TIMEOUT, abandon_on_cancel=True
    )


def _exit_flush() -> None:
    if _dispatcher.thread is None:
        return
    try:
        timeout = float(os.environ.get("AELASTIC_EVENTS_EXIT_FLUSH_TIMEOUT", "5"))
    except ValueError:
        timeout = 5.0
    with contextlib.suppress(Exception):  # best effort at exit
        shutdown_blocking(timeout)


def _after_fork_in_child() -> None:
    _dispatcher.reset_after_fork()
    registry.reset_after_fork()


atexit.register(_exit_flush)
os.register_at_fork(after_in_child=_after_fork_in_child)

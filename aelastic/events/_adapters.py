"""Handlers as the dispatcher calls them: every kind a user may register, normalised to
one calling convention (:class:`Handler`), and the runners that call one on a batch of
events, in the dispatcher's loop or in the handler's home loop (:func:`run_each`,
:func:`run_on`). Nothing here owns a thread or a queue (see ``_dispatch``)."""

from __future__ import annotations

import inspect
import logging
import threading
import types
from collections.abc import Callable
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
from anyio.lowlevel import EventLoopToken

from ._exceptions import EventsError
from ._signal import Signal

__all__ = ("Handler", "HandlerLike", "is_null_handler", "run_each", "run_on", "same_handler")


#: A handler: a ``logging.Handler``, an object with a (sync or async) ``record(event)``
#: method, or a (sync or async) callable taking the event.
HandlerLike = Any


def is_null_handler(handler: Any) -> bool:
    """Whether ``handler`` does nothing (``logging.NullHandler``, ``NullEventHandler``)."""
    return (
        isinstance(handler, logging.NullHandler) or getattr(handler, "null_handler", False) is True
    )


class Handler:
    """A registered handler, normalised to one calling convention."""

    __slots__ = (
        "batch",
        "call",
        "home",
        "is_async",
        "is_null",
        "logging_handler",
        "original",
        "via_logger",
    )

    def __init__(self, original: HandlerLike) -> None:
        self.original = original
        self.is_null = is_null_handler(original)
        self.logging_handler: logging.Handler | None = None
        self.batch: Callable[[list[Any]], None] | None = None
        self.home: EventLoopToken | None = None
        #: a logging handler attached to the destination's logger (not batch-capable)
        self.via_logger = False
        if isinstance(original, logging.Handler):
            self.logging_handler = original
            self.batch = getattr(original, "record_batch", None)
            self.via_logger = self.batch is None
            self.call: Callable[[Any], Any] = original.handle
            self.is_async = False
            return
        fn = getattr(original, "record", None)
        if fn is None or not callable(fn):
            if not callable(original):
                raise TypeError(
                    f"cannot use {original!r} as an event handler: pass a logging.Handler, an "
                    "object with a record(event) method, or a callable taking the event"
                )
            fn = original
        self.call = fn
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)  # noqa: B004 - async callable objects
        )
        if self.is_async:
            try:  # the caller's event loop, whichever anyio backend runs it
                self.home = anyio.lowlevel.current_token()
            except RuntimeError:  # no event loop here: the dispatcher's loop runs it
                self.home = None


def same_handler(a: Any, b: Any) -> bool:
    """Identity, or equality (``obj.method`` makes a new but equal bound method each time)."""
    return a is b or (isinstance(a, (types.MethodType, types.BuiltinMethodType)) and a == b)


async def run_each(
    call: Callable[[Any], Any], items: list[tuple[int, Any]]
) -> dict[int, Exception]:
    errors: dict[int, Exception] = {}
    for i, event in items:
        try:
            result = call(event)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            errors[i] = exc
    return errors


async def run_on(
    home: EventLoopToken, call: Callable[[Any], Any], items: list[tuple[int, Any]]
) -> dict[int, Exception]:
    """Run ``call`` on each event of ``items`` in the event loop ``home``, one hop per batch.

    Backend-neutral (asyncio, uvloop, trio): a short-lived thread enters ``home`` with
    ``anyio.from_thread.run`` while the dispatcher's loop waits on a thread-safe
    wake-up, so other destinations keep draining. Cancelled (dispatcher shutdown): the
    wait is abandoned; the hop ends when ``home`` has run the batch.
    """
    is_running = getattr(home.native_token, "is_running", None)  # asyncio: a stopped loop
    if is_running is not None and not is_running():  # would never run the batch
        raise EventsError(
            f"async handler {call!r} belongs to an event loop that is no longer running; "
            "unregister handlers before their loop ends"
        )
    done = Signal()
    outcome: list[dict[int, Exception] | BaseException] = []

    def hop() -> None:
        try:
            outcome.append(anyio.from_thread.run(run_each, call, items, token=home))
        except BaseException as exc:  # handed to the dispatcher's loop below
            outcome.append(exc)
        finally:
            done.set()

    threading.Thread(target=hop, name="aelastic-events-hop", daemon=True).start()
    await done.wait()
    result = outcome[0]
    if isinstance(result, anyio.RunFinishedError):
        raise EventsError(
            f"async handler {call!r} belongs to an event loop that is no longer running; "
            "unregister handlers before their loop ends"
        )
    if isinstance(result, BaseException):
        raise EventsError(f"async handler {call!r}: its event loop did not run it: {result!r}")
    return result

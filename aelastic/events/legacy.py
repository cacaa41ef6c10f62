"""The older torchelastic events API (handlers routed by event type), on aelastic's machinery.

An event type *is* a destination name: ``configure(handler, "foo")`` makes ``handler`` the
own handler of destination ``foo`` (replacing the previous one, as the old API did), and
``record_event(Event(name, type="foo"))`` records to ``foo``. A type with no destination of
its own goes to the default route, set by ``configure(handler)`` (``event_type=""``) and
null by default; ``torchelastic`` (the platform type) has no destination of its own.
Built-in destinations are types too: ``record("x", event_type="console")`` prints.

Handlers may be synchronous or ``async def`` (see :func:`aelastic.events.register_handler`);
subscribers of :func:`aelastic.events.subscribe` see these events as :class:`Event`
objects of this module.

Example::

    from aelastic.events import legacy

    class StdoutEventHandler(legacy.EventHandler):
        def record(self, event):
            print(f"[{event.type}]: event_name: {event.name}")

    legacy.configure(StdoutEventHandler(), event_type="stdout_events")
    legacy.record("started", event_type="stdout_events")
"""

from __future__ import annotations

import abc
import json
import time
from collections.abc import Awaitable
from dataclasses import field
from typing import Any

from .._dataclass import dataclass
from ._adapters import Handler
from ._dispatch import record as _record
from ._dispatch import registry
from ._exceptions import EventFormatError

__all__ = (
    "ConsoleEventHandler",
    "Event",
    "EventHandler",
    "NullEventHandler",
    "configure",
    "record",
    "record_event",
)

_PLATFORM_TYPE = "torchelastic"


@dataclass(init=False)
class Event:
    """An event of the older API.

    Args:
        name: event name.
        type: the event type; selects the handler (``event_type=`` is accepted too).
        metadata: data associated with the event (JSON-serialisable).
        timestamp: when it occurred, in milliseconds.
    """

    name: str
    type: str = _PLATFORM_TYPE
    metadata: dict[str, Any] = field(default_factory=dict)
    timestamp: int = 0

    def __init__(
        self,
        name: str,
        type: str | None = None,  # the old API's parameter name
        metadata: dict[str, Any] | None = None,
        timestamp: int = 0,
        *,
        event_type: str | None = None,
    ) -> None:
        if type is not None and event_type is not None and type != event_type:
            raise ValueError(f"Event got type={type!r} and event_type={event_type!r}; pass one")
        self.name = name
        self.type = type or event_type or _PLATFORM_TYPE
        self.metadata = dict(metadata) if metadata else {}
        self.timestamp = timestamp

    @property
    def event_type(self) -> str:
        """Alias of :attr:`type`."""
        return self.type

    def __str__(self) -> str:
        return self.serialize()

    def serialize(self) -> str:
        """Return the event as a JSON object string."""
        return json.dumps(
            {
                "name": self.name,
                "type": self.type,
                "metadata": self.metadata,
                "timestamp": self.timestamp,
            }
        )

    @staticmethod
    def deserialize(data: str | bytes | Event) -> Event:
        """Parse :meth:`serialize`'s output; :class:`EventFormatError` when malformed."""
        if isinstance(data, Event):
            return data
        try:
            d = json.loads(data)
            return Event(d["name"], d["type"], d.get("metadata"), d.get("timestamp", 0))
        except (ValueError, KeyError, TypeError) as exc:
            raise EventFormatError(
                f"not a legacy Event: {exc!r}; expected keys name, type, metadata, timestamp"
            ) from None


class EventHandler(abc.ABC):
    """Records events somewhere: subclass it and implement :meth:`record`.

    ``record`` runs in the events dispatcher thread, never on the recorder's path; it may
    be ``async def``. Exceptions are logged and counted, and raised by ``arecord``.
    """

    @abc.abstractmethod
    def record(self, event: Event) -> Awaitable[None] | None:
        """Process one event."""


class ConsoleEventHandler(EventHandler):
    """Prints each event (as JSON) to stdout."""

    def record(self, event: Event) -> None:
        print(event, flush=True)


class NullEventHandler(EventHandler):
    """Discards events; a type routed only to it costs nothing to record."""

    null_handler = True

    def record(self, event: Event) -> None:
        pass


def configure(handler: EventHandler, event_type: str = "") -> None:
    """Make ``handler`` process every event of type ``event_type``.

    ``event_type=""`` sets the default handler, used for types without a destination of
    their own. Replaces the type's previous handler.
    """
    if not isinstance(handler, EventHandler) and not callable(getattr(handler, "record", None)):
        raise TypeError(
            f"configure() needs an EventHandler (an object with record(event)), got {handler!r}"
        )
    entry = Handler(handler)
    with registry.lock:
        registry.ensure(event_type, builtin=False).set_primary(entry)


def _route(event_type: str) -> str:
    if event_type in registry.destinations or event_type in registry.factories:
        return event_type
    return ""


def record_event(event: Event) -> None:
    """Record ``event`` with the handler of its type; returns at once (never blocks)."""
    _record(event, _route(event.type))


def record(
    event_name: str, event_type: str = _PLATFORM_TYPE, metadata: dict[str, Any] | None = None
) -> None:
    """Build an :class:`Event` stamped with the current time (ms) and record it."""
    record_event(Event(event_name, event_type, metadata, int(time.time() * 1000)))

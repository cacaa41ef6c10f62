"""Events of an elastic job: torch's API (``record``, ``RdzvEvent``...) made async-aware.

Recording never blocks nor does I/O on the caller's path: events are handed to a
per-destination queue drained by the ``aelastic-events`` dispatcher thread, where
handlers (stdlib ``logging`` handlers, sync or ``async def`` callables) run. Destinations:
``null`` (default; free), ``console`` (stderr), ``dynamic_rendezvous`` (rendezvous events;
null until configured), ``file`` (JSON lines; :func:`configure_file` or
``AELASTIC_EVENTS_FILE``), ``store`` (:func:`configure_store`), and any name given to
:func:`register_handler`. :func:`subscribe` streams events to async consumers;
:func:`arecord` and :func:`flush` wait for handlers; :func:`shutdown` stops the thread
(bounded; the next record restarts it). Works on every anyio backend (asyncio, trio).
The older type-routed API is ``aelastic.events.legacy``.

Example::

    from aelastic import events

    event = events.Event(name="test_event", source=events.EventSource.WORKER)
    events.record(event, destination="console")
    events.get_logging_handler("console").setLevel("WARNING")
"""

from ._dispatch import DestinationStatistics as DestinationStatistics
from ._dispatch import arecord as arecord
from ._dispatch import check_destination as check_destination
from ._dispatch import flush as flush
from ._dispatch import flush_blocking as flush_blocking
from ._dispatch import record as record
from ._dispatch import register_handler as register_handler
from ._dispatch import shutdown as shutdown
from ._dispatch import shutdown_blocking as shutdown_blocking
from ._dispatch import statistics as statistics
from ._dispatch import unregister_handler as unregister_handler
from ._event import Event as Event
from ._event import EventMetadataValue as EventMetadataValue
from ._event import EventSource as EventSource
from ._event import NodeState as NodeState
from ._event import RdzvEvent as RdzvEvent
from ._exceptions import EventFormatError as EventFormatError
from ._exceptions import EventHandlerError as EventHandlerError
from ._exceptions import EventsError as EventsError
from ._exceptions import UnknownDestinationError as UnknownDestinationError
from ._handlers import JsonLinesFileHandler as JsonLinesFileHandler
from ._handlers import configure_file as configure_file
from ._handlers import get_logging_handler as get_logging_handler
from ._record import construct_and_record_rdzv_event as construct_and_record_rdzv_event
from ._record import record_rdzv_event as record_rdzv_event
from ._store import StoreEventHandler as StoreEventHandler
from ._store import configure_store as configure_store
from ._store import events_key as events_key
from ._subscribe import EventStream as EventStream
from ._subscribe import subscribe as subscribe

__all__ = (
    "DestinationStatistics",
    "Event",
    "EventFormatError",
    "EventHandlerError",
    "EventMetadataValue",
    "EventSource",
    "EventStream",
    "EventsError",
    "JsonLinesFileHandler",
    "NodeState",
    "RdzvEvent",
    "StoreEventHandler",
    "UnknownDestinationError",
    "arecord",
    "check_destination",
    "configure_file",
    "configure_store",
    "construct_and_record_rdzv_event",
    "events_key",
    "flush",
    "flush_blocking",
    "get_logging_handler",
    "record",
    "record_rdzv_event",
    "register_handler",
    "shutdown",
    "shutdown_blocking",
    "statistics",
    "subscribe",
    "unregister_handler",
)

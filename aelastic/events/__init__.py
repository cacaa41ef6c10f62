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

    events.register_handler("mine", logging.StreamHandler())
    event = events.Event(name="test_event", source=events.EventSource.WORKER)
    events.record(event, destination="mine")
"""

from ._dispatch import record as record
from ._dispatch import register_handler as register_handler
from ._dispatch import shutdown as shutdown
from ._event import Event as Event
from ._event import EventSource as EventSource
from ._event import NodeState as NodeState
from ._event import RdzvEvent as RdzvEvent
from ._exceptions import EventsError as EventsError
from ._handlers import configure_file as configure_file
from ._record import record_rdzv_event as record_rdzv_event
from ._subscribe import subscribe as subscribe

__all__ = (
    "Event",
    "EventSource",
    "EventsError",
    "NodeState",
    "RdzvEvent",
    "configure_file",
    "record",
    "record_rdzv_event",
    "register_handler",
    "shutdown",
    "subscribe",
)

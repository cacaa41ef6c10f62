"""The ``store`` destination: events pushed onto a queue per run in an aelastic store.

Every node pushes its events with ``queue_push`` onto ``aelastic/events/<run_id>``, so one
consumer anywhere (``python -m aelastic events --store HOST:PORT --run-id ID``) sees the
events of all nodes. Popping consumes: one consumer sees each event once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ._dispatch import register_handler
from ._exceptions import EventsError

if TYPE_CHECKING:
    from ..store import Store

__all__ = ("EVENTS_KEY_PREFIX", "StoreEventHandler", "configure_store", "events_key")

#: Prefix of the store queue that holds a run's events.
EVENTS_KEY_PREFIX = "aelastic/events/"


def events_key(run_id: str) -> str:
    """Return the store queue key of ``run_id``'s events."""
    return f"{EVENTS_KEY_PREFIX}{run_id}"


def _run_id_of(event: Any) -> str | None:
    run_id = getattr(event, "run_id", None)
    if isinstance(run_id, str) and run_id:
        return run_id
    metadata = getattr(event, "metadata", None)
    if isinstance(metadata, dict):
        value = metadata.get("run_id")
        if isinstance(value, str) and value:
            return value
    return None


class StoreEventHandler:
    """An async handler pushing each event (its JSON) onto ``aelastic/events/<run_id>``.

    The run id is the event's own (``RdzvEvent.run_id`` or metadata ``run_id``), else
    ``run_id``. Runs on the event loop that registered it, i.e. the store's loop.
    Store errors propagate to the dispatcher (logged, counted, raised by ``arecord``).
    """

    def __init__(self, store: Store, run_id: str | None = None) -> None:
        from ..store import Store  # the store package loads only with this destination

        if not isinstance(store, Store):
            raise TypeError(f"StoreEventHandler needs an aelastic.store.Store, got {store!r}")
        self.store = store
        self.run_id = run_id

    async def record(self, event: Any) -> None:
        run_id = _run_id_of(event) or self.run_id
        if not run_id:
            raise EventsError(
                f"event {getattr(event, 'name', event)!r} has no run_id metadata and the "
                "store handler has no default: pass run_id to configure_store()"
            )
        await self.store.queue_push(events_key(run_id), event.serialize())

    def __repr__(self) -> str:
        return f"StoreEventHandler({self.store!r}, run_id={self.run_id!r})"


def configure_store(
    store: Store, run_id: str | None = None, *, destinations: Iterable[str] = ("store",)
) -> StoreEventHandler:
    """Push every event of ``destinations`` (default: ``store``) to ``store``.

    Call it inside the event loop that owns ``store``; the pushes run there. Remove it
    with ``unregister_handler(destination, handler)`` before that loop ends.
    """
    handler = StoreEventHandler(store, run_id)
    for name in destinations:
        register_handler(name, handler)
    return handler

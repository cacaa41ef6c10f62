"""Event objects of the current torch elastic API: ``Event``, ``RdzvEvent`` and their enums.

Both classes serialise to the same JSON shape as torch (``json.dumps(asdict(obj))``), so a
consumer of torch's events reads aelastic's unchanged and vice versa.
"""

from __future__ import annotations

import json
from dataclasses import field, fields
from enum import Enum
from typing import Any, TypeVar

from .._dataclass import dataclass
from ._exceptions import EventFormatError

__all__ = ("Event", "EventMetadataValue", "EventSource", "NodeState", "RdzvEvent")

#: The type of an :class:`Event` metadata value (torch's alias).
EventMetadataValue = str | int | float | bool | None

_T = TypeVar("_T")


class EventSource(str, Enum):
    """Known identifiers of the event producers."""

    AGENT = "AGENT"
    WORKER = "WORKER"


class NodeState(str, Enum):
    """The states a node can be in during rendezvous."""

    INIT = "INIT"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


#: ``json.dumps`` with torch's (default) separators; built once.
_dumps = json.JSONEncoder().encode


def _load(data: str | bytes, kind: str) -> dict[str, Any]:
    try:
        loaded = json.loads(data)
    except ValueError as exc:
        raise EventFormatError(f"cannot parse {kind}: {exc}; expected a JSON object") from None
    if not isinstance(loaded, dict):
        raise EventFormatError(f"cannot parse {kind}: expected a JSON object, got {loaded!r:.80}")
    return loaded


def _parse(cls: type[_T], data: str | bytes, enum_key: str, enum: type[Enum]) -> _T:
    """Build ``cls`` from JSON ``data`` whose ``enum_key`` holds an ``enum`` member name.

    Raises :class:`EventFormatError` naming the expected keys on malformed input.
    """
    d = _load(data, cls.__name__)
    try:
        d[enum_key] = enum[d[enum_key]]
        return cls(**d)
    except (KeyError, TypeError) as exc:
        keys = ", ".join(
            f"{f.name} ({'|'.join(enum.__members__)})" if f.name == enum_key else f.name
            for f in fields(cls)  # type: ignore[arg-type]
        )
        raise EventFormatError(f"not an {cls.__name__}: {exc!r}; expected keys {keys}") from None


@dataclass
class Event:
    """A generic event of an elastic job (an agent's or a worker's meaningful action).

    Args:
        name: the event name, e.g. ``torchelastic.worker.status.SUCCEEDED``.
        source: the producer, :class:`EventSource`.
        timestamp: when the event occurred, in milliseconds (0 when unknown).
        metadata: data associated with the event (JSON scalars).
    """

    name: str
    source: EventSource
    timestamp: int = 0
    metadata: dict[str, EventMetadataValue] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.serialize()

    def serialize(self) -> str:
        """Return the event as a JSON object string (torch's shape, ``asdict`` order)."""
        return _dumps(
            {
                "name": self.name,
                "source": getattr(self.source, "value", self.source),
                "timestamp": self.timestamp,
                "metadata": self.metadata,
            }
        )

    @staticmethod
    def deserialize(data: str | bytes | Event) -> Event:
        """Parse :meth:`serialize`'s output (an :class:`Event` is returned as is).

        Raises :class:`~aelastic.events._exceptions.EventFormatError` on malformed input.
        """
        if isinstance(data, Event):
            return data
        return _parse(Event, data, "source", EventSource)


@dataclass
class RdzvEvent:
    """A rendezvous event.

    Args:
        name: ``<file>:<function>`` of the code that recorded it.
        run_id: the rendezvous run id.
        message: what happened.
        hostname: the node's hostname.
        pid: the node's process id.
        node_state: the node's :class:`NodeState`.
        master_endpoint: the rendezvous store's endpoint, if known.
        rank: the node's rank, if known.
        local_id: the node's local id within the rendezvous, if defined.
        error_trace: the traceback when ``node_state`` is FAILED.
    """

    name: str
    run_id: str
    message: str
    hostname: str
    pid: int
    node_state: NodeState
    master_endpoint: str = ""
    rank: int | None = None
    local_id: int | None = None
    error_trace: str = ""

    def __str__(self) -> str:
        return self.serialize()

    def serialize(self) -> str:
        """Return the event as a JSON object string (torch's shape, ``asdict`` order)."""
        return _dumps(
            {
                "name": self.name,
                "run_id": self.run_id,
                "message": self.message,
                "hostname": self.hostname,
                "pid": self.pid,
                "node_state": getattr(self.node_state, "value", self.node_state),
                "master_endpoint": self.master_endpoint,
                "rank": self.rank,
                "local_id": self.local_id,
                "error_trace": self.error_trace,
            }
        )

    @staticmethod
    def deserialize(data: str | bytes | RdzvEvent) -> RdzvEvent:
        """Parse :meth:`serialize`'s output (an :class:`RdzvEvent` is returned as is).

        Raises :class:`~aelastic.events._exceptions.EventFormatError` on malformed input.
        """
        if isinstance(data, RdzvEvent):
            return data
        return _parse(RdzvEvent, data, "node_state", NodeState)

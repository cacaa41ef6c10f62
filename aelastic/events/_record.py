"""Rendezvous events: ``record_rdzv_event`` and ``construct_and_record_rdzv_event``."""

from __future__ import annotations

import os
import socket
import sys
import traceback

from ._dispatch import record, registry
from ._event import NodeState, RdzvEvent

__all__ = ("RDZV_DESTINATION", "construct_and_record_rdzv_event", "record_rdzv_event")

#: The destination of rendezvous events (null until a handler is registered).
RDZV_DESTINATION = "dynamic_rendezvous"

_hostname: str | None = None
#: created at import; destination objects live as long as the process
_rdzv = registry.get(RDZV_DESTINATION)


def _fqdn() -> str:
    global _hostname
    if _hostname is None:
        _hostname = socket.getfqdn()
    return _hostname


def record_rdzv_event(event: RdzvEvent) -> None:
    """Record ``event`` to the ``dynamic_rendezvous`` destination (never blocks)."""
    record(event, RDZV_DESTINATION)


def construct_and_record_rdzv_event(
    run_id: str,
    message: str,
    node_state: NodeState,
    name: str = "",
    hostname: str = "",
    pid: int | None = None,
    master_endpoint: str = "",
    local_id: int | None = None,
    rank: int | None = None,
    *,
    stacklevel: int = 1,
) -> None:
    """Build an :class:`RdzvEvent` and record it to ``dynamic_rendezvous``.

    Does nothing at all (not even build the event) while that destination has only null
    handlers and no subscriber. Fills ``hostname`` (FQDN) and ``pid`` when not given,
    names the event ``<caller's file name>:<name or caller's function>``, and puts
    ``traceback.format_exc()`` in ``error_trace`` when ``node_state`` is FAILED.
    ``stacklevel`` picks the caller whose file names the event (like ``logging``'s: 1
    is the direct caller; a recording helper passes 2 or more to name its own caller).
    """
    if not _rdzv.active:
        return
    frame = sys._getframe(stacklevel)
    filename = os.path.basename(frame.f_code.co_filename)
    if not name:
        name = frame.f_code.co_name
    del frame
    event = RdzvEvent(
        name=f"{filename}:{name}",
        run_id=run_id,
        message=message,
        hostname=hostname or _fqdn(),
        pid=pid or os.getpid(),
        node_state=node_state,
        master_endpoint=master_endpoint,
        rank=rank,
        local_id=local_id,
        error_trace=traceback.format_exc() if node_state == NodeState.FAILED else "",
    )
    record(event, RDZV_DESTINATION)

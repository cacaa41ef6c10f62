"""Record rendezvous transitions as RdzvEvents (via ``aelastic.events``, imported lazily)."""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

__all__ = ("record",)

_log = logging.getLogger("aelastic.rendezvous")


def record(
    run_id: str,
    message: str,
    *,
    name: str,
    state: str = "RUNNING",
    master_endpoint: str = "",
    local_id: int | None = None,
    rank: int | None = None,
    stacklevel: int = 1,
) -> None:
    """Record one rendezvous event; never raises (events must not break a rendezvous).

    ``state`` is the name of an ``aelastic.events.NodeState`` member (INIT, RUNNING,
    SUCCEEDED, FAILED). The event is named ``<file>:<name>`` after the file of the
    caller ``stacklevel`` frames up (1: whoever called this function), not this helper.
    """
    _log.debug("rdzv %s [%s]: %s", run_id, name, message)
    try:
        from ..events import NodeState, construct_and_record_rdzv_event
    except ImportError:  # the events package is not there yet
        return
    try:
        node_state: Any = getattr(NodeState, state)
        construct_and_record_rdzv_event(
            run_id=run_id,
            message=message,
            node_state=node_state,
            name=name,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            master_endpoint=master_endpoint,
            local_id=local_id,
            rank=rank,
            stacklevel=stacklevel + 1,
        )
    except Exception:  # pragma: no cover - a broken event handler must not fail the rendezvous
        _log.exception("failed to record rendezvous event %s", name)

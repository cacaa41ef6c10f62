"""Record rendezvous transitions as RdzvEvents (via ``aelastic.events``).

``aelastic.events`` is imported with this module, not at the first event: imported there,
it cost the first rendezvous of a process ~8 ms of imports on the event loop while the
nodes were joining (the agent has it imported already; an embedder using the handlers
alone paid it mid-join).
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from .. import events
from ..events._record import construct_and_record_rdzv_event

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
        node_state: Any = getattr(events.NodeState, state)
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

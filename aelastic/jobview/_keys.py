"""Where a run's node statuses live in the rendezvous store, and how to reach them.

Layout, under the run's status prefix (``aelastic/status/<run id>/`` in a c10d store,
``<etcd prefix>/<run id>/status/`` in etcd):

* ``n/<node id>``: the node's status (compact JSON), rewritten by the node;
* ``nodes``: the index, one node id per line, appended once per node and store (after
  the node's first status is written, so every listed node has a status).
"""

from __future__ import annotations

from typing import Any

from ..store import PrefixStore, Store

__all__ = ("INDEX_KEY", "REPLICAS_KEY", "STATUS_PREFIX", "node_key", "status_store")

STATUS_PREFIX = "aelastic/status"
INDEX_KEY = "nodes"
REPLICAS_KEY = "replicas"


def node_key(node: str) -> str:
    """The key of ``node``'s status."""
    return f"n/{node}"


def status_store(handler: Any) -> tuple[Store, object] | None:
    """The status store of ``handler``'s run now, and a token naming its connection.

    Follows the backend: a c10d store re-hosted by the heir after its host was lost
    is the new one (the token changes, so the caller re-registers in the new index;
    tokens compare with ``==``).
    None when the backend has no store here (``static``) or is not entered yet.
    Never does I/O.
    """
    from ..rendezvous._dynamic import DynamicRendezvousHandler

    run_id = handler.get_run_id()
    if isinstance(handler, DynamicRendezvousHandler):
        if not handler.started:
            return None
        base = handler.store
        # a client that silently reconnected to a re-hosted store keeps its object:
        # the epoch tells (once the node rejoined)
        return PrefixStore(f"{STATUS_PREFIX}/{run_id}", base), (base, handler.epoch)
    if handler.get_backend() in ("etcd", "etcd-v2") and handler.started:
        from ..rendezvous.etcd._store import EtcdStore

        client = handler.client
        prefix = f"{handler.settings.prefix}/{run_id}/status/"
        return EtcdStore(client, prefix), client
    return None

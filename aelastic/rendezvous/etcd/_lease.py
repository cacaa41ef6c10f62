"""This node's etcd lease in the etcd rendezvous: granted on first join, kept alive by a
task, revoked on leave.

The node's join key is attached to the lease, so a node that dies (or loses etcd for
longer than the TTL) loses its key within the TTL, on etcd's clock, and every peer's
watch sees it at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio
from anyio.abc import TaskGroup, TaskStatus

from ...store import StoreError
from ._client import EtcdClient

__all__ = ("NodeLease",)

log = logging.getLogger(__name__)


class NodeLease:
    """One node's lease: at most one granted at a time, re-granted after it expired.

    :param ttl: the lease's time to live in seconds (etcd's clock).
    :param label: names the lease in log messages (``rendezvous <id>: lease of node <id>``).
    :param on_lost: called when etcd reports the current lease expired, before
        :attr:`lost` is set (the handler forgets the join key that went with it).
    """

    def __init__(self, ttl: int, label: str, on_lost: Callable[[], None]) -> None:
        self._ttl = ttl
        self._label = label
        self._on_lost = on_lost
        self._id: int | None = None
        self._lock = anyio.Lock()
        self._keep_alive_scope: anyio.CancelScope | None = None
        #: Set when etcd reports the current lease expired; a new grant replaces it.
        self.lost = anyio.Event()

    @property
    def id(self) -> int | None:
        """The granted lease's id; None before the first grant, after expiry or revoke."""
        return self._id

    async def ensure(self, client: EtcdClient, task_group: TaskGroup) -> int:
        """Return the current lease, granting one and starting its keep-alive task in
        ``task_group`` when there is none.

        Concurrent calls grant one lease. Raises the client's :class:`StoreError` when
        etcd refuses or cannot be reached.
        """
        async with self._lock:
            if self._id is not None:
                return self._id
            lease = await client.lease_grant(self._ttl)
            self._id = lease
            self.lost = anyio.Event()
            await task_group.start(self._keep_alive, client, lease)
            return lease

    async def _keep_alive(
        self, client: EtcdClient, lease: int, *, task_status: TaskStatus[None]
    ) -> None:
        with anyio.CancelScope() as scope:
            self._keep_alive_scope = scope
            task_status.started()
            await client.keep_alive(lease, self._ttl)
            # Returned: etcd says the lease is gone (we were out of touch for > TTL).
            log.warning(
                "%s expired on etcd %s; peers consider it gone",
                self._label,
                client.config.describe(),
            )
            if self._id == lease:
                self._id = None
                self._on_lost()
            self.lost.set()

    async def revoke(self, client: EtcdClient) -> bool:
        """Stop the keep-alive task and revoke the lease (its keys vanish at once).

        Return False when etcd could not be told (logged; the lease then expires within
        its TTL), True otherwise; a no-op without a lease. The lease is forgotten either
        way. Not shielded: the caller bounds and shields it.
        """
        lease, self._id = self._id, None
        if self._keep_alive_scope is not None:
            self._keep_alive_scope.cancel()
        if lease is None:
            return True
        try:
            await client.lease_revoke(lease)
        except StoreError as exc:
            log.warning(
                "could not revoke lease %x on etcd %s: %s", lease, client.config.describe(), exc
            )
            return False
        return True

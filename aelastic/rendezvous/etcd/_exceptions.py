"""The errors of the etcd backend (``aelastic.rendezvous.etcd``)."""

from __future__ import annotations

from ...store import StoreError

__all__ = ("EtcdCompactedError",)


class EtcdCompactedError(StoreError):
    """A watch asked for a revision etcd has already compacted: re-read and watch again."""

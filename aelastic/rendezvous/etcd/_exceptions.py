"""The errors of the etcd backend (``aelastic.rendezvous.etcd``)."""

from __future__ import annotations

from ..._exceptions import show_public_module
from ...store import StoreError

__all__ = ()


class EtcdCompactedError(StoreError):
    """A watch asked for a revision etcd has already compacted: re-read and watch again."""


class EtcdRequestError(StoreError):
    """etcd refused a request with a non-retryable gRPC status; ``code`` is its name
    (``"NOT_FOUND"``, ``"PERMISSION_DENIED"``...), so callers branch on it, not on text."""

    def __init__(self, message: str, *, code: str, endpoint: str | None = None) -> None:
        super().__init__(message, endpoint=endpoint)
        self.code = code


show_public_module(__name__, globals())

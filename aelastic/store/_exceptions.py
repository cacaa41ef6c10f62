"""Errors raised by stores, their clients and servers."""

from __future__ import annotations

from .._exceptions import AelasticError, ConfigError, show_public_module

__all__ = (
    "StoreError",
    "StoreTimeoutError",
    "StoreConnectionError",
    "StoreClosedError",
)


class StoreError(AelasticError):
    """Base class of every store error.

    ``endpoint`` is ``"host:port"`` (or a store's description) when known, ``key``
    the key the failed operation was about, if any.
    """

    def __init__(self, message: str, *, endpoint: str | None = None, key: str | None = None):
        self.endpoint = endpoint
        self.key = key
        where = f" [store {endpoint}]" if endpoint else ""
        super().__init__(f"{message}{where}")


class StoreTimeoutError(StoreError, TimeoutError):
    """A blocking operation (``get``, ``wait``, ``multi_get``, ``queue_pop``) timed out.

    Also a :class:`TimeoutError`, so ``except TimeoutError`` catches it.
    """


class StoreConnectionError(StoreError, ConnectionError):
    """The store could not be reached, or the connection to it was lost."""


class NotAStoreError(StoreConnectionError):
    """The endpoint answered the connection handshake, but not as a TCPStore server.

    Another service holds the address (an HTTP server, a TLS or SSH port...), or a
    TCPStore too old to answer ``PING`` (torch < 2.4). Raised at once, never retried:
    a different program will not become a store. ``head`` holds the first bytes it
    sent (at most 64); the message names the kind of server they look like.
    """

    def __init__(self, message: str, *, endpoint: str | None = None, head: bytes = b"") -> None:
        super().__init__(message, endpoint=endpoint)
        self.head = head


class StoreClosedError(StoreError):
    """The store (client or server) was closed while the operation was pending or before it."""


class QueueEmptyError(StoreError):
    """A non-blocking ``queue_pop`` found the queue empty."""


class ProtocolError(StoreError):
    """A peer sent bytes that do not follow the TCPStore wire protocol."""


class StoreLimitError(StoreError, ValueError):
    """A key, value or request exceeds a configured limit of the store."""


class StoreConfigError(StoreError, ConfigError):
    """A store server or client was given invalid settings (address, port, limits)."""


class StoreUnsupportedError(StoreError):
    """The store (or the server behind it) does not implement the requested feature.

    Raised, for example, by :meth:`~aelastic.store.Store.ephemeral` against torch's own
    TCPStore server, which does not know aelastic's extension requests: fall back
    to what every server supports (heartbeat keys and timeouts).
    """


show_public_module(__name__, globals())

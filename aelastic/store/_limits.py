"""What a :class:`~aelastic.store.StoreServer` shares with its connections.

:class:`StoreLimits` (the server's options), :class:`BufferBudget` (the bytes of
partial requests held for all connections, and which connection may read more) and
:class:`ConnectionHost` (both, with the data and the server's name). Connections
depend on this module, never on the server, so the server can import them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from .._dataclass import dataclass
from ._dispatch import Dispatcher
from ._exceptions import StoreConfigError
from ._protocol import MAX_KEY_COUNT, MAX_KEY_SIZE, MAX_VALUE_SIZE
from ._state import StoreState

__all__ = (
    "FRAME_TIMEOUT",
    "MAX_BUFFERED_BYTES",
    "MAX_CONNECTIONS",
    "BufferBudget",
    "ConnectionHost",
    "StoreLimits",
)

#: Default maximum number of simultaneous client connections.
MAX_CONNECTIONS = 16384
#: Default bound on the bytes of partial requests held for all connections together
#: (beyond it only the oldest partial request is read: back-pressure, not a refusal).
MAX_BUFFERED_BYTES = 48 * 1024 * 1024
#: Default time a client has to complete a request it started sending, in seconds.
FRAME_TIMEOUT = 30.0


@dataclass(frozen=True)
class StoreLimits:
    """A server's limits; the defaults accept every request torch's (libuv) server does.

    ``max_key_size``, ``max_value_size`` and ``max_key_count`` are torch's (8 KiB,
    8 MiB, 128 Ki keys per request). ``max_frame_size`` (one whole request) and
    ``max_connection_buffer`` (the partial request held for one connection) are off
    (None) by default: memory is bounded by ``max_buffered_bytes`` instead, by not
    reading the connections whose partial request would exceed it (except the
    oldest). Set them to close a connection that sends more. Raises
    :class:`~aelastic.store._exceptions.StoreConfigError` for a limit that is not positive.
    """

    max_key_size: int = MAX_KEY_SIZE
    max_value_size: int = MAX_VALUE_SIZE
    max_key_count: int = MAX_KEY_COUNT
    max_frame_size: int | None = None
    max_connection_buffer: int | None = None
    max_buffered_bytes: int = MAX_BUFFERED_BYTES
    frame_timeout: float = FRAME_TIMEOUT
    max_connections: int = MAX_CONNECTIONS

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value is not None and value <= 0:
                raise StoreConfigError(f"{name} must be positive, got {value}")


class BufferBudget:
    """Bytes of partial requests held for all connections, and who may read more.

    A connection counts its partial request with :meth:`hold` and gives it back with
    :meth:`release`. Beyond ``limit`` bytes only the connection whose partial request
    is the oldest may read (:meth:`may_buffer`), so one request always progresses
    (it completes or times out) and frees space; the others :meth:`wait`.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._event: anyio.Event | None = None
        # owners holding a partial request, oldest first
        self._partial: dict[object, None] = {}

    def hold(self, owner: object, before: int, after: int) -> None:
        """``owner``'s partial request grew from ``before`` to ``after`` bytes (both > 0
        or a start); ``after == 0`` ends it (see :meth:`release`)."""
        if not after:
            self.release(owner, before)
            return
        if not before:
            self._partial[owner] = None
        self.held += after - before

    def release(self, owner: object, held: int) -> None:
        """``owner`` holds no partial request any more (it had ``held`` bytes)."""
        self._partial.pop(owner, None)
        if held:
            self.held -= held
            self.wake()

    def may_buffer(self, owner: object) -> bool:
        """Whether ``owner`` may read more of its partial request now."""
        if self.held <= self.limit:
            return True
        return next(iter(self._partial), owner) is owner

    async def wait(self) -> None:
        """Wait until some connection releases buffered bytes (then check again)."""
        if self._event is None:
            self._event = anyio.Event()
        await self._event.wait()

    def wake(self) -> None:
        """Wake the connections waiting for buffer space."""
        event, self._event = self._event, None
        if event is not None:
            event.set()


#: Hosts whose first refused connection the store warns about (later ones: debug).
MAX_WARNED_HOSTS = 1024


class ConnectionHost:
    """The server as its connections see it: data, limits, budget, name, task spawner.

    ``spawn(func, connection)`` runs a connection's task (its serving loop or its
    outbox drain) in the server's task group. :attr:`closing` is set when the
    server stops (on-close actions are then not performed). :attr:`connections`
    holds the open connections (a connection removes itself when it ends);
    :attr:`dispatcher` serves the idle ones while the server listens (None:
    every connection has a task of its own).
    """

    def __init__(
        self,
        state: StoreState,
        limits: StoreLimits,
        spawn: Callable[[Callable[[], Awaitable[None]], Any], None],
    ) -> None:
        self.state = state
        self.limits = limits
        self.budget = BufferBudget(limits.max_buffered_bytes)
        self.spawn = spawn
        self.address = ""
        self.closing = False
        self.connections: set[Any] = set()
        self.dispatcher: Dispatcher | None = None
        self._next_action_id = 0
        self._refused_hosts: set[str] = set()

    def first_refusal(self, peer: str) -> bool:
        """Whether a refused connection from ``peer`` (``host:port``) is the first from
        its host: a scanner or a misconfigured client is warned about once per host, the
        rest go to the debug log (at most :data:`MAX_WARNED_HOSTS` hosts remembered)."""
        host = peer.rpartition(":")[0] or peer
        if host in self._refused_hosts or len(self._refused_hosts) >= MAX_WARNED_HOSTS:
            return False
        self._refused_hosts.add(host)
        return True

    def new_action_id(self) -> int:
        """A server-wide unique id for an on-close action."""
        self._next_action_id += 1
        return self._next_action_id

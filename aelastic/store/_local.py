"""``LocalStore``: an in-process :class:`Store` (like torch's ``HashStore``)."""

# The Store API takes per-call timeouts (torch parity), hence ASYNC109.
# ruff: noqa: ASYNC109
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence

import anyio

from ._ephemeral import LocalEphemeralSession
from ._exceptions import QueueEmptyError, StoreClosedError, StoreError, StoreTimeoutError
from ._interface import EphemeralSession, Store, Value, to_bytes
from ._state import StoreState, Waiter

__all__ = ("LocalStore", "KEY_PREFIX", "describe_keys")

#: Prefix torch's TCPStore client puts in front of every user key; our stores do
#: the same so that in-process users and TCP clients see the same keys.
KEY_PREFIX = "/"


def describe_keys(keys: Sequence[str]) -> str:
    """``'a'`` or ``keys ['a', 'b']`` for error messages (long lists shortened)."""
    if len(keys) == 1:
        return f"key {keys[0]!r}"
    shown = ", ".join(repr(k) for k in keys[:5])
    more = f", ... ({len(keys)} keys)" if len(keys) > 5 else ""
    return f"keys [{shown}{more}]"


class LocalStore(Store):
    """An in-process store: no sockets, same semantics as the TCP store.

    ``LocalStore()`` owns a fresh, empty data set. ``StoreServer.local_store`` is
    a ``LocalStore`` over the server's own data, so what it writes is what TCP
    clients (ours or torch's) read, and blocking calls on it are woken by their
    writes. Keys are stored with torch's ``/`` prefix, like the TCP clients do.

    Blocking calls wait on events (no polling), raise
    :class:`StoreTimeoutError` on timeout and :class:`StoreClosedError` if the
    store is closed meanwhile; cancelling one leaves nothing registered.
    Must be used from a single event loop.
    """

    def __init__(
        self,
        *,
        timeout: float = 300.0,
        name: str = "in-process",
        _state: StoreState | None = None,
    ) -> None:
        self.timeout = timeout
        self.name = name
        self._state = StoreState() if _state is None else _state
        self._closed = False
        self._blocked: set[anyio.Event] = set()

    def __repr__(self) -> str:
        return f"LocalStore({self.name!r})"

    # -- helpers --------------------------------------------------------------

    def _k(self, key: str) -> bytes:
        if self._closed:
            raise StoreClosedError("the store is closed", endpoint=self.name, key=key)
        return (KEY_PREFIX + key).encode()

    def _timeout(self, timeout: float | None) -> float:
        return self.timeout if timeout is None else timeout

    async def _block(
        self,
        register: Callable[[Callable[[], object]], Waiter | None],
        timeout: float | None,
        what: str,
        key: str | None,
    ) -> None:
        """Register a waiter with ``register`` and block until it fires.

        Raises :class:`StoreTimeoutError` after ``timeout`` and
        :class:`StoreClosedError` when the store is closed meanwhile; ``what`` says
        what was awaited. Cancellation unregisters the waiter.
        """
        event = anyio.Event()
        waiter = register(event.set)
        if waiter is None:
            return
        t = self._timeout(timeout)
        self._blocked.add(event)
        try:
            with anyio.move_on_after(t) as scope:
                await event.wait()
        finally:
            self._blocked.discard(event)
            self._state.cancel_waiter(waiter)
        if scope.cancelled_caught:
            raise StoreTimeoutError(f"timed out after {t} s {what}", endpoint=self.name, key=key)
        if self._closed:
            raise StoreClosedError(
                f"the store was closed while {what}", endpoint=self.name, key=key
            )

    async def _wait_for(self, keys: Sequence[str], timeout: float | None) -> None:
        raw = [self._k(k) for k in keys]
        if self._state.check(raw):
            return
        await self._block(
            lambda wake: self._state.add_waiter(raw, wake),
            timeout,
            f"waiting for {describe_keys(keys)}",
            keys[0] if len(keys) == 1 else None,
        )

    # -- Store API ------------------------------------------------------------

    async def set(self, key: str, value: Value) -> None:
        self._state.set(self._k(key), to_bytes(value))

    async def get(self, key: str, *, timeout: float | None = None) -> bytes:
        k = self._k(key)
        v = self._state.get(k)
        if v is None:
            await self._wait_for([key], timeout)
            v = self._state.get(k)
        return b"" if v is None else v

    async def add(self, key: str, amount: int) -> int:
        try:
            return self._state.add(self._k(key), amount)
        except ValueError as exc:
            raise StoreError(str(exc), endpoint=self.name, key=key) from None

    async def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        return self._state.compare_set(self._k(key), to_bytes(expected), to_bytes(desired))

    async def wait(self, keys: Sequence[str], *, timeout: float | None = None) -> None:
        await self._wait_for(list(keys), timeout)

    async def check(self, keys: Sequence[str]) -> bool:
        return self._state.check([self._k(k) for k in keys])

    async def delete_key(self, key: str) -> bool:
        return self._state.delete(self._k(key))

    async def num_keys(self) -> int:
        if self._closed:
            raise StoreClosedError("the store is closed", endpoint=self.name)
        return self._state.num_keys()

    async def list_keys(self) -> list[str]:
        if self._closed:
            raise StoreClosedError("the store is closed", endpoint=self.name)
        return [strip_prefix(k) for k in self._state.list_keys()]

    async def multi_get(self, keys: Sequence[str], *, timeout: float | None = None) -> list[bytes]:
        keys = list(keys)
        await self._wait_for(keys, timeout)
        return self._state.multi_get([self._k(k) for k in keys])

    async def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        if len(keys) != len(values):
            raise ValueError(f"multi_set got {len(keys)} keys but {len(values)} values")
        self._state.multi_set([self._k(k) for k in keys], [to_bytes(v) for v in values])

    async def append(self, key: str, value: Value) -> None:
        self._state.append(self._k(key), to_bytes(value))

    async def queue_push(self, key: str, value: Value) -> None:
        self._state.queue_push(self._k(key), to_bytes(value))

    async def queue_pop(
        self, key: str, *, block: bool = True, timeout: float | None = None
    ) -> bytes:
        k = self._k(key)
        v = self._state.queue_pop(k)
        if v is not None:
            return v
        if not block:
            raise QueueEmptyError(f"queue {key!r} is empty", endpoint=self.name, key=key)
        event = anyio.Event()
        got: list[bytes] = []

        def deliver(value: bytes) -> None:
            got.append(value)
            event.set()

        popper = self._state.add_popper(k, deliver)
        t = self._timeout(timeout)
        self._blocked.add(event)
        try:
            with anyio.move_on_after(t):
                await event.wait()
        finally:
            self._blocked.discard(event)
            self._state.cancel_popper(k, popper)
        if got:
            return got[0]
        if self._closed:
            raise StoreClosedError(
                f"the store was closed while popping queue {key!r}", endpoint=self.name, key=key
            )
        raise StoreTimeoutError(
            f"timed out after {t} s waiting for key {key!r} (queue_pop)",
            endpoint=self.name,
            key=key,
        )

    async def queue_len(self, key: str) -> int:
        return self._state.queue_len(self._k(key))

    async def barrier_arrive(
        self, key: str, world_size: int, *, timeout: float | None = None
    ) -> None:
        """Server-side style barrier: return once ``world_size`` callers arrived at ``key``."""
        k = self._k(key)
        await self._block(
            lambda wake: self._state.barrier(k, world_size, wake),
            timeout,
            f"in barrier {key!r} of {world_size}",
            key,
        )

    @contextlib.asynccontextmanager
    async def ephemeral(self) -> AsyncIterator[EphemeralSession]:
        """A session whose on-close actions run when the block is left (however it is left)."""
        if self._closed:
            raise StoreClosedError("the store is closed", endpoint=self.name)
        session = LocalEphemeralSession(self._state, KEY_PREFIX, self.name)
        try:
            yield session
        finally:
            session.end()

    async def aclose(self) -> None:
        """Close the store: blocked calls raise :class:`StoreClosedError`. Idempotent."""
        self.close()

    def close(self) -> None:
        """:meth:`aclose` without awaiting (for cleanups that must not yield)."""
        self._closed = True
        for event in list(self._blocked):
            event.set()
        self._blocked.clear()


def strip_prefix(key: bytes) -> str:
    """Decode a stored key, dropping torch's ``/`` prefix when present."""
    s = key.decode(errors="surrogateescape")
    return s[1:] if s.startswith(KEY_PREFIX) else s

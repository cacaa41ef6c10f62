"""The async key-value store interface every aelastic component awaits against.

It mirrors the operation set of ``torch.distributed.Store``: keys are ``str``,
values are ``bytes`` (``str`` values are encoded as UTF-8), counters written by
:meth:`Store.add` are decimal ASCII so that torch clients read the same numbers.
"""

# The Store API takes per-call timeouts (torch parity), hence ASYNC109.
# ruff: noqa: ASYNC109
from __future__ import annotations

import abc
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Literal

from anyio.abc import AsyncResource

from ._exceptions import StoreUnsupportedError

__all__ = ("DEFAULT_TIMEOUT", "EphemeralSession", "OnCloseAction", "Store", "Value", "to_bytes")

#: Default timeout, in seconds, of blocking operations (torch's store default).
DEFAULT_TIMEOUT = 300.0

Value = bytes | str


def to_bytes(value: Value) -> bytes:
    """Return ``value`` as bytes, encoding ``str`` as UTF-8."""
    return value.encode() if isinstance(value, str) else bytes(value)


#: The store write an on-close action performs.
OnCloseAction = Literal["set", "add", "append", "queue_push", "delete_key"]


class EphemeralSession(abc.ABC):
    """Writes the store performs when this session ends (see the module docstring).

    Obtained with ``async with store.ephemeral() as session``. Leaving the block
    ends the session, which performs the actions still registered (a clean exit
    is also an exit); :meth:`cancel` them first to leave without a trace.
    Actions run in registration order, exactly once.
    """

    @abc.abstractmethod
    async def on_close(self, action: OnCloseAction, key: str, value: Value = b"") -> int:
        """Register ``action`` on ``key`` (``set``/``append``/``queue_push`` ``value``,
        ``add`` the decimal delta ``value``, ``delete_key``); return its id.

        Raises :class:`ValueError` for an unknown action or a non-integer ``add``
        delta, :class:`~aelastic.store._exceptions.StoreLimitError` beyond
        ``MAX_ON_CLOSE_ACTIONS`` (1024) actions, and the store's connection errors.
        When it returns, the server holds the action: a crash right after it is
        covered.
        """

    @abc.abstractmethod
    async def cancel(self, action_id: int | None = None) -> int:
        """Forget action ``action_id`` (all with ``None``); return how many were removed."""


class Store(AsyncResource):
    """An async key-value store with torch's Store semantics.

    Blocking operations take ``timeout`` in seconds; ``None`` means the store's
    :attr:`timeout`. They raise :class:`~aelastic.store.StoreTimeoutError` when it
    expires and :class:`~aelastic.store.StoreClosedError` or
    :class:`~aelastic.store.StoreConnectionError` when the store goes away while
    they wait: a blocked call never hangs past its timeout. Cancelling any call
    leaves the store usable by other tasks.

    Stores are async context managers (:class:`anyio.abc.AsyncResource`):
    ``async with store: ...`` returns the store and awaits :meth:`aclose` on exit.
    """

    #: Default timeout of blocking operations, in seconds.
    timeout: float = DEFAULT_TIMEOUT

    @abc.abstractmethod
    async def set(self, key: str, value: Value) -> None:
        """Set ``key`` to ``value``, overwriting it; wakes waiters on ``key``."""

    @abc.abstractmethod
    async def get(self, key: str, *, timeout: float | None = None) -> bytes:
        """Return the value of ``key``, waiting until it exists."""

    @abc.abstractmethod
    async def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the integer counter ``key`` (missing counts as 0); return the sum."""

    @abc.abstractmethod
    async def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        """Set ``key`` to ``desired`` if its value is ``expected``; torch's semantics.

        * key missing, ``expected`` empty: set it, return ``desired``;
        * key missing, ``expected`` non-empty: set nothing, return ``expected``;
        * key present and equal to ``expected``: set it, return ``desired``;
        * key present and different: set nothing, return the current value.
        """

    @abc.abstractmethod
    async def wait(self, keys: Sequence[str], *, timeout: float | None = None) -> None:
        """Wait until every key in ``keys`` exists."""

    @abc.abstractmethod
    async def check(self, keys: Sequence[str]) -> bool:
        """Return whether every key in ``keys`` exists, without waiting."""

    @abc.abstractmethod
    async def delete_key(self, key: str) -> bool:
        """Delete ``key``; return whether it existed."""

    @abc.abstractmethod
    async def num_keys(self) -> int:
        """Return the number of keys (queues not included)."""

    @abc.abstractmethod
    async def list_keys(self) -> list[str]:
        """Return every key (queues not included)."""

    @abc.abstractmethod
    async def multi_get(self, keys: Sequence[str], *, timeout: float | None = None) -> list[bytes]:
        """Return the values of ``keys`` in order, waiting until all exist."""

    @abc.abstractmethod
    async def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        """Set each of ``keys`` to the matching entry of ``values``."""

    @abc.abstractmethod
    async def append(self, key: str, value: Value) -> None:
        """Append ``value`` to ``key``'s value, creating the key if missing."""

    @abc.abstractmethod
    async def queue_push(self, key: str, value: Value) -> None:
        """Push ``value`` onto the FIFO queue ``key``; wakes one blocked popper."""

    @abc.abstractmethod
    async def queue_pop(
        self, key: str, *, block: bool = True, timeout: float | None = None
    ) -> bytes:
        """Pop the oldest value of queue ``key``.

        With ``block=False`` an empty queue raises
        :class:`~aelastic.store._exceptions.QueueEmptyError`; otherwise wait for a value.
        """

    @abc.abstractmethod
    async def queue_len(self, key: str) -> int:
        """Return the number of values in queue ``key``."""

    def ephemeral(self) -> AbstractAsyncContextManager[EphemeralSession]:
        """A session whose registered writes the store performs when it ends.

        ``async with store.ephemeral() as session: await session.on_close(
        "queue_push", "departed", node_id)``: if this process dies, its connection
        closes and the server pushes at once (see
        :class:`EphemeralSession`). Raises
        :class:`~aelastic.store._exceptions.StoreUnsupportedError` (on entering) where the store
        cannot do it, e.g. torch's own TCPStore server.
        """
        raise StoreUnsupportedError(f"{type(self).__name__} has no ephemeral sessions")

    async def aclose(self) -> None:  # optional hook, default no-op
        """Release the store's resources. Idempotent; safe under cancellation."""

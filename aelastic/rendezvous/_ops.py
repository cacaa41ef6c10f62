"""Store calls of the rendezvous, with store errors translated to rendezvous errors."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext

from ..store import (
    Store,
    StoreClosedError,
    StoreConnectionError,
    StoreError,
    StoreTimeoutError,
)
from ._exceptions import RendezvousError, map_store_errors, rendezvous_error

__all__ = ("Ops",)


class Ops:
    """The subset of :class:`Store` the rendezvous uses, with translated errors.

    ``get``/``queue_pop``/``wait`` with an explicit ``timeout`` raise the store's
    :class:`~aelastic.store.StoreTimeoutError` on expiry (callers handle it), everything
    else raises rendezvous errors. Every request that gets a reply runs inside ``guard``
    (a ``StoreWatch.guard``: a frozen store host is noticed); requests without a reply
    are no evidence either way.
    """

    def __init__(
        self,
        store: Store,
        read_timeout: float,
        guard: Callable[[], AbstractContextManager[None]] = nullcontext,
    ) -> None:
        self.store = store
        self.read_timeout = read_timeout
        self.guard = guard

    async def add(self, key: str, amount: int) -> int:
        with self.guard(), map_store_errors(f"add to {key!r}"):
            return await self.store.add(key, amount)

    async def set(self, key: str, value: str) -> None:
        with map_store_errors(f"set {key!r}"):
            await self.store.set(key, value)

    async def multi_set(self, keys: Sequence[str], values: Sequence[str]) -> None:
        with map_store_errors(f"set {_first(keys)!r}"):
            await self.store.multi_set(keys, values)

    async def check(self, key: str) -> bool:
        with self.guard(), map_store_errors(f"check {key!r}"):
            return await self.store.check([key])

    async def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        with self.guard(), map_store_errors(f"compare-and-set {key!r}"):
            return await self.store.compare_set(key, expected, desired)

    async def delete(self, key: str) -> None:
        with self.guard(), map_store_errors(f"delete {key!r}"):
            await self.store.delete_key(key)

    async def push(self, key: str, value: str, *, confirm: bool = True) -> None:
        """Push ``value`` onto queue ``key``; with ``confirm``, make sure it landed.

        A push has no reply: if the connection drops right after it, it may vanish
        and the reader would wait for a timeout. Confirmed, a CHECK follows on the same
        connection (answered only after the push was applied); if that fails the push
        is sent once more, so readers must accept a duplicate (every rendezvous
        message is idempotent).
        """
        with self.guard() if confirm else nullcontext(), map_store_errors(f"push to {key!r}"):
            try:
                await self.store.queue_push(key, value)
                if confirm:
                    await self.store.check([key])
            except (StoreConnectionError, StoreClosedError, OSError):
                if not confirm:
                    raise
                await self.store.queue_push(key, value)  # the client reconnected
                await self.store.check([key])

    async def get(self, key: str, timeout: float | None = None) -> bytes:
        """Blocking get; with ``timeout`` given, StoreTimeoutError propagates untranslated."""
        if timeout is None:
            with self.guard(), map_store_errors(f"read {key!r}"):
                return await self.store.get(key, timeout=self.read_timeout)
        with self.guard(), map_store_errors(f"read {key!r}", keep=(StoreTimeoutError,)):
            return await self.store.get(key, timeout=max(timeout, 0.001))

    async def pop(self, key: str, timeout: float) -> bytes | None:
        """Blocking queue pop; return None when ``timeout`` expires first."""
        try:
            with self.guard():  # an expired pop is no answer of the store
                return await self.store.queue_pop(key, block=True, timeout=max(timeout, 0.001))
        except StoreTimeoutError:
            return None
        except RendezvousError:
            raise  # the guard found the store's host lost
        except (StoreError, OSError) as exc:
            raise rendezvous_error(exc, f"pop from {key!r}") from exc

    async def multi_get(self, keys: Sequence[str], timeout: float) -> list[bytes]:
        """Blocking multi-get; StoreTimeoutError propagates untranslated."""
        with self.guard(), map_store_errors(f"read {_first(keys)!r}", keep=(StoreTimeoutError,)):
            return await self.store.multi_get(keys, timeout=max(timeout, 0.001))


def _first(keys: Sequence[str]) -> str:
    return keys[0] if keys else ""

"""``PrefixStore``: a namespaced view of another store (like torch's ``PrefixStore``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

from ._interface import EphemeralSession, OnCloseAction, Store, Value

__all__ = ("PrefixStore",)


class PrefixStore(Store):
    """Every key ``k`` is stored as ``f"{prefix}/{k}"`` in ``store``, like torch's PrefixStore.

    ``num_keys`` counts the whole underlying store (as torch does); ``list_keys``
    returns only this prefix's keys, with the prefix removed. Closing a
    ``PrefixStore`` does not close the underlying store. Errors and cancellation
    behave as in the underlying store.
    """

    def __init__(self, prefix: str, store: Store) -> None:
        self.prefix = prefix
        self.store = store
        self.timeout = store.timeout
        self._p = prefix + "/"

    def __repr__(self) -> str:
        return f"PrefixStore({self.prefix!r}, {self.store!r})"

    def _k(self, key: str) -> str:
        return self._p + key

    async def set(self, key: str, value: Value) -> None:
        await self.store.set(self._p + key, value)

    async def get(self, key: str, *, timeout: float | None = None) -> bytes:
        return await self.store.get(self._p + key, timeout=timeout)

    async def add(self, key: str, amount: int) -> int:
        return await self.store.add(self._p + key, amount)

    async def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        return await self.store.compare_set(self._p + key, expected, desired)

    async def wait(self, keys: Sequence[str], *, timeout: float | None = None) -> None:
        await self.store.wait([self._p + k for k in keys], timeout=timeout)

    async def check(self, keys: Sequence[str]) -> bool:
        return await self.store.check([self._p + k for k in keys])

    async def delete_key(self, key: str) -> bool:
        return await self.store.delete_key(self._p + key)

    async def num_keys(self) -> int:
        return await self.store.num_keys()

    async def list_keys(self) -> list[str]:
        n = len(self._p)
        return [k[n:] for k in await self.store.list_keys() if k.startswith(self._p)]

    async def multi_get(self, keys: Sequence[str], *, timeout: float | None = None) -> list[bytes]:
        return await self.store.multi_get([self._p + k for k in keys], timeout=timeout)

    async def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        await self.store.multi_set([self._p + k for k in keys], values)

    async def append(self, key: str, value: Value) -> None:
        await self.store.append(self._p + key, value)

    async def queue_push(self, key: str, value: Value) -> None:
        await self.store.queue_push(self._p + key, value)

    async def queue_pop(
        self, key: str, *, block: bool = True, timeout: float | None = None
    ) -> bytes:
        return await self.store.queue_pop(self._p + key, block=block, timeout=timeout)

    async def queue_len(self, key: str) -> int:
        return await self.store.queue_len(self._p + key)

    @contextlib.asynccontextmanager
    async def ephemeral(self) -> AsyncIterator[EphemeralSession]:
        async with self.store.ephemeral() as inner:
            yield _PrefixSession(self._p, inner)


class _PrefixSession(EphemeralSession):
    """An ephemeral session whose keys carry a :class:`PrefixStore`'s prefix."""

    def __init__(self, prefix: str, inner: EphemeralSession) -> None:
        self._p = prefix
        self._inner = inner

    async def on_close(self, action: OnCloseAction, key: str, value: Value = b"") -> int:
        return await self._inner.on_close(action, self._p + key, value)

    async def cancel(self, action_id: int | None = None) -> int:
        return await self._inner.cancel(action_id)

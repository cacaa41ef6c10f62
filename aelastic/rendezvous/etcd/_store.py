"""``EtcdStore``: aelastic's :class:`~aelastic.store.Store` on etcd v3.

Layout under the store's ``prefix`` (bytes): ``k/<key>`` holds plain keys and
counters; ``q/<quoted name>/<unique id>`` holds queue items, ordered by their
creation revision. Atomic updates (``add``, ``append``, ``compare_set``, queue
pops) are transactions guarded by the key's modification revision; blocking
reads (``get``, ``wait``, ``multi_get``, ``queue_pop``) read once and then watch
from the revision after that read, so no write between the two is missed, and
the watch resumes from the last revision it delivered after a reconnect.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from urllib.parse import quote

import anyio

from ...store import Store, StoreClosedError, StoreError, StoreTimeoutError
from ...store._exceptions import QueueEmptyError
from ...store._interface import Value, to_bytes
from ._client import (
    EtcdClient,
    cmp_mod,
    cmp_version,
    op_delete,
    op_put,
    op_range,
    prefix_end,
)
from ._exceptions import EtcdCompactedError

__all__ = ("EtcdStore",)

_UpdateFn = Callable[[bytes | None], bytes]

#: etcd's default ``--max-txn-ops``: operations per transaction.
_TXN_OPS = 128


class EtcdStore(Store):
    """An etcd-backed :class:`~aelastic.store.Store` scoped to one key prefix.

    ``client`` is borrowed unless ``owns_client`` is true (then :meth:`aclose`
    closes it). Blocking calls raise :class:`~aelastic.store.StoreTimeoutError`
    naming the key and the endpoint; an unreachable etcd raises
    :class:`~aelastic.store.StoreConnectionError` after the client's
    ``read_timeout``. Cancelling a call cancels its RPCs; the store stays usable.
    """

    def __init__(
        self,
        client: EtcdClient,
        prefix: str | bytes,
        *,
        timeout: float | None = None,
        owns_client: bool = False,
    ) -> None:
        self.client = client
        self.prefix = prefix.encode() if isinstance(prefix, str) else bytes(prefix)
        if timeout is not None:
            self.timeout = timeout
        self._owns_client = owns_client
        self._closed = False

    def __repr__(self) -> str:
        return f"EtcdStore({self.client.config.describe()!r}, prefix={self.prefix.decode()!r})"

    def prefixed(self, sub: str) -> EtcdStore:
        """Return a store over ``<prefix><sub>/`` sharing this store's client."""
        return EtcdStore(self.client, self.prefix + sub.encode() + b"/", timeout=self.timeout)

    async def aclose(self) -> None:
        self._closed = True
        if self._owns_client:
            await self.client.aclose()

    # -- helpers ---------------------------------------------------------------------

    def _k(self, key: str) -> bytes:
        return self.prefix + b"k/" + key.encode()

    def _q(self, key: str) -> bytes:
        return self.prefix + b"q/" + quote(key, safe="").encode() + b"/"

    def _check_open(self, key: str | None = None) -> None:
        if self._closed:
            raise StoreClosedError(
                "the etcd store is closed", endpoint=self.client.endpoint, key=key
            )

    def _timeout_error(self, what: str, keys: Sequence[str], timeout: float) -> StoreTimeoutError:
        shown = ", ".join(repr(k) for k in keys[:5]) + (" ..." if len(keys) > 5 else "")
        return StoreTimeoutError(
            f"timed out after {timeout:g}s {what} {shown}",
            endpoint=self.client.endpoint,
            key=keys[0] if keys else None,
        )

    async def _update(self, key: str, fn: _UpdateFn) -> bytes:
        """Atomically replace ``key``'s value by ``fn(old)``; return the new value."""
        k = self._k(key)
        # First guess: the key is missing (1 request when it is).
        compare = [cmp_version(k, 0)]
        old: bytes | None = None
        while True:
            new = fn(old)
            reply = await self.client.txn(compare, [op_put(k, new)], [op_range(k)])
            if reply.succeeded:
                return new
            kvs = reply.responses[0].response_range.kvs
            if kvs:
                old, compare = bytes(kvs[0].value), [cmp_mod(k, kvs[0].mod_revision)]
            else:
                old, compare = None, [cmp_version(k, 0)]

    async def _read_many(self, keys: Sequence[bytes]) -> tuple[list[bytes | None], int]:
        """Read ``keys`` at one revision (:meth:`EtcdClient.read`: never a read-only
        transaction). Returns their values and that revision: a watch from the revision
        after it sees every later write to any of the keys.
        """
        replies, revision = await self.client.read(keys)
        return [bytes(r.kvs[0].value) if r.kvs else None for r in replies], revision

    async def _wait_values(
        self,
        keys: Sequence[str],
        timeout: float | None,  # noqa: ASYNC109
        what: str,
    ) -> list[bytes]:
        self._check_open(keys[0] if keys else None)
        if not keys:
            return []
        limit = self.timeout if timeout is None else timeout
        raw = [self._k(k) for k in keys]
        try:
            with anyio.fail_after(limit):
                while True:
                    values, revision = await self._read_many(raw)
                    missing = {raw[i]: i for i, v in enumerate(values) if v is None}
                    if not missing:
                        return [v for v in values if v is not None]
                    if len(raw) == 1:
                        watch_key, watch_end = raw[0], None
                    else:
                        watch_key = self.prefix + b"k/"
                        watch_end = prefix_end(watch_key)
                    try:
                        async with self.client.watch(
                            watch_key, watch_end, start_revision=revision + 1, no_delete=True
                        ) as watch:
                            while missing:
                                for event in await watch.next():
                                    index = missing.pop(bytes(event.kv.key), None)
                                    if index is not None:
                                        values[index] = bytes(event.kv.value)
                    except EtcdCompactedError:
                        continue  # history gone: read again
                    return [v for v in values if v is not None]
        except TimeoutError:
            raise self._timeout_error(what, keys, limit) from None

    # -- Store API -------------------------------------------------------------------

    async def set(self, key: str, value: Value) -> None:
        self._check_open(key)
        await self.client.put(self._k(key), to_bytes(value))

    async def get(self, key: str, *, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        return (await self._wait_values([key], timeout, "waiting for key"))[0]

    async def add(self, key: str, amount: int) -> int:
        self._check_open(key)

        def bump(old: bytes | None) -> bytes:
            try:
                current = int(old) if old is not None else 0
            except ValueError:
                raise StoreError(
                    f"add() on key {key!r} whose value {(old or b'')[:40]!r} is not an integer",
                    endpoint=self.client.endpoint,
                    key=key,
                ) from None
            return str(current + amount).encode()

        return int(await self._update(key, bump))

    async def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        self._check_open(key)
        k, exp, des = self._k(key), to_bytes(expected), to_bytes(desired)
        while True:
            kvs = (await self.client.range(k)).kvs
            if not kvs:  # missing
                if exp:
                    return exp
                done = await self.client.txn([cmp_version(k, 0)], [op_put(k, des)])
                if done.succeeded:
                    return des
                continue
            kv = kvs[0]
            if bytes(kv.value) != exp:
                return bytes(kv.value)
            done = await self.client.txn([cmp_mod(k, kv.mod_revision)], [op_put(k, des)])
            if done.succeeded:
                return des

    async def wait(self, keys: Sequence[str], *, timeout: float | None = None) -> None:  # noqa: ASYNC109
        await self._wait_values(list(keys), timeout, "waiting for keys")

    async def check(self, keys: Sequence[str]) -> bool:
        self._check_open()
        if not keys:
            return True
        values, _ = await self._read_many([self._k(k) for k in keys])
        return all(v is not None for v in values)

    async def delete_key(self, key: str) -> bool:
        self._check_open(key)
        reply = await self.client.delete(self._k(key))
        return int(reply.deleted) > 0

    async def num_keys(self) -> int:
        self._check_open()
        start = self.prefix + b"k/"
        reply = await self.client.range(start, prefix_end(start), count_only=True)
        return int(reply.count)

    async def list_keys(self) -> list[str]:
        self._check_open()
        start = self.prefix + b"k/"
        reply = await self.client.range(start, prefix_end(start), keys_only=True)
        return [bytes(kv.key)[len(start) :].decode() for kv in reply.kvs]

    async def multi_get(self, keys: Sequence[str], *, timeout: float | None = None) -> list[bytes]:  # noqa: ASYNC109
        return await self._wait_values(list(keys), timeout, "waiting for keys")

    async def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        self._check_open()
        if len(keys) != len(values):
            raise ValueError(f"multi_set got {len(keys)} keys but {len(values)} values")
        puts = [op_put(self._k(k), to_bytes(v)) for k, v in zip(keys, values, strict=True)]
        for i in range(0, len(puts), _TXN_OPS):  # atomic per 128 keys (etcd's op limit)
            await self.client.txn([], puts[i : i + _TXN_OPS])

    async def append(self, key: str, value: Value) -> None:
        self._check_open(key)
        tail = to_bytes(value)
        await self._update(key, lambda old: (old or b"") + tail)

    async def queue_push(self, key: str, value: Value) -> None:
        self._check_open(key)
        await self.client.put(self._q(key) + uuid.uuid4().hex.encode(), to_bytes(value))

    async def _try_pop(self, key: str) -> tuple[bytes | None, int]:
        """Pop the oldest item; return ``(value or None if empty, read revision)``."""
        start = self._q(key)
        while True:
            reply = await self.client.range(start, prefix_end(start), limit=1, sort_by_create=True)
            if not reply.kvs:
                return None, int(reply.header.revision)
            kv = reply.kvs[0]
            done = await self.client.txn(
                [cmp_mod(bytes(kv.key), kv.mod_revision)], [op_delete(bytes(kv.key))]
            )
            if done.succeeded:
                return bytes(kv.value), int(done.header.revision)
            # Another popper won this item: try the next one.

    async def queue_pop(
        self,
        key: str,
        *,
        block: bool = True,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> bytes:
        self._check_open(key)
        if not block:
            value, _ = await self._try_pop(key)
            if value is None:
                raise QueueEmptyError(
                    f"queue {key!r} is empty", endpoint=self.client.endpoint, key=key
                )
            return value
        limit = self.timeout if timeout is None else timeout
        start = self._q(key)
        try:
            with anyio.fail_after(limit):
                while True:
                    value, revision = await self._try_pop(key)
                    if value is not None:
                        return value
                    try:
                        async with self.client.watch(
                            start, prefix_end(start), start_revision=revision + 1, no_delete=True
                        ) as watch:
                            await watch.next()
                    except EtcdCompactedError:
                        pass
        except TimeoutError:
            raise self._timeout_error("waiting to pop queue", [key], limit) from None

    async def queue_len(self, key: str) -> int:
        self._check_open(key)
        start = self._q(key)
        reply = await self.client.range(start, prefix_end(start), count_only=True)
        return int(reply.count)

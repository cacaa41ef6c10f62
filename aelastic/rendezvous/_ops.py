"""Store calls of the rendezvous, with store errors translated to rendezvous errors."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext

from ..store import (
    Store,
    StoreClosedError,
    StoreConnectionError,
    StoreError,
    StoreTimeoutError,
)
from ._exceptions import RendezvousConnectionError, RendezvousStateError

__all__ = ("Ops", "translate", "translated")


def translated(what: str, key: str, exc: BaseException) -> Exception | None:
    """Return the rendezvous error for store error ``exc``, or None if it is no store error."""
    if isinstance(exc, (StoreConnectionError, StoreClosedError, StoreTimeoutError, OSError)):
        return RendezvousConnectionError(
            f"rendezvous store unreachable while trying to {what} {key!r}: {exc}"
        )
    if isinstance(exc, StoreError):
        return RendezvousStateError(f"rendezvous store refused to {what} {key!r}: {exc}")
    return None


@contextmanager
def translate(what: str, key: str) -> Iterator[None]:
    """Turn store errors raised while doing ``what`` on ``key`` into rendezvous errors.

    Lost or closed connections and timed-out reads become
    :class:`RendezvousConnectionError`; any other store error (a counter that is not a
    number, an oversized value) means the stored state is wrong:
    :class:`RendezvousStateError`. Both name the key.
    """
    try:
        yield
    except (StoreError, OSError) as exc:
        new = translated(what, key, exc)
        assert new is not None
        raise new from exc


def _must(exc: Exception | None) -> Exception:
    assert exc is not None
    return exc


class Ops:
    """The subset of :class:`Store` the rendezvous uses, with translated errors.

    ``get``/``queue_pop``/``wait`` with an explicit ``timeout`` raise the store's
    :class:`~aelastic.store.StoreTimeoutError` on expiry (callers handle it), everything
    else raises rendezvous errors.
    """

    def __init__(
        self,
        store: Store,
        read_timeout: float,
        guard: Callable[[], AbstractContextManager[None]] = nullcontext,
    ) -> None:
        self.store = store
        self.read_timeout = read_timeout
        #: wraps every request (a ``StoreWatch.guard``: a frozen store host is noticed)
        self.guard = guard

    async def add(self, key: str, amount: int) -> int:
        with self.guard(), translate("add to", key):
            return await self.store.add(key, amount)

    async def set(self, key: str, value: str) -> None:
        with translate("set", key):  # no reply: no evidence either way
            await self.store.set(key, value)

    async def multi_set(self, keys: Sequence[str], values: Sequence[str]) -> None:
        with translate("set", keys[0] if keys else ""):
            await self.store.multi_set(keys, values)

    async def check(self, key: str) -> bool:
        with self.guard(), translate("check", key):
            return await self.store.check([key])

    async def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        with self.guard(), translate("compare-and-set", key):
            return await self.store.compare_set(key, expected, desired)

    async def delete(self, key: str) -> None:
        with self.guard(), translate("delete", key):
            await self.store.delete_key(key)

    async def push(self, key: str, value: str, *, confirm: bool = True) -> None:
        """Push ``value`` onto queue ``key``; with ``confirm``, make sure it landed.

        A push has no reply: if the connection drops right after it, it may vanish
        and the reader would wait for a timeout. Confirmed, a CHECK follows on the same
        connection (answered only after the push was applied); if that fails the push
        is sent once more, so readers must accept a duplicate (every rendezvous
        message is idempotent).
        """
        with self.guard() if confirm else nullcontext(), translate("push to", key):
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
            with self.guard(), translate("read", key):
                return await self.store.get(key, timeout=self.read_timeout)
        with self.guard():
            try:
                return await self.store.get(key, timeout=max(timeout, 0.001))
            except StoreTimeoutError:
                raise
            except (StoreError, OSError) as exc:
                raise _must(translated("read", key, exc)) from exc

    async def pop(self, key: str, timeout: float) -> bytes | None:
        """Blocking queue pop; return None when ``timeout`` expires first."""
        try:
            with self.guard():  # an expired pop is no answer of the store
                return await self.store.queue_pop(key, block=True, timeout=max(timeout, 0.001))
        except StoreTimeoutError:
            return None
        except (StoreError, OSError) as exc:
            if isinstance(exc, RendezvousConnectionError):
                raise
            raise _must(translated("pop from", key, exc)) from exc

    async def multi_get(self, keys: Sequence[str], timeout: float) -> list[bytes]:
        """Blocking multi-get; StoreTimeoutError propagates untranslated."""
        with self.guard():
            try:
                return await self.store.multi_get(keys, timeout=max(timeout, 0.001))
            except StoreTimeoutError:
                raise
            except (StoreError, OSError) as exc:
                raise _must(translated("read", keys[0] if keys else "", exc)) from exc

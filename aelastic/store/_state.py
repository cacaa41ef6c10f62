"""The store's in-memory data model: keys, queues, counters and event-driven waiters.

:class:`StoreState` is synchronous and I/O-free; the TCP server and
:class:`LocalStore` drive it. Waiting never polls: a waiter is a callback
registered on each missing key and fired once, by the mutation that makes its
last key present. Semantics follow torch's libuv server:

* GET of a missing key returns ``None`` (the server answers empty bytes);
* a key counts as present if it has a value or is a non-empty queue;
* SET, ADD, APPEND, COMPARE_SET (when it writes) and QUEUE_PUSH wake waiters;
* counters are decimal ASCII; ADD on a non-integer value raises :class:`ValueError`.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterable, Sequence

__all__ = ("StoreState", "Waiter")


class Waiter:
    """A pending wait for keys (or a barrier arrival); fires ``callback`` at most once."""

    __slots__ = ("active", "barrier", "callback", "keys", "remaining")

    def __init__(
        self, keys: list[bytes], callback: Callable[[], object], barrier: bytes | None = None
    ) -> None:
        self.keys = keys
        self.remaining = len(keys)
        self.callback = callback
        self.active = True
        self.barrier = barrier


class _Popper:
    __slots__ = ("active", "callback")

    def __init__(self, callback: Callable[[bytes], object]) -> None:
        self.callback = callback
        self.active = True


class StoreState:
    """Keys, queues and waiters of one store. Not thread-safe: use from one event loop."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.queues: dict[bytes, deque[bytes]] = {}
        self._waiters: dict[bytes, list[Waiter]] = {}
        self._poppers: dict[bytes, deque[_Popper]] = {}
        self._barriers: dict[bytes, list[Waiter]] = {}

    # -- waiting -----------------------------------------------------------

    def _present(self, key: bytes) -> bool:
        return key in self.data or bool(self.queues.get(key))

    def _wake(self, key: bytes) -> None:
        waiters = self._waiters.pop(key, None)
        if not waiters:
            return
        for w in waiters:
            if w.active:
                w.remaining -= 1
                if w.remaining <= 0:
                    w.active = False
                    w.callback()

    def add_waiter(self, keys: Iterable[bytes], callback: Callable[[], object]) -> Waiter | None:
        """Register ``callback`` to fire once every key is present.

        Returns ``None`` without registering (and without calling ``callback``)
        when every key is already present.
        """
        missing = [k for k in keys if not self._present(k)]
        if not missing:
            return None
        missing = list(dict.fromkeys(missing))
        waiter = Waiter(missing, callback)
        for k in missing:
            lst = self._waiters.get(k)
            if lst is None:
                self._waiters[k] = [waiter]
            else:
                lst.append(waiter)
        return waiter

    def open_waiter(self, callback: Callable[[], object]) -> Waiter:
        """Start a waiter whose keys are registered in pieces (:meth:`extend_waiter`).

        For a WAIT on very many keys, registered in slices with the event loop
        running in between: the waiter cannot fire before :meth:`close_waiter`.
        """
        waiter = Waiter([], callback)
        waiter.remaining = 1  # the registration itself, released by close_waiter
        return waiter

    def extend_waiter(self, waiter: Waiter, keys: Iterable[bytes]) -> None:
        """Register ``waiter`` on those of ``keys`` that are missing now."""
        if not waiter.active:
            return
        present = self._present
        table = self._waiters
        for k in keys:
            if not present(k):
                waiter.keys.append(k)
                waiter.remaining += 1
                lst = table.get(k)
                if lst is None:
                    table[k] = [waiter]
                else:
                    lst.append(waiter)

    def close_waiter(self, waiter: Waiter) -> bool:
        """End the registration; return True (callback not called) if every key is present."""
        waiter.remaining -= 1
        if waiter.active and waiter.remaining <= 0:
            waiter.active = False
            return True
        return False

    def cancel_waiter(self, waiter: Waiter) -> None:
        """Deactivate ``waiter`` and unregister it; its callback will not fire."""
        if not waiter.active:
            return
        waiter.active = False
        for k in waiter.keys:
            lst = self._waiters.get(k)
            if lst is not None:
                with contextlib.suppress(ValueError):
                    lst.remove(waiter)
                if not lst:
                    del self._waiters[k]
        if waiter.barrier is not None:
            arrivals = self._barriers.get(waiter.barrier)
            if arrivals is not None:
                with contextlib.suppress(ValueError):
                    arrivals.remove(waiter)
                if not arrivals:
                    del self._barriers[waiter.barrier]

    def waiter_count(self) -> int:
        """Number of registered key waiters (for tests and metrics)."""
        return sum(len(v) for v in self._waiters.values())

    # -- key-value operations ---------------------------------------------

    def set(self, key: bytes, value: bytes) -> None:
        self.data[key] = value
        if key in self._waiters:
            self._wake(key)

    def get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def add(self, key: bytes, delta: int) -> int:
        old = self.data.get(key)
        if old is None:
            total = delta
        else:
            try:
                total = int(old) + delta
            except ValueError:
                raise ValueError(
                    f"value of key {key.decode(errors='replace')!r} is not a decimal integer "
                    f"({old[:32]!r}); ADD only works on counters"
                ) from None
        self.data[key] = str(total).encode()
        if key in self._waiters:
            self._wake(key)
        return total

    def compare_set(self, key: bytes, expected: bytes, desired: bytes) -> bytes:
        current = self.data.get(key)
        if current is None:
            if expected:
                return expected
        elif current != expected:
            return current
        self.set(key, desired)
        return desired

    def append(self, key: bytes, value: bytes) -> None:
        old = self.data.get(key)
        self.set(key, value if old is None else old + value)

    def check(self, keys: Iterable[bytes]) -> bool:
        present = self._present
        return all(present(k) for k in keys)

    def delete(self, key: bytes) -> bool:
        return self.data.pop(key, None) is not None

    def num_keys(self) -> int:
        return len(self.data)

    def list_keys(self) -> list[bytes]:
        return list(self.data)

    def multi_get(self, keys: Sequence[bytes]) -> list[bytes]:
        get = self.data.get
        return [get(k, b"") for k in keys]

    def multi_set(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        """Set every key at once (C-level: 128k keys take a few ms, no Python loop per key)."""
        if len(keys) != len(values):
            raise ValueError(f"multi_set got {len(keys)} keys but {len(values)} values")
        self.data.update(zip(keys, values, strict=True))
        if self._waiters:
            for k in self._waiters.keys() & keys:
                self._wake(k)

    def apply(self, op: int, key: bytes, value: bytes) -> None:
        """Perform a recorded write (an on-close action): the torch opcode ``op`` on ``key``.

        SET (1), ADD (4: ``value`` is the decimal delta), DELETE_KEY (8), APPEND (9),
        QUEUE_PUSH (14). Raises :class:`ValueError` for ADD on a non-integer value
        or an unknown ``op``.
        """
        if op == 1:
            self.set(key, value)
        elif op == 14:
            self.queue_push(key, value)
        elif op == 4:
            self.add(key, int(value))
        elif op == 8:
            self.delete(key)
        elif op == 9:
            self.append(key, value)
        else:
            raise ValueError(f"opcode {op} is not a recordable write")

    # -- queues -------------------------------------------------------------

    def queue_push(self, key: bytes, value: bytes) -> None:
        """Append ``value``; hand it straight to one in-process popper if one waits."""
        poppers = self._poppers.get(key)
        while poppers:
            p = poppers.popleft()
            if p.active:
                if not poppers:
                    del self._poppers[key]
                p.active = False
                p.callback(value)
                return
        if poppers is not None:
            del self._poppers[key]
        q = self.queues.get(key)
        if q is None:
            self.queues[key] = q = deque()
        q.append(value)
        if key in self._waiters:
            self._wake(key)

    def queue_pop(self, key: bytes) -> bytes | None:
        q = self.queues.get(key)
        if not q:
            return None
        value = q.popleft()
        if not q:
            del self.queues[key]
        return value

    def queue_len(self, key: bytes) -> int:
        q = self.queues.get(key)
        return len(q) if q else 0

    def add_popper(self, key: bytes, callback: Callable[[bytes], object]) -> _Popper:
        """Register ``callback(value)`` to receive the next value pushed on ``key``."""
        popper = _Popper(callback)
        self._poppers.setdefault(key, deque()).append(popper)
        return popper

    def cancel_popper(self, key: bytes, popper: _Popper) -> None:
        popper.active = False
        lst = self._poppers.get(key)
        if lst is not None:
            with contextlib.suppress(ValueError):
                lst.remove(popper)
            if not lst:
                del self._poppers[key]

    # -- barrier ----------------------------------------------------------

    def barrier(self, key: bytes, world_size: int, callback: Callable[[], object]) -> Waiter | None:
        """Arrive at barrier ``key``; fire every arrival's callback on the ``world_size``-th.

        The last arrival's callback is not called: ``None`` is returned instead
        (the caller answers it directly). The barrier then resets for reuse.
        """
        arrivals = self._barriers.get(key)
        if arrivals is None:
            arrivals = self._barriers[key] = []
        if len(arrivals) + 1 >= world_size:
            del self._barriers[key]
            for w in arrivals:
                if w.active:
                    w.active = False
                    w.callback()
            return None
        waiter = Waiter([], callback, barrier=key)
        arrivals.append(waiter)
        return waiter

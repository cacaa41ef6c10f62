"""Noticing a frozen store host: requests that get no answer while its host still accepts.

A store host that is frozen (SIGSTOP, a hung machine whose kernel still runs) keeps
accepting connections and acknowledging data: nothing closes and nothing refuses, so
its clients' requests simply wait (up to ``read_timeout``). :class:`StoreWatch` times
the rendezvous' requests to the store: when the store gave this node no answer for
``silence`` seconds (the heartbeat timeout) while a request of ours waits, it asks
a probe (a fresh connection and one request, bounded; see ``_c10d``) and judges with
:func:`host_lost`; if lost, the waiting requests and every later one raise the
verdict (:class:`~._exceptions.RendezvousConnectionError`), which moves the node to
the heir's store. A partition is not a loss: there a fresh connection is not even
accepted, and the node keeps trying the same store as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Literal

import anyio

from ._exceptions import RendezvousConnectionError

__all__ = ("HostState", "StoreWatch", "host_lost")

#: What a probe of the store's address found: ``refused`` (nothing listens: the host
#: process is gone), ``unreachable`` (no connection in time: partition, or the machine
#: is off), ``silent`` (the connection is accepted but the store does not answer: the
#: host is frozen or hung) or ``answers``.
HostState = Literal["refused", "unreachable", "silent", "answers"]


def host_lost(state: HostState) -> bool:
    """Whether the store's host is lost for good (its successor takes over).

    A refused connection means the store and its data are gone; a store whose kernel
    accepts but that does not answer has been silent for the whole heartbeat timeout
    before it is probed: it is acted on as lost (if it comes back, it finds itself
    deposed). An unreachable one may be a partition that heals: not lost.
    """
    return state in ("refused", "silent")


class StoreWatch:
    """Times the rendezvous' store requests; declares the store's host lost (see above).

    ``probe`` returns the error to raise if the host is lost, else None; it must bound
    itself. Run :meth:`run` in a task group; wrap each request in :meth:`guard`.
    """

    def __init__(
        self, silence: float, probe: Callable[[], Awaitable[RendezvousConnectionError | None]]
    ) -> None:
        self.silence = silence
        self._probe = probe
        self.lost: RendezvousConnectionError | None = None
        self.last_answer = anyio.current_time()
        self._pending: set[anyio.CancelScope] = set()
        self._changed = anyio.Event()
        self._scope = anyio.CancelScope()

    def stop(self) -> None:
        """End :meth:`run` (the watch is replaced); guards go on without a judge."""
        self._scope.cancel()

    def guard(self) -> AbstractContextManager[None]:
        """Around one request: raise the verdict at once if the host is lost, or when it
        is declared lost while the request waits (the request is cancelled)."""
        return _Guard(self)

    async def run(self) -> None:
        """Judge the host whenever a request waits and the store was silent for
        ``silence`` seconds; ends once the host is lost or :meth:`stop` is called."""
        with self._scope:
            await self._judge()

    async def _judge(self) -> None:
        while self.lost is None:
            changed = self._changed
            if not self._pending:
                await changed.wait()
                self._changed = anyio.Event()
                continue
            delay = self.last_answer + self.silence - anyio.current_time()
            if delay > 0:
                await anyio.sleep(delay)  # answers meanwhile move the deadline on
                continue
            verdict = await self._probe()
            if verdict is None:  # it answered: silence counts from now
                self.last_answer = anyio.current_time()
                continue
            self.lost = verdict
            for scope in list(self._pending):
                scope.cancel()


class _Guard:
    """:meth:`StoreWatch.guard`: a plain class, not a generator (it wraps every request)."""

    __slots__ = ("_scope", "_watch")

    def __init__(self, watch: StoreWatch) -> None:
        self._watch = watch
        self._scope: anyio.CancelScope | None = None

    def __enter__(self) -> None:
        watch = self._watch
        if watch.lost is not None:
            raise watch.lost
        scope = self._scope = anyio.CancelScope()
        pending = watch._pending
        pending.add(scope)
        if len(pending) == 1:
            watch._changed.set()
        try:
            scope.__enter__()
        except BaseException:
            pending.discard(scope)
            raise

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        scope = self._scope
        assert scope is not None
        watch = self._watch
        try:
            swallowed = bool(scope.__exit__(typ, exc, tb))
        finally:
            watch._pending.discard(scope)
        if exc is not None and not swallowed:
            return False
        if scope.cancelled_caught and watch.lost is not None:
            raise watch.lost
        watch.last_answer = anyio.current_time()
        return swallowed

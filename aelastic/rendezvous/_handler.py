"""The async rendezvous handler API (torch's current RendezvousHandler API, made awaitable)."""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
from anyio import AsyncContextManagerMixin
from anyio.abc import TaskGroup, TaskStatus

from .._dataclass import dataclass
from ..store import Store

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = (
    "RendezvousHandler",
    "RendezvousInfo",
    "RendezvousStoreInfo",
)


@dataclass(frozen=True)
class RendezvousStoreInfo:
    """Where the workers' TCPStore-compatible store listens (their MASTER_ADDR/MASTER_PORT)."""

    master_addr: str
    master_port: int


@dataclass(frozen=True)
class RendezvousInfo:
    """The result of one completed rendezvous round.

    ``store`` is namespaced by run id and round, so keys written in one round are
    never read in another. Unpacks as ``store, rank, world_size`` like torch's RendezvousInfo tuple.
    """

    store: Store
    rank: int
    world_size: int
    bootstrap_store_info: RendezvousStoreInfo | None = None
    round: int = 0

    def __iter__(self) -> Iterator[Any]:
        return iter((self.store, self.rank, self.world_size))


class RendezvousHandler(AsyncContextManagerMixin, abc.ABC):
    """Main rendezvous interface: one instance per agent (node).

    A handler is an async context manager: ``async with handler:`` starts what it
    runs in the background (a hosted store, heartbeats) in its own task group, and
    leaving the block calls :meth:`shutdown`. Backends implement both in
    :meth:`__asynccontextmanager__`; those with nothing to run in the background
    need not override it.

    The other ways to run a handler are shims over ``async with``: :meth:`serve`
    holds it in a task group (``await tg.start(handler.serve)``); :meth:`run_in`
    gives the handler a task group to :meth:`serve` in on first use (seed-style
    ``await handler.next_rendezvous()``; a later :meth:`shutdown` ends it, so the
    task group can finish); and an agent given a handler nobody entered enters it
    for the length of its run (:meth:`entered`).

    Methods that touch the network are coroutines. Cancelling any of them leaves
    the handler usable: a cancelled :meth:`next_rendezvous` withdraws this node
    from the pending round before the cancellation propagates (best effort, in a
    shielded scope bounded by the backend's ``read_timeout``).
    """

    #: Set by :meth:`run_in`: where the handler starts itself on first use.
    _task_group: TaskGroup | None = None
    _serving: anyio.Event | None = None
    _stop_serving: anyio.Event | None = None

    @asynccontextmanager
    async def __asynccontextmanager__(self) -> AsyncIterator[Self]:
        """Run the handler for the block; leaving it calls :meth:`shutdown`.

        Backends that run something in the background (a hosted store, heartbeats)
        override this: start it before the ``yield``, and stop it after, bounded and
        shielded so that leaving works under cancellation. No task group or exit
        stack is entered by hand (``async with`` both around the ``yield``; see
        :func:`aelastic._tasks.background_tasks` for a group whose tasks must not
        change the block's errors).
        """
        try:
            yield self
        finally:
            await self.shutdown()

    @property
    def started(self) -> bool:
        """Whether the handler can serve calls now (entered, or started by :meth:`run_in`).

        Backends with nothing to start are always started.
        """
        return True

    def run_in(self, task_group: TaskGroup) -> None:
        """Let the handler enter itself in ``task_group`` when first used.

        The first call that needs the handler started runs :meth:`serve` in
        ``task_group``; :meth:`shutdown` (or cancelling ``task_group``) leaves it.
        """
        self._task_group = task_group

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Enter the handler, report it started, and hold it until :meth:`shutdown`.

        For ``await task_group.start(handler.serve)``. Cancellation leaves the handler
        like the end of an ``async with`` block (shielded, bounded by the backend).
        """
        stop = self._stop_serving = anyio.Event()
        async with self:
            task_status.started()
            await stop.wait()

    def _serve_ends(self) -> None:
        """Let :meth:`serve` return (backends call it from :meth:`shutdown`)."""
        if self._stop_serving is not None:
            self._stop_serving.set()
            self._stop_serving = None

    async def _autostart(self) -> None:
        """Start the handler in the :meth:`run_in` task group if it is not started.

        Raises the error of entering the handler (e.g. RendezvousConnectionError); a
        no-op without a task group (the caller reports "not started").
        """
        while not self.started and self._task_group is not None:
            serving = self._serving
            if serving is not None:  # another task is starting it: wait for that
                await serving.wait()
                continue
            serving = self._serving = anyio.Event()
            try:
                await self._task_group.start(self.serve)
            finally:
                self._serving = None
                serving.set()
            return

    @asynccontextmanager
    async def entered(self) -> AsyncIterator[RendezvousHandler]:
        """Enter the handler for the block unless someone else runs it already.

        A handler already entered, or given a task group by :meth:`run_in`, is used as
        is (its owner leaves it); otherwise leaving the block leaves the handler.
        """
        if self.started or self._task_group is not None:
            yield self
            return
        async with self:
            yield self

    @abc.abstractmethod
    def get_backend(self) -> str:
        """Return the backend name (``"static"``, ``"c10d"``, ``"etcd"``...)."""

    @abc.abstractmethod
    def get_run_id(self) -> str:
        """Return the run id shared by every node of the job."""

    @property
    def use_agent_store(self) -> bool:
        """Whether workers should use the agent-hosted store (``TORCHELASTIC_USE_AGENT_STORE``)."""
        return False

    @property
    def hosts_store(self) -> bool:
        """Whether this node serves the store its peers use (leaving the handler closes it)."""
        return False

    @abc.abstractmethod
    async def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round and wait until it completes with this node admitted.

        Raises:
            RendezvousClosedError: the rendezvous is closed.
            RendezvousTimeoutError: the round did not complete in time.
            RendezvousConnectionError: the backend is unreachable.
            RendezvousStateError: the backend holds malformed state.
        """

    @abc.abstractmethod
    async def is_closed(self) -> bool:
        """Return whether the rendezvous of this run was closed."""

    @abc.abstractmethod
    async def set_closed(self) -> None:
        """Close the rendezvous of this run: later joins raise RendezvousClosedError."""

    @abc.abstractmethod
    async def num_nodes_waiting(self) -> int:
        """Return how many nodes wait to join a next round (late arrivals, spares excluded)."""

    async def wait_for_membership_change(self) -> None:
        """Return as soon as the current round's membership changes.

        A change is a node waiting to join (when the world may grow) or a participant
        whose heartbeat lapsed. Backends without elasticity never return (cancel the
        wait instead). Push-based: no polling.
        """
        import anyio

        await anyio.sleep_forever()

    @abc.abstractmethod
    async def shutdown(self) -> bool:
        """Leave the rendezvous and release resources; return True on a clean exit.

        Idempotent and safe under cancellation. Does not close the rendezvous for
        the other nodes.
        """

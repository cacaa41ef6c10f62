"""The async rendezvous handler API (seed 003, torch's current handler API, made awaitable)."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from ..store import Store

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
    never read in another. Unpacks as ``store, rank, world_size`` like seed 003's tuple.
    """

    store: Store
    rank: int
    world_size: int
    bootstrap_store_info: RendezvousStoreInfo | None = None
    round: int = 0

    def __iter__(self) -> Iterator[Any]:
        return iter((self.store, self.rank, self.world_size))


class RendezvousHandler(abc.ABC):
    """Main rendezvous interface: one instance per agent (node).

    A handler is an async context manager: ``async with handler:`` starts what it
    runs in the background (a hosted store, heartbeats) in its own task group, and
    leaving the block calls :meth:`shutdown`. Backends with nothing to run in the
    background need not override :meth:`__aenter__`.

    Methods that touch the network are coroutines. Cancelling any of them leaves
    the handler usable: a cancelled :meth:`next_rendezvous` withdraws this node
    from the pending round before the cancellation propagates (best effort, in a
    shielded scope bounded by the backend's ``read_timeout``).
    """

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

    async def __aenter__(self) -> RendezvousHandler:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.shutdown()

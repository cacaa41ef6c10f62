"""What a node of the dynamic rendezvous knows of the round it is in: plain state, kept
up to date by the node's background task and read by its calls."""

from __future__ import annotations

import anyio

from ..store import Store
from ._exceptions import RendezvousConnectionError
from ._state import Keys, Tick

__all__ = ("RoundView",)


class RoundView:
    """What this node knows of the round it is in; updated by its background task."""

    def __init__(
        self, round_: int, ticket: int, store: Store | None = None, keys: Keys | None = None
    ) -> None:
        self.round = round_
        self.ticket = ticket
        self.store = store  # the store this round lives in (the store may move: c10d)
        self.keys = keys  # and its keys (the epoch may change: c10d)
        self.tick: Tick | None = None
        self.coordinator_lost = False
        self.store_lost: RendezvousConnectionError | None = None  # why the store is gone
        self.error: BaseException | None = None
        self.member_tick: Tick | None = None  # the running tick this node was admitted by
        self.scope: anyio.CancelScope | None = None
        self.done = anyio.Event()  # the background task has ended
        self.forgotten = False  # this node's keys of the round were deleted
        self.actions: list[int] = []  # on-close actions registered for this round
        self.event = anyio.Event()

    def wake(self) -> None:
        self.event.set()
        self.event = anyio.Event()

    def publish(self, tick: Tick) -> None:
        self.tick = tick
        self.wake()

    @property
    def ended(self) -> bool:
        """The round is over for this node (dissolved, closed, coordinator gone, error)."""
        tick = self.tick
        return (
            self.coordinator_lost
            or self.error is not None
            or (tick is not None and tick.state in ("dissolved", "closed"))
        )

    def membership_changed(self, max_nodes: int) -> bool:
        if self.ended:
            return True
        tick = self.tick
        if tick is None or self.member_tick is None:
            return False
        if tick.state == "running" and tick.waiting > 0 and tick.world < max_nodes:
            return True
        return tick.state != "running" or self.ticket in tick.removed

"""The coordinator's "lost" orders, registered ahead so that no tick waits for one.

Before tick ``n`` of a round is out, the store must hold an order (an on-close action
of the coordinator's ephemeral session) to write a ``lost`` tick ``n+1`` if the
coordinator dies: members blocked on ``n+1`` then wake at once. Registering that
order is a round trip on the session's connection; made right before each tick, it
delayed every tick (the round's completion among them) by one round trip.
:class:`LostOrders` keeps the orders two ticks ahead instead: while tick ``n`` is
published, the order for ``n+2`` is registered in the background, so when ``n+1``
comes its order is normally held already. The guarantee is unchanged: ``n`` is never
published before the order for ``n+1`` is confirmed (or has failed: then heartbeats
remain, as before). Dying with several orders held writes ``lost`` at each of those
ticks, all after the last published one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
from anyio.abc import TaskGroup

__all__ = ("LostOrders",)


class LostOrders:
    """The orders of one round's coordinator, by tick number.

    ``register(k)`` places the order for tick ``k`` and returns its id (None if the
    store holds none); ``cancel(id)`` withdraws one. Background registrations run in
    ``tg`` (the coordinator's task group), shielded and bounded by ``register``
    itself, so that an order placed is always known and later withdrawn.
    """

    def __init__(
        self,
        register: Callable[[int], Awaitable[int | None]],
        cancel: Callable[[int], Awaitable[None]],
        tg: TaskGroup,
    ) -> None:
        self._register = register
        self._cancel = cancel
        self._tg = tg
        self._held: dict[int, int | None] = {}  # tick -> order id (None: not held)
        self._pending: dict[int, anyio.Event] = {}

    def start(self, k: int) -> None:
        """Begin registering the order for tick ``k`` (no-op if held or under way)."""
        if k in self._held or k in self._pending:
            return
        done = self._pending[k] = anyio.Event()
        self._tg.start_soon(self._place, k, done)

    async def _place(self, k: int, done: anyio.Event) -> None:
        try:
            with anyio.CancelScope(shield=True):
                self._held[k] = await self._register(k)
        finally:
            del self._pending[k]
            done.set()

    async def hold(self, n: int) -> None:
        """Return once the order for tick ``n+1`` is placed (call before publishing ``n``);
        the registration of ``n+2``'s starts in the background."""
        self.start(n + 1)
        self.start(n + 2)
        pending = self._pending.get(n + 1)
        if pending is not None:
            await pending.wait()

    async def release(self, upto: int | None = None) -> None:
        """Withdraw the orders for ticks ``<= upto`` (all of them with None, once the
        round's last tick is out: registrations under way are awaited first)."""
        if upto is None:
            for event in list(self._pending.values()):
                await event.wait()
        for k in sorted(self._held):
            if upto is not None and k > upto:
                break
            action_id = self._held.pop(k)
            if action_id is not None:
                await self._cancel(action_id)

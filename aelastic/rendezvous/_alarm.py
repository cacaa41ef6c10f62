"""The dynamic rendezvous coordinator's alarm: a wake-up pushed into its own inbox."""

from __future__ import annotations

import math

import anyio

from ._exceptions import RendezvousError
from ._ops import Ops
from ._state import Message

__all__ = ("InboxAlarm",)

#: The message the alarm pushes; :meth:`InboxAlarm.pop` never returns it.
_TICK_MESSAGE = Message("tick").dumps()


class InboxAlarm:
    """Wakes a coordinator blocked on its inbox at a given time, by a ``tick`` message.

    A blocking pop that times out (or is cancelled) costs a TCPStoreClient its pooled
    connection; one ended by a message keeps it. So the coordinator pops with a long
    safety timeout and this alarm, a task next to it, pushes the wake-up: one
    fire-and-forget push per wake-up instead of a reconnect.
    """

    def __init__(self, ops: Ops, inbox: str, safety: float) -> None:
        self._ops = ops
        self._inbox = inbox
        self._safety = safety
        self._at = math.inf
        self._changed = anyio.Event()

    async def pop(self, at: float) -> bytes | None:
        """Pop the next message, or return None at time ``at`` (never a ``tick``)."""
        if at != self._at:
            self._at = at
            self._changed.set()
            self._changed = anyio.Event()
        while True:
            remaining = at - anyio.current_time()
            if remaining <= 0:
                return None
            raw = await self._ops.pop(self._inbox, remaining + self._safety)
            if raw is None:
                return None
            if raw != _TICK_MESSAGE.encode():
                return raw

    async def run(self) -> None:
        """Push a ``tick`` when the armed time comes; re-arm on every :meth:`pop`."""
        while True:
            changed = self._changed
            delay = self._at - anyio.current_time()
            if delay <= 0:
                self._at = math.inf
                try:
                    await self._ops.push(self._inbox, _TICK_MESSAGE, confirm=False)
                except RendezvousError:
                    return  # the pop's safety timeout takes over
                continue
            with anyio.move_on_after(delay):
                await changed.wait()

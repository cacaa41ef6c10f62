"""Ephemeral sessions: store writes performed when their session ends, however it ends.

A session is tied to one client connection (TCP) or to one ``async with`` block
(in-process). Writes registered with :meth:`EphemeralSession.on_close` are
performed *by the server* when the session's connection closes, whether the
client left cleanly, crashed or was SIGKILLed: the kernel closes the socket of a
dead process, the server sees EOF and performs them at once. That turns process
death into a store event (a key set, a queue push) that peers can wait on,
like a ZooKeeper ephemeral node, with no heartbeat timeout in between.

This is an aelastic extension of torch's protocol (opcodes ``0xA0``-``0xA2``):
stock torch clients never send it and are unaffected. Against torch's own
TCPStore server, opening a session raises
:class:`~aelastic.store._exceptions.StoreUnsupportedError` before anything is registered.
"""

from __future__ import annotations

import logging

from ._exceptions import StoreClosedError, StoreLimitError
from ._interface import EphemeralSession, OnCloseAction, Value, to_bytes
from ._state import StoreState

__all__ = ("MAX_ON_CLOSE_ACTIONS", "LocalEphemeralSession", "action_opcode")

logger = logging.getLogger("aelastic.store")

_OPCODES: dict[str, int] = {"set": 1, "add": 4, "delete_key": 8, "append": 9, "queue_push": 14}

#: Most on-close actions one session may hold (each costs server memory).
MAX_ON_CLOSE_ACTIONS = 1024


def action_opcode(action: str, value: bytes) -> int:
    """The torch opcode that performs ``action``; :class:`ValueError` if it is not one.

    ``add`` needs ``value`` to be a decimal integer (the delta).
    """
    op = _OPCODES.get(action)
    if op is None:
        raise ValueError(f"on_close action must be one of {sorted(_OPCODES)}, got {action!r}")
    if op == 4:
        try:
            int(value)
        except ValueError:
            raise ValueError(
                f"on_close('add', ...) needs a decimal integer delta, got {value[:32]!r}"
            ) from None
    return op


class LocalEphemeralSession(EphemeralSession):
    """An in-process session over a :class:`StoreState`: actions run when :meth:`end` is called."""

    def __init__(self, state: StoreState, prefix: str, name: str) -> None:
        self._state = state
        self._prefix = prefix
        self._name = name
        self._actions: dict[int, tuple[int, bytes, bytes]] = {}
        self._next = 0
        self._ended = False

    async def on_close(self, action: OnCloseAction, key: str, value: Value = b"") -> int:
        raw = to_bytes(value)
        op = action_opcode(action, raw)
        if self._ended:
            raise StoreClosedError("the ephemeral session has ended", endpoint=self._name, key=key)
        if len(self._actions) >= MAX_ON_CLOSE_ACTIONS:
            raise StoreLimitError(
                f"an ephemeral session holds at most {MAX_ON_CLOSE_ACTIONS} on-close actions",
                endpoint=self._name,
                key=key,
            )
        self._next += 1
        self._actions[self._next] = (op, (self._prefix + key).encode(), raw)
        return self._next

    async def cancel(self, action_id: int | None = None) -> int:
        if action_id is None:
            n = len(self._actions)
            self._actions.clear()
            return n
        return 1 if self._actions.pop(action_id, None) is not None else 0

    def end(self) -> None:
        """Perform the registered actions (once); an ADD on a non-counter is skipped."""
        if self._ended:
            return
        self._ended = True
        actions, self._actions = self._actions, {}
        for op, key, value in actions.values():
            try:
                self._state.apply(op, key, value)
            except ValueError as exc:  # ADD on a non-integer value: nothing to add to
                logger.warning("store %s: on-close action skipped: %s", self._name, exc)

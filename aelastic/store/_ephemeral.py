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
:class:`~aelastic.store.StoreUnsupportedError` before anything is registered.
"""

from __future__ import annotations

import abc
import logging
from typing import Literal

from ._api import Value, to_bytes
from ._exceptions import StoreClosedError, StoreLimitError
from ._state import StoreState

__all__ = ("EphemeralSession", "OnCloseAction", "action_opcode", "LocalEphemeralSession")

logger = logging.getLogger("aelastic.store")

#: The store write an on-close action performs.
OnCloseAction = Literal["set", "add", "append", "queue_push", "delete_key"]

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


class EphemeralSession(abc.ABC):
    """Writes the store performs when this session ends (see the module docstring).

    Obtained with ``async with store.ephemeral() as session``. Leaving the block
    ends the session, which performs the actions still registered (a clean exit
    is also an exit); :meth:`cancel` them first to leave without a trace.
    Actions run in registration order, exactly once.
    """

    @abc.abstractmethod
    async def on_close(self, action: OnCloseAction, key: str, value: Value = b"") -> int:
        """Register ``action`` on ``key`` (``set``/``append``/``queue_push`` ``value``,
        ``add`` the decimal delta ``value``, ``delete_key``); return its id.

        Raises :class:`ValueError` for an unknown action or a non-integer ``add``
        delta, :class:`~aelastic.store.StoreLimitError` beyond
        ``MAX_ON_CLOSE_ACTIONS`` (1024) actions, and the store's connection errors.
        When it returns, the server holds the action: a crash right after it is
        covered.
        """

    @abc.abstractmethod
    async def cancel(self, action_id: int | None = None) -> int:
        """Forget action ``action_id`` (all with ``None``); return how many were removed."""


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

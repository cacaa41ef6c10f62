"""Liveness tied to the store connection: a node's on-close actions on the store's
ephemeral session.

Where the store offers ephemeral sessions (aelastic's server), the server performs a
session's registered actions the moment its connection closes (SIGKILL, crash): a
member registers a ``gone`` push to its coordinator's inbox, a coordinator an order to
write a ``lost`` tick (see :mod:`._guards`), so peers learn of a death at once instead
of after a heartbeat timeout. Best effort throughout: heartbeats remain for silent loss
and wherever there is no session.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, AsyncExitStack

import anyio

from ..store import Store, StoreError
from ..store._exceptions import StoreUnsupportedError
from ..store._interface import EphemeralSession, OnCloseAction
from ._settings import DynamicSettings
from ._view import RoundView

__all__ = ("SessionActions", "open_session")

_log = logging.getLogger("aelastic.rendezvous")


async def open_session(stack: AsyncExitStack, store: Store) -> EphemeralSession | None:
    """Open ``store``'s ephemeral session on ``stack``; None where the store has none."""
    try:
        return await stack.enter_async_context(store.ephemeral())
    except StoreUnsupportedError:
        return None
    except (StoreError, OSError) as exc:
        _log.warning("no ephemeral store session (%s); peers rely on heartbeats", exc)
        return None


class SessionActions:
    """A node's ephemeral session (None: heartbeats only) and its on-close actions.

    The handler opens the session (:func:`open_session`) and hands it over with
    :meth:`use`; a request that fails drops it until the store is reconnected and a new
    one is given. Every request runs inside ``guard`` (the handler's store watch).
    """

    def __init__(
        self,
        run_id: str,
        settings: DynamicSettings,
        guard: Callable[[], AbstractContextManager[None]],
    ) -> None:
        self._run_id = run_id
        self._settings = settings
        self._guard = guard
        self.session: EphemeralSession | None = None

    def use(self, session: EphemeralSession | None) -> None:
        """Register actions on ``session`` from now on (None: none)."""
        self.session = session

    async def on_close(
        self, view: RoundView, key: str, action: OnCloseAction, value: str
    ) -> int | None:
        """Have the store server do ``action`` on ``key`` if this process dies; the
        action's id (also added to ``view.actions``), None if none was registered.

        The server performs it when this node's session connection closes (SIGKILL,
        crash): peers learn of the death at once instead of after a heartbeat timeout.
        Best effort: without a session (a store that cannot, e.g. torch's server) or
        when registering fails, heartbeats remain the only evidence. Takes at most
        ``min(read_timeout, heartbeat_timeout)``; never raises.
        """
        session = self.session
        if session is None:
            return None
        aid: int | None = None
        # Never hold a join up for long (a session whose link broke may not answer).
        with anyio.move_on_after(
            min(self._settings.read_timeout, self._settings.heartbeat_timeout)
        ):
            try:
                with self._guard():
                    aid = await session.on_close(action, key, value)
            except (StoreError, OSError) as exc:
                _log.warning("rendezvous %s: no on-close action (%s)", self._run_id, exc)
        if aid is None:
            self.session = None  # heartbeats only, until the store is reconnected
            return None
        view.actions.append(aid)
        return aid

    async def cancel(self, actions: list[int]) -> None:
        """Cancel ``actions`` (emptying the list); best effort, never raises."""
        session = self.session
        while actions:
            aid = actions.pop()
            if session is None:
                continue
            try:
                with self._guard():
                    await session.cancel(aid)
            except (StoreError, OSError):
                self.session = session = None

    async def cancel_all(self) -> None:
        """Cancel every action of the session (this node left cleanly: nothing to
        announce). Raises the store's errors (:class:`~aelastic.store.StoreError`,
        :class:`OSError`) when its connection or the store's host is gone."""
        if self.session is not None:
            with self._guard():  # a frozen store host: no wait at all
                await self.session.cancel()

"""Helper tasks that live exactly as long as a resource's block, whatever cancels around it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import anyio.abc

from .._tasks import background_tasks as task_group

__all__ = ("BackgroundTasks", "background_tasks")


class BackgroundTasks:
    """Start tasks that only the end of their :func:`background_tasks` block cancels."""

    def __init__(self, tg: anyio.abc.TaskGroup) -> None:
        self._tg = tg
        self._scopes: set[anyio.CancelScope] = set()
        self._closed = False

    def start_soon(self, func: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``func(*args)`` until it returns or the block ends.

        The task is shielded from cancellation of the scopes around the block
        (an exit watcher or a pipe reader must keep working while the
        resource's own shielded cleanup waits on it); the end of the block
        cancels it. ``func`` must not raise.
        """
        self._tg.start_soon(self._run, func, args)

    async def _run(self, func: Callable[..., Awaitable[Any]], args: tuple[Any, ...]) -> None:
        if self._closed:
            return
        with anyio.CancelScope(shield=True) as scope:
            self._scopes.add(scope)
            try:
                await func(*args)
            finally:
                self._scopes.discard(scope)

    def _cancel(self) -> None:
        self._closed = True
        for scope in self._scopes:
            scope.cancel()
        self._tg.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def background_tasks() -> AsyncIterator[BackgroundTasks]:
    """Tasks for a resource (exit watchers, pipe readers, a refill loop), cancelled at its end.

    An exception of the block itself propagates as itself, never wrapped in an
    exception group (the tasks never raise), so a resource built on this keeps
    its documented exceptions. Leaving cancels every task and waits for them:
    each ends at its next checkpoint, so the wait is short and bounded by the
    tasks' own cleanup.
    """
    async with task_group() as tg:
        tasks = BackgroundTasks(tg)
        try:
            yield tasks
        finally:
            tasks._cancel()

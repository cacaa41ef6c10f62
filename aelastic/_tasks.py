"""A task group for background tasks that must not change the errors of the block they serve."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc

__all__ = ("background_tasks",)


@asynccontextmanager
async def background_tasks() -> AsyncIterator[anyio.abc.TaskGroup]:
    """A task group whose tasks are cancelled when the block is left.

    An exception from the block itself leaves as it is, not wrapped in the task
    group's ``ExceptionGroup`` (callers map ``SignalException``, ``ChildFailedError``...
    to exit codes); a task's own error still leaves in one.
    """
    raised: BaseException | None = None
    async with anyio.create_task_group() as tg:
        try:
            yield tg
        except BaseException as exc:
            raised = exc
        finally:
            tg.cancel_scope.cancel()
    if raised is not None:
        raise raised

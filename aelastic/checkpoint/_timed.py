"""``save`` and ``load`` as the worker calls them: the checkpoint calls of ``_worker``,
timed for the goodput ledger (``aelastic.progress.checkpoint_blocked``).

A completed ``save(obj, step=n)`` also reports step ``n`` (``aelastic.progress.step``)
unless the worker reports steps itself, so a loop that only checkpoints is counted.
Importing ``aelastic.progress`` attaches the worker to its agent's progress file; both
calls are no-ops for it outside an agent's worker.
"""

from __future__ import annotations

import functools
import time
from types import ModuleType
from typing import Any

from . import _worker

__all__ = ("load", "save")


@functools.cache
def _progress() -> ModuleType:
    """``aelastic.progress``, imported at the first call (an import statement in
    :func:`save` cost microseconds on every save)."""
    from .. import progress

    return progress


def save(obj: Any, *, step: int, asynchronous: bool = False) -> None:
    progress = _progress()
    started = time.monotonic_ns()  # an asynchronous save blocks only until it returns
    _worker.save(obj, step=step, asynchronous=asynchronous)
    progress.checkpoint_blocked("save", time.monotonic_ns() - started, step)


save.__doc__ = _worker.save.__doc__


def load(
    *, rank: int | None = None, map_location: Any = "cpu", weights_only: bool = True
) -> tuple[int, Any] | None:
    progress = _progress()
    started = time.monotonic_ns()
    try:
        return _worker.load(rank=rank, map_location=map_location, weights_only=weights_only)
    finally:
        progress.checkpoint_blocked("load", time.monotonic_ns() - started)


load.__doc__ = _worker.load.__doc__

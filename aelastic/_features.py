"""Which optional agent modules a job loads: hang detection and torch's file timer.

A job that uses neither never imports them (a few ms of the launch's critical path).
The launcher imports what :func:`feature_modules` names before its event loop;
:func:`import_features` imports what is still missing in a worker thread, so the
modules that use them import them at the point of use, already loaded, never on the loop.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping

import anyio.to_thread

__all__ = (
    "FILE_TIMER_ENV",
    "feature_modules",
    "file_timer_enabled",
    "hang_detection_enabled",
    "import_features",
)

#: torchrun's switch: ``TORCHELASTIC_ENABLE_FILE_TIMER=1`` serves the workers' timers.
FILE_TIMER_ENV = "TORCHELASTIC_ENABLE_FILE_TIMER"
_HANG = "aelastic.agent._hang"
_FILE_TIMER = "aelastic.agent._file_timer"


def file_timer_enabled(environ: Mapping[str, str]) -> bool:
    """Whether the agent serves torch's file timer (the agent's own environment)."""
    return environ.get(FILE_TIMER_ENV) == "1"


def hang_detection_enabled(
    *timeouts: float | None,
    section_timeouts: Mapping[str, float] | None,
    learn_timeouts: float | None,
    max_no_progress_restarts: int | None,
) -> bool:
    """Whether any hang-detection setting is given (``timeouts``: the heartbeat ones)."""
    given = (*timeouts, learn_timeouts, max_no_progress_restarts)
    return any(value is not None for value in given) or bool(section_timeouts)


def feature_modules(hang_detection: bool, environ: Mapping[str, str]) -> tuple[str, ...]:
    """The optional modules a job with these features imports (the file timer captures
    stacks with hang detection's files, so it needs both)."""
    if file_timer_enabled(environ):
        return (_HANG, _FILE_TIMER)
    return (_HANG,) if hang_detection else ()


async def import_features(names: tuple[str, ...]) -> None:
    """Import the modules ``names`` not imported yet, in a worker thread (no thread when
    all are). Raises what an import raises. Cancellation: waits for the import under way."""
    for name in names:
        if name not in sys.modules:
            await anyio.to_thread.run_sync(importlib.import_module, name)

"""Which optional agent modules a job loads: hang detection (with its learned timeouts)
and torch's file timer.

A job that uses neither never imports them (~8 ms of the launch's critical path).
The launcher imports what :func:`feature_modules` names before its event loop;
:func:`import_features` imports what is still missing in a worker thread, so the
modules that use them import them at the point of use, already loaded, never on the loop.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from typing import Protocol

import anyio.abc  # here, not first in an import thread: see below
import anyio.to_thread

# anyio.abc builds its lazy-import table from its own source with ast at import. The
# worker thread of import_features (and launcher/_preimport.py's) imports modules that
# import anyio.abc; building an AST there while the loop's thread builds one can fail on
# CPython 3.11.7 ("SystemError: AST constructor recursion depth mismatch", cpython#106905;
# seen once, an ``aelastic run`` ending with it at its start). Imported here, on the
# importing thread, it is loaded before any such thread starts: an import thread then
# builds no AST (tests/launcher/test_loop_imports.py).

__all__ = (
    "FILE_TIMER_ENV",
    "HangSettings",
    "feature_modules",
    "file_timer_enabled",
    "hang_detection_enabled",
    "import_features",
)

#: torchrun's switch: ``TORCHELASTIC_ENABLE_FILE_TIMER=1`` serves the workers' timers.
FILE_TIMER_ENV = "TORCHELASTIC_ENABLE_FILE_TIMER"
_HANG = ("aelastic.agent._hang", "aelastic.agent._learned")
_FILE_TIMER = "aelastic.agent._file_timer"


def file_timer_enabled(environ: Mapping[str, str]) -> bool:
    """Whether the agent serves torch's file timer (the agent's own environment)."""
    return environ.get(FILE_TIMER_ENV) == "1"


class HangSettings(Protocol):
    """The hang-detection settings of a job (a ``LaunchConfig`` or a ``WorkerSpec``)."""

    @property
    def initial_heartbeat_timeout(self) -> float | None: ...
    @property
    def heartbeat_timeout(self) -> float | None: ...
    @property
    def section_timeouts(self) -> Mapping[str, float] | None: ...
    @property
    def out_of_section_timeout(self) -> float | None: ...
    @property
    def learn_timeouts(self) -> float | None: ...
    @property
    def max_no_progress_restarts(self) -> int | None: ...


def hang_detection_enabled(settings: HangSettings) -> bool:
    """Whether any hang-detection setting is given."""
    given = (
        settings.initial_heartbeat_timeout,
        settings.heartbeat_timeout,
        settings.out_of_section_timeout,
        settings.learn_timeouts,
        settings.max_no_progress_restarts,
    )
    return any(value is not None for value in given) or bool(settings.section_timeouts)


def feature_modules(settings: HangSettings, environ: Mapping[str, str]) -> tuple[str, ...]:
    """The optional modules a job with these settings imports (the file timer captures
    stacks with hang detection's files, so it needs both). The progress files
    (``aelastic.agent._hang``) are always on: the goodput ledger reads the steps."""
    if file_timer_enabled(environ):
        return (*_HANG, _FILE_TIMER)
    return _HANG if hang_detection_enabled(settings) else _HANG[:1]


def _import_all(names: list[str]) -> None:
    for name in names:
        importlib.import_module(name)


async def import_features(names: tuple[str, ...]) -> None:
    """Import the modules ``names`` not imported yet, in one worker thread hop (none when
    all are). Raises what an import raises. Cancellation: waits for the imports under way."""
    missing = [name for name in names if name not in sys.modules]
    if missing:
        await anyio.to_thread.run_sync(_import_all, missing)

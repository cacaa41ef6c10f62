"""``ProcessSpec`` (what to start) and ``ProcessExit`` (how it ended)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .._dataclass import dataclass
from ..errors._failure import signal_name_of
from ._std import Std

__all__ = ("ProcessExit", "ProcessSpec")


@dataclass(frozen=True)
class ProcessSpec:
    """One worker process to start.

    ``args`` is the full argv and ``env`` the full environment of the child.
    ``stdout_file``/``stderr_file`` redirect a stream to a log file (opened for
    append; ``None`` keeps the console). ``tee`` also copies the named streams
    to the agent's console. Console lines get ``console_prefix`` (for example
    ``"[default0]:"``) whether tee'd or not. ``show_on_console=False`` (the
    local-ranks filter) sends nothing of this rank to the console; files are
    unaffected. ``error_file`` is the worker's ``TORCHELASTIC_ERROR_FILE``.
    ``filtered_stdout_file``/``filtered_stderr_file`` (appended to; may be
    shared by every rank) get each tee'd console line of that stream that
    contains any of ``duplicate_stdout_filters``/``duplicate_stderr_filters``,
    with the prefix; an empty filter tuple copies nothing.
    """

    local_rank: int
    args: Sequence[str]
    env: Mapping[str, str]
    stdout_file: str | None = None
    stderr_file: str | None = None
    tee: Std = Std.NONE
    console_prefix: str = ""
    show_on_console: bool = True
    error_file: str | None = None
    cwd: str | None = None
    filtered_stdout_file: str | None = None
    filtered_stderr_file: str | None = None
    duplicate_stdout_filters: tuple[str, ...] = ()
    duplicate_stderr_filters: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProcessExit:
    """A worker's exit: ``exitcode`` is negative for a signal death (``-9`` = SIGKILL).

    ``timestamp`` is ``time.time()`` when the exit was noticed.
    """

    local_rank: int
    pid: int
    exitcode: int
    timestamp: float

    @property
    def signal_name(self) -> str | None:
        """``"SIGKILL"`` for exit code ``-9``; None for a normal exit."""
        return signal_name_of(self.exitcode)

    @property
    def failed(self) -> bool:
        """True for any non-zero exit code (signals included)."""
        return self.exitcode != 0

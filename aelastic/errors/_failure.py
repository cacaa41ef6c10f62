"""``ProcessFailure``: one failed worker, read from its exit status and ``error.json``."""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import field
from typing import Any

from .._dataclass import dataclass

__all__ = ("NOT_AVAILABLE", "ProcessFailure", "signal_name_of")

#: Placeholder torch prints for a missing error file or signal name.
NOT_AVAILABLE = "<N/A>"

_EMPTY_ERROR_DATA: dict[str, Any] = {"message": "<NONE>"}


def signal_name_of(exitcode: int) -> str | None:
    """Name of the signal behind a negative exit code (``-9`` -> ``"SIGKILL"``), else None."""
    if exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return None


@dataclass
class ProcessFailure:
    """A worker process that exited with a non-zero code (torch's fields and semantics).

    ``error_file`` is the worker's ``TORCHELASTIC_ERROR_FILE``. When that file
    exists (written by :func:`aelastic.errors.record` or torch's ``@record``),
    ``message`` and ``timestamp`` come from it; otherwise ``error_file`` becomes
    ``"<N/A>"``, ``timestamp`` is the exit time (``exit_time``, default now) and
    ``message`` is generated from the exit code. ``message`` is a ``dict`` (the
    ``"message"`` object of the file) or a ``str``, exactly like torch.
    ``failure_time`` is the finer moment of failure: when the error file was
    written (its mtime), else ``exit_time``; it orders failures within a second.

    An unreadable or malformed error file does not raise: its problem becomes
    the message, so a failure report is never lost to a second failure.
    """

    local_rank: int
    pid: int
    exitcode: int
    error_file: str | None
    exit_time: float | None = None
    #: The worker's stderr log, when it went to a file (named in the generated message).
    stderr_file: str | None = None
    error_file_data: dict[str, Any] = field(init=False)
    message: Any = field(init=False)
    timestamp: int = field(init=False)
    failure_time: float = field(init=False)

    def __post_init__(self) -> None:
        if self.exit_time is None:
            self.exit_time = time.time()
        self.error_file_data = dict(_EMPTY_ERROR_DATA)
        self.message = ""
        self.timestamp = int(self.exit_time)
        self.failure_time = self.exit_time
        path = self.error_file
        if path and path != NOT_AVAILABLE and os.path.isfile(path):
            self._read_error_file(path)
        else:
            self.error_file = NOT_AVAILABLE
        if not self.message:
            self.message = self._generated_message()

    def _read_error_file(self, path: str) -> None:
        try:
            with open(path, encoding="utf-8") as fp:
                data = json.load(fp)
                written = os.fstat(fp.fileno()).st_mtime
            message = data["message"]
            if isinstance(message, str):
                timestamp = int(data.get("timestamp", self.timestamp))
            else:
                timestamp = int(message["extraInfo"]["timestamp"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.message = (
                f"error file {path} exists but is not in torch's error.json schema"
                f" ({type(exc).__name__}: {exc}); exit code {self.exitcode}"
            )
            return
        self.error_file_data = data
        self.message = message
        self.timestamp = timestamp
        self.failure_time = written

    def _generated_message(self) -> str:
        if self.exitcode < 0:
            text = f"Signal {-self.exitcode} ({self.signal_name()}) received by PID {self.pid}"
            if self.exitcode == -signal.SIGKILL:
                text += (
                    ". Hint: a SIGKILL without an error file is most often the kernel OOM"
                    " killer; check `dmesg -T | grep -i -E 'killed process|oom'` or the"
                    " cgroup's memory.events (oom_kill counter)."
                )
            return text
        self.error_file_data["errorTraits"] = {
            "category": "system_terminated_error",
            "retryability": "False",
        }
        text = (
            f"Process {self.pid} exited with code {self.exitcode} and wrote no error file:"
            " it failed before its entry point ran (a syntax or import error, say), or its"
            " entry point is not decorated with @aelastic.errors.record (or torch's"
            " @record), which puts the traceback here."
        )
        stderr = self.stderr_file
        if stderr and os.path.isfile(stderr):
            text += f" Its stderr: {stderr}"
        return text

    def signal_name(self) -> str:
        """The signal's name (``"SIGKILL"``) for a signal death, else ``"<N/A>"``."""
        return signal_name_of(self.exitcode) or NOT_AVAILABLE

    def timestamp_isoformat(self) -> str:
        """The failure time as ``YYYY-MM-DD_HH:MM:SS`` (local time, like torch)."""
        from datetime import datetime  # only a failure needs it (~2 ms to import)

        return datetime.fromtimestamp(self.timestamp).isoformat(sep="_")

    @property
    def traceback(self) -> str:
        """The Python traceback from the error file, or the message as text."""
        msg = self.message
        if isinstance(msg, dict):
            extra = msg.get("extraInfo", {})
            stack = extra.get("py_callstack") if isinstance(extra, dict) else None
            return str(stack if stack else msg.get("message", NOT_AVAILABLE))
        return str(msg)

    def sort_key(self) -> tuple[int, float]:
        """Order of occurrence: the recorded second, then ``failure_time``.

        Two workers that raised in the same second are ordered by when each wrote
        its error file, not by which process happened to exit first.
        """
        return (self.timestamp, self.failure_time)

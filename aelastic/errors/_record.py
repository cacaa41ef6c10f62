"""``record``: write a worker's uncaught exception to ``TORCHELASTIC_ERROR_FILE``.

The file uses torch's schema exactly (``torch.distributed.elastic.multiprocessing
.errors.error_handler.ErrorHandler.record_exception``), so torch's tools read it
and torch's ``@record`` and ours are interchangeable::

    {"message": {"message": "<Type>: <str>",
                 "extraInfo": {"py_callstack": "<traceback>", "timestamp": "<epoch s>"}}}
"""

from __future__ import annotations

import faulthandler
import functools
import inspect
import json
import logging
import os
import time
import traceback
import warnings
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar, overload

from ._exceptions import ChildFailedError
from ._failure import NOT_AVAILABLE

__all__ = ("ERROR_FILE_ENV", "ErrorHandler", "error_file_data", "record")

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"

_P = ParamSpec("_P")
_R = TypeVar("_R")

log = logging.getLogger(__name__)


def error_file_data(exc: BaseException, *, timestamp: float | None = None) -> dict[str, Any]:
    """The error.json document (torch's schema) for ``exc``."""
    stack = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {
        "message": {
            "message": f"{type(exc).__name__}: {exc}",
            "extraInfo": {
                "py_callstack": stack,
                "timestamp": str(int(time.time() if timestamp is None else timestamp)),
            },
        }
    }


class ErrorHandler:
    """Writes and copies error files; the same duties as torch's ``ErrorHandler``.

    Writing never raises: an unwritable error file is reported as a warning, so
    the original exception is what propagates.
    """

    def error_file_path(self) -> str | None:
        """``TORCHELASTIC_ERROR_FILE`` or None (empty means disabled)."""
        return os.environ.get(ERROR_FILE_ENV) or None

    def initialize(self) -> None:
        """Dump Python tracebacks of all threads on fatal signals (SIGSEGV...)."""
        try:
            faulthandler.enable(all_threads=True)
        except Exception as exc:  # e.g. sys.stderr without a fileno
            warnings.warn(
                f"Unable to enable faulthandler: {type(exc).__name__}: {exc}", stacklevel=2
            )

    def record_exception(self, exc: BaseException) -> None:
        """Write ``exc`` to the error file; does nothing when the variable is unset."""
        path = self.error_file_path()
        if path:
            self._write(path, error_file_data(exc))

    def dump_error_file(self, rootcause_error_file: str, error_code: int = 0) -> None:
        """Copy a child's error file to ours, setting ``message.errorCode`` like torch."""
        with open(rootcause_error_file, encoding="utf-8") as fp:
            data = json.load(fp)
        if error_code and isinstance(data.get("message"), dict):
            data["message"]["errorCode"] = error_code
        path = self.error_file_path()
        if path:
            self._write(path, data)
        else:
            log.error(
                "no %s set for this process to copy %s into", ERROR_FILE_ENV, rootcause_error_file
            )

    def record_failure(self, exc: BaseException) -> None:
        """What torch's ``@record`` does with ``exc`` leaving the decorated function.

        A :class:`ChildFailedError` copies its root cause's error file (with
        ``errorCode`` = its exit code); when the root cause left no error file,
        nothing is written (torch only logs it). Any other ``Exception`` is
        written by :meth:`record_exception`; ``SystemExit``, ``KeyboardInterrupt``
        and other ``BaseException`` are not recorded. Never raises.
        """
        if isinstance(exc, ChildFailedError):
            rank, failure = exc.get_first_failure()
            if not failure.error_file or failure.error_file == NOT_AVAILABLE:
                log.info(
                    "rank %s (local_rank %s) failed with no error file; decorate its entry"
                    " point with @record for its traceback",
                    rank,
                    failure.local_rank,
                )
                return
            try:
                self.dump_error_file(failure.error_file, failure.exitcode)
            except (OSError, ValueError) as copy_exc:
                log.warning("could not copy the error file of rank %s: %s", rank, copy_exc)
                self.record_exception(exc)
        elif isinstance(exc, Exception):
            self.record_exception(exc)

    def _write(self, path: str, data: dict[str, Any]) -> None:
        try:
            tmp = f"{path}.tmp{os.getpid()}"
            with open(tmp, "w", encoding="utf-8") as fp:
                json.dump(data, fp)
            os.replace(tmp, path)
        except OSError as exc:
            warnings.warn(
                f"Unable to write error file {path}: {type(exc).__name__}: {exc}", stacklevel=3
            )


def _exited_cleanly(handler: ErrorHandler, exc: BaseException) -> bool:
    """True for ``SystemExit(0)``/``SystemExit()``; else record an ``Exception`` and say False."""
    if isinstance(exc, SystemExit):
        return exc.code in (0, None)
    handler.record_failure(exc)
    return False


@overload
def record(
    fn: Callable[_P, Coroutine[Any, Any, _R]], error_handler: ErrorHandler | None = None
) -> Callable[_P, Coroutine[Any, Any, _R | None]]: ...
@overload
def record(
    fn: Callable[_P, _R], error_handler: ErrorHandler | None = None
) -> Callable[_P, _R | None]: ...
def record(fn: Callable[_P, Any], error_handler: ErrorHandler | None = None) -> Callable[_P, Any]:
    """Decorate a worker's entry point so an uncaught exception lands in ``error.json``.

    On an exception the decorator writes torch's error.json schema to
    ``$TORCHELASTIC_ERROR_FILE`` (nothing is written when it is unset) and
    re-raises. ``SystemExit(0)`` (``sys.exit()`` in a script) returns None.
    A :class:`ChildFailedError` copies the root cause's file, as torch does
    (see :meth:`ErrorHandler.record_failure`).
    Works on plain and ``async def`` functions; never imports torch.
    KeyboardInterrupt and other non-``Exception`` errors propagate unrecorded.
    """
    handler = error_handler if error_handler is not None else ErrorHandler()

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: _P.args, **kwargs: _P.kwargs) -> Any:
            handler.initialize()
            try:
                return await fn(*args, **kwargs)
            except BaseException as exc:
                if _exited_cleanly(handler, exc):
                    return None
                raise

        return async_wrapper

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> Any:
        handler.initialize()
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            if _exited_cleanly(handler, exc):
                return None
            raise

    return wrapper

"""Built-in destinations and their stdlib logging handlers; the ``file`` destination.

``null``, ``dynamic_rendezvous`` and ``store`` start with a ``logging.NullHandler`` (no work
at all until a real handler is registered), ``console`` with a ``logging.StreamHandler`` to
stderr, ``file`` with a :class:`JsonLinesFileHandler` on the path given to
:func:`configure_file` or in ``AELASTIC_EVENTS_FILE``. The legacy API's default route (event
types with no destination of their own) is the destination ``""``, null by default.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ._adapters import Handler, is_null_handler
from ._dispatch import Destination, registry
from ._exceptions import EventsError, UnknownDestinationError

__all__ = (
    "FILE_ENV",
    "JsonLinesFileHandler",
    "configure_file",
    "get_logging_handler",
    "is_null_handler",
)

#: Environment variable naming the ``file`` destination's path.
FILE_ENV = "AELASTIC_EVENTS_FILE"

_log_handlers: dict[str, logging.Handler] = {
    "console": logging.StreamHandler(),
    "dynamic_rendezvous": logging.NullHandler(),
    "null": logging.NullHandler(),
    "store": logging.NullHandler(),
    "": logging.NullHandler(),
}


class JsonLinesFileHandler(logging.FileHandler):
    """Append each event as one JSON line to ``path`` (created on first write).

    A ``logging.Handler`` (so it also works on any logger) with a batch fast path used by
    the dispatcher: one ``write`` and one ``flush`` per batch of events.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(os.fspath(path), mode="a", encoding="utf-8", delay=True)
        self.setFormatter(logging.Formatter("%(message)s"))

    def record_batch(self, events: list[Any]) -> None:
        """Write ``events`` (objects with ``serialize()``), one JSON object per line."""
        text = "".join(f"{event.serialize()}\n" for event in events)
        self.acquire()
        try:
            if self.stream is None:
                self.stream = self._open()
            self.stream.write(text)
            self.stream.flush()
        finally:
            self.release()


def _builtin(name: str) -> None:
    def install(dest: Destination) -> None:
        dest.set_primary(Handler(_log_handlers[name]))

    registry.factories[name] = install


def _install_file(dest: Destination) -> None:
    path = os.environ.get(FILE_ENV)
    if not path:
        raise EventsError(
            "events destination 'file' has no path: call "
            f"aelastic.events.configure_file(path) or set {FILE_ENV}"
        )
    handler = JsonLinesFileHandler(path)
    _log_handlers["file"] = handler
    dest.set_primary(Handler(handler))


for _name in _log_handlers:
    _builtin(_name)
registry.factories["file"] = _install_file


def configure_file(path: str | os.PathLike[str]) -> JsonLinesFileHandler:
    """Send the ``file`` destination's events to ``path`` (JSON lines, appended).

    Replaces the previous file handler (events already queued for it may land in either
    file). Returns the new handler.
    """
    handler = JsonLinesFileHandler(path)
    with registry.lock:
        dest = registry.ensure("file", builtin=False)
        old = dest.set_primary(Handler(handler))
        _log_handlers["file"] = handler
    if old is not None and old.logging_handler is not None:
        old.logging_handler.close()
    return handler


def get_logging_handler(destination: str = "null") -> logging.Handler:
    """Return the stdlib logging handler of a built-in ``destination``.

    ``null``, ``console``, ``dynamic_rendezvous``, ``store`` and (once configured)
    ``file``. Raises :class:`UnknownDestinationError` for any other name. To add a
    handler (a ``logging.Handler`` or any other), use ``register_handler()``: a handler
    added to the logger directly is not seen while the destination is otherwise null.
    """
    handler = _log_handlers.get(destination)
    if handler is None:
        if destination == "file":
            registry.get("file")  # raises the 'no path' error, or installs from the env
            return _log_handlers["file"]
        raise UnknownDestinationError(
            f"no logging handler for events destination {destination!r}; built-in ones: "
            f"{', '.join(repr(n) for n in sorted(_log_handlers) if n)}"
        )
    return handler

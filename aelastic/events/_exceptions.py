"""Errors raised by ``aelastic.events``."""

from __future__ import annotations

from .._exceptions import AelasticError, show_public_module

__all__ = ("EventsError",)


class EventsError(AelasticError):
    """Base class of the errors raised by ``aelastic.events``."""


class EventFormatError(EventsError, ValueError):
    """A serialised event could not be parsed."""


class UnknownDestinationError(EventsError, KeyError):
    """An event was recorded to a destination that has no handler registered."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class EventHandlerError(EventsError):
    """One or more handlers failed to process an awaited event (see ``__cause__``)."""


show_public_module(__name__, globals())

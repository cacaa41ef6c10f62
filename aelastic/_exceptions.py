"""The root of aelastic's exception tree.

Every error aelastic raises on purpose derives from :class:`AelasticError`, so an
embedding service can catch the whole family with one ``except`` clause. Each
subpackage defines its own subclasses next to the code that raises them
(``aelastic.store``, ``aelastic.rendezvous``, ``aelastic.errors``...).
"""

from __future__ import annotations

__all__ = ("AelasticError", "ConfigError")


class AelasticError(Exception):
    """Base class of every error raised by aelastic itself.

    Messages name the object involved (a key, an endpoint, a rank) and, where
    there is one, the fix.
    """


class ConfigError(AelasticError, ValueError):
    """A setting cannot work (a flag, a config field, a parameter); the message names it and
    the fix. Also a :class:`ValueError`, so callers that catch that keep working."""

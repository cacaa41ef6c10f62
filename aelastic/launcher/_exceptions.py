"""The errors of the ``aelastic run`` command line (its own module, so the flag tables of
other concerns can raise it without importing the argument parser)."""

from __future__ import annotations

from .._exceptions import AelasticError

__all__ = ("UsageError",)


class UsageError(AelasticError, ValueError):
    """A flag or value of ``aelastic run`` is wrong; the message names it and the fix."""

"""The errors of ``aelastic.jobview``."""

from __future__ import annotations

from .._exceptions import AelasticError, show_public_module

__all__ = ("JobViewError",)


class JobViewError(AelasticError):
    """The job's status cannot be read: no such run in the store, or no store."""


show_public_module(__name__, globals())

"""The errors of ``aelastic.metrics``."""

from __future__ import annotations

from .._exceptions import AelasticError, show_public_module

__all__ = ("MetricsError",)


class MetricsError(AelasticError):
    """A metrics handler could not be set up."""


show_public_module(__name__, globals())

"""Errors of straggler detection."""

from __future__ import annotations

from .._exceptions import ConfigError, show_public_module

__all__ = ()


class StragglerConfigError(ConfigError):
    """A straggler setting cannot work (a threshold outside (0, 1), a window <= 0,
    ``exclude`` where no node can replace an excluded one)."""


show_public_module(__name__, globals())

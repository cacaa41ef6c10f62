"""The errors of ``aelastic.progress``."""

from __future__ import annotations

from .._exceptions import ConfigError, show_public_module

__all__ = ()


class ProgressTimeoutError(ConfigError):
    """A hang-detection timeout cannot work; the message names the fix."""


show_public_module(__name__, globals())

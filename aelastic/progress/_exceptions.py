"""The errors of ``aelastic.progress``."""

from __future__ import annotations

from .._exceptions import ConfigError

__all__ = ("ProgressTimeoutError",)


class ProgressTimeoutError(ConfigError):
    """A hang-detection timeout cannot work; the message names the fix."""

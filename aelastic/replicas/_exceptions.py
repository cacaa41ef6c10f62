"""Errors of replica groups and of the torchft Lighthouse."""

from __future__ import annotations

from .._exceptions import AelasticError, ConfigError, show_public_module

__all__ = (
    "LighthouseError",
    "ReplicaGroupError",
)


class ReplicaGroupError(AelasticError):
    """Base class of this package's errors."""


class ReplicaGroupConfigError(ReplicaGroupError, ConfigError):
    """A replica-group setting cannot work (a bad count, a bad ``--lighthouse`` URL,
    torchft not installed); the message names it and the fix. Raised before any
    worker starts."""


class LighthouseError(ReplicaGroupError):
    """The Lighthouse does not answer: the user's (``--lighthouse URL``) at start, or
    the one aelastic supervises could not be started (or restarted)."""


show_public_module(__name__, globals())

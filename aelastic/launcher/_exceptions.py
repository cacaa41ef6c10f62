"""The errors of ``aelastic.launcher`` and of the ``aelastic run`` command line (their own
module, so the flag tables of other concerns can raise them without importing the parser)."""

from __future__ import annotations

from .._exceptions import AelasticError, ConfigError, show_public_module

__all__ = ("JobStoppedError",)


class UsageError(ConfigError):
    """A flag or value of ``aelastic run`` is wrong; the message names it and the fix."""


class LaunchConfigError(ConfigError):
    """A :class:`LaunchConfig` field holds a value that cannot work; the message names the fix."""


class JobStoppedError(AelasticError):
    """The job was stopped before it finished: its ``open_job`` block was left or cancelled."""


class JobSignalError(AelasticError, ValueError):
    """:meth:`Job.send_signal` was given a number that is not a signal of this platform.

    Also a ``ValueError`` (what ``signal.Signals(n)`` raises), so existing handlers work.
    """


show_public_module(__name__, globals())

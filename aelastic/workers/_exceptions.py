"""Errors raised while starting, supervising and stopping worker processes."""

from __future__ import annotations

from .._exceptions import AelasticError, show_public_module

__all__ = (
    "WorkerProcessError",
    "WorkerStartError",
)


class WorkerProcessError(AelasticError):
    """Base class of the errors of ``aelastic.workers``."""


class WorkerStartError(WorkerProcessError):
    """A worker process could not be started (missing binary, bad cwd, bad spec)."""


class NoMoreExitsError(WorkerProcessError):
    """``wait_for_exit`` was called after every worker's exit was already returned."""


class CallableResultError(WorkerProcessError):
    """A callable entry point's result file is missing or unreadable."""


show_public_module(__name__, globals())

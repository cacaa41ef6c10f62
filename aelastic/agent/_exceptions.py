"""Errors raised by the elastic agent."""

from __future__ import annotations

import signal

from .._exceptions import AelasticError, ConfigError, show_public_module
from ..errors import ChildFailedError

__all__ = (
    "AgentError",
    "NoProgressError",
    "SignalException",
)


class AgentError(AelasticError):
    """Base class of the agent's errors."""


class AgentConfigError(AgentError, ConfigError):
    """A :class:`~aelastic.agent.WorkerSpec` or agent argument is invalid."""


class SignalException(AgentError):
    """The agent was told to terminate by a forwarded signal (``agent.send_signal``).

    Raised by ``agent.run()`` after the workers were stopped with ``sigval`` (then
    SIGKILL after the shutdown timeout). ``sigval`` is the :class:`signal.Signals`;
    ``workers_started`` is False when the signal came before any worker started.
    ``persisted_step``: set by the launcher when a preemption signal stopped the job and
    ``--checkpoint-dir`` holds that whole step (``aelastic run`` then exits 96).
    """

    def __init__(self, msg: str, sigval: signal.Signals, *, workers_started: bool = True) -> None:
        super().__init__(msg)
        self.sigval = sigval
        self.workers_started = workers_started
        self.persisted_step: int | None = None


class NoProgressError(ChildFailedError):
    """The job kept failing without step progress (``max_no_progress_restarts``).

    A :class:`~aelastic.errors.ChildFailedError` (the last attempt's failures);
    ``aelastic run`` exits with ``NO_PROGRESS_EXIT_CODE`` (93) so a scheduler does
    not requeue the job.
    """


show_public_module(__name__, globals())

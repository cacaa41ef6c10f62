"""The records a :class:`~aelastic.Job` hands out: its state transitions, its
workers, its last failure and its last hang (frozen; made by the job, never by users).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._dataclass import dataclass

if TYPE_CHECKING:
    from ..agent import WorkerState

__all__ = ("FailureInfo", "HangInfo", "StateChange", "WorkerInfo")


@dataclass(frozen=True)
class StateChange:
    """One transition of the job's worker group (see :class:`aelastic.agent.WorkerState`).

    ``previous`` is None for the first item (the group's initial ``INIT``). ``round``
    is the rendezvous round the workers belong to (None before the first one),
    ``attempt`` the worker start (``attempt_<n>`` of the logs, -1 before the first),
    ``restart_count`` the failures restarted so far (the workers'
    ``TORCHELASTIC_RESTART_COUNT``), ``timestamp`` the wall clock (``time.time()``).
    """

    state: WorkerState
    previous: WorkerState | None
    round: int | None
    attempt: int
    restart_count: int
    remaining_restarts: int
    timestamp: float


@dataclass(frozen=True)
class WorkerInfo:
    """One local worker of the current (or last) attempt.

    ``pid`` is None before the worker started; ``stdout``/``stderr``/``error_file`` are
    the files of this attempt (None when not redirected to a file).
    """

    local_rank: int
    global_rank: int
    role_rank: int
    world_size: int
    pid: int | None
    attempt: int
    stdout: str | None
    stderr: str | None
    error_file: str | None


@dataclass(frozen=True)
class FailureInfo:
    """A worker of the last attempt that failed (restarted or not): the lowest local rank
    among the failures the agent reported once it stopped that attempt's workers (a
    hung worker: with the code it was stopped with). ``wait()``'s ``ChildFailedError``
    names the root cause."""

    local_rank: int
    global_rank: int
    pid: int | None
    exitcode: int
    attempt: int
    timestamp: float


@dataclass(frozen=True)
class HangInfo:
    """The last hung worker the agent found (its ``aelastic.progress.hang`` event).

    ``rule`` is the deadline that expired (``initial``, ``heartbeat``, ``section``,
    ``out_of_section``), ``section`` the section it was in (None: none), ``timeout``
    that rule's seconds, ``stacks_file`` where every local worker's stacks were
    written (``stacks_captured`` of them), ``detected_at`` the wall clock.
    """

    global_rank: int | None
    local_rank: int
    pid: int
    rule: str
    section: str | None
    timeout: float
    stacks_file: str | None
    stacks_captured: int
    step: int
    detected_at: float

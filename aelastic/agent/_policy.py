"""The agent's decisions, as plain functions the async shell executes.

Nothing here awaits, spawns or reads the clock: each function maps what the agent
observed (worker exits, a membership change, the restart budget) to the next
:class:`Action`. The state machine in :mod:`aelastic.agent._api` only carries the
actions out, so the policy is unit-tested without processes.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass

from ._types import WorkerState

__all__ = (
    "Action",
    "Decision",
    "decide_after_exit",
    "decide_after_membership_change",
    "restart_count",
    "flakiness",
)


class Action(str, enum.Enum):
    """What the agent does next with its local worker group."""

    #: Keep waiting: some workers are still running and none failed.
    WAIT = "WAIT"
    #: Every local worker exited 0: run the exit barrier and return SUCCEEDED.
    SUCCEED = "SUCCEED"
    #: A worker failed and the budget allows it: stop, spend one restart, re-rendezvous.
    RESTART = "RESTART"
    #: The membership changed: stop and re-rendezvous WITHOUT spending the budget.
    REJOIN = "REJOIN"
    #: A worker failed and the budget is spent: stop the others and return FAILED.
    FAIL = "FAIL"


@dataclass(frozen=True)
class Decision:
    """An :class:`Action` plus the group state the agent reports while carrying it out."""

    action: Action
    state: WorkerState
    #: Restarts left after this decision is carried out.
    remaining_restarts: int

    @property
    def consumes_restart(self) -> bool:
        """Whether carrying out this decision spends one restart."""
        return self.action is Action.RESTART


def decide_after_exit(
    exitcodes: Collection[int], local_world_size: int, remaining_restarts: int
) -> Decision:
    """Decide after a worker exit, given the exit codes of every local worker exited so far.

    All-or-nothing, like torchrun: one non-zero exit fails the whole local group; the
    group succeeds only when all ``local_world_size`` workers exited 0.
    """
    if local_world_size <= 0:
        raise ValueError(f"local_world_size must be positive, got {local_world_size}")
    if remaining_restarts < 0:
        raise ValueError(f"remaining_restarts must be >= 0, got {remaining_restarts}")
    if len(exitcodes) > local_world_size:
        raise ValueError(
            f"{len(exitcodes)} exits reported for a group of {local_world_size} workers"
        )
    if any(code != 0 for code in exitcodes):
        if remaining_restarts > 0:
            return Decision(Action.RESTART, WorkerState.FAILED, remaining_restarts - 1)
        return Decision(Action.FAIL, WorkerState.FAILED, 0)
    if len(exitcodes) == local_world_size:
        return Decision(Action.SUCCEED, WorkerState.SUCCEEDED, remaining_restarts)
    return Decision(Action.WAIT, WorkerState.HEALTHY, remaining_restarts)


def decide_after_membership_change(
    exitcodes: Collection[int], local_world_size: int, remaining_restarts: int
) -> Decision:
    """Decide after the rendezvous reported a membership change (a node waiting, a peer lost).

    The group restarts with a new round unless the local outcome is already decided
    (a failure or a complete success observed at the same moment wins: it is what the
    workers did). Membership restarts never spend the budget, so the workers'
    ``TORCHELASTIC_RESTART_COUNT`` is unchanged.
    """
    local = decide_after_exit(exitcodes, local_world_size, remaining_restarts)
    if local.action is not Action.WAIT:
        return local
    return Decision(Action.REJOIN, WorkerState.HEALTHY, remaining_restarts)


def restart_count(max_restarts: int, remaining_restarts: int) -> int:
    """``TORCHELASTIC_RESTART_COUNT``: the failures restarted so far."""
    return max_restarts - remaining_restarts


def flakiness(is_failed: bool, max_restarts: int, remaining_restarts: int) -> int:
    """Seed 004's flakiness metric: 100 on failure, else the share of the budget spent."""
    if is_failed:
        return 100
    return int(100.0 - 100.0 * (remaining_restarts + 1) / (max_restarts + 1))

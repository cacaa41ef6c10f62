"""The agent's decisions, as plain functions the async shell executes.

Nothing here awaits, spawns or reads the clock: each function maps what the agent
observed (worker exits, a membership change, the restart budget) to the next
:class:`Action`. The state machine in :mod:`aelastic.agent._agent` only carries the
actions out, so the policy is unit-tested without processes.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Collection, Mapping
from dataclasses import field

from .._dataclass import dataclass
from .._numbers import finite_number
from ..progress._reader import ProgressSnapshot
from ..progress._timeouts import ProgressTimeouts
from ._exceptions import AgentConfigError
from ._types import WorkerState

__all__ = (
    "Action",
    "Decision",
    "decide_after_exit",
    "decide_after_membership_change",
    "restart_count",
    "flakiness",
    "UNINTERRUPTIBLE_STATE_TIMEOUT_ENV",
    "resolve_uninterruptible_state_timeout",
    "uninterruptible_poll_interval",
    "track_uninterruptible",
    "stuck_workers",
    "decide_after_stuck",
    "ProgressDeadline",
    "progress_deadline",
    "decide_after_hang",
    "NO_PROGRESS_EXIT_CODE",
    "decide_job_budget",
    "StepProgress",
    "fold_attempt_steps",
    "no_progress",
    "restart_backoff",
    "Observed",
    "merge_observed",
    "observe",
    "learned_timeouts",
)

#: torch's opt-in knob: seconds a worker may stay in uninterruptible sleep (D-state).
UNINTERRUPTIBLE_STATE_TIMEOUT_ENV = "TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT"
#: Upper bound on the D-state check's period, whatever the timeout.
_MAX_POLL_INTERVAL = 5.0


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
    #: A worker is stuck in uninterruptible sleep (D-state): stop the workers, spend
    #: the whole budget (no restart on this host) and return FAILED.
    ABANDON = "ABANDON"


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
    exitcodes: Collection[int],
    local_world_size: int,
    remaining_restarts: int,
    peer_finished: bool = False,
) -> Decision:
    """Decide after the rendezvous reported a membership change (a node waiting, a peer lost).

    The group restarts with a new round unless the local outcome is already decided
    (a failure or a complete success observed at the same moment wins: it is what the
    workers did). Membership restarts never spend the budget, so the workers'
    ``TORCHELASTIC_RESTART_COUNT`` is unchanged.

    ``peer_finished``: a node of this round finished its workers successfully. The job
    is then ending, not changing: the finished node leaves (its exit barrier may time
    out before this node's workers are done) and never rejoins, so a new round could
    only wait for it until ``join_timeout``. The workers keep running (WAIT); their
    own exits decide.
    """
    local = decide_after_exit(exitcodes, local_world_size, remaining_restarts)
    if local.action is not Action.WAIT or peer_finished:
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


# -- uninterruptible sleep (Linux D-state) -------------------------------------------


def resolve_uninterruptible_state_timeout(
    value: float | None, env_value: str | None
) -> float | None:
    """The D-state timeout in seconds, or None when the check is off (the default).

    ``value`` (an agent argument or ``WorkerSpec.uninterruptible_state_timeout``) wins
    when not None; otherwise ``env_value``, the raw
    ``TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT``, decides (unset or blank: off).
    Zero or a negative number turns the check off, as in torch.

    Raises:
        AgentConfigError: the value is not a finite number of seconds.
    """
    if value is None:
        if env_value is None or not env_value.strip():
            return None
        try:
            seconds = float(env_value)
        except ValueError:
            seconds = math.nan
        if not finite_number(seconds):
            raise AgentConfigError(
                f"{UNINTERRUPTIBLE_STATE_TIMEOUT_ENV}={env_value!r} is not a number of"
                " seconds; set it to e.g. 600, or unset it (or set 0) to turn the D-state"
                " check off"
            )
    else:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise AgentConfigError(
                f"uninterruptible_state_timeout must be seconds (a number) or None, got {value!r}"
            )
        seconds = float(value)
        if not finite_number(seconds):
            raise AgentConfigError(
                f"uninterruptible_state_timeout must be a finite number of seconds,"
                f" got {value!r}; use 0 or a negative number to turn the check off"
            )
    return seconds if seconds > 0 else None


def uninterruptible_poll_interval(timeout: float) -> float:
    """How often the agent reads its workers' states: ``min(timeout / 4, 5)`` seconds."""
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    return min(timeout / 4.0, _MAX_POLL_INTERVAL)


def track_uninterruptible(
    since: Mapping[int, float], states: Mapping[int, str], now: float
) -> dict[int, float]:
    """Fold one sample of worker states into ``{local_rank: first seen in D}``.

    ``states`` is ``{local_rank: state letter}`` of the live workers (see
    ``WorkerProcesses.states``). A worker seen in ``"D"`` keeps the time it was first
    seen in D in an unbroken run of samples; any other state (or no state: exited,
    unreadable) drops it, so only a worker *continuously* in D accumulates time.
    """
    return {rank: since.get(rank, now) for rank, state in states.items() if state == "D"}


def stuck_workers(since: Mapping[int, float], now: float, timeout: float) -> list[int]:
    """Local ranks (sorted) continuously in D-state for at least ``timeout`` seconds."""
    return sorted(rank for rank, first in since.items() if now - first >= timeout)


def decide_after_stuck() -> Decision:
    """A worker is stuck in D-state: give up on this host, like torch.

    torch's agent marks the group UNHEALTHY, sets the remaining restarts to 0 and
    exits; a D-state worker usually means a hung GPU, NCCL, RDMA or network file
    system call that a restart on the same host will not clear. The agent carries
    this out as: stop the workers, return FAILED naming the stuck workers.
    """
    return Decision(Action.ABANDON, WorkerState.UNHEALTHY, 0)


# -- hang detection (aelastic.progress) -----------------------------------------------


@dataclass(frozen=True)
class ProgressDeadline:
    """When a worker is due to show progress again, and which rule says so.

    ``rule`` is ``"initial"`` (no heartbeat since start), ``"heartbeat"`` (steady
    heartbeat interval), ``"section"`` (inside ``section``) or ``"out-of-section"``.
    """

    at_ns: int
    rule: str
    timeout: float
    section: str | None = None


def progress_deadline(
    snapshot: ProgressSnapshot, timeouts: ProgressTimeouts, started_ns: int
) -> ProgressDeadline | None:
    """The earliest deadline that applies to a worker now, or None when none does.

    A worker that has not attached (never imported :mod:`aelastic.progress`) is not
    judged (None), nor one whose script ended (``snapshot.ended_ns``: it is exiting; a
    slow interpreter shutdown is bounded by ``--exit-grace``, not a hang). Inside a
    section with a timeout only that timeout counts (a long
    checkpoint is not a missed heartbeat). Otherwise: until the first heartbeat or
    section exit, the initial timeout from ``started_ns`` (the worker's start), also
    inside an untimed section (a hang there is caught, not ignored); after a heartbeat,
    the heartbeat timeout from the latest heartbeat or section exit, whichever is later
    (leaving a long timed section is progress, not a missed heartbeat); once sections
    were used, the out-of-section timeout from the latest section exit.
    """
    if not snapshot.attached or snapshot.ended_ns:
        return None
    section = snapshot.section
    if section is not None and section in timeouts.sections:
        seconds = timeouts.sections[section]
        return ProgressDeadline(snapshot.section_ns + _ns(seconds), "section", seconds, section)
    candidates: list[ProgressDeadline] = []
    if snapshot.beats == 0 and snapshot.section_exit_ns == 0:
        if timeouts.initial is not None:
            candidates.append(
                ProgressDeadline(
                    started_ns + _ns(timeouts.initial), "initial", timeouts.initial, section
                )
            )
    elif snapshot.beats > 0 and timeouts.heartbeat is not None:
        candidates.append(
            ProgressDeadline(
                max(snapshot.last_beat_ns, snapshot.section_exit_ns) + _ns(timeouts.heartbeat),
                "heartbeat",
                timeouts.heartbeat,
                section,
            )
        )
    if section is None and snapshot.section_exit_ns > 0 and timeouts.out_of_section is not None:
        candidates.append(
            ProgressDeadline(
                snapshot.section_exit_ns + _ns(timeouts.out_of_section),
                "out-of-section",
                timeouts.out_of_section,
            )
        )
    return min(candidates, key=lambda d: d.at_ns, default=None)


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def decide_after_hang(remaining_restarts: int) -> Decision:
    """A worker missed its progress deadline: restart the group if the budget allows."""
    if remaining_restarts < 0:
        raise ValueError(f"remaining_restarts must be >= 0, got {remaining_restarts}")
    if remaining_restarts > 0:
        return Decision(Action.RESTART, WorkerState.FAILED, remaining_restarts - 1)
    return Decision(Action.FAIL, WorkerState.FAILED, 0)


# -- restart policy by failure kind ----------------------------------------------------

#: ``aelastic run``'s exit code when a job stopped for making no progress: do not requeue
#: (NVRx ``ft_launcher``'s value, so schedulers configured for it work unchanged).
NO_PROGRESS_EXIT_CODE = 93

#: ``aelastic run``'s exit code when a preemption signal (SIGTERM, or SIGUSR1 with
#: ``--checkpoint-dir``) stopped the job after its newest complete step was persisted
#: to ``--checkpoint-dir``: retry, the progress is saved (a fresh start resumes there).
PREEMPTED_EXIT_CODE = 96


def decide_job_budget(failed_rounds: int, max_restarts: int) -> Decision:
    """Job-wide budget: restart while the job's failed rounds do not exceed ``max_restarts``.

    ``failed_rounds`` counts this failure (each failed rendezvous round counts once,
    whichever nodes failed in it).
    """
    if failed_rounds <= max_restarts:
        return Decision(Action.RESTART, WorkerState.FAILED, max_restarts - failed_rounds)
    return Decision(Action.FAIL, WorkerState.FAILED, 0)


@dataclass(frozen=True)
class StepProgress:
    """The best step seen so far and the failed attempts since it last improved."""

    best: int = -1
    streak: int = 0


def fold_attempt_steps(state: StepProgress, attempt_best: int, *, failed: bool) -> StepProgress:
    """Fold one attempt's highest step (-1: none reported) into ``state``.

    An attempt that passed the best step resets the streak; a failed attempt that did
    not adds one to it; a membership restart without progress leaves it as is.
    """
    if attempt_best > state.best:
        return StepProgress(attempt_best, 0)
    return StepProgress(state.best, state.streak + 1 if failed else state.streak)


def no_progress(state: StepProgress, limit: int | None) -> bool:
    """Whether ``limit`` consecutive failed attempts made no step progress (None: off).

    Never before a step was seen (``state.best < 0``): a job that does not call
    ``aelastic.progress.step()`` cannot show progress, so it is not stopped for lacking it.
    """
    return limit is not None and state.best >= 0 and state.streak >= limit


def restart_backoff(consecutive_failures: int, base: float, cap: float) -> float:
    """Seconds to wait before restart number ``consecutive_failures`` (1-based): ``base``,
    doubling each time, at most ``cap``; 0 when ``base`` is 0 (off, the default)."""
    if base <= 0 or consecutive_failures <= 0:
        return 0.0
    return float(min(cap, base * 2.0 ** min(consecutive_failures - 1, 60)))


# -- learned timeouts -------------------------------------------------------------------


@dataclass(frozen=True)
class Observed:
    """The longest healthy intervals seen so far (seconds): between two heartbeats, and
    inside each section. Every recorded interval ended in progress, so all are healthy."""

    heartbeat: float = 0.0
    sections: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"heartbeat": self.heartbeat, "sections": dict(self.sections)}

    @classmethod
    def from_json(cls, obj: object) -> Observed:
        """Parse :meth:`to_json`'s shape; ValueError when it is not that."""
        if not isinstance(obj, dict):
            raise ValueError(f"learned timeouts must be a JSON object, got {obj!r}")
        sections = obj.get("sections", {})
        if not isinstance(sections, dict):
            raise ValueError(f"learned section intervals must be an object, got {sections!r}")
        return cls(
            float(obj.get("heartbeat", 0.0)), {str(k): float(v) for k, v in sections.items()}
        )


def merge_observed(a: Observed, b: Observed) -> Observed:
    """The longer of each interval of ``a`` and ``b``."""
    sections = dict(a.sections)
    for name, seconds in b.sections.items():
        sections[name] = max(seconds, sections.get(name, 0.0))
    return Observed(max(a.heartbeat, b.heartbeat), sections)


def observe(snapshots: Collection[ProgressSnapshot]) -> Observed:
    """The longest intervals the workers of one attempt reported."""
    observed = Observed()
    for snap in snapshots:
        if not snap.attached:
            continue
        sections = {k: v / 1e9 for k, v in snap.longest_sections_ns.items() if v > 0}
        observed = merge_observed(observed, Observed(snap.max_gap_ns / 1e9, sections))
    return observed


def learned_timeouts(
    configured: ProgressTimeouts, observed: Observed, factor: float
) -> ProgressTimeouts:
    """Tighter timeouts: ``factor`` x the longest healthy interval, never looser than the
    configured value, and only for rules that are on (learning never turns a rule on)."""
    heartbeat = configured.heartbeat
    if heartbeat is not None and observed.heartbeat > 0:
        heartbeat = min(heartbeat, factor * observed.heartbeat)
    sections = dict(configured.sections)
    for name, seconds in configured.sections.items():
        longest = observed.sections.get(name, 0.0)
        if longest > 0:
            sections[name] = min(seconds, factor * longest)
    return ProgressTimeouts(
        initial=configured.initial,
        heartbeat=heartbeat,
        sections=sections,
        out_of_section=configured.out_of_section,
    )

"""The restart policy's plain functions: job-wide budget, no-progress streak, back-off."""

from __future__ import annotations

import pytest

from aelastic.agent import Action, AgentConfigError, WorkerSpec
from aelastic.agent._policy import (
    Observed,
    StepProgress,
    decide_job_budget,
    fold_attempt_steps,
    learned_timeouts,
    merge_observed,
    no_progress,
    restart_backoff,
)
from aelastic.progress import ProgressTimeouts

from .conftest import LocalRendezvous


def test_job_budget_allows_max_restarts_failed_rounds() -> None:
    assert decide_job_budget(1, 2).action is Action.RESTART
    assert decide_job_budget(2, 2).remaining_restarts == 0
    assert decide_job_budget(2, 2).action is Action.RESTART
    assert decide_job_budget(3, 2).action is Action.FAIL


def test_no_progress_counts_failed_attempts_since_the_best_step() -> None:
    state = StepProgress()
    state = fold_attempt_steps(state, 5, failed=True)  # first steps ever: progress
    assert state == StepProgress(5, 0)
    state = fold_attempt_steps(state, 5, failed=True)
    state = fold_attempt_steps(state, 3, failed=True)  # resumed from an older checkpoint
    assert state == StepProgress(5, 2) and no_progress(state, 2) and not no_progress(state, 3)
    assert fold_attempt_steps(state, 4, failed=False) == state  # a membership change
    assert fold_attempt_steps(state, 6, failed=True) == StepProgress(6, 0)
    assert not no_progress(StepProgress(-1, 99), None)  # off


def test_backoff_doubles_up_to_the_cap_and_is_off_by_default() -> None:
    assert [restart_backoff(n, 0.5, 3.0) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 3.0]
    assert restart_backoff(5, 0.0, 300.0) == 0.0
    assert restart_backoff(10_000, 1.0, 60.0) == 60.0


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("heartbeat_timeout", 0, "positive number of seconds"),
        ("section_timeouts", {"": 1.0}, "needs a name"),
        ("max_no_progress_restarts", 0, "int >= 1"),
        ("restart_backoff", -1, "seconds >= 0"),
        ("learn_timeouts", 1.0, "safety factor > 1"),
    ],
)
def test_bad_spec_fields_are_one_clear_error(field: str, value: object, match: str) -> None:
    with pytest.raises(AgentConfigError, match=match):
        WorkerSpec(
            role="r",
            local_world_size=1,
            rdzv_handler=LocalRendezvous(),
            entrypoint="/bin/true",
            **{field: value},  # type: ignore[arg-type]
        )


def test_learned_timeouts_only_tighten_rules_that_are_on() -> None:
    configured = ProgressTimeouts(initial=60, heartbeat=10, sections={"ckpt": 100, "fwd": 1})
    seen = merge_observed(Observed(0.5, {"ckpt": 4.0}), Observed(1.0, {"fwd": 0.5, "eval": 9}))
    assert seen == Observed(1.0, {"ckpt": 4.0, "fwd": 0.5, "eval": 9})
    learned = learned_timeouts(configured, seen, 5)
    assert learned.heartbeat == 5.0 and learned.initial == 60
    assert learned.sections == {"ckpt": 20.0, "fwd": 1}  # never looser; "eval" stays off
    assert learned_timeouts(ProgressTimeouts(), seen, 5) == ProgressTimeouts()
    assert Observed.from_json(seen.to_json()) == seen
    with pytest.raises(ValueError, match="JSON object"):
        Observed.from_json([1])


async def test_backoff_grows_while_crash_looping_and_resets_on_progress() -> None:
    from aelastic.agent import WorkerState
    from aelastic.agent._policy import Decision
    from aelastic.agent._restart_policy import RestartPolicy

    spec = WorkerSpec(
        role="r",
        local_world_size=1,
        rdzv_handler=LocalRendezvous(),
        entrypoint="/bin/true",
        restart_backoff=1.0,
        restart_backoff_max=10.0,
    )
    policy = RestartPolicy(spec)
    restart = Decision(Action.RESTART, WorkerState.FAILED, 3)
    waits = []
    for best in (5, 5, 5, 9, 9):
        assert await policy.review(restart, attempt_best_step=best, round_=1) == restart
        waits.append(policy.backoff_seconds())
    assert waits == [1.0, 2.0, 4.0, 1.0, 2.0]

"""The agent's decisions, without processes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aelastic.agent import WorkerState
from aelastic.agent._policy import (
    Action,
    decide_after_exit,
    decide_after_membership_change,
    flakiness,
    restart_count,
)


def test_waits_while_workers_run() -> None:
    d = decide_after_exit([0], local_world_size=2, remaining_restarts=3)
    assert d.action is Action.WAIT and d.state is WorkerState.HEALTHY
    assert d.remaining_restarts == 3


def test_succeeds_when_all_exit_zero() -> None:
    d = decide_after_exit([0, 0], 2, 0)
    assert d.action is Action.SUCCEED and d.state is WorkerState.SUCCEEDED


def test_failure_spends_one_restart() -> None:
    d = decide_after_exit([3], 2, 2)
    assert d.action is Action.RESTART and d.consumes_restart
    assert d.remaining_restarts == 1 and d.state is WorkerState.FAILED


def test_failure_without_budget_fails() -> None:
    d = decide_after_exit([0, -9], 2, 0)
    assert d.action is Action.FAIL and d.state is WorkerState.FAILED


def test_membership_change_restarts_for_free() -> None:
    d = decide_after_membership_change([], 2, 0)
    assert d.action is Action.REJOIN and not d.consumes_restart
    assert d.remaining_restarts == 0


def test_a_finished_peer_leaving_is_no_membership_change() -> None:
    d = decide_after_membership_change([0], 2, 1, peer_finished=True)
    assert d.action is Action.WAIT and d.state is WorkerState.HEALTHY
    assert decide_after_membership_change([1], 2, 1, peer_finished=True).action is Action.RESTART


def test_local_outcome_wins_over_membership_change() -> None:
    assert decide_after_membership_change([1], 2, 1).action is Action.RESTART
    assert decide_after_membership_change([0, 0], 2, 1).action is Action.SUCCEED


@pytest.mark.parametrize(
    ("codes", "lws", "remaining"), [([0, 0, 0], 2, 1), ([], 0, 1), ([], 1, -1)]
)
def test_rejects_impossible_inputs(codes: list[int], lws: int, remaining: int) -> None:
    with pytest.raises(ValueError):
        decide_after_exit(codes, lws, remaining)


@given(
    codes=st.lists(st.integers(-15, 5), max_size=4),
    extra=st.integers(0, 3),
    remaining=st.integers(0, 3),
)
def test_budget_never_goes_negative(codes: list[int], extra: int, remaining: int) -> None:
    lws = len(codes) + extra or 1
    d = decide_after_exit(codes, lws, remaining)
    assert 0 <= d.remaining_restarts <= remaining
    assert (d.remaining_restarts < remaining) == (d.action is Action.RESTART)
    if any(codes):
        assert d.action in (Action.RESTART, Action.FAIL)


def test_counters() -> None:
    assert restart_count(3, 1) == 2
    assert flakiness(True, 3, 3) == 100
    assert flakiness(False, 3, 3) == 0
    assert flakiness(False, 3, 1) == 50

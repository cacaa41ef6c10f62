"""The restart policy's plain functions: job-wide budget, no-progress streak, back-off."""

from __future__ import annotations

from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from aelastic.agent import WorkerSpec
from aelastic.agent._exceptions import AgentConfigError
from aelastic.agent._policy import (
    Action,
    Observed,
    StepProgress,
    decide_job_budget,
    fold_attempt_steps,
    learned_timeouts,
    merge_observed,
    no_progress,
    restart_backoff,
)
from aelastic.progress._timeouts import ProgressTimeouts
from aelastic.store import LocalStore, Store
from aelastic.store._interface import Value

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


def test_no_progress_stop_needs_a_step_to_have_been_seen() -> None:
    never_stepped = StepProgress()
    for _ in range(5):
        never_stepped = fold_attempt_steps(never_stepped, -1, failed=True)
    assert not no_progress(never_stepped, 2)


async def test_a_job_that_never_calls_step_is_not_stopped_for_no_progress(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from aelastic.agent import WorkerState
    from aelastic.agent._policy import Decision
    from aelastic.agent._restart_policy import RestartPolicy

    spec = WorkerSpec(
        role="r",
        local_world_size=1,
        rdzv_handler=LocalRendezvous(),
        entrypoint="/bin/true",
        max_restarts=9,
        max_no_progress_restarts=2,
    )
    policy = RestartPolicy(spec)
    restart = Decision(Action.RESTART, WorkerState.FAILED, 3)
    with caplog.at_level("WARNING", logger="aelastic.agent"):
        for _ in range(4):
            assert await policy.review(restart, attempt_best_step=-1, round_=1) == restart
    assert not policy.stopped_for_no_progress
    assert sum("never called" in r.getMessage() for r in caplog.records) == 1


class _StoreRendezvous(LocalRendezvous):
    """One node's view of a job whose rendezvous has a shared store (as c10d's has)."""

    def __init__(self, store: Store) -> None:
        super().__init__("budget-run")
        self.store = store


class _CancelAfterOneRequest(LocalStore):
    """A real LocalStore whose writer is cancelled right after its first request lands."""

    def __init__(self) -> None:
        super().__init__()
        self.scope: anyio.CancelScope | None = None

    async def _landed(self) -> None:
        if self.scope is not None:
            self.scope.cancel()
            self.scope = None
            await anyio.lowlevel.checkpoint()  # the reply is lost to the cancellation

    async def add(self, key: str, amount: int) -> int:
        total = await super().add(key, amount)
        await self._landed()
        return total

    async def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        value = await super().compare_set(key, expected, desired)
        await self._landed()
        return value


def _budget_spec(store: Store) -> WorkerSpec:
    return WorkerSpec(
        role="r",
        local_world_size=1,
        rdzv_handler=_StoreRendezvous(store),
        entrypoint="/bin/true",
        max_restarts=3,
        job_wide_restarts=True,
    )


async def test_job_wide_budget_counts_a_round_whose_first_node_was_cancelled() -> None:
    from aelastic.agent import WorkerState
    from aelastic.agent._policy import Decision
    from aelastic.agent._restart_policy import RestartPolicy

    store = _CancelAfterOneRequest()
    restart = Decision(Action.RESTART, WorkerState.FAILED, 3)
    with anyio.CancelScope() as scope:
        store.scope = scope
        await RestartPolicy(_budget_spec(store)).review(restart, attempt_best_step=-1, round_=7)
    assert scope.cancelled_caught
    # Another node of the same failed round: the round counts once, not zero times.
    peer = await RestartPolicy(_budget_spec(store)).review(restart, attempt_best_step=-1, round_=7)
    assert peer.remaining_restarts == 2
    again = await RestartPolicy(_budget_spec(store)).review(restart, attempt_best_step=-1, round_=7)
    assert again.remaining_restarts == 2  # idempotent per round
    later = await RestartPolicy(_budget_spec(store)).review(restart, attempt_best_step=-1, round_=8)
    assert later.remaining_restarts == 1


class _SilentStore(LocalStore):
    """A store that never answers the budget's request (an unreachable endpoint)."""

    async def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


async def test_job_wide_budget_store_timeout_is_one_clear_agent_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aelastic.agent import AgentError, WorkerState, _restart_policy
    from aelastic.agent._policy import Decision

    monkeypatch.setattr(_restart_policy, "_STORE_TIMEOUT", 0.05)
    policy = _restart_policy.RestartPolicy(_budget_spec(_SilentStore()))
    restart = Decision(Action.RESTART, WorkerState.FAILED, 3)
    with pytest.raises(AgentError, match=r"did not answer within.*--job-wide-restarts"):
        await policy.review(restart, attempt_best_step=-1, round_=1)


async def test_learned_timeouts_survive_a_store_error(tmp_path: Path) -> None:
    """A closed rendezvous store (StoreClosedError) is logged, never raised: the learned
    intervals are still used and written to the run's file."""
    from aelastic.agent._learned import LearnedTimeouts
    from aelastic.progress._reader import ProgressSnapshot

    store = LocalStore()
    await store.aclose()
    rdzv = _StoreRendezvous(store)
    spec = WorkerSpec(
        role="r",
        local_world_size=1,
        rdzv_handler=rdzv,
        entrypoint="/bin/true",
        heartbeat_timeout=30.0,
        learn_timeouts=5.0,
        log_dir=str(tmp_path),
    )
    emitted: list[str] = []
    learned = LearnedTimeouts(spec, lambda name, md: emitted.append(name))
    snap = ProgressSnapshot(True, 1, 3, 2, 1_000_000_000, 4, None, 0, 0, {})
    await learned.update([snap])
    assert learned.timeouts().heartbeat == 5.0
    assert emitted == ["aelastic.progress.learned_timeouts"]


class _GatedStore(LocalStore):
    """A real LocalStore that holds the job-wide budget's request until released."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = anyio.Event()
        self.release = anyio.Event()

    async def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        self.entered.set()
        await self.release.wait()
        return await super().compare_set(key, expected, desired)


async def test_the_failed_group_is_stopped_before_the_restart_review(tmp_path: Path) -> None:
    """While the review waits on the store (up to 40 s), the failed worker's peer must
    not keep running."""
    from aelastic.agent import LocalElasticAgent, WorkerState

    from .conftest import local_spec, open_reporter, pid_alive, start_run

    store = _GatedStore()
    rdzv = _StoreRendezvous(store)
    async with open_reporter() as rep, anyio.create_task_group() as tg:
        spec = local_spec(rdzv, rep.args("hold"), tmp_path, max_restarts=1, job_wide_restarts=True)
        agent = LocalElasticAgent(spec)
        results = start_run(tg, agent)
        first, peer = sorted(await rep.next(2), key=lambda r: r.rank)
        await first.send(3)
        with anyio.fail_after(30):
            await store.entered.wait()
        with anyio.fail_after(10):
            await peer.wait_closed()  # stopped while the review is still pending
        assert not pid_alive(peer.pid)
        store.release.set()
        for r in await rep.next_of_attempt(1):
            await r.send(0)
    (result,) = results
    assert result.state is WorkerState.SUCCEEDED
    assert agent.remaining_restarts == 0

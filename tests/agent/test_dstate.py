"""Opt-in D-state check (torch's ``TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT``).

A real process in uninterruptible sleep cannot be made here, so the agent tests
report ``"D"`` for one worker through the agent's ``_worker_states`` seam; the
workers themselves are real subprocesses.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aelastic.agent import LocalElasticAgent, WorkerGroup, WorkerSpec, WorkerState
from aelastic.agent._exceptions import AgentConfigError
from aelastic.agent._policy import (
    UNINTERRUPTIBLE_STATE_TIMEOUT_ENV,
    Action,
    decide_after_stuck,
    resolve_uninterruptible_state_timeout,
    stuck_workers,
    track_uninterruptible,
    uninterruptible_poll_interval,
)
from aelastic.errors import ChildFailedError

from .conftest import LocalRendezvous, local_spec, open_reporter, pid_alive, start_run

ENV = UNINTERRUPTIBLE_STATE_TIMEOUT_ENV

# -- the pure policy ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "env", "expected"),
    [
        (None, None, None),
        (None, "", None),
        (None, "0", None),
        (None, "-3", None),
        (None, "600", 600.0),
        (None, " 1.5 ", 1.5),
        (2, "600", 2.0),  # the argument wins over the variable
        (0, "600", None),  # ... also to turn the check off
        (-1.0, None, None),
    ],
)
def test_resolve_timeout(value: float | None, env: str | None, expected: float | None) -> None:
    assert resolve_uninterruptible_state_timeout(value, env) == expected


@pytest.mark.parametrize("env", ["ten", "nan", "inf", "5s"])
def test_non_number_variable_is_one_clear_error(env: str) -> None:
    with pytest.raises(AgentConfigError, match=ENV):
        resolve_uninterruptible_state_timeout(None, env)


@pytest.mark.parametrize("value", [True, "5", float("nan")])
def test_non_number_argument_is_rejected(value: object) -> None:
    with pytest.raises(AgentConfigError, match="uninterruptible_state_timeout"):
        resolve_uninterruptible_state_timeout(value, None)  # type: ignore[arg-type]


def test_poll_interval_is_a_quarter_capped_at_five_seconds() -> None:
    assert uninterruptible_poll_interval(2.0) == 0.5
    assert uninterruptible_poll_interval(600.0) == 5.0
    with pytest.raises(ValueError):
        uninterruptible_poll_interval(0.0)


def test_only_a_continuous_run_of_d_counts() -> None:
    since = track_uninterruptible({}, {0: "D", 1: "S"}, now=10.0)
    assert since == {0: 10.0}
    since = track_uninterruptible(since, {0: "D", 1: "D"}, now=12.0)
    assert since == {0: 10.0, 1: 12.0}
    assert stuck_workers(since, now=12.0, timeout=2.0) == [0]
    # Rank 0 leaves D once: its clock restarts; rank 1 exited (absent): dropped.
    since = track_uninterruptible(since, {0: "R"}, now=13.0)
    assert since == {}
    since = track_uninterruptible(since, {0: "D"}, now=14.0)
    assert stuck_workers(since, now=15.9, timeout=2.0) == []
    assert stuck_workers(since, now=16.0, timeout=2.0) == [0]


@given(
    st.lists(
        st.dictionaries(st.integers(0, 3), st.sampled_from("DSRZ"), max_size=4),
        min_size=1,
        max_size=12,
    )
)
def test_stuck_means_d_in_every_sample_spanning_the_timeout(
    samples: list[dict[int, str]],
) -> None:
    timeout = 3.0
    since: dict[int, float] = {}
    for i, states in enumerate(samples):
        since = track_uninterruptible(since, states, float(i))
    now = float(len(samples) - 1)
    for rank in range(4):
        run = 0
        for states in reversed(samples):
            if states.get(rank) != "D":
                break
            run += 1
        # ``run`` trailing samples one second apart span run - 1 seconds.
        assert (rank in stuck_workers(since, now, timeout)) == (run >= 1 and run - 1 >= timeout)


def test_stuck_decision_spends_the_budget() -> None:
    d = decide_after_stuck()
    assert d.action is Action.ABANDON and d.state is WorkerState.UNHEALTHY
    assert d.remaining_restarts == 0 and not d.consumes_restart


# -- the agent, with real workers and an injected state source -------------------------


class DStateAgent(LocalElasticAgent):
    """Reports ``"D"`` for the worker of ``stuck_rank`` (None: the real states)."""

    def __init__(
        self,
        spec: WorkerSpec,
        stuck_rank: int | None = 0,
        uninterruptible_state_timeout: float | None = None,
    ) -> None:
        super().__init__(spec, uninterruptible_state_timeout=uninterruptible_state_timeout)
        self.stuck_rank = stuck_rank
        self.reads = 0

    def _worker_states(self, worker_group: WorkerGroup) -> Mapping[int, str]:
        self.reads += 1
        states = dict(super()._worker_states(worker_group))
        if self.stuck_rank is not None and self.stuck_rank in states:
            states[self.stuck_rank] = "D"
        return states


_spec = local_spec


async def test_stuck_worker_stops_the_group_and_fails_without_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, "0.4")
    rdzv = LocalRendezvous()
    async with open_reporter() as rep:
        spec = _spec(rdzv, rep.args("hold"), tmp_path)
        agent = DStateAgent(spec, stuck_rank=1)
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                results = start_run(tg, agent)
                reports = {r.env["LOCAL_RANK"]: r for r in await rep.next(2)}
    (result,) = results
    assert result.is_failed() and result.state is WorkerState.FAILED
    assert agent.get_worker_group().state is WorkerState.FAILED
    assert agent.remaining_restarts == 0 and rdzv.round == 1  # no restart on this host
    assert agent.reads >= 2  # ~0.1 s apart: a continuous run of D, not one sample
    stuck_pid = reports["1"].pid
    assert list(result.failures) == [1]  # global rank 1 (one node)
    failure = result.failures[1]
    assert failure.local_rank == 1 and failure.pid == stuck_pid
    assert failure.exitcode != 0
    assert "uninterruptible sleep" in failure.message and ENV in failure.message
    assert not any(pid_alive(r.pid) for r in reports.values())
    summary = str(ChildFailedError(spec.get_entrypoint_name(), result.failures))
    assert str(stuck_pid) in summary and "recycle this host" in summary


async def test_agent_argument_enables_the_check_over_an_unset_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    rdzv = LocalRendezvous()
    async with open_reporter() as rep:
        agent = DStateAgent(
            _spec(rdzv, rep.args("hold"), tmp_path, local_world_size=1),
            uninterruptible_state_timeout=0.2,
        )
        with anyio.fail_after(20):
            result = await agent.run()
    assert result.is_failed() and list(result.failures) == [0]


async def test_off_by_default_no_state_is_ever_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    rdzv = LocalRendezvous()
    async with open_reporter() as rep, anyio.create_task_group() as tg:
        agent = DStateAgent(_spec(rdzv, rep.args("hold"), tmp_path))
        results = start_run(tg, agent)
        for r in await rep.next(2):
            await r.send(0)
    (result,) = results
    assert result.state is WorkerState.SUCCEEDED
    assert agent.reads == 0


def test_zero_turns_it_off_and_bad_values_fail_at_construction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rdzv = LocalRendezvous()
    spec = _spec(rdzv, ("-c", "pass"), tmp_path)
    monkeypatch.setenv(ENV, "0")
    assert LocalElasticAgent(spec)._uninterruptible_state_timeout is None
    monkeypatch.setenv(ENV, "ten minutes")
    with pytest.raises(AgentConfigError, match=ENV):
        LocalElasticAgent(spec)
    with pytest.raises(AgentConfigError, match="uninterruptible_state_timeout"):
        _spec(rdzv, ("-c", "pass"), tmp_path, uninterruptible_state_timeout="5")
    monkeypatch.delenv(ENV)
    spec = _spec(rdzv, ("-c", "pass"), tmp_path, uninterruptible_state_timeout=30)
    assert LocalElasticAgent(spec)._uninterruptible_state_timeout == 30.0

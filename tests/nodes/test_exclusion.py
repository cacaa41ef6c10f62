"""Exclusion after repeated failures: the decisions, and the record in a real store."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import pytest

from aelastic.agent import WorkerState
from aelastic.agent._policy import Action, Decision
from aelastic.errors import ChildFailedError, ProcessFailure
from aelastic.nodes import NodeExcludedError, excluded_nodes
from aelastic.nodes._exclusion import NodeExclusion
from aelastic.nodes._gate import NodeGate
from aelastic.nodes._policy import ExclusionSettings
from aelastic.rendezvous._dynamic import DynamicRendezvousHandler
from aelastic.rendezvous._settings import DynamicSettings
from aelastic.store import LocalStore

FAST = DynamicSettings(join_timeout=10.0, close_timeout=2.0, read_timeout=5.0)
RESTART = Decision(Action.RESTART, WorkerState.FAILED, 2)
FAIL = Decision(Action.FAIL, WorkerState.FAILED, 0)


def test_failures_count_within_the_window_and_cooldowns_grow_to_the_cap() -> None:
    ex = NodeExclusion(ExclusionSettings(2, window=10, cooldown=5, cooldown_max=12), node="n")
    assert ex.note_failure(0.0, "a") is None
    assert ex.note_failure(11.0, "b") is None  # the first one is out of the window
    first = ex.note_failure(12.0, "c")
    assert first is not None and (first.times, first.cooldown) == (1, 5)
    assert first.reason == "its workers failed 2 time(s) within 10 s, last: c"
    assert ex.remaining(13.0) == 4.0 and ex.remaining(17.0) == 0.0
    assert ex.note_failure(20.0, "d") is None  # the count starts over after an exclusion
    second = ex.note_failure(21.0, "e")
    assert second is not None and (second.times, second.cooldown) == (2, 10)  # doubled
    ex.note_failure(40.0, "f")
    third = ex.note_failure(41.0, "g")
    assert third is not None and (third.times, third.cooldown) == (3, 12)  # capped


async def test_review_turns_the_nth_failure_into_a_free_restart_and_publishes_it() -> None:
    events: list[tuple[str, Mapping[str, Any]]] = []
    ex = NodeExclusion(ExclusionSettings(2, cooldown=60), node="bad")
    gate = NodeGate([], exclusion=ex)

    def emit(name: str, metadata: Mapping[str, Any]) -> None:
        events.append((name, metadata))

    async with DynamicRendezvousHandler("x", 1, 2, FAST, store=LocalStore()) as handler:
        assert await gate.review(RESTART, 3, "local_rank 0 exited 1", handler, emit) is RESTART
        rejoin = Decision(Action.REJOIN, WorkerState.STOPPED, 2)
        assert await gate.review(rejoin, 2, "", handler, emit) is rejoin  # not a failure
        # the budget is spent: FAIL would end the job; the exclusion replaces it, for free
        out = await gate.review(FAIL, 0, "local_rank 0 exited 1", handler, emit)
        assert out == Decision(Action.RESTART, WorkerState.FAILED, 0)
        assert [name for name, _ in events] == ["aelastic.node.excluded"]
        assert events[0][1]["node"] == "bad" and events[0][1]["cooldown"] == 60
        records = await excluded_nodes(handler)
        assert [r.describe() for r in records] == [
            "bad excluded for 60 s (exclusion #1): its workers failed 2 time(s) within 3600 s,"
            " last: local_rank 0 exited 1"
        ]
        assert await gate.notes(handler) == [records[0].describe()]
        # sitting it out: the job closes meanwhile, so the node gives up at once
        await handler.set_closed()
        with anyio.fail_after(30), pytest.raises(NodeExcludedError, match="was excluded"):
            await gate.admit(handler, emit)


def test_failure_summary_lists_the_excluded_nodes() -> None:
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=None)
    text = ChildFailedError("train.py", {0: failure}, notes=["bad excluded for 60 s"]).format_msg()
    assert "Excluded nodes:\n  bad excluded for 60 s\n" in text
    assert "Excluded nodes" not in ChildFailedError("train.py", {0: failure}).format_msg()

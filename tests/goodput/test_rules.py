"""The ledger's rules for restarted step counters, silent ranks and the job's figures.

Every expected number is worked out by hand in the comments (times in s), not by the
code under test.
"""

from __future__ import annotations

import math

import pytest

from aelastic.goodput import combine
from aelastic.goodput._categories import BADPUT, CATEGORIES
from aelastic.goodput._ledger import (
    COUNTER_START,
    Attempt,
    Ledger,
    RankSteps,
    compute,
    job_charge,
    job_steps,
    new_count,
)

S = 1_000_000_000  # ns per second


def steps(first: int, first_s: float, last: int, last_s: float) -> RankSteps:
    return RankSteps(first, round(first_s * S), last, round(last_s * S))


def seconds(ledger: Ledger) -> dict[str, float]:
    return {c: round(s, 6) for c, s in ledger.seconds.items() if s}


def assert_adds_up(ledger: Ledger) -> None:
    assert set(ledger.seconds) == set(CATEGORIES)
    assert math.isclose(sum(ledger.seconds.values()), ledger.wall_s, abs_tol=1e-6)


# -- a step counter that starts again is a new count, not a rollback ----------------


def test_a_restarted_step_counter_is_a_new_count() -> None:
    # step() / report_optimizer_steps(start=0) count from 0 in each process.
    # attempt 0: steps 0..99 at 0.1 s from 1 s to 10.9 s, crashes, noticed at 11 s;
    # attempt 1 counts from 0 again: 100 more steps from 12 s to 21.9 s, ends 22 s
    run = [
        Attempt(0, 0, 11 * S, "crash", None, (steps(0, 1, 99, 10.9),)),
        Attempt(11 * S, 11 * S, 22 * S, None, None, (steps(0, 12, 99, 21.9),)),
    ]
    ledger = compute(0, run, 22 * S)
    assert seconds(ledger) == {
        "startup": 1.0,
        "productive": 9.9 + 9.9,  # both counts' steps are new work
        "rollback": 0.1,  # the step under way at the crash (10.9-11 s), nothing re-run
        "restart.crash": 1.0,
        "other": 0.1,
    }
    assert (ledger.steps_kept, ledger.steps_lost) == (200, 0)
    assert_adds_up(ledger)


def test_after_a_new_count_a_resume_rolls_back_within_it() -> None:
    run = [
        # count 1: steps 0..99 from 1 s to 10.9 s, crash noticed at 11 s
        Attempt(0, 0, 11 * S, "crash", None, (steps(0, 1, 99, 10.9),)),
        # count 2: steps 0..49 from 12 s to 16.9 s, crash noticed at 17 s
        Attempt(11 * S, 11 * S, 17 * S, "crash", None, (steps(0, 12, 49, 16.9),)),
        # resumed from a checkpoint of count 2 at step 40: steps 40..60 from 18 s to 20 s
        Attempt(17 * S, 17 * S, round(20.5 * S), None, None, (steps(40, 18, 60, 20),)),
    ]
    ledger = compute(0, run, round(20.5 * S))
    assert seconds(ledger) == {
        "startup": 1.0,
        # 99 + 49 steps after each count's first, then steps 50..60 (11 x 0.1 s)
        "productive": 9.9 + 4.9 + 1.1,
        # the steps under way at the two crashes, then steps 41..49 again (9 x 0.1 s)
        "rollback": 0.1 + 0.1 + 0.9,
        "restart.crash": 1.0 + 1.0,
        "other": 0.5,
    }
    # count 1: 100 steps; count 2: steps 0..60, of which 40..49 ran twice
    assert (ledger.steps_kept, ledger.steps_lost) == (100 + 61, 10)
    assert_adds_up(ledger)


def test_a_global_step_that_starts_over_is_a_rollback() -> None:
    # global steps (step(n + 1), Lightning's global_step) begin at 1 and are restored
    # from checkpoints: steps 1..50 at 0.1 s from 1 s to 5.9 s, a crash noticed at 6 s,
    # then the run starts over from nothing: steps 1..80 from 7 s to 14.9 s, ends 15 s
    run = [
        Attempt(0, 0, 6 * S, "crash", None, (steps(1, 1, 50, 5.9),)),
        Attempt(6 * S, 6 * S, 15 * S, None, None, (steps(1, 7, 80, 14.9),)),
    ]
    ledger = compute(0, run, 15 * S)
    assert seconds(ledger) == {
        "startup": 1.0,
        "productive": 4.9 + 3.0,  # steps 2..50, then 51..80
        "rollback": 0.1 + 4.9,  # the step under way at the crash, then steps 2..50 again
        "restart.crash": 1.0,
        "other": 0.1,
    }
    # the distinct steps completed: 1..80, of which 1..50 twice
    assert (ledger.steps_kept, ledger.steps_lost) == (80, 50)
    assert_adds_up(ledger)


def test_new_count_rule() -> None:
    assert not new_count(0, None)  # the first steps of the run
    assert new_count(0, 99)  # where step() and report_optimizer_steps() begin
    assert new_count(0, 0)  # the count before never got past its first step
    assert not new_count(1, 99)  # a global step from 1 again: the run started over
    assert not new_count(2, 99)  # resumed at step 2: steps 2..99 are run again
    assert not new_count(41, 40)  # resumed after the best step: nothing is lost
    assert not new_count(1, 0)  # step 1 after step 0: the same count, going on
    assert COUNTER_START == 0


# -- a rank that reports no step holds its share of the time as unreported ---------------


@pytest.mark.parametrize(
    ("silent", "ranks", "productive", "unreported"),
    [(1, 2, 5.0, 5.0), (1, 4, 7.5, 2.5), (3, 4, 2.5, 7.5)],
)
def test_a_silent_rank_is_not_productive(
    silent: int, ranks: int, productive: float, unreported: float
) -> None:
    # the reporting ranks step from 1 s to 11 s (10 s), the attempt ends at 12 s; each
    # of the node's ranks holds 10 s / ranks of that stepping time
    reporting = [steps(0, 1, 100, 11)] * (ranks - silent)
    run = [Attempt(0, 0, 12 * S, None, None, (*reporting, *[RankSteps()] * silent))]
    ledger = compute(0, run, 12 * S)
    assert seconds(ledger) == {
        "startup": 1.0,
        "productive": productive,
        "unreported": unreported,
        "other": 1.0,
    }
    assert ledger.steps_kept == 101  # the steps of the ranks that reported them
    assert_adds_up(ledger)


def test_a_silent_rank_while_a_step_is_under_way() -> None:
    # live at 10 s: the reporting rank's last step at 8 s, the step under way since
    run = [Attempt(0, 0, None, None, None, (steps(0, 2, 60, 8), RankSteps()))]
    ledger = compute(0, run, 10 * S)
    assert seconds(ledger) == {"startup": 2.0, "productive": 4.0, "unreported": 4.0}
    assert_adds_up(ledger)


# -- the job's figures from the nodes' records -----------------------------------------


def record(
    wall: float, productive: float, kept: int | None = 1000, lost: int | None = 0, **badput: float
) -> dict[str, object]:
    return {
        "wall_s": wall,
        "productive_s": productive,
        "ratio": productive / wall,
        "badput_s": {c: badput.get(c, 0.0) for c in BADPUT},
        "steps_kept": kept,
        "steps_lost": None if kept is None else lost,
    }


def test_a_slow_node_costs_the_job_its_pace() -> None:
    # 4 nodes for 100 s; one at score 0.5 throughout: the synchronous job ran at half
    # speed, so half of its 100 s was lost to the straggler (docs/stragglers.md)
    slow = record(100, 50, straggler=50)
    job = combine([slow, record(100, 100), record(100, 100), record(100, 100)])
    assert job is not None
    assert job.seconds["straggler"] == pytest.approx(50.0)
    assert job.seconds["productive"] == pytest.approx(50.0)
    assert_adds_up(job)
    assert job_charge([50.0, 0.0, 0.0, 0.0]) == 50.0
    assert job_charge([20.0, 30.0]) == 30.0  # the slowest node's pace
    assert job_charge([]) == 0.0


def test_the_jobs_steps_are_not_those_of_a_node_that_left() -> None:
    # a node that left after 50 steps, one there throughout (1000, 20 of them re-run)
    # and one that joined late (101 steps)
    left = record(5, 5, kept=50)
    full = record(100, 98, kept=1000, lost=20, rollback=2)
    late = record(10, 10, kept=101)
    job = combine([left, full, late])
    assert job is not None and (job.steps_kept, job.steps_lost) == (1000, 20)
    assert_adds_up(job)
    assert job_steps([(50, 0), (None, None), (1000, 20)]) == (1000, 20)
    assert job_steps([(None, None)]) == (None, None)


def test_a_node_without_steps_is_not_productive_among_stepping_ones() -> None:
    # two nodes for 10 s, 1 s of start-up each; only the first reported steps (9 s of them)
    stepping = record(10, 9, kept=90, startup=1)
    silent = record(10, 9, kept=None, startup=1)
    job = combine([stepping, silent])
    assert job is not None
    assert seconds(job) == {"productive": 4.5, "unreported": 4.5, "startup": 1.0}
    assert (job.steps_kept, job.steps_lost) == (90, 0)
    assert_adds_up(job)
    # no node reported steps: a ledger by phase, running time as productive, no ratio
    phases = combine([silent, silent])
    assert phases is not None and seconds(phases) == {"productive": 9.0, "startup": 1.0}
    assert phases.steps_kept is None
    assert phases.summary().startswith("goodput unknown of 10.0 s (steps unknown")
    assert "%" not in phases.summary()

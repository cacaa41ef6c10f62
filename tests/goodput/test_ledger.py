"""The ledger's accounting, as plain functions with exact expected numbers (times in s)."""

from __future__ import annotations

import math

import pytest

from aelastic.goodput import combine
from aelastic.goodput._categories import BADPUT, CATEGORIES
from aelastic.goodput._ledger import Attempt, Ledger, RankSteps, compute
from aelastic.goodput._recorder import GoodputRecorder

S = 1_000_000_000  # ns per second


def steps(first: int, first_s: float, last: int, last_s: float, **kw: float) -> RankSteps:
    extra = {k.replace("_s", "_ns"): int(v * S) for k, v in kw.items()}
    return RankSteps(first, int(first_s * S), last, int(last_s * S), **extra)


def seconds(ledger: Ledger) -> dict[str, float]:
    return {c: round(s, 6) for c, s in ledger.seconds.items() if s}


def assert_adds_up(ledger: Ledger) -> None:
    assert set(ledger.seconds) == set(CATEGORIES)
    assert math.isclose(sum(ledger.seconds.values()), ledger.wall_s, abs_tol=1e-6)


def test_a_clean_run() -> None:
    # launch 0, rendezvous 0-1 s, workers at 2 s, steps 0..99 from 3 s to 13 s, ends 14 s
    run = [Attempt(0, 2 * S, 14 * S, None, None, (steps(0, 3, 99, 13, load_s=0.5, save_s=2),))]
    ledger = compute(0, run, 15 * S, waits=[(0, 1 * S), (14 * S, 15 * S)])
    assert seconds(ledger) == {
        "waiting": 2.0,  # the rendezvous and the exit barrier
        "checkpoint_load": 0.5,
        "startup": 1.5,  # 0-3 s less the wait and the load
        "checkpoint_save": 2.0,
        "productive": 8.0,
        "other": 1.0,  # the last step to the workers' end
    }
    assert (ledger.steps_kept, ledger.steps_lost) == (100, 0)
    assert ledger.ratio == pytest.approx(8 / 15)
    assert_adds_up(ledger)


def test_a_crash_with_rollback() -> None:
    # attempt 0: steps 0..50 in 1-6 s, crashes at 6.4 s, noticed at 6.5 s;
    # attempt 1 resumes from step 40: steps 40..100 in 8-14 s (0.1 s per step)
    run = [
        Attempt(0, 0, int(6.5 * S), "crash", int(6.4 * S), (steps(0, 1, 50, 6),)),
        Attempt(int(6.5 * S), 7 * S, 14 * S, None, None, (steps(40, 8, 100, 14),)),
    ]
    ledger = compute(0, run, 14 * S)
    assert seconds(ledger) == {
        "startup": 1.0,
        "productive": 5.0 + 5.0,  # steps 0..50, then 51..100
        "rollback": 0.4 + 1.0,  # the unfinished step at the crash, then steps 40..50 again
        "detection": 0.1,
        "restart.crash": 1.5,  # noticed at 6.5 s to the first step at 8 s
    }
    assert (ledger.steps_kept, ledger.steps_lost) == (101, 11)
    assert dict(ledger.restarts) == {"crash": 1}
    assert_adds_up(ledger)


def test_a_hang_is_detected_late_and_an_attempt_without_steps_is_restart_time() -> None:
    run = [
        Attempt(0, 0, 10 * S, "hang", 5 * S, (steps(0, 1, 40, 5),)),  # silent from 5 s
        Attempt(10 * S, 11 * S, 12 * S, "crash", None, (RankSteps(),)),  # dies before a step
        Attempt(12 * S, 13 * S, None, None, None, (steps(41, 14, 60, 16),)),  # running
    ]
    ledger = compute(0, run, 17 * S)
    assert seconds(ledger) == {
        "startup": 1.0,
        "productive": 4.0 + 2.0 + 1.0,  # the step under way at 16-17 s counts
        "detection": 5.0,
        "restart.hang": 2.0,
        "restart.crash": 2.0,
    }
    assert (ledger.steps_kept, ledger.steps_lost) == (61, 0)
    assert_adds_up(ledger)


def test_the_slowest_rank_sets_the_pace() -> None:
    ranks = (steps(0, 1, 10, 11), steps(0, 2, 8, 11))
    ledger = compute(0, [Attempt(0, 0, 12 * S, None, None, ranks)], 12 * S)
    # every rank stepped from 2 s; the slowest reached step 8 at 11 s
    assert seconds(ledger) == {"startup": 2.0, "productive": 9.0, "other": 1.0}
    assert ledger.steps_kept == 9
    assert_adds_up(ledger)


def test_no_steps_gives_a_ledger_by_phase() -> None:
    run = [
        Attempt(0, 2 * S, 6 * S, "hang", 5 * S, (RankSteps(),)),
        Attempt(6 * S, 7 * S, 9 * S, None, None, (RankSteps(),)),
    ]
    ledger = compute(0, run, 10 * S)
    assert seconds(ledger) == {
        "startup": 2.0,
        "productive": 3.0 + 2.0,
        "detection": 1.0,
        "restart.hang": 1.0,
        "other": 1.0,
    }
    assert (ledger.steps_kept, ledger.steps_lost) == (None, None)
    # no ratio: 50% would claim the running time as goodput
    assert ledger.summary() == (
        "goodput unknown of 10.0 s (steps unknown: the workers ran 5.0 s):"
        " startup 2.0 s, restart 1.0 s (1), detection 1.0 s, other 1.0 s"
    )
    assert_adds_up(ledger)


def test_summary_line_and_record() -> None:
    run = [
        Attempt(0, 0, int(6.5 * S), "crash", int(6.4 * S), (steps(0, 1, 50, 6),)),
        Attempt(int(6.5 * S), 7 * S, 14 * S, None, None, (steps(40, 8, 100, 14),)),
    ]
    ledger = compute(0, run, 14 * S)
    assert ledger.summary() == (
        "goodput 71.4% of 14.0 s: restart 1.5 s (1), rollback 1.4 s (11 steps),"
        " startup 1.0 s, detection 0.1 s"
    )
    record = ledger.record()
    assert set(record) == {
        "wall_s",
        "productive_s",
        "ratio",
        "badput_s",
        "steps_kept",
        "steps_lost",
    }
    badput = record["badput_s"]
    assert isinstance(badput, dict) and set(badput) == set(BADPUT)
    again = Ledger.from_record(record)
    assert again.seconds == pytest.approx(dict(ledger.seconds), abs=1e-3)


def test_combine_weights_nodes_by_their_time_in_the_job() -> None:
    full = compute(0, [Attempt(0, 0, 10 * S, None, None, (steps(0, 1, 9, 10),))], 10 * S)
    # a node that left after 5 s keeps its share
    left = compute(0, [Attempt(0, 0, 5 * S, "crash", None, (steps(0, 1, 4, 5),))], 5 * S)
    job = combine([full.record(), left.record()])
    assert job is not None
    assert job.wall_s == 10.0
    assert job.seconds["productive"] == pytest.approx(10 * (9 + 4) / 15)
    assert job.seconds["startup"] == pytest.approx(10 * 2 / 15)
    assert (job.steps_kept, job.steps_lost) == (10, 0)  # the job's steps: the full node's
    assert math.isclose(sum(job.seconds.values()), 10.0)
    assert combine([]) is None


def test_recorder_feeds_the_same_ledger() -> None:
    now = [0]
    rec = GoodputRecorder(clock=lambda: now[0])
    assert rec.ledger() is None
    rec.launched()
    with rec.wait():
        now[0] = 1 * S
    now[0] = 2 * S
    rec.attempt_started()
    rec.steps = lambda: [steps(0, 3, 9, 5)]
    now[0] = 6 * S
    live = rec.ledger()
    assert live is not None and seconds(live) == {"waiting": 1, "startup": 2, "productive": 3}
    rec.attempt_ended([steps(0, 3, 9, 5)], "membership", noticed_ns=6 * S)
    rec.reclassify("node_loss")
    now[0] = int(6.5 * S)
    with rec.wait():  # live, mid-rendezvous: the wait so far, and restarting
        now[0] = int(6.6 * S)
        live = rec.ledger()
        assert live is not None and seconds(live)["waiting"] == pytest.approx(1.1)
        assert seconds(live)["restart.node_loss"] == pytest.approx(0.5)
        now[0] = int(6.7 * S)
    now[0] = 7 * S
    rec.attempt_started()
    now[0] = 10 * S
    rec.attempt_ended([steps(10, 8, 19, 9)])
    rec.charge("other", 0.5)
    rec.finished()
    now[0] = 99 * S
    ledger = rec.ledger()
    assert ledger is not None
    assert seconds(ledger) == {
        "startup": 2.0,
        "productive": 2.0 + 1.0 - 0.5,
        "detection": 1.0,  # another node's fault: from the last step at 5 s to the notice
        "restart.node_loss": 2.0 - 0.2,
        "waiting": 1.0 + 0.2,
        "other": 1.0 + 0.5,
    }
    assert dict(rec.restarts()) == {"node_loss": 1}
    assert_adds_up(ledger)
    with pytest.raises(ValueError, match=r"add it to .*BADPUT"):
        rec.charge("slowness", 1.0)
    rec.charge("straggler", 1.5)  # a slow rank's cost moves out of productive time
    charged = rec.ledger()
    assert charged is not None
    assert_adds_up(charged)
    assert charged.seconds["straggler"] == pytest.approx(1.5)
    assert charged.seconds["productive"] == pytest.approx(ledger.seconds["productive"] - 1.5)
    with pytest.raises(ValueError, match="cause 'oops'"):
        rec.attempt_started()
        rec.attempt_ended([], "oops")


def test_a_run_stopped_before_its_attempt_ended_keeps_the_steps_of_its_last_round() -> None:
    # SIGTERM: the round's progress files close before the attempt is ended (or never
    # is): the steps its workers reported stay in the ledger (before: "steps unknown")
    now = [0]
    rec = GoodputRecorder(clock=lambda: now[0])
    rec.launched()
    now[0] = 2 * S
    rec.attempt_started()
    reported = [steps(1, 3, 30, 8), steps(1, 3, 30, 8)]
    live: list[RankSteps] = list(reported)
    rec.steps = lambda: live
    now[0] = 9 * S
    rec.round_closing(live)
    live = [RankSteps(), RankSteps()]  # the files are gone: nothing attached
    rec.finished()
    ledger = rec.ledger()
    assert ledger is not None
    assert ledger.steps_kept == 30
    # from the first step at 3 s to the stop at 9 s (the step under way counts, as live)
    assert seconds(ledger) == {"startup": 3.0, "productive": 6.0}
    assert_adds_up(ledger)
    # an attempt ended later without its steps (read after the close) keeps them too
    rec.attempt_ended(live)
    ended = rec.ledger()
    assert ended is not None and ended.steps_kept == 30

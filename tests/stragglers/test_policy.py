"""The plain decisions of straggler detection: scores, confirmation, node verdicts."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from aelastic.stragglers import SlowInterval
from aelastic.stragglers._exceptions import StragglerConfigError
from aelastic.stragglers._policy import (
    NodeVerdict,
    RateWindow,
    SlowTracker,
    StragglerSettings,
    node_verdicts,
    score_ranks,
    slow_intervals,
)

#: global rank -> node: two nodes of two ranks
NODES = {0: "a", 1: "a", 2: "b", 3: "b"}
FAST = StragglerSettings(window=4.0, min_duration=3.0)


def simulate(
    rate: Callable[[int, float], float], settings: StragglerSettings = FAST, until: float = 60.0
) -> tuple[list[tuple[float, list[NodeVerdict]]], SlowTracker]:
    """Feed ``rate(rank, t)`` every interval through windows, scores and the tracker;
    return every time at which a verdict stood, with the verdicts."""
    windows = {rank: RateWindow(settings.window) for rank in NODES}
    tracker = SlowTracker(settings)
    seen = []
    t = 0.0
    while t < until:
        t = round(t + settings.interval, 6)
        medians = {}
        for rank, window in windows.items():
            window.add(t, rate(rank, t))
            median = window.median()
            if median is not None:
                medians[rank] = (NODES[rank], median)
        best = {r: w.best for r, w in windows.items() if w.best is not None}
        scores = score_ranks(medians, best)
        tracker.update(scores, t)
        verdicts = node_verdicts(scores, tracker.slow)
        if verdicts:
            seen.append((t, verdicts))
    return seen, tracker


def even(rank: int, t: float) -> float:
    return 0.7


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"threshold": 0.0}, "strictly between 0 and 1"),
        ({"threshold": 1.0}, "strictly between 0 and 1"),
        ({"threshold": 1.5}, "--straggler-threshold 1.5"),
        ({"threshold": -0.2}, "strictly between 0 and 1"),
        ({"window": 0.0}, "--straggler-window 0.0: need seconds > 0"),
        ({"min_duration": -1.0}, "--straggler-min-duration"),
        ({"timeout": -1.0}, "--straggler-timeout -1.0"),
        ({"warmup": -1.0}, "--straggler-warmup -1.0: need seconds >= 0"),
        ({"action": "kill"}, "choose one of report, exclude, off"),
    ],
)
def test_out_of_range_settings_are_one_clear_error(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(StragglerConfigError, match=needle):
        StragglerSettings(**kwargs)  # type: ignore[arg-type]


def test_defaults_and_the_sampling_interval() -> None:
    s = StragglerSettings()
    assert (s.action, s.threshold, s.window, s.min_duration, s.timeout) == (
        "report",
        0.75,
        10.0,
        20.0,
        120.0,
    )
    assert s.enabled and not StragglerSettings(action="off").enabled
    assert s.interval == 1.0
    assert StragglerSettings(window=4).interval == 0.4
    assert StragglerSettings(window=0.5).interval == 0.1


def test_window_median_needs_three_samples_and_forgets_old_ones() -> None:
    w = RateWindow(3.0)
    w.add(1.0, 0.5)
    w.add(2.0, 0.9)
    assert w.median() is None
    w.add(3.0, 0.6)
    assert w.median() == 0.6
    w.add(4.0, 0.8)  # 1.0 leaves the window
    w.add(5.0, 0.8)  # so does 2.0
    assert [t for t, _ in w.samples] == [3.0, 4.0, 5.0]
    assert w.median() == 0.8
    assert w.best == 0.6  # the lowest median so far: the rank's best work per step


def test_scores_relative_to_the_fastest_rank_and_to_its_own_best() -> None:
    scores = score_ranks(
        {0: ("a", 0.5), 1: ("a", 0.5), 2: ("b", 0.7), 3: ("b", 1.0)},
        {0: 0.5, 1: 0.5, 2: 0.5, 3: 0.5},
    )
    by_rank = {s.global_rank: s for s in scores}
    assert by_rank[0].relative == 1.0 and by_rank[0].individual == 1.0
    assert by_rank[3].relative == pytest.approx(0.5)
    assert by_rank[2].relative == pytest.approx(0.5 / 0.7)
    assert by_rank[3].individual == pytest.approx(0.5)
    assert by_rank[3].node == "b"


def test_nothing_is_scored_alone_or_when_every_rank_is_idle() -> None:
    assert score_ranks({0: ("a", 0.9)}, {}) == []
    assert score_ranks({0: ("a", 0.01), 1: ("a", 0.2)}, {}) == []


def test_a_rank_forty_percent_slower_is_named_after_half_a_window_and_min_duration() -> None:
    def rate(rank: int, t: float) -> float:
        return 1.0 if rank == 3 and t > 30 else 0.7

    seen, _ = simulate(rate)
    assert seen, "never reported"
    first, verdicts = seen[0]
    assert [(v.node, list(v.ranks), v.whole_node) for v in verdicts] == [("b", [3], False)]
    assert verdicts[0].score == pytest.approx(0.7, abs=0.01)
    # the median turns after half the window (2 s), then it must last min_duration (3 s)
    assert 30 + 3.0 <= first <= 30 + 2.0 + 3.0 + 1.0, first
    assert all(t >= first for t, _ in seen)  # and it stays reported


def test_every_rank_of_a_node_slow_names_the_node() -> None:
    def rate(rank: int, t: float) -> float:
        return 1.0 if NODES[rank] == "a" and t > 20 else 0.6

    seen, _ = simulate(rate)
    _, verdicts = seen[-1]
    assert [(v.node, sorted(v.ranks), v.whole_node) for v in verdicts] == [("a", [0, 1], True)]
    assert "every rank of the node is slow" in verdicts[0].describe()


@pytest.mark.parametrize(
    "name",
    ["one_slow_step", "checkpoint_save", "all_ranks_stall", "everyone_slower", "short_blip"],
)
def test_no_report_for_what_is_not_a_straggler(name: str) -> None:
    def rate(rank: int, t: float) -> float:
        if name == "one_slow_step":  # a single sample doubles
            return 1.4 if rank == 1 and 20 < t <= 20.4 else 0.7
        if name == "checkpoint_save":  # rank 0 alone busy for 2 s (< min_duration)
            return 1.0 if rank == 0 and 20 < t <= 22 else 0.7
        if name == "all_ranks_stall":  # data loading: everyone waits, nobody works
            return 0.01 if 20 < t <= 40 else 0.7
        if name == "everyone_slower":  # a CPU hog slows every rank alike
            return 0.95 if t > 20 else 0.7
        # rank 2 busier for 2.5 s (< min_duration), e.g. contention: its median is
        # high for about as long
        return 1.0 if rank == 2 and 20 < t <= 22.5 else 0.7

    seen, _ = simulate(rate)
    assert seen == []


def test_a_sustained_higher_rate_on_one_rank_is_reported() -> None:
    def rate(rank: int, t: float) -> float:
        return 1.0 if rank == 2 and t > 20 else 0.7

    seen, _ = simulate(rate)
    assert seen and seen[-1][1][0].ranks.keys() == {2}


def test_a_recovered_rank_is_cleared_past_the_hysteresis() -> None:
    def rate(rank: int, t: float) -> float:
        return 1.0 if rank == 1 and 10 < t <= 30 else 0.7

    seen, tracker = simulate(rate)
    assert seen and seen[-1][0] < 40  # cleared within a window of the end
    assert tracker.slow == {} and tracker.since == {}


def test_the_hysteresis_band_keeps_a_slow_rank_slow() -> None:
    tracker = SlowTracker(FAST)
    scores = score_ranks({0: ("a", 0.7), 1: ("a", 1.0)}, {})
    for t in range(5):
        tracker.update(scores, float(t))
    assert set(tracker.slow) == {1}
    # 0.78: above the threshold (0.75), within the band (0.80): still slow
    tracker.update(score_ranks({0: ("a", 0.78), 1: ("a", 1.0)}, {}), 5.0)
    assert set(tracker.slow) == {1}
    tracker.update(score_ranks({0: ("a", 0.9), 1: ("a", 1.0)}, {}), 6.0)
    assert tracker.slow == {}
    # a rank that is no longer scored (a new round) is forgotten
    tracker.update(scores, 7.0)
    tracker.update([], 8.0)
    assert tracker.since == {}


def test_slow_intervals_open_extend_and_close() -> None:
    verdict = NodeVerdict("b", {3: 0.7}, False)
    worse = NodeVerdict("b", {2: 0.6, 3: 0.7}, True)
    out = slow_intervals([], verdict, 100.0, 103.0)
    assert out == [SlowInterval("b", (3,), 100.0, None, 0.7)]
    out = slow_intervals(out, worse, 101.0, 104.0)
    assert out == [SlowInterval("b", (2, 3), 100.0, None, 0.6)]
    out = slow_intervals(out, None, None, 110.0)
    assert out == [SlowInterval("b", (2, 3), 100.0, 110.0, 0.6)]
    assert out[0].seconds(500.0) == 10.0
    assert slow_intervals(out, None, None, 120.0) == out  # closed stays closed
    again = slow_intervals(out, verdict, None, 130.0)
    assert again[-1] == SlowInterval("b", (3,), 130.0, None, 0.7) and len(again) == 2
    assert again[0].seconds(999.0) == 10.0 and again[-1].seconds(131.0) == 1.0

"""The plain decisions of straggler exclusion: when, how often, and for which ranks."""

from __future__ import annotations

import pytest

from aelastic.stragglers._exclude import (
    EXCLUDE_ATTEMPTS,
    ExcludedFor,
    exclusion_due,
    parse_record,
    workload_ranks,
)
from aelastic.stragglers._settings import StragglerSettings

#: due 5 s after the onset; the backoff is 10 + 2 + 3 = 15 s
SETTINGS = StragglerSettings(action="exclude", min_duration=2, timeout=3, warmup=10)


def _due(
    now: float,
    since: float | None = 0.0,
    *,
    excluded: bool = False,
    attempts: int = 0,
    last: float | None = None,
    settings: StragglerSettings = SETTINGS,
) -> bool:
    return exclusion_due(settings, now, since, excluded=excluded, attempts=attempts, last=last)


def test_the_backoff_is_what_new_workers_take_to_be_scored_confirmed_and_excluded() -> None:
    assert SETTINGS.exclude_backoff == 15.0
    assert StragglerSettings().exclude_backoff == 200.0  # 60 + 20 + 120, the defaults


def test_an_exclusion_is_due_once_the_slowdown_lasted_min_duration_and_timeout() -> None:
    assert not _due(4.9) and _due(5.0)
    assert not _due(100.0, None)  # nothing slow
    assert not _due(100.0, settings=StragglerSettings(action="report"))


def test_once_per_set_of_workers_and_not_within_the_backoff_of_the_last() -> None:
    assert not _due(100.0, excluded=True)  # these workers' node was excluded already
    # new workers (excluded False again), slow since 50: due at 55, held to 15 s after 45
    assert not _due(59.9, 50.0, last=45.0)
    assert _due(60.0, 50.0, last=45.0)
    assert _due(55.0, 50.0, last=30.0)  # an old exclusion holds nothing back


def test_failed_attempts_are_bounded_per_set_of_workers() -> None:
    assert _due(10.0, attempts=EXCLUDE_ATTEMPTS - 1)
    assert not _due(10.0, attempts=EXCLUDE_ATTEMPTS)


def test_a_rank_another_node_was_excluded_for_is_the_workloads() -> None:
    record = [ExcludedFor("b", (2, 3)), ExcludedFor("c", (3,)), ExcludedFor("b", (3,))]
    # node d holds ranks 2 and 3 now: both followed their rank, 3 through two nodes
    assert workload_ranks("d", [3, 2], record) == {2: ("b",), 3: ("b", "c")}
    # rank 1 was never a reason to exclude anyone: the node's own slowness
    assert workload_ranks("d", [1], record) == {}
    # node b slow again with rank 3: its own exclusions do not clear it, c's does
    assert workload_ranks("b", [2, 3], record) == {3: ("c",)}
    assert workload_ranks("d", [3], []) == {}


def test_the_record_round_trips_and_skips_what_does_not_parse() -> None:
    lines = ExcludedFor("b", (2, 3)).line() + '{"node": "c", "ranks": [1]}\n'
    assert parse_record(lines) == [ExcludedFor("b", (2, 3)), ExcludedFor("c", (1,))]
    garbled = lines + '{"node": "x"\n' + '{"ranks": [1]}\n' + "[]\n" + '{"node":"e","ranks":[4]}'
    assert parse_record(garbled) == [
        ExcludedFor("b", (2, 3)),
        ExcludedFor("c", (1,)),
        ExcludedFor("e", (4,)),
    ]
    assert parse_record("") == []


@pytest.mark.parametrize("ranks", [(), (0,), (5, 7)])
def test_a_record_line_is_one_line(ranks: tuple[int, ...]) -> None:
    line = ExcludedFor("node:1", ranks).line()
    assert line.endswith("\n") and line.count("\n") == 1
    assert parse_record(line) == [ExcludedFor("node:1", ranks)]

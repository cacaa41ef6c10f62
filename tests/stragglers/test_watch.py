"""``StragglerWatch.decide``: what one node says and does about its own slow ranks."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from aelastic.progress._reader import ProgressSnapshot
from aelastic.store import LocalStore
from aelastic.stragglers._exclude import EXCLUDE_ATTEMPTS, ExcludedFor, parse_record
from aelastic.stragglers._settings import StragglerSettings
from aelastic.stragglers._watch import RECORD_KEY, StragglerWatch

pytestmark = pytest.mark.anyio


class _Worker:
    def __init__(self, rank: int) -> None:
        self.global_rank = self.local_rank = rank
        self.pid: int | None = None


class _Job:
    round: int | None = 1
    done = False

    def __init__(self, ranks: list[int]) -> None:
        self._workers = [_Worker(r) for r in ranks]

    def workers(self) -> list[_Worker]:
        return self._workers

    def progress(self) -> dict[int, ProgressSnapshot]:
        return {}


def _watch(
    settings: StragglerSettings, ranks: list[int]
) -> tuple[StragglerWatch, list[tuple[str, Mapping[str, Any]]], list[tuple[str, str]], list[str]]:
    events: list[tuple[str, Mapping[str, Any]]] = []
    marks: list[tuple[str, str]] = []
    excluded: list[str] = []

    async def exclude(reason: str) -> None:
        excluded.append(reason)

    watch = StragglerWatch(
        settings,
        _Job(ranks),
        lambda: None,
        node="b",
        host="hostb",
        emit=lambda name, md: events.append((name, md)),
        mark=lambda kind, detail: marks.append((kind, detail)),
        exclude=exclude,
    )
    return watch, events, marks, excluded


def _shared(slow: Mapping[int, float]) -> dict[int, tuple[str, float, float]]:
    return {r: ("a" if r < 2 else "b", slow.get(r, 0.6), 0.6) for r in range(4)}


async def test_a_whole_node_is_reported_once_as_a_node_then_excluded_after_the_timeout() -> None:
    settings = StragglerSettings(action="exclude", window=4, min_duration=2, timeout=3)
    watch, events, marks, excluded = _watch(settings, [2, 3])
    now = 0.0
    # rank 3 slows down one second after rank 2: one report, naming the node
    for _ in range(30):
        now += 0.5
        await watch.decide(_shared({2: 0.9, 3: 0.9 if now > 1 else 0.6}), now)
    names = [name for name, _ in events]
    assert names == ["aelastic.straggler"]
    metadata = events[0][1]
    assert metadata["ranks"] == "2,3" and metadata["whole_node"] is True
    assert metadata["node"] == "b" and metadata["host"] == "hostb"
    assert marks and marks[0][0] == "straggler" and "every rank of the node" in marks[0][1]
    assert len(excluded) == 1 and excluded[0].startswith("straggler: every rank of the node")
    status = watch.status()
    assert status["slow"]["whole_node"] is True and set(status["scores"]) == {"2", "3"}
    assert status["scores"]["2"]["relative"] == pytest.approx(0.6 / 0.9, abs=0.001)
    assert len(watch.intervals) == 1 and watch.intervals[0].end is None


async def test_recovery_is_reported_and_closes_the_slow_interval() -> None:
    watch, events, marks, excluded = _watch(StragglerSettings(window=4, min_duration=2), [2, 3])
    now = 0.0
    for slow in (True, False):
        for _ in range(20):
            now += 0.5
            await watch.decide(_shared({3: 0.9} if slow else {}), now)
    assert [name for name, _ in events] == ["aelastic.straggler", "aelastic.straggler.recovered"]
    assert events[0][1]["ranks"] == "3" and events[0][1]["whole_node"] is False
    assert [kind for kind, _ in marks] == ["straggler", "straggler_end"]
    assert excluded == []  # report only
    (interval,) = watch.intervals
    assert interval.end is not None and interval.ranks == (3,)
    assert watch.status()["slow"] is None


async def test_another_nodes_straggler_is_not_this_nodes_to_report() -> None:
    watch, events, _, _ = _watch(StragglerSettings(window=4, min_duration=2), [2, 3])
    for i in range(20):
        await watch.decide(_shared({0: 0.9}), i * 0.5)
    assert events == [] and watch.verdict is None
    assert {s.global_rank for s in watch.scores} == {0, 1, 2, 3}  # yet every rank is scored


async def test_no_store_traffic_in_the_warmup_and_new_workers_end_a_slowdown() -> None:
    import os

    calls: list[int] = []

    def store_of() -> None:
        calls.append(1)

    events: list[str] = []
    job = _Job([2, 3])
    for worker in job.workers():
        worker.pid = os.getpid()
    watch = StragglerWatch(
        StragglerSettings(window=4, min_duration=2, warmup=30),
        job,
        store_of,
        node="b",
        host="hostb",
        emit=lambda name, md: events.append(name),
    )
    await watch.tick(100.0)
    await watch.tick(110.0)
    assert calls == []  # warm-up: nothing shared, nothing decided
    await watch.tick(131.0)
    assert calls == [1]
    for i in range(20):  # rank 3 slow: reported
        await watch.decide(_shared({3: 0.9}), 131.0 + i * 0.5)
    assert events == ["aelastic.straggler"] and watch.verdict is not None
    job.round = 2  # a new round: new workers; the slowdown ended with the old ones
    await watch.tick(150.0)
    assert events == ["aelastic.straggler", "aelastic.straggler.recovered"]
    assert watch.verdict is None and watch.intervals[-1].end is not None


async def test_the_time_a_slowdown_cost_is_charged_to_the_goodput_ledger() -> None:
    charged: list[float] = []
    watch = StragglerWatch(
        StragglerSettings(window=4, min_duration=2),
        _Job([2, 3]),
        lambda: None,
        node="b",
        host="hostb",
        emit=lambda name, md: None,
        charge=charged.append,
    )
    now, slow_for = 0.0, 0.0
    for slow in (False, True, False):
        for _ in range(20):
            now += 0.5
            await watch.decide(_shared({3: 0.9} if slow else {}), now)
            if watch.verdict is not None:
                slow_for += 0.5
    assert slow_for > 0
    # rank 3 ran at 0.6/0.9 of the fastest rank's speed: a third of each slow second is lost
    assert sum(charged) == pytest.approx(slow_for / 3, rel=0.01)


def test_straggler_cost_is_the_share_of_time_lost() -> None:
    from aelastic.stragglers._policy import straggler_cost

    assert straggler_cost(10.0, 0.75) == pytest.approx(2.5)
    assert straggler_cost(10.0, 1.0) == 0.0
    assert straggler_cost(-1.0, 0.5) == 0.0 and straggler_cost(4.0, -1.0) == 4.0


class _ReadCounting(LocalStore):
    """A real in-process store that counts the reads of other nodes' medians."""

    def __init__(self) -> None:
        super().__init__()
        self.multi_gets = 0

    async def multi_get(self, keys: Sequence[str], *, timeout: float | None = None) -> list[bytes]:
        self.multi_gets += 1
        return await super().multi_get(keys, timeout=timeout)


async def test_beyond_direct_max_nodes_the_others_read_the_leaders_summary() -> None:
    # three nodes, direct reads up to one: node a runs global rank 0 (the leader) and
    # reads everyone's medians; b and c read its summary (one key) and score their own
    # ranks against the job's fastest rate; a summary that stops moving sends them back
    store = _ReadCounting()
    ranks = {"a": [0, 1], "b": [2, 3], "c": [4, 5]}
    watches = {}
    for node, own in ranks.items():
        watches[node] = StragglerWatch(
            StragglerSettings(),
            _Job(own),
            lambda: (store, "token"),
            node=node,
            host=f"host{node}",
            emit=lambda name, md: None,
            direct_max=1,
        )
    rate = {0: 0.5, 1: 0.55, 2: 0.6, 3: 0.9, 4: 0.6, 5: 0.62}  # rank 3 slow

    async def share(node: str) -> tuple[dict[int, tuple[str, float, float]], float | None]:
        rates = {r: (rate[r], rate[r]) for r in ranks[node]}
        return await watches[node].share(rates, store, "token")

    for node in ("b", "c"):
        assert (await share(node))[1] is None  # no summary yet: every node read
    shared, fastest = await share("a")
    assert sorted(shared) == [0, 1, 2, 3, 4, 5] and fastest is None  # the leader reads all
    reads = store.multi_gets
    shared, fastest = await share("b")
    assert sorted(shared) == [2, 3] and fastest == 0.5 and store.multi_gets == reads
    await watches["b"].decide(shared, 0.0, fastest)
    scores = {s.global_rank: round(s.relative, 3) for s in watches["b"].scores}
    assert scores == {2: round(0.5 / 0.6, 3), 3: round(0.5 / 0.9, 3)}  # as if it read all
    for _ in range(2):  # the leader stopped publishing: three reads of its last summary...
        assert sorted((await share("b"))[0]) == [2, 3]
    assert sorted((await share("b"))[0]) == [0, 1, 2, 3, 4, 5]  # ...then every node again
    assert store.multi_gets == reads + 1


#: exclusion due 5 s after the onset (2 s to confirm, 3 s more); backoff 10 + 2 + 3 = 15 s
EXCLUDE = StragglerSettings(action="exclude", window=4, min_duration=2, timeout=3, warmup=10)


class _Node:
    """One node's watch over ranks 2 and 3 (rank 3 slow from the first sample, rank 2 once
    ``slow2``), a clock, and what its ``exclude`` was called at; ``fail`` makes the
    next calls of ``exclude`` raise (a count; -1: every one)."""

    def __init__(self, node: str, store: LocalStore | None = None) -> None:
        self.now = 0.0
        self.node = node
        self.calls: list[tuple[float, str]] = []  # (clock, reason) of each exclude call
        self.events: list[tuple[str, Mapping[str, Any]]] = []
        self.marks: list[str] = []
        self.fail = 0
        self.slow2 = False
        self.job = _Job([2, 3])
        self.watch = StragglerWatch(
            EXCLUDE,
            self.job,
            (lambda: None) if store is None else (lambda: (store, "token")),
            node=node,
            host=f"host{node}",
            emit=lambda name, md: self.events.append((name, md)),
            mark=lambda kind, detail: self.marks.append(kind),
            exclude=self._exclude,
        )

    async def _exclude(self, reason: str) -> None:
        self.calls.append((self.now, reason))
        if self.fail:
            self.fail -= 1
            raise RuntimeError("the store is gone")

    async def run(self, until: float) -> None:
        """Decide every half second until ``until``."""
        while self.now < until:
            self.now += 0.5
            rates = {r: ("a" if r < 2 else self.node, 0.6, 0.6) for r in range(4)}
            rates[3] = (self.node, 0.9, 0.6)
            if self.slow2:
                rates[2] = (self.node, 0.9, 0.6)
            await self.watch.decide(rates, self.now)

    def new_workers(self) -> None:
        """A new round: its workers are new (what ``sample`` sees), their slowdown too."""
        self.job.round = (self.job.round or 0) + 1
        self.watch.sample(self.now)

    def named(self, name: str) -> list[Mapping[str, Any]]:
        return [md for event, md in self.events if event == name]


async def test_a_node_is_excluded_again_for_new_workers_but_not_within_the_backoff() -> None:
    node = _Node("b")
    await node.run(10.0)  # slow from 0.5: confirmed at 2.5, excluded at 5.5, once
    assert [t for t, _ in node.calls] == [5.5] and node.watch.excluded
    node.new_workers()  # a new round; rank 3 slow again from 10.5: due at 15.5...
    assert not node.watch.excluded
    await node.run(40.0)
    # ...held back until 15 s after the first exclusion, then once for these workers
    assert [t for t, _ in node.calls] == [5.5, 20.5]
    assert node.calls[1][1].startswith("straggler: slow rank(s): global rank 3 (score")
    assert len(node.named("aelastic.straggler")) == 2  # each round's slowdown reported


async def test_a_failed_exclusion_is_retried_at_the_next_sample_a_bounded_number_of_times(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="aelastic.stragglers")
    node = _Node("b")
    node.fail = -1  # every try fails: one per sample, EXCLUDE_ATTEMPTS of them, then none
    await node.run(30.0)
    assert [t for t, _ in node.calls] == [5.5, 6.0, 6.5][:EXCLUDE_ATTEMPTS]
    failed = [r.getMessage() for r in caplog.records if "excluding node b failed" in r.getMessage()]
    assert len(failed) == EXCLUDE_ATTEMPTS, failed  # once per failure
    assert "attempt 1 of 3; retried at the next sample): RuntimeError" in failed[0]
    assert "not retried until this node has new workers" in failed[-1]
    assert not node.watch.excluded
    node.fail = 1  # new workers, slow again: the first try fails, the next sample's succeeds
    node.new_workers()
    await node.run(60.0)
    assert [t for t, _ in node.calls][3:] == [35.5, 36.0] and node.watch.excluded


async def test_a_slowdown_that_follows_the_rank_to_the_spare_is_reported_not_excluded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="aelastic.stragglers")
    store = LocalStore()
    b = _Node("b", store)
    await b.run(10.0)  # rank 3 slow on node b: b is excluded for it, and says so first
    assert [t for t, _ in b.calls] == [5.5]
    assert parse_record((await store.get(RECORD_KEY, timeout=5)).decode()) == [
        ExcludedFor("b", (3,))
    ]
    # the spare takes b's group rank, so global ranks 2 and 3; rank 3 is slow there too
    spare = _Node("spare", store)
    await spare.run(30.0)
    assert spare.calls == []  # not excluded: the slowdown is rank 3's work
    (found,) = spare.named("aelastic.straggler.workload")  # reported once
    assert found == {
        "node": "spare",
        "host": "hostspare",
        "ranks": "3",
        "excluded_nodes": "b",
        "action": "exclude",
    }
    assert "straggler_workload" in spare.marks
    lines = [r.getMessage() for r in caplog.records if "follows the rank" in r.getMessage()]
    assert lines == [
        "straggler: host hostspare node spare global ranks 3 slow again after node(s) b were"
        " excluded for them: the slowdown follows the rank (its work), not the node; no node"
        " is excluded for these ranks"
    ]
    assert len(spare.named("aelastic.straggler")) == 1  # still reported as a straggler
    # rank 2 slows down on the spare too: that one is the spare's, which is excluded for it
    spare.slow2 = True
    await spare.run(60.0)
    ((_, reason),) = spare.calls
    assert reason.startswith("straggler: slow rank(s): global rank 2 (score"), reason
    assert "rank 3" not in reason
    record = parse_record((await store.get(RECORD_KEY, timeout=5)).decode())
    assert record == [ExcludedFor("b", (3,)), ExcludedFor("spare", (2,))]

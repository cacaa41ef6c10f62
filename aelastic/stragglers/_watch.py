"""``StragglerWatch``: the async shell that samples this node's workers, shares their
medians with the other nodes through the rendezvous store, scores every rank of the
job and acts on this node's slow ranks.

Each agent decides from the same shared medians, but speaks and acts only for its own
node: the ``straggler:`` log line, the ``aelastic.straggler`` event, the job view's
mark, its ``/status`` and ``/metrics``, and with ``exclude`` its own exclusion. So no
two agents report the same straggler and no agent acts for another machine. Store
layout (under the run's status prefix): ``strag/nodes`` (the index, one node id per
line) and ``strag/n/<node>`` (its round and its ranks' medians), one SET per interval.

**Reads.** A relative score needs only the job's fastest rank. Up to ``direct_max``
nodes (32), every agent reads every node's medians each interval (n key reads per
agent, n² job-wide). The agent that runs global rank 0 (the *leader*) always does, and
publishes ``strag/summary``: the round, the number of nodes, the fastest rate and a
sequence number. In a job of more nodes, the other agents read that one key instead:
O(n) reads job-wide, and their reference is at most an interval or two older. A summary
of another round, or one whose sequence number has not moved for three reads (the
leader stopped publishing), sends them back to reading every node.

**Exclusion** (``exclude``; the rules are plain functions in :mod:`._exclude`): at most
once per set of workers and once per ``exclude_backoff`` seconds; an ``exclude`` that
raises is retried at the next sample, up to ``EXCLUDE_ATTEMPTS`` times per set of
workers. Before it excludes its node, an agent appends ``{node, ranks}`` to
``strag/excluded``, the job's record; an agent whose slow rank another node was already
excluded for reports the slowness as its rank's work (``aelastic.straggler.workload``)
and does not exclude its node for that rank.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import anyio.abc

from ._exclude import (
    EXCLUDE_ATTEMPTS,
    ExcludedFor,
    exclusion_due,
    parse_record,
    workload_ranks,
)
from ._policy import (
    NodeVerdict,
    RankScore,
    RateWindow,
    SlowInterval,
    SlowTracker,
    fastest_rate,
    node_verdicts,
    score_ranks,
    slow_intervals,
    straggler_cost,
)
from ._settings import StragglerSettings
from ._signal import busy_seconds

if TYPE_CHECKING:
    from ..progress._reader import ProgressSnapshot
    from ..store import Store

__all__ = ("StragglerWatch",)

log = logging.getLogger("aelastic.stragglers")

INDEX_KEY = "strag/nodes"
SUMMARY_KEY = "strag/summary"
#: The job's record of straggler exclusions, one ``{node, ranks}`` JSON line each.
RECORD_KEY = "strag/excluded"
#: Seconds a read or an append of the record may take (once per exclusion: generous).
_RECORD_BOUND = 5.0
#: Jobs of up to this many nodes: every agent reads every node's medians.
DIRECT_MAX = 32
#: Reads of an unchanged summary after which an agent reads every node again.
_STALE_READS = 3


def _node_key(node: str) -> str:
    return f"strag/n/{node}"


class _Worker(Protocol):
    @property
    def local_rank(self) -> int: ...
    @property
    def global_rank(self) -> int: ...
    @property
    def pid(self) -> int | None: ...


class _Job(Protocol):
    """What the watch reads of a job (an :class:`aelastic.Job`)."""

    @property
    def round(self) -> int | None: ...
    @property
    def done(self) -> bool: ...
    def workers(self) -> Sequence[_Worker]: ...
    def progress(self) -> Mapping[int, ProgressSnapshot]: ...


Emit = Callable[[str, Mapping[str, Any]], None]
StoreOf = Callable[[], "tuple[Store, object] | None"]


class StragglerWatch:
    """Watch one node's workers for stragglers; ``await task_group.start(watch.run)``.

    ``node`` names this node (its exclusion name), ``host`` its host; ``store_of()``
    returns the run's status store and a token naming its connection (None: none yet);
    ``emit(name, metadata)`` records an event; ``mark(kind, detail)`` puts a mark on
    the job view's time axis; ``exclude(reason)`` excludes this node (action
    ``exclude``; awaited when due, see :mod:`._exclude`; what it raises is logged and
    retried at the next sample, a bounded number of times); ``charge(seconds)`` is told, at each
    decision, the time this node's slowdown cost the job since the last one (the
    goodput ledger's ``straggler`` category). Store errors are logged and retried at
    the next interval: the job never waits on the watch.
    """

    def __init__(
        self,
        settings: StragglerSettings,
        job: _Job,
        store_of: StoreOf,
        *,
        node: str,
        host: str,
        emit: Emit,
        mark: Callable[[str, str], None] | None = None,
        exclude: Callable[[str], Awaitable[None]] | None = None,
        charge: Callable[[float], None] | None = None,
        direct_max: int = DIRECT_MAX,
    ) -> None:
        self.settings = settings
        self.direct_max = direct_max
        self.job = job
        self.store_of = store_of
        self.node = node
        self.host = host
        self.emit = emit
        self.mark = mark
        self.exclude = exclude
        self.charge = charge
        self._decided: float | None = None  # when decide() last ran (the charge's start)
        self.tracker = SlowTracker(settings)
        #: the job's latest scores, every rank (empty: not enough samples yet)
        self.scores: list[RankScore] = []
        #: this node's confirmed slowdown now (None: not slow)
        self.verdict: NodeVerdict | None = None
        #: this node's slow stretches, oldest first (wall clock, ``time.time()``)
        self.intervals: list[SlowInterval] = []
        #: this node was excluded for its current workers (new workers: False again)
        self.excluded = False
        self._attempts = 0  # failed exclusions for the current workers
        self._last_exclusion: float | None = None  # when this node was last excluded
        # global ranks whose slowness is their work's: {rank: nodes excluded for it}
        self._workload: dict[int, tuple[str, ...]] = {}
        self._windows: dict[int, RateWindow] = {}
        #: rank: (pid, signal, its value, when): busy seconds at agent time, or work at span
        self._last: dict[int, tuple[int, str, float, float]] = {}
        self._round: int | None = None
        self._pids: set[int | None] = set()
        self._started = 0.0  # when the current workers were first seen
        self._held_since: float | None = None  # a first report held back (see _hold)
        self._errors: set[str] = set()  # kinds of errors logged as warnings already
        self._token: object | None = None
        self._seq = 0  # the leader's summaries published
        self._summary_seen: tuple[int, int] = (-1, 0)  # (its seq, reads of that seq)

    def status(self) -> dict[str, Any]:
        """This node's ranks' scores and its verdict (``/status``'s ``stragglers``)."""
        own = {w.global_rank for w in self.job.workers()}
        verdict = self.verdict
        return {
            "action": self.settings.action,
            "threshold": self.settings.threshold,
            "scores": {
                str(s.global_rank): {
                    "relative": round(s.relative, 3),
                    "individual": round(s.individual, 3),
                }
                for s in self.scores
                if s.global_rank in own
            },
            "slow": None
            if verdict is None
            else {
                "ranks": {str(r): score for r, score in verdict.ranks.items()},
                "whole_node": verdict.whole_node,
                "since": self.intervals[-1].start if self.intervals else None,
            },
            "slow_seconds": round(sum(i.seconds(time.time()) for i in self.intervals), 1),
        }

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Sample, share, score and act every :attr:`StragglerSettings.interval` seconds,
        until cancelled or the job is done. Never raises but cancellation."""
        task_status.started()
        interval = self.settings.interval
        while not self.job.done:
            await anyio.sleep(interval)
            try:
                await self.tick(anyio.current_time())
            except Exception as exc:  # best effort: the job must not fail on its watch
                # once per kind of error: a store that is gone for a while must not spam
                kind = type(exc).__name__
                level = logging.DEBUG if kind in self._errors else logging.WARNING
                self._errors.add(kind)
                log.log(level, "straggler detection skipped a sample: %s: %s", kind, exc)

    async def tick(self, now: float) -> None:
        """One sample of this node's workers, one exchange with the store, one decision."""
        medians = self.sample(now)
        if now - self._started < self.settings.warmup:
            return  # nothing to share yet: no store traffic during the warm-up
        rates = {r: (m, self._windows[r].best or m) for r, m in medians.items()}
        found = self.store_of()
        if found is None:  # no store (static backend): this node's ranks among themselves
            shared, fastest = {r: (self.node, m, b) for r, (m, b) in rates.items()}, None
        else:
            shared, fastest = await self.share(rates, *found)
        await self.decide(shared, now, fastest)

    def sample(self, now: float) -> dict[int, float]:
        """Read every local worker's signal (its timed work, else its busy time); return
        ``{global rank: median rate}``."""
        workers = [w for w in self.job.workers() if w.pid is not None]
        pids = {w.pid for w in workers}
        if self.job.round != self._round or pids != self._pids:  # new workers: start over
            self._round, self._pids, self._started = self.job.round, pids, now
            self._windows.clear()
            self._last.clear()
            self.tracker = SlowTracker(self.settings)
            self.excluded, self._attempts = False, 0  # (the backoff still holds)
            if self.verdict is not None:  # its workers are gone: that slowdown is over
                self._recovered(self.verdict)
                self.verdict = None
                self.intervals = slow_intervals(self.intervals, None, None, time.time())
        if now - self._started < self.settings.warmup:
            return {}
        window = self.settings.window
        progress = self.job.progress()
        medians = {}
        for worker in workers:
            rank, pid = worker.global_rank, worker.pid
            if pid is None:
                continue
            reading = _reading(pid, progress.get(worker.local_rank), now)
            if reading is None:
                continue
            last = self._last.get(rank)
            self._last[rank] = (pid, *reading)
            if last is None or last[:2] != (pid, reading[0]):
                self._windows.pop(rank, None)  # new worker or signal: its rates start over
                continue
            rates = self._windows.setdefault(rank, RateWindow(window))
            if reading[2] > last[3]:  # else no iteration timed since (work timers)
                rates.add(now, (reading[1] - last[2]) / (reading[2] - last[3]))
            median = rates.median()
            if median is not None:
                medians[rank] = median
        return medians

    async def share(
        self, rates: Mapping[int, tuple[float, float]], store: Store, token: object
    ) -> tuple[dict[int, tuple[str, float, float]], float | None]:
        """Publish this node's ``{global rank: (median, best median)}``; return what to
        score: every node's ranks of this round (``{rank: (node, median, best)}``) and
        None, or this node's ranks and the job's fastest rate from the leader's summary
        (see the module docstring). ``token`` names ``store``'s connection (this node
        enters the index once per connection).

        Raises:
            TimeoutError: the store did not answer within the bound.
            Exception: what the store raised (the caller skips the sample).
        """
        bound = max(self.settings.interval, 1.0)
        doc = {"round": self._round, "ranks": {str(r): [m, b] for r, (m, b) in rates.items()}}
        own = {r: (self.node, m, b) for r, (m, b) in rates.items()}
        with anyio.move_on_after(bound):
            await store.set(_node_key(self.node), json.dumps(doc, separators=(",", ":")))
            if token != self._token:
                await store.append(INDEX_KEY, self.node + "\n")
                self._token = token
            leader = any(w.global_rank == 0 for w in self.job.workers())
            if not leader:
                summary = await self._summary(store)
                if summary is not None and summary["nodes"] > self.direct_max:
                    return own, summary["fastest"] or 0.0  # 0: no reference, no scores
            nodes = sorted({n for n in (await store.get(INDEX_KEY)).decode().split() if n})
            raws = await store.multi_get([_node_key(n) for n in nodes])
            shared: dict[int, tuple[str, float, float]] = {}
            publishing = 0
            for node, raw in zip(nodes, raws, strict=True):
                other = json.loads(raw)
                if other.get("round") != self._round:
                    continue  # a node of another round (gone, or not caught up)
                publishing += 1
                for rank, (median, best) in other["ranks"].items():
                    shared[int(rank)] = (node, float(median), float(best))
            if leader:
                self._seq += 1
                summary = {
                    "round": self._round,
                    "seq": self._seq,
                    "nodes": publishing,
                    "fastest": fastest_rate([m for _, m, _ in shared.values()]),
                }
                await store.set(SUMMARY_KEY, json.dumps(summary))
            return shared, None
        # no decision on this node's ranks alone: skip the sample (logged by run())
        raise TimeoutError(f"the rendezvous store did not answer within {bound:g} s")

    async def _summary(self, store: Store) -> dict[str, Any] | None:
        """The leader's summary of this round while it is being refreshed (None: none,
        another round's, or unchanged for ``_STALE_READS`` reads)."""
        if not await store.check([SUMMARY_KEY]):
            return None
        summary: dict[str, Any] = json.loads(await store.get(SUMMARY_KEY))
        if summary.get("round") != self._round:
            return None
        seq, reads = self._summary_seen
        reads = reads + 1 if summary["seq"] == seq else 1
        self._summary_seen = (summary["seq"], reads)
        return summary if reads <= _STALE_READS else None

    async def decide(
        self,
        shared: Mapping[int, tuple[str, float, float]],
        now: float,
        fastest: float | None = None,
    ) -> None:
        """Score the ranks of ``shared`` (against ``fastest``, the job's fastest rate,
        when ``shared`` holds only this node's); report, clear or exclude this node's
        slowdown (see :meth:`_act`). Raises nothing of the exclusion's (logged and
        retried); cancellation propagates."""
        medians = {rank: (node, median) for rank, (node, median, _) in shared.items()}
        best = {rank: b for rank, (_, _, b) in shared.items()}
        self.scores = score_ranks(medians, best, fastest)
        self.tracker.update(self.scores, now)
        mine = [v for v in node_verdicts(self.scores, self.tracker.slow) if v.node == self.node]
        verdict = mine[0] if mine else None
        if verdict is not None and self.verdict is None and self._hold(verdict, now):
            verdict = None
        previous, self.verdict = self.verdict, verdict
        last, self._decided = self._decided, now
        if self.charge is not None and verdict is not None and last is not None and now > last:
            self.charge(straggler_cost(now - last, verdict.score))
        wall = time.time()
        onset = None
        if verdict is not None:
            since = self.tracker.slow_since(verdict.ranks)
            onset = None if since is None else wall - (now - since)
        self.intervals = slow_intervals(self.intervals, verdict, onset, wall)
        if verdict is not None and (previous is None or set(previous.ranks) != set(verdict.ranks)):
            self._report(verdict)
        elif verdict is None and previous is not None:
            self._recovered(previous)
        if verdict is not None and self.settings.action == "exclude":
            await self._act(verdict, now)

    async def _act(self, verdict: NodeVerdict, now: float) -> None:
        """Exclude this node for ``verdict``'s ranks once due (:func:`exclusion_due`),
        less the ranks whose slowness is their work's (:func:`workload_ranks`: those are
        reported once, and never counted again). Reading the job's record or ``exclude``
        failing is logged and counts as a failed attempt, retried at the next decision
        up to ``EXCLUDE_ATTEMPTS`` times for these workers. Never raises but
        cancellation (an attempt cancelled is not counted)."""
        ranks = [r for r in verdict.ranks if r not in self._workload]
        if not self._due(ranks, now):
            return
        try:
            found = workload_ranks(self.node, ranks, await self._read_record())
            if found:
                self._workload.update(found)
                self._report_workload(found)
                ranks = [r for r in ranks if r not in found]
                if not self._due(ranks, now):
                    return
            await self._write_record(ExcludedFor(self.node, tuple(ranks)))
            if self.exclude is not None:
                await self.exclude(self._reason(_part(verdict, ranks)))
        except Exception as exc:
            self._failed(exc)
            return
        self.excluded, self._last_exclusion = True, now

    def _due(self, ranks: Sequence[int], now: float) -> bool:
        return exclusion_due(
            self.settings,
            now,
            self.tracker.slow_since(ranks),
            excluded=self.excluded,
            attempts=self._attempts,
            last=self._last_exclusion,
        )

    def _failed(self, exc: Exception) -> None:
        """Count and log (once) a failed exclusion."""
        self._attempts += 1
        then = (
            "retried at the next sample"
            if self._attempts < EXCLUDE_ATTEMPTS
            else "not retried until this node has new workers"
        )
        log.warning(
            "straggler: excluding node %s failed (attempt %d of %d; %s): %s: %s",
            self.node,
            self._attempts,
            EXCLUDE_ATTEMPTS,
            then,
            type(exc).__name__,
            exc,
        )

    async def _read_record(self) -> list[ExcludedFor]:
        """The job's straggler exclusions so far ([] without a store).

        Raises:
            TimeoutError: the store did not answer within the bound.
            Exception: what the store raised.
        """
        found = self.store_of()
        if found is None:
            return []
        store = found[0]
        with anyio.fail_after(_RECORD_BOUND):
            if not await store.check([RECORD_KEY]):
                return []
            raw = await store.get(RECORD_KEY)
        return parse_record(raw.decode(errors="replace"))

    async def _write_record(self, exclusion: ExcludedFor) -> None:
        """Append ``exclusion`` to the job's record before this node goes, so the node
        that takes its place reads it. Best effort: a store that fails or does not
        answer within the bound is logged, and the exclusion goes on. Never raises but
        cancellation."""
        found = self.store_of()
        if found is None:
            return
        try:
            with anyio.fail_after(_RECORD_BOUND):
                await found[0].append(RECORD_KEY, exclusion.line())
        except Exception as exc:
            log.warning(
                "straggler: could not record this node's exclusion in the store (a node"
                " that takes its place may be excluded for the same ranks): %s: %s",
                type(exc).__name__,
                exc,
            )

    def _hold(self, verdict: NodeVerdict, now: float) -> bool:
        """Whether to hold a first report back while other ranks of this node are slow but
        not confirmed yet (for at most one window): a whole node slows down at once, and
        its ranks are confirmed a sample or two apart; one report names the node."""
        pending = [
            s.global_rank
            for s in self.scores
            if s.node == self.node
            and s.global_rank in self.tracker.since
            and s.global_rank not in verdict.ranks
        ]
        if not pending:
            self._held_since = None
            return False
        if self._held_since is None:
            self._held_since = now
        return now - self._held_since < self.settings.window

    def _reason(self, verdict: NodeVerdict) -> str:
        slow = self.intervals[-1].seconds(time.time()) if self.intervals else 0.0
        return (
            f"straggler: {verdict.describe()}, slow for {slow:.0f} s "
            f"(threshold {self.settings.threshold:g},"
            f" --straggler-timeout {self.settings.timeout:g} s)"
        )

    def _report(self, verdict: NodeVerdict) -> None:
        ranks = ",".join(str(r) for r in verdict.ranks)
        scores = ",".join(f"{s:.2f}" for s in verdict.ranks.values())
        what = "node" if verdict.whole_node else "rank(s)"
        log.warning(
            "straggler: host %s node %s global ranks %s scores %s (%s slow: relative score below"
            " %g for %g s; action %s)",
            self.host,
            self.node,
            ranks,
            scores,
            what,
            self.settings.threshold,
            self.settings.min_duration,
            self.settings.action,
        )
        self.emit(
            "aelastic.straggler",
            {
                "node": self.node,
                "host": self.host,
                "ranks": ranks,
                "scores": scores,
                "score": verdict.score,
                "whole_node": verdict.whole_node,
                "action": self.settings.action,
            },
        )
        if self.mark is not None:
            self.mark("straggler", f"{self.node}: {verdict.describe()}")

    def _report_workload(self, found: Mapping[int, tuple[str, ...]]) -> None:
        ranks = ",".join(str(r) for r in found)
        nodes = ",".join(dict.fromkeys(n for excluded in found.values() for n in excluded))
        log.warning(
            "straggler: host %s node %s global ranks %s slow again after node(s) %s were"
            " excluded for them: the slowdown follows the rank (its work), not the node;"
            " no node is excluded for these ranks",
            self.host,
            self.node,
            ranks,
            nodes,
        )
        self.emit(
            "aelastic.straggler.workload",
            {
                "node": self.node,
                "host": self.host,
                "ranks": ranks,
                "excluded_nodes": nodes,
                "action": self.settings.action,
            },
        )
        if self.mark is not None:
            self.mark(
                "straggler_workload",
                f"{self.node}: global rank(s) {ranks} slow again after {nodes} excluded:"
                " the workload, not the node",
            )

    def _recovered(self, previous: NodeVerdict) -> None:
        ranks = ",".join(str(r) for r in previous.ranks)
        log.warning(
            "straggler: host %s node %s global ranks %s no longer slow", self.host, self.node, ranks
        )
        self.emit(
            "aelastic.straggler.recovered", {"node": self.node, "host": self.host, "ranks": ranks}
        )
        if self.mark is not None:
            self.mark("straggler_end", f"{self.node}: ranks {ranks} no longer slow")


def _part(verdict: NodeVerdict, ranks: Sequence[int]) -> NodeVerdict:
    """``verdict`` restricted to ``ranks`` (the ones an exclusion is for)."""
    whole = verdict.whole_node and len(ranks) == len(verdict.ranks)
    return NodeVerdict(verdict.node, {r: verdict.ranks[r] for r in ranks}, whole)


def _reading(
    pid: int, progress: ProgressSnapshot | None, now: float
) -> tuple[str, float, float] | None:
    """A worker's signal now: ``("work", work s, span s)`` once its work timer reported
    (``aelastic.stragglers.time_work``, GPU jobs), else ``("busy", busy s, now)`` (its
    CPU time from ``/proc``); None when neither can be read."""
    if progress is not None and progress.work_span_ns > 0:
        return "work", progress.work_ns / 1e9, progress.work_span_ns / 1e9
    busy = busy_seconds(pid)
    return None if busy is None else ("busy", busy, now)

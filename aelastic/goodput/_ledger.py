"""The ledger: the timestamped facts of a run in, seconds per category out (plain functions).

Times are ``time.monotonic_ns()`` of one host. An attempt is split in three spans:

* ``[begin, first step)``: ``startup`` (the first attempt) or ``restart.<cause>`` (the
  cause that ended the attempt before), less the rendezvous waits in it (``waiting``)
  and the time its ranks blocked loading a checkpoint (``checkpoint_load``);
* ``[first step, last step]``: stepping. Re-running steps an earlier attempt already
  reported is ``rollback`` (at the attempt's mean step time); the time ranks blocked
  saving checkpoints is ``checkpoint_save``; the rest is ``productive``, less the share
  of the ranks that reported no step (``unreported``, :func:`silent_share`);
* ``[last step, end)``: after a failure, the unfinished work up to the fault is
  ``rollback`` and the fault to its notice ``detection`` (a fault on another node, a
  membership change or node loss, counts from the last step); after a clean end,
  ``other``.

The slowest rank sets each figure: an attempt steps once every rank that reports steps
has (the latest first step) and has reached the lowest rank's last step. An attempt
whose first step is where a step counter begins (:func:`new_count`) starts a new count
instead of re-running the steps before. An attempt without steps is all ``startup`` /
``restart`` while other attempts step; in a run with no steps at all the workers'
running time counts as ``productive`` (a ledger by phase) and the step counts are None.

:func:`combine` makes the job's ledger of the nodes' (:func:`job_charge`,
:func:`job_steps` for its straggler cost and step counts).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from .._dataclass import dataclass
from ._categories import BADPUT, CATEGORIES, CHARGED, PRODUCTIVE, UNREPORTED, restart_category

__all__ = (
    "COUNTER_START",
    "Attempt",
    "Ledger",
    "RankSteps",
    "combine",
    "compute",
    "job_charge",
    "job_steps",
    "new_count",
    "silent_share",
)

_NS = 1e-9
#: Where a worker's own step counter begins: ``progress.step()`` and
#: ``report_optimizer_steps()`` count from 0 in each process. (Lightning's ``global_step``
#: is restored from checkpoints: 1 again means the run started over, a rollback.)
COUNTER_START = 0


@dataclass(frozen=True)
class RankSteps:
    """What one rank reported in one attempt (``aelastic.progress``); ns times, 0: never."""

    first_step: int = -1
    first_ns: int = 0
    last_step: int = -1
    last_ns: int = 0
    #: Total time blocked in ``aelastic.checkpoint.save`` / ``load``.
    save_ns: int = 0
    load_ns: int = 0

    @property
    def stepped(self) -> bool:
        return self.first_ns > 0 and self.last_ns >= self.first_ns


@dataclass(frozen=True)
class Attempt:
    """One start of the node's workers.

    ``begin_ns``: when the node began towards it (the launch, or the previous attempt's
    end); ``started_ns``: the workers started; ``end_ns``: they finished or a failure
    was noticed (None: running); ``cause``: why it ended (None: finished or running;
    else a restart cause); ``fault_ns``: when that fault happened (a hung rank's last
    sign of progress; None: when noticed).
    """

    begin_ns: int
    started_ns: int
    end_ns: int | None = None
    cause: str | None = None
    fault_ns: int | None = None
    ranks: tuple[RankSteps, ...] = ()


@dataclass(frozen=True)
class Ledger:
    """Seconds per category (every name of ``CATEGORIES``), adding up to ``wall_s``."""

    wall_s: float
    seconds: Mapping[str, float]
    #: Steps reported and kept, and re-run after a rollback; None: no step was reported.
    steps_kept: int | None
    steps_lost: int | None
    #: Restarts (attempts that ended on a fault) per cause.
    restarts: Mapping[str, int]

    @property
    def productive_s(self) -> float:
        return self.seconds[PRODUCTIVE]

    @property
    def ratio(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0

    def record(self) -> dict[str, object]:
        """The JSON record: ``wall_s``, ``productive_s``, ``ratio``, ``badput_s``
        (``{category: seconds}``), ``steps_kept``, ``steps_lost``."""
        return {
            "wall_s": round(self.wall_s, 3),
            "productive_s": round(self.productive_s, 3),
            "ratio": round(self.ratio, 4),
            "badput_s": {c: round(self.seconds[c], 3) for c in BADPUT},
            "steps_kept": self.steps_kept,
            "steps_lost": self.steps_lost,
        }

    @classmethod
    def from_record(cls, record: Mapping[str, object]) -> Ledger:
        """The inverse of :meth:`record` (restart counts are not in it: empty)."""
        badput = record.get("badput_s")
        seconds = {c: 0.0 for c in CATEGORIES}
        if isinstance(badput, Mapping):
            for c, s in badput.items():
                if c in seconds and isinstance(s, (int, float)):
                    seconds[c] = float(s)
        seconds[PRODUCTIVE] = _float(record.get("productive_s"))
        kept, lost = record.get("steps_kept"), record.get("steps_lost")
        return cls(
            wall_s=_float(record.get("wall_s")),
            seconds=seconds,
            steps_kept=kept if isinstance(kept, int) else None,
            steps_lost=lost if isinstance(lost, int) else None,
            restarts={},
        )

    def summary(self, scope: str = "") -> str:
        """``goodput 96.1% of 312.0 s: restart 2.1 s (2), rollback 3.1 s (31 steps), ...``
        (the badput categories over 0.05 s, largest first; restarts summed). Without
        steps no ratio: ``goodput unknown of 312.0 s (steps unknown: the workers ran
        300.0 s): ...``. ``scope`` (``job, 2 nodes``) is said after the head, in
        parentheses."""
        parts: list[tuple[float, str]] = []
        restart = sum(s for c, s in self.seconds.items() if c.startswith("restart."))
        if restart >= 0.05:
            count = sum(self.restarts.values())
            parts.append((restart, f"restart {restart:.1f} s" + (f" ({count})" if count else "")))
        for c in BADPUT:
            s = self.seconds[c]
            if c.startswith("restart.") or s < 0.05:
                continue
            extra = f" ({self.steps_lost} steps)" if c == "rollback" and self.steps_lost else ""
            parts.append((s, f"{c} {s:.1f} s{extra}"))
        parts.sort(key=lambda p: -p[0])
        if self.steps_kept is None:  # a ledger by phase: running time is no goodput
            head = (
                f"goodput unknown of {self.wall_s:.1f} s"
                f" (steps unknown: the workers ran {self.productive_s:.1f} s)"
            )
        else:
            head = f"goodput {100 * self.ratio:.1f}% of {self.wall_s:.1f} s"
        if scope:
            head += f" ({scope})"
        return head + (": " + ", ".join(p[1] for p in parts) if parts else "")


def _float(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def _overlap(intervals: Iterable[tuple[int, int]], lo: int, hi: int) -> int:
    return sum(max(0, min(b, hi) - max(a, lo)) for a, b in intervals)


def _slowest(ranks: Sequence[RankSteps]) -> RankSteps | None:
    """The attempt's steps as the slowest rank sets them; None: no rank stepped."""
    stepped = [r for r in ranks if r.stepped]
    if not stepped:
        return None
    last = min(stepped, key=lambda r: (r.last_step, -r.last_ns))
    return RankSteps(
        first_step=min(r.first_step for r in stepped),
        first_ns=max(r.first_ns for r in stepped),
        last_step=last.last_step,
        last_ns=max(last.last_ns, max(r.first_ns for r in stepped)),
        save_ns=max(r.save_ns for r in ranks),
        load_ns=max(r.load_ns for r in ranks),
    )


def new_count(first_step: int, best: int | None) -> bool:
    """Whether an attempt whose first step is ``first_step`` began a new step count, after
    attempts of the current count that reached ``best`` (None: no step yet).

    A counter that starts again where a worker's own counter begins
    (:data:`COUNTER_START`: ``step()`` counts from 0 in each process) is a new count:
    its steps add to those before, none is a rollback. A resumed run reports the step
    it resumed from (``step(n)``, ``start=n``), above that, and what it runs again is
    rollback."""
    return best is not None and first_step <= min(COUNTER_START, best)


def silent_share(ns: int, ranks: Sequence[RankSteps]) -> int:
    """The part of ``ns`` of an attempt's stepping time that belongs to its silent ranks
    (those that reported no step while another did): each rank holds an equal share,
    and a silent rank's is ``unreported``, not ``productive``."""
    if not ranks:
        return 0
    silent = sum(1 for r in ranks if not r.stepped)
    return ns * silent // len(ranks)


def compute(
    launch_ns: int,
    attempts: Sequence[Attempt],
    now_ns: int,
    waits: Iterable[tuple[int, int]] = (),
    charges: Mapping[str, float] | None = None,
) -> Ledger:
    """The ledger of a node from ``launch_ns`` to ``now_ns``.

    ``waits``: ``(start_ns, end_ns)`` of the rendezvous and exit-barrier waits;
    ``charges``: seconds another component carved out of the stepping time (e.g.
    ``{"straggler": 1.5}``), moved from ``productive`` to that badput category.
    """
    waits = [(a, min(b, now_ns)) for a, b in waits if a < now_ns]
    ns = dict.fromkeys(CATEGORIES, 0)
    restarts: dict[str, int] = {}
    slowest = [_slowest(a.ranks) for a in attempts]
    known = any(s is not None for s in slowest)
    kept = lost = 0
    best: int | None = None  # the highest step of the current count
    prev_cause: str | None = None
    cursor = launch_ns
    for index, (attempt, steps) in enumerate(zip(attempts, slowest, strict=True)):
        end = now_ns if attempt.end_ns is None else min(attempt.end_ns, now_ns)
        begin = max(cursor, min(attempt.begin_ns, end))
        ns["other"] += max(0, begin - cursor)  # a gap the agent did not account for
        ns["waiting"] += _overlap(waits, cursor, begin)
        ns["other"] -= _overlap(waits, cursor, begin)
        opening = "startup" if index == 0 else restart_category(prev_cause or "crash")
        if steps is None and known:
            ready = work_end = end
        elif steps is None:  # a ledger by phase: the workers' running time is productive
            ready = min(max(attempt.started_ns, begin), end)
            work_end = _fault(attempt, ready, end)
            ns[PRODUCTIVE] += work_end - ready
        else:
            ready = min(max(steps.first_ns, begin), end)
            last = min(max(steps.last_ns, ready), end)
            span = last - ready
            redo = 0
            if new_count(steps.first_step, best):
                best = None  # the steps before stay kept
            if best is not None and steps.first_step <= best:
                repeated = min(steps.last_step, best) - steps.first_step
                total = steps.last_step - steps.first_step
                redo = span * repeated // total if total > 0 else 0
                lost += repeated + 1
                kept -= repeated + 1
            kept += steps.last_step - steps.first_step + 1
            best = steps.last_step if best is None else max(best, steps.last_step)
            save = min(steps.save_ns, span - redo)
            ns["rollback"] += redo
            ns["checkpoint_save"] += save
            work = span - redo - save
            work_end = last
            if attempt.cause is None and attempt.end_ns is None:
                work += end - last  # a step under way
                work_end = end
            silent = silent_share(work, attempt.ranks)
            ns[UNREPORTED] += silent
            ns[PRODUCTIVE] += work - silent
        # the opening span, less its waits and checkpoint loads
        waited = _overlap(waits, begin, ready)
        load = 0 if steps is None else min(steps.load_ns, ready - begin - waited)
        ns["waiting"] += waited
        ns["checkpoint_load"] += load
        ns[opening] += ready - begin - waited - load
        # the closing span
        if attempt.cause is not None:
            fault = _fault(attempt, work_end, end)
            ns["rollback" if steps is not None else PRODUCTIVE] += fault - work_end
            ns["detection"] += end - fault
            restarts[attempt.cause] = restarts.get(attempt.cause, 0) + 1
        elif work_end < end:
            ns["other"] += end - work_end
        prev_cause = attempt.cause
        cursor = end
    # after the last attempt: the exit barrier, then the rest
    if cursor < now_ns:
        waited = _overlap(waits, cursor, now_ns)
        ns["waiting"] += waited
        ns["other"] += now_ns - cursor - waited
    seconds = {c: v * _NS for c, v in ns.items()}
    for category, value in (charges or {}).items():
        moved = min(max(0.0, value), seconds[PRODUCTIVE])
        seconds[category] = seconds.get(category, 0.0) + moved
        seconds[PRODUCTIVE] -= moved
    return Ledger(
        wall_s=max(0, now_ns - launch_ns) * _NS,
        seconds=seconds,
        steps_kept=kept if known else None,
        steps_lost=lost if known else None,
        restarts=restarts,
    )


#: Causes whose fault happened on another node: unless told, the workers' last step is
#: when they stopped (their peers' fault), so the wait for the notice is ``detection``.
_ELSEWHERE = ("membership", "node_loss")


def _fault(attempt: Attempt, lo: int, hi: int) -> int:
    """When the attempt's fault happened, within ``[lo, hi]``: when unknown, at its notice
    (a fault of this node's workers) or at ``lo`` (the last step: another node's)."""
    if attempt.cause is None:
        return hi
    fault = attempt.fault_ns
    if fault is None:
        fault = lo if attempt.cause in _ELSEWHERE else hi
    return min(max(fault, lo), hi)


def job_charge(node_seconds: Sequence[float]) -> float:
    """The job's cost of a charged category (``straggler``) from each node's: the largest.
    A synchronous job runs at the pace of its slowest node, so a node that cost itself
    50 s cost every node, and the job, 50 s (slowdowns of two nodes at the same time
    cost the larger; at different times, this is the larger of the two, a lower bound)."""
    return max((max(0.0, s) for s in node_seconds), default=0.0)


def job_steps(
    counts: Sequence[tuple[int | None, int | None]],
) -> tuple[int | None, int | None]:
    """The job's ``(steps_kept, steps_lost)`` from each node's: those of the node that saw
    the most steps kept (then lost), the one in the job the longest. A node that left
    early, or joined late, saw fewer of the job's steps. ``(None, None)``: no node's
    steps are known."""
    known = [(kept, lost or 0) for kept, lost in counts if kept is not None]
    if not known:
        return None, None
    return max(known)


def combine(records: Sequence[Mapping[str, object]]) -> Ledger | None:
    """The job's ledger from every node's :meth:`Ledger.record` (None: no record).

    Node-seconds are added up and scaled to the longest wall time: each node counts in
    proportion to the time it was part of the job, so a node that left keeps its
    share. Where some nodes reported steps, a node that reported none has no
    ``productive`` time: its running time is ``unreported``. The charged categories
    (``straggler``) are the job's pace (:func:`job_charge`), taken from ``productive``;
    the step counts are the job's (:func:`job_steps`).
    """
    ledgers = [Ledger.from_record(r) for r in records]
    ledgers = [lg for lg in ledgers if lg.wall_s > 0]
    if not ledgers:
        return None
    stepped = any(lg.steps_kept is not None for lg in ledgers)
    node_seconds = [dict(lg.seconds) for lg in ledgers]
    for lg, node in zip(ledgers, node_seconds, strict=True):
        if stepped and lg.steps_kept is None:  # a silent node among stepping ones
            node[UNREPORTED] += node[PRODUCTIVE]
            node[PRODUCTIVE] = 0.0
    wall = max(lg.wall_s for lg in ledgers)
    total = sum(lg.wall_s for lg in ledgers)
    seconds = {c: wall * sum(n[c] for n in node_seconds) / total for c in CATEGORIES}
    for category in CHARGED:
        cost = job_charge([n[category] for n in node_seconds])
        moved = min(max(0.0, cost - seconds[category]), seconds[PRODUCTIVE])
        seconds[category] += moved
        seconds[PRODUCTIVE] -= moved
    kept, lost = job_steps([(lg.steps_kept, lg.steps_lost) for lg in ledgers])
    return Ledger(wall_s=wall, seconds=seconds, steps_kept=kept, steps_lost=lost, restarts={})

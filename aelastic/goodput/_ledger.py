"""The ledger: the timestamped facts of a run in, seconds per category out (plain functions).

Times are ``time.monotonic_ns()`` of one host. An attempt is split in three spans:

* ``[begin, first step)``: ``startup`` (the first attempt) or ``restart.<cause>`` (the
  cause that ended the attempt before), less the rendezvous waits in it (``waiting``)
  and the time its ranks blocked loading a checkpoint (``checkpoint_load``);
* ``[first step, last step]``: stepping. Re-running steps an earlier attempt already
  reported is ``rollback`` (at the attempt's mean step time); the time ranks blocked
  saving checkpoints is ``checkpoint_save``; the rest is ``productive``;
* ``[last step, end)``: after a failure, the unfinished work up to the fault is
  ``rollback`` and the fault to its notice ``detection`` (a fault on another node, a
  membership change or node loss, counts from the last step); after a clean end,
  ``other``.

The slowest rank sets each figure: an attempt steps once every rank has (the latest
first step) and has reached the lowest rank's last step. An attempt without steps is
all ``startup`` / ``restart`` while other attempts step; in a run with no steps at
all the workers' running time counts as ``productive`` (a ledger by phase) and the
step counts are None.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from .._dataclass import dataclass
from ._categories import BADPUT, CATEGORIES, PRODUCTIVE, restart_category

__all__ = ("Attempt", "Ledger", "RankSteps", "combine", "compute")

_NS = 1e-9


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

    def summary(self) -> str:
        """``goodput 96.1% of 312.0 s: restart 2.1 s (2), rollback 3.1 s (31 steps), ...``
        (the badput categories over 0.05 s, largest first; restarts summed)."""
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
        head = f"goodput {100 * self.ratio:.1f}% of {self.wall_s:.1f} s"
        if self.steps_kept is None:
            head += " (steps unknown: productive is the workers' running time)"
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
    prev_max: int | None = None
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
            if prev_max is not None and steps.first_step <= prev_max:
                repeated = min(steps.last_step, prev_max) - steps.first_step
                total = steps.last_step - steps.first_step
                redo = span * repeated // total if total > 0 else 0
                lost += repeated + 1
                kept -= repeated + 1
            kept += steps.last_step - steps.first_step + 1
            prev_max = steps.last_step if prev_max is None else max(prev_max, steps.last_step)
            save = min(steps.save_ns, span - redo)
            ns["rollback"] += redo
            ns["checkpoint_save"] += save
            ns[PRODUCTIVE] += span - redo - save
            work_end = last
            if attempt.cause is None and attempt.end_ns is None:
                ns[PRODUCTIVE] += end - last  # a step under way
                work_end = end
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


def combine(records: Sequence[Mapping[str, object]]) -> Ledger | None:
    """The job's ledger from every node's :meth:`Ledger.record` (None: no record).

    Node-seconds are added up and scaled to the longest wall time: each node counts in
    proportion to the time it was part of the job, so a node that left keeps its
    share. Steps: the fewest kept and the most lost (the slowest node).
    """
    ledgers = [Ledger.from_record(r) for r in records]
    ledgers = [lg for lg in ledgers if lg.wall_s > 0]
    if not ledgers:
        return None
    wall = max(lg.wall_s for lg in ledgers)
    total = sum(lg.wall_s for lg in ledgers)
    seconds = {c: wall * sum(lg.seconds[c] for lg in ledgers) / total for c in CATEGORIES}
    kept = [lg.steps_kept for lg in ledgers if lg.steps_kept is not None]
    lost = [lg.steps_lost for lg in ledgers if lg.steps_lost is not None]
    return Ledger(
        wall_s=wall,
        seconds=seconds,
        steps_kept=min(kept) if kept else None,
        steps_lost=max(lost) if lost else None,
        restarts={},
    )

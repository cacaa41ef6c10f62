"""``GoodputRecorder``: the facts of one node's run as the agent sees them, and its ledger.

The agent calls :meth:`~GoodputRecorder.launched` once, :meth:`~GoodputRecorder.wait`
around each rendezvous and the exit barrier, :meth:`~GoodputRecorder.attempt_started`
when the workers run and :meth:`~GoodputRecorder.attempt_ended` when they finished or a
failure was noticed; :meth:`~GoodputRecorder.ledger` computes the ledger at any time
(a few microseconds per attempt). Plain state, no I/O, no locks: the event loop's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from ._categories import BADPUT, RESTART_CAUSES
from ._ledger import Attempt, Ledger, RankSteps, compute

__all__ = ("GoodputRecorder",)


class GoodputRecorder:
    """One node's run, from the launch. ``clock``: ``time.monotonic_ns`` (tests pass theirs).

    ``steps`` (optional) reads the running attempt's ranks (``RankSteps`` each), so a
    live :meth:`ledger` counts the steps reported so far.
    """

    def __init__(self, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.clock = clock
        self.launch_ns: int | None = None
        self.attempts: list[Attempt] = []
        self.waits: list[tuple[int, int]] = []
        self.charges: dict[str, float] = {}
        self.steps: Callable[[], Sequence[RankSteps]] | None = None
        self._begin: int | None = None
        self._wait_from: int | None = None
        self._end: int | None = None
        #: the running attempt's steps when its progress files closed (:meth:`round_closing`)
        self._closing: tuple[RankSteps, ...] = ()

    def launched(self, at_ns: int | None = None) -> None:
        """The run starts now (or at ``at_ns``); later calls are ignored."""
        if self.launch_ns is None:
            self.launch_ns = self.clock() if at_ns is None else at_ns
            self._begin = self.launch_ns

    @contextlib.contextmanager
    def wait(self) -> Iterator[None]:
        """Time spent waiting for other nodes (a rendezvous, the exit barrier)."""
        start = self._wait_from = self.clock()
        try:
            yield
        finally:
            self._wait_from = None
            self.waits.append((start, self.clock()))

    def attempt_started(self) -> None:
        """The workers of a new attempt run now."""
        self.launched()
        assert self._begin is not None
        self.attempts.append(Attempt(begin_ns=self._begin, started_ns=self.clock()))
        self._closing = ()

    def round_closing(self, ranks: Sequence[RankSteps]) -> None:
        """The running attempt's progress is about to go (its files close): ``ranks`` are
        its steps from now on, for an :meth:`attempt_ended` without them and for a
        :meth:`ledger` of a run stopped before the attempt ended (a signal)."""
        if self.attempts and self.attempts[-1].end_ns is None:
            self._closing = tuple(ranks)

    def _steps_now(self) -> tuple[RankSteps, ...]:
        return self._or_closing(self.steps() if self.steps is not None else ())

    def _or_closing(self, ranks: Sequence[RankSteps]) -> tuple[RankSteps, ...]:
        """``ranks``, unless they say nothing (the progress files are gone) and the steps
        were kept when they closed."""
        if self._closing and not any(r != RankSteps() for r in ranks):
            return self._closing
        return tuple(ranks)

    def attempt_ended(
        self,
        ranks: Sequence[RankSteps],
        cause: str | None = None,
        fault_ns: int | None = None,
        noticed_ns: int | None = None,
    ) -> None:
        """The running attempt ended: finished (``cause`` None) or a fault noticed at
        ``noticed_ns`` (now by default) that happened at ``fault_ns``. ``cause`` is one
        of ``RESTART_CAUSES``. A second call for the same attempt is ignored."""
        if not self.attempts or self.attempts[-1].end_ns is not None:
            return
        if cause is not None and cause not in RESTART_CAUSES:
            raise ValueError(f"cause {cause!r}: use one of {', '.join(RESTART_CAUSES)}")
        end = self.clock() if noticed_ns is None else noticed_ns
        last = self.attempts[-1]
        kept = self._or_closing(ranks)
        self.attempts[-1] = Attempt(last.begin_ns, last.started_ns, end, cause, fault_ns, kept)
        self._begin = end

    def reclassify(self, cause: str) -> None:
        """The last attempt, ended by a membership change, ended for ``cause`` after all
        (a node lost, once the next round is smaller). Otherwise nothing changes."""
        if self.attempts and self.attempts[-1].cause == "membership" and cause in RESTART_CAUSES:
            last = self.attempts[-1]
            self.attempts[-1] = Attempt(
                last.begin_ns, last.started_ns, last.end_ns, cause, last.fault_ns, last.ranks
            )

    def charge(self, category: str, seconds: float) -> None:
        """Move ``seconds`` of stepping time from ``productive`` to ``category`` (one of
        ``BADPUT``, e.g. a straggler category); adds up over calls."""
        if category not in BADPUT:
            raise ValueError(f"category {category!r}: add it to aelastic.goodput's BADPUT first")
        self.charges[category] = self.charges.get(category, 0.0) + seconds

    def finished(self) -> None:
        """The run is over: the ledger stops growing."""
        if self._end is None:
            self._end = self.clock()

    def ledger(self) -> Ledger | None:
        """The ledger so far (None before the launch). Live, the running attempt counts
        the steps reported so far, a wait under way is ``waiting`` and the time since a
        failure ``restart.<cause>``."""
        if self.launch_ns is None:
            return None
        now = self._end if self._end is not None else self.clock()
        attempts = list(self.attempts)
        last = attempts[-1] if attempts else None
        if last is not None and last.end_ns is None:
            attempts[-1] = Attempt(last.begin_ns, last.started_ns, ranks=self._steps_now())
        elif last is not None and last.cause is not None and self._end is None:
            attempts.append(Attempt(begin_ns=self._begin or now, started_ns=now))  # restarting
        waits = self.waits
        if self._wait_from is not None and self._end is None:
            waits = [*waits, (self._wait_from, now)]
        return compute(self.launch_ns, attempts, now, waits, self.charges)

    def restarts(self) -> Mapping[str, int]:
        """Attempts that ended on a fault, per cause."""
        out: dict[str, int] = {}
        for a in self.attempts:
            if a.cause is not None:
                out[a.cause] = out.get(a.cause, 0) + 1
        return out

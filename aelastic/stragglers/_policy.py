"""Plain decisions of straggler detection: scores, confirmation, node verdicts.

No I/O, no awaiting: the async shell (:mod:`._watch`) samples the workers and acts on
these. Times are seconds on one monotonic clock (the deciding agent's); rates are
"busy seconds per second" of one worker (see :mod:`._signal`). In a synchronous job
every rank takes the same number of steps in the same wall time, so a rank's busy
rate is proportional to its own work per step: a rank that does more work has a
higher rate, while the ranks waiting for it sleep in the collective and have lower ones.

* relative score of a rank = the least median rate of the job / this rank's median
  (1.0: as fast as the fastest; 0.71: needs 1.4x the fastest rank's time per step);
* individual score = this rank's best (lowest) past median / its current median;
* a rank is *slow* once its relative score stayed below the threshold for
  ``min_duration`` seconds (one slow step, a checkpoint save, a few seconds of
  contention do not last that long; a stall that hits every rank lowers every rate
  alike and moves no relative score; a job that is idle everywhere is not scored);
* a node is named (``whole_node``) when every scored rank of it is slow.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Collection, Iterable, Mapping, Sequence

from .._dataclass import dataclass
from ._settings import StragglerSettings

__all__ = (
    "NodeVerdict",
    "RankScore",
    "RateWindow",
    "SlowInterval",
    "SlowTracker",
    "StragglerSettings",  # its home is ._settings; kept importable from here
    "node_verdicts",
    "score_ranks",
    "slow_intervals",
    "straggler_cost",
)

#: Busy rate (CPU cores) below which a rank is idle: an idle job is not scored.
IDLE_RATE = 0.05
#: A slow rank recovers once its score is this much above the threshold (no flapping).
HYSTERESIS = 0.05
#: Fewest samples a window needs before its median counts.
MIN_SAMPLES = 3


class RateWindow:
    """One rank's busy rates over the last ``window`` seconds, and its best median."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.samples: deque[tuple[float, float]] = deque()
        #: the lowest median of a full window so far (None: none yet)
        self.best: float | None = None

    def add(self, now: float, rate: float) -> None:
        self.samples.append((now, rate))
        while self.samples and self.samples[0][0] <= now - self.window:
            self.samples.popleft()

    def median(self) -> float | None:
        """The median rate of the window; None with fewer than ``MIN_SAMPLES`` samples."""
        if len(self.samples) < MIN_SAMPLES:
            return None
        median = statistics.median(rate for _, rate in self.samples)
        if median >= IDLE_RATE and (self.best is None or median < self.best):
            self.best = median
        return median


@dataclass(frozen=True)
class RankScore:
    """One rank's scores: ``relative`` (fastest median / this median) and ``individual``
    (best past median / current), both in (0, 1]; ``rate`` is its median busy rate."""

    global_rank: int
    node: str
    rate: float
    relative: float
    individual: float


def fastest_rate(rates: Collection[float]) -> float | None:
    """The job's reference for relative scores: the fastest rank's median rate; None with
    fewer than two ranks (a rank alone is not slow relative to anything)."""
    return min(rates) if len(rates) >= 2 else None


def score_ranks(
    medians: Mapping[int, tuple[str, float]],
    best: Mapping[int, float],
    fastest: float | None = None,
) -> list[RankScore]:
    """Score the ranks of ``{global rank: (node, median rate)}``, each against the job's
    fastest rank and its own best past median; [] when fewer than two ranks are known or
    the fastest one is idle (a job that waits everywhere, e.g. on its data, says nothing
    about who is slow). ``fastest``: the job's fastest rate when ``medians`` holds only
    some of its ranks (from a summary: see ``_watch``); None: computed from ``medians``."""
    if fastest is None:
        fastest = fastest_rate([rate for _, rate in medians.values()])
    if fastest is None or fastest < IDLE_RATE:
        return []
    scores = []
    for rank in sorted(medians):
        node, rate = medians[rank]
        own = best.get(rank, rate)
        scores.append(RankScore(rank, node, rate, min(1.0, fastest / rate), min(1.0, own / rate)))
    return scores


@dataclass(frozen=True)
class SlowInterval:
    """A stretch of time during which ranks of ``node`` were slow (``end`` None: still).

    ``start`` is when their scores first fell below the threshold (the slowdown's onset
    as seen, before it was confirmed); times are the caller's clock."""

    node: str
    ranks: tuple[int, ...]
    start: float
    end: float | None
    score: float

    def seconds(self, now: float) -> float:
        return (now if self.end is None else self.end) - self.start


class SlowTracker:
    """Which ranks are slow, confirmed over ``settings.min_duration``.

    :meth:`update` takes each round of scores; :attr:`slow` is ``{rank: score}`` of the
    confirmed ones; :attr:`since` when each rank's score first fell below the threshold.
    """

    def __init__(self, settings: StragglerSettings) -> None:
        self.settings = settings
        self.since: dict[int, float] = {}
        self.slow: dict[int, RankScore] = {}

    def update(self, scores: Iterable[RankScore], now: float) -> None:
        s = self.settings
        seen = set()
        for score in scores:
            rank = score.global_rank
            seen.add(rank)
            if score.relative < s.threshold:
                start = self.since.setdefault(rank, now)
                if now - start >= s.min_duration:
                    self.slow[rank] = score
            elif rank not in self.slow or score.relative >= s.threshold + HYSTERESIS:
                self.since.pop(rank, None)
                self.slow.pop(rank, None)
            else:  # slow, inside the hysteresis band: still slow, with its new score
                self.slow[rank] = score
        for rank in set(self.since) - seen:  # gone (a new round) or not scored now
            self.since.pop(rank, None)
            self.slow.pop(rank, None)

    def slow_since(self, ranks: Iterable[int]) -> float | None:
        """When the earliest of ``ranks`` started being slow (None: none is)."""
        return min((self.since[r] for r in ranks if r in self.since), default=None)


@dataclass(frozen=True)
class NodeVerdict:
    """The slow ranks of one node: ``{global rank: relative score}``; ``whole_node`` when
    every scored rank of the node is slow (the node is named, not the ranks)."""

    node: str
    ranks: Mapping[int, float]
    whole_node: bool

    @property
    def score(self) -> float:
        """The node's worst (lowest) score."""
        return min(self.ranks.values())

    def describe(self) -> str:
        ranks = ", ".join(f"{rank} (score {score:.2f})" for rank, score in self.ranks.items())
        what = "every rank of the node is slow" if self.whole_node else "slow rank(s)"
        return f"{what}: global rank {ranks}"


def node_verdicts(scores: Sequence[RankScore], slow: Mapping[int, RankScore]) -> list[NodeVerdict]:
    """Group the confirmed slow ranks by node, worst node first."""
    by_node: dict[str, list[RankScore]] = {}
    for score in scores:
        by_node.setdefault(score.node, []).append(score)
    verdicts = []
    for node, ranks in by_node.items():
        flagged = {
            r.global_rank: round(slow[r.global_rank].relative, 3)
            for r in ranks
            if r.global_rank in slow
        }
        if flagged:
            verdicts.append(NodeVerdict(node, flagged, len(flagged) == len(ranks)))
    return sorted(verdicts, key=lambda v: v.score)


def slow_intervals(
    intervals: Sequence[SlowInterval], verdict: NodeVerdict | None, since: float | None, now: float
) -> list[SlowInterval]:
    """``intervals`` of one node followed by its current verdict: the open interval is
    extended (its ranks and score updated), opened (``since``: the slowdown's onset), or
    closed at ``now`` when the node is no longer slow. A plain record for accounting
    ("time spent slow" in a goodput ledger)."""
    out = list(intervals)
    last = out[-1] if out and out[-1].end is None else None
    if verdict is None:
        if last is not None:
            out[-1] = SlowInterval(last.node, last.ranks, last.start, now, last.score)
        return out
    ranks = tuple(sorted(verdict.ranks))
    if last is None:
        out.append(
            SlowInterval(verdict.node, ranks, now if since is None else since, None, verdict.score)
        )
    else:
        out[-1] = SlowInterval(last.node, ranks, last.start, None, min(last.score, verdict.score))
    return out


def straggler_cost(seconds: float, score: float) -> float:
    """The time a slow rank cost a synchronous job over ``seconds``: the job moved at
    the rank's relative speed ``score`` (0-1], so ``(1 - score)`` of that time is lost
    (the goodput ledger's ``straggler`` category). Negative inputs count as none."""
    return max(0.0, seconds) * min(1.0, max(0.0, 1.0 - score))

"""The ledger on ``/metrics``: no counter goes down when a crash reclassifies time.

A crash turns the step under way from ``productive`` into ``rollback`` (8.0 s of
productive time becomes 5.0 s): the ledger's series are gauges (no ``_total``), and
every series typed ``counter`` on the page only ever goes up.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

from aelastic.agent import WorkerState
from aelastic.goodput._categories import BADPUT
from aelastic.goodput._ledger import RankSteps
from aelastic.goodput._recorder import GoodputRecorder
from aelastic.health._report import metrics_text

S = 1_000_000_000  # ns per second


@dataclasses.dataclass
class _Worker:
    pid: int | None = 4242


@dataclasses.dataclass
class _Config:
    max_restarts: int = 3


class FakeJob:
    """A JobView whose goodput is a recorder's ledger (the rest stays put)."""

    node = "host"
    run_id = "r1"
    name = "train.py"
    hang_count = 0
    stacks_captured = 0
    learned_heartbeat_timeout: float | None = None

    def __init__(self, recorder: GoodputRecorder) -> None:
        self.recorder = recorder
        self.restarts = 0

    @property
    def config(self) -> _Config:
        return _Config()

    @property
    def state(self) -> WorkerState:
        return WorkerState.HEALTHY

    @property
    def role(self) -> str:
        return "trainer"

    @property
    def round(self) -> int | None:
        return 1

    @property
    def done(self) -> bool:
        return False

    @property
    def restart_count(self) -> int:
        return self.restarts

    @property
    def remaining_restarts(self) -> int:
        return 3 - self.restarts

    @property
    def last_failure(self) -> Any:
        return None

    @property
    def last_hang(self) -> Any:
        return None

    def workers(self) -> Sequence[_Worker]:
        return [_Worker()]

    def heartbeat_age_ms(self) -> int | None:
        return None

    def idle_interpreters(self) -> tuple[int, int]:
        return (0, 0)

    def checkpoint_status(self) -> dict[str, Any] | None:
        return None

    def node_health(self) -> dict[str, Any] | None:
        return None

    def unhealthy_reason(self) -> str | None:
        return None

    def goodput(self) -> dict[str, Any] | None:
        ledger = self.recorder.ledger()
        return None if ledger is None else ledger.record()

    def straggler_status(self) -> dict[str, Any] | None:
        return None


def scrape(job: FakeJob) -> tuple[dict[str, str], dict[str, float]]:
    """The page's metric types by name and values by series."""
    types: dict[str, str] = {}
    values: dict[str, float] = {}
    for line in metrics_text(job).splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            types[name] = kind
        elif line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            values[series] = float(value)
    return types, values


def test_no_counter_goes_down_across_a_crash_reclassification() -> None:
    now = [0]
    rec = GoodputRecorder(clock=lambda: now[0])
    job = FakeJob(rec)
    ranks = [RankSteps(0, 2 * S, 50, 7 * S)]  # steps 0..50 from 2 s to 7 s
    rec.launched()
    rec.attempt_started()
    rec.steps = lambda: ranks
    pages = []
    labels = 'run_id="r1",role="trainer"'
    productive = f"aelastic_goodput_productive_seconds{{{labels}}}"
    rollback = f'aelastic_goodput_badput_seconds{{{labels},category="rollback"}}'

    now[0] = 10 * S  # live: 5 s of steps and the step under way since 7 s
    pages.append(scrape(job))
    rec.attempt_ended(ranks, "crash")  # noticed now: the step under way was lost
    job.restarts = 1
    pages.append(scrape(job))
    now[0] = 12 * S  # restarting, then resumed after step 40: steps 41..60 to 16 s
    pages.append(scrape(job))
    rec.attempt_started()
    ranks = [RankSteps(41, 14 * S, 60, 16 * S)]
    now[0] = round(16.5 * S)
    pages.append(scrape(job))
    rec.attempt_ended(ranks)
    rec.finished()
    pages.append(scrape(job))

    counters = {n for types, _ in pages for n, kind in types.items() if kind == "counter"}
    assert counters  # the page has counters (restarts...): none goes down
    for (_, before), (_, after) in itertools.pairwise(pages):
        for series, value in before.items():
            if series.split("{")[0] in counters:
                assert after[series] >= value, series
    # the reclassification the review saw: 8.0 s productive, then 5.0 s and 3.0 s rollback
    assert (pages[0][1][productive], pages[0][1][rollback]) == (8.0, 0.0)
    assert (pages[1][1][productive], pages[1][1][rollback]) == (5.0, 3.0)
    for types, values in pages:
        # the ledger's series are gauges, and none is named as a counter
        assert types["aelastic_goodput_productive_seconds"] == "gauge"
        assert types["aelastic_goodput_badput_seconds"] == "gauge"
        assert types["aelastic_goodput_wall_seconds"] == "gauge"
        assert not any(n.startswith("aelastic_goodput") and n.endswith("_total") for n in types)
        categories = {s.split('category="')[1][:-2] for s in values if "category=" in s}
        assert categories == set(BADPUT)

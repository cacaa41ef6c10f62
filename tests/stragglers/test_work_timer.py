"""``time_work``'s timer: own work between all-reduces, from clock marks (CPU) or CUDA
events read without waiting (GPU); and the watch scoring by it once a worker reports it.

The CUDA events are a stand-in (no GPU here): they keep the times the test gives them and
complete when the test says, as ``torch.cuda.Event`` completes when the GPU gets there.
The real hook on a real gloo DDP job is ``tests/launcher/test_stragglers.py``'s."""

from __future__ import annotations

import os

import pytest

from aelastic.progress._reader import ProgressSnapshot
from aelastic.stragglers import time_work
from aelastic.stragglers._hook import WorkTimer
from aelastic.stragglers._settings import StragglerSettings
from aelastic.stragglers._watch import StragglerWatch

from .test_watch import _Job


def test_cpu_marks_report_each_iteration_from_the_second_on() -> None:
    clock = iter([100, 160, 200, 300, 340])  # ready, done, ready, done, ...
    reports: list[tuple[int, int]] = []
    timer = WorkTimer(lambda work, span: reports.append((work, span)), clock=lambda: next(clock))
    timer.ready()
    timer.done()  # the first iteration: nothing before it to measure from
    assert reports == []
    timer.ready()
    timer.done()
    # own work: from the last all-reduce's completion (160) to this bucket ready (200);
    # span: between the two completions (160 -> 300)
    assert reports == [(40, 140)]


class _Event:
    """Keeps the time it is given at ``record()``; complete once ``finished`` is set."""

    now = 0.0  # ms: what the "GPU" reached when an event is recorded

    def __init__(self) -> None:
        self.at: float | None = None
        self.finished = False

    def record(self) -> None:
        self.at = _Event.now

    def query(self) -> bool:
        return self.finished

    def elapsed_time(self, end: _Event) -> float:
        assert self.finished and end.finished, "elapsed_time on an incomplete event"
        assert self.at is not None and end.at is not None
        return end.at - self.at


def test_cuda_events_are_read_only_once_complete_and_never_waited_for() -> None:
    made: list[_Event] = []

    def event() -> _Event:
        made.append(_Event())
        return made[-1]

    reports: list[tuple[int, int]] = []
    timer = WorkTimer(lambda work, span: reports.append((work, span)), event=event)
    for ready, done in [(10.0, 12.0), (30.0, 31.0), (50.0, 60.0)]:
        _Event.now = ready
        timer.ready()
        _Event.now = done
        timer.done()
    assert len(timer.pending) == 2 and reports == []  # nothing complete: nothing read
    for e in made[:4]:  # the GPU finished the second iteration only
        e.finished = True
    timer.resolve()
    assert reports == [(18_000_000, 19_000_000)]  # 12 -> 30 ms own work, 12 -> 31 ms span
    for e in made:
        e.finished = True
    timer.ready()  # the next iteration's hook reads what completed, oldest first
    assert reports[1:] == [(19_000_000, 29_000_000)] and not timer.pending


def test_time_work_refuses_a_model_that_is_not_ddp() -> None:
    with pytest.raises(TypeError, match="not a DistributedDataParallel model"):
        time_work(object())


def _work(work_s: float, span_s: float) -> ProgressSnapshot:
    return ProgressSnapshot(
        attached=True, attach_ns=1, beats=1, last_beat_ns=1, max_gap_ns=0, step=1,
        section=None, section_ns=0, section_exit_ns=0, longest_sections_ns={},
        work_ns=int(work_s * 1e9), work_span_ns=int(span_s * 1e9),
    )  # fmt: skip


async def test_the_watch_scores_by_timed_work_once_a_worker_reports_it() -> None:
    job = _Job([0, 1])
    for worker in job.workers():
        worker.pid = os.getpid()
    reports: dict[int, ProgressSnapshot] = {}
    job.progress = lambda: reports  # type: ignore[method-assign]
    watch = StragglerWatch(
        StragglerSettings(window=100, min_duration=2, warmup=0),
        job,
        lambda: None,
        node="a",
        host="hosta",
        emit=lambda name, md: None,
    )
    for now in (10.0, 10.5, 11.0, 11.5):
        busy = watch.sample(now)  # CPU time from /proc: the rate this process ran
    assert set(busy) == {0, 1}
    # the work timers report: each rank's own work over the span it covers. The rates
    # start over (a work fraction is not a CPU rate), counted from the second report
    for i, now in enumerate((12.0, 13.0, 14.0, 15.0), start=1):
        reports.update({0: _work(0.7 * i, 1.0 * i), 1: _work(0.95 * i, 1.0 * i)})
        medians = watch.sample(now)
    assert medians == pytest.approx({0: 0.7, 1: 0.95})
    assert len(watch._windows[0].samples) == 3
    # no iteration timed since: no new rate (the window keeps what it had)
    assert watch.sample(16.0) == pytest.approx({0: 0.7, 1: 0.95})
    assert len(watch._windows[0].samples) == 3

"""WaitReporter: one task reports the successive waits of a handler (issue 40 item 1).

A join used to open a task group and a sleeping task per wait, cancelled when the wait
ended; the reporter serves every wait of its owner from one task. These tests check that
the lines still come for the wait in progress, and only for it.
"""

from __future__ import annotations

import logging

import anyio
import anyio.lowlevel
import pytest

from aelastic.rendezvous._waiting import WaitReporter, reporting_wait

pytestmark = pytest.mark.anyio

INTERVAL = 0.05


class Describer:
    """A ``describe`` that counts its calls, records ``waited`` and can be awaited."""

    def __init__(self, text: str, fail: bool = False) -> None:
        self.text, self.fail = text, fail
        self.waited: list[float] = []
        self.called = anyio.Event()

    async def __call__(self, waited: float) -> str:
        self.waited.append(waited)
        self.called.set()
        if self.fail:
            raise OSError("store unreachable")
        return self.text


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "aelastic.rendezvous._waiting"]


async def test_successive_waits_each_get_their_own_lines(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "aelastic.rendezvous._waiting")
    reporter = WaitReporter(INTERVAL)
    first, second = Describer("first wait"), Describer("second wait")
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(10):
            with reporter.waiting(first, tg):
                await first.called.wait()
            assert first.waited[0] >= INTERVAL * 0.9  # a line only once a wait is that long
            calls = len(first.waited)
            with reporter.waiting(second, tg):
                await second.called.wait()
                second.called = anyio.Event()
                await second.called.wait()  # and again one interval later
        tg.cancel_scope.cancel()
    assert len(first.waited) == calls, "the ended wait was described again"
    assert second.waited[1] > second.waited[0]
    lines = _lines(caplog)
    assert lines[:calls] == ["first wait"] * calls
    assert set(lines[calls:]) == {"second wait"} and len(lines) >= calls + 2


async def test_a_wait_shorter_than_the_interval_says_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "aelastic.rendezvous._waiting")
    reporter = WaitReporter(3600.0)
    quick, slow = Describer("quick"), Describer("slow")
    async with anyio.create_task_group() as tg:
        for _ in range(100):
            with reporter.waiting(quick, tg):
                await anyio.lowlevel.checkpoint()
        tg.cancel_scope.cancel()
    # and a reporter whose group ended starts a new task in the next group it is given
    reporter._interval = INTERVAL
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(10), reporter.waiting(slow, tg):
            await slow.called.wait()
        tg.cancel_scope.cancel()
    assert quick.waited == [] and _lines(caplog)[:1] == ["slow"]


async def test_nested_wait_is_reported_then_the_outer_one_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "aelastic.rendezvous._waiting")
    reporter = WaitReporter(INTERVAL)
    outer, inner = Describer("joining"), Describer("reconnecting")
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(10), reporter.waiting(outer, tg):
            with reporter.waiting(inner, tg):
                await inner.called.wait()
            outer.called = anyio.Event()
            await outer.called.wait()
        tg.cancel_scope.cancel()
    lines = _lines(caplog)
    assert "reconnecting" in lines and lines[-1] == "joining"


async def test_a_failing_describe_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "aelastic.rendezvous._waiting")
    broken = Describer("never", fail=True)
    with anyio.fail_after(10):
        async with reporting_wait(broken, INTERVAL):
            await broken.called.wait()
    line = _lines(caplog)[0]
    assert line.startswith("still waiting for the rendezvous after") and "unreachable" in line

"""Subscriptions: ordering, filtering, overflow policy and drop counting, foreign loops."""

from __future__ import annotations

import threading

import anyio
import anyio.abc
import anyio.to_thread
import pytest

from aelastic import events
from aelastic.events import Event, EventSource
from aelastic.events._dispatch import statistics
from aelastic.events._record import construct_and_record_rdzv_event


def _ev(i: int) -> Event:
    return Event(f"e{i}", EventSource.WORKER, i)


async def test_sees_every_destination_in_order() -> None:
    events.register_handler("sub-a", lambda e: None)
    async with events.subscribe() as stream:
        events.record(_ev(0), "null")
        events.record(_ev(1), "sub-a")
        construct_and_record_rdzv_event("r", "m", events.NodeState.INIT)
        events.record(_ev(3))
        got = [await stream.receive() for _ in range(4)]
    assert [getattr(e, "timestamp", None) for e in got] == [0, 1, None, 3]
    assert isinstance(got[2], events.RdzvEvent)


async def test_destination_filter_and_later_destinations() -> None:
    async with events.subscribe("sub-only") as only, events.subscribe() as everything:
        events.register_handler("sub-created-later", lambda e: None)
        events.record(_ev(1), "sub-created-later")
        events.record(_ev(2), "sub-only")
        assert [e.timestamp for e in (only.receive_nowait(),)] == [2]
        with pytest.raises(anyio.WouldBlock):
            only.receive_nowait()
        assert [everything.receive_nowait().timestamp for _ in range(2)] == [1, 2]


async def test_iteration_ends_when_the_block_exits() -> None:
    async with events.subscribe() as stream:
        events.record(_ev(1))
    assert [e.timestamp async for e in stream] == [1]
    assert len(stream) == 0


@pytest.mark.parametrize(
    ("overflow", "kept"), [("drop_oldest", range(9900, 10000)), ("drop_newest", range(100))]
)
async def test_flood_drops_by_policy_and_counts(overflow: str, kept: range) -> None:
    async with events.subscribe(max_buffer=100, overflow=overflow) as stream:  # type: ignore[arg-type]
        for i in range(10_000):
            events.record(_ev(i))
        assert stream.dropped == 9_900
        assert [stream.receive_nowait().timestamp for _ in range(100)] == list(kept)


async def test_slow_subscriber_never_blocks_the_recorder() -> None:
    async with (
        events.subscribe(max_buffer=10) as slow,
        events.subscribe(max_buffer=100_000) as fast,
    ):
        for i in range(50_000):  # no await: a blocked recorder would hang right here
            events.record(_ev(i))
        assert slow.dropped == 49_990 and fast.dropped == 0
        assert [e.timestamp for e in [fast.receive_nowait() for _ in range(50_000)]] == list(
            range(50_000)
        )


async def test_events_from_another_thread_wake_the_subscriber() -> None:
    async with events.subscribe(max_buffer=100_000) as stream:

        def produce() -> None:
            for i in range(2_000):
                events.record(_ev(i))

        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, produce)
            with anyio.fail_after(10):
                got = [(await stream.receive()).timestamp for _ in range(2_000)]
    assert got == list(range(2_000))


def _subscribe_in_own_thread(backend: str) -> None:
    ready, results = threading.Event(), []

    def run() -> None:
        async def main() -> None:
            async with events.subscribe("foreign") as stream:
                ready.set()
                with anyio.fail_after(10):
                    async for event in stream:
                        results.append(event.timestamp)
                        if event.timestamp == 99:
                            return

        anyio.run(main, backend=backend)

    events.register_handler("foreign", lambda e: None)
    thread = threading.Thread(target=run)
    thread.start()
    assert ready.wait(10)
    for i in range(100):
        events.record(_ev(i), "foreign")
    thread.join(15)
    assert results == list(range(100))


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
async def test_subscriber_in_another_loop_and_thread(backend: str) -> None:
    pytest.importorskip(backend)
    await anyio.to_thread.run_sync(_subscribe_in_own_thread, backend)


async def test_cancelled_receive_loses_nothing() -> None:
    async with events.subscribe() as stream:
        with anyio.move_on_after(0.01):
            await stream.receive()
        events.record(_ev(5))
        assert (await stream.receive()).timestamp == 5


async def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_buffer"):
        async with events.subscribe(max_buffer=0):
            pass
    with pytest.raises(ValueError, match="overflow"):
        async with events.subscribe(overflow="block"):  # type: ignore[arg-type]
            pass


async def test_run_id_filter_keeps_one_jobs_events() -> None:
    def agent_event(run_id: str) -> Event:
        return Event("a", EventSource.AGENT, metadata={"run_id": run_id})

    async with events.subscribe(run_id="job-a") as mine, events.subscribe() as everything:
        events.record(agent_event("job-b"))
        events.record(agent_event("job-a"))
        construct_and_record_rdzv_event("job-a", "joined", events.NodeState.INIT)
        construct_and_record_rdzv_event("job-b", "joined", events.NodeState.INIT)
        assert len(everything) == 4
        got = [mine.receive_nowait(), mine.receive_nowait()]
        with pytest.raises(anyio.WouldBlock):
            mine.receive_nowait()
    assert got[0].metadata["run_id"] == "job-a" and got[1].run_id == "job-a"


async def test_stream_is_an_anyio_object_receive_stream_with_async_close() -> None:
    stream = events.subscribe()
    assert isinstance(stream, anyio.abc.ObjectReceiveStream)
    with pytest.raises(anyio.WouldBlock):
        stream.receive_nowait()  # the first read starts the subscription
    events.record(_ev(1))
    await stream.aclose()
    events.record(_ev(2))  # after the close: not delivered
    assert [e.timestamp async for e in stream] == [1]
    assert statistics()["null"].subscribers == 0


async def test_subscribe_outside_an_event_loop_names_the_problem() -> None:
    with pytest.raises(events.EventsError, match="outside a running event loop"):
        await anyio.to_thread.run_sync(events.subscribe)


async def test_a_stream_never_used_is_not_subscribed() -> None:
    events.record(_ev(0))  # makes the "null" destination
    before = statistics()["null"].subscribers
    unused = events.subscribe()
    events.record(_ev(1))
    assert statistics()["null"].subscribers == before
    assert len(unused) == 0  # buffers nothing: it would otherwise hold up to max_buffer
    async with unused:  # entering starts it
        assert statistics()["null"].subscribers == before + 1
        events.record(_ev(2))
    assert [e.timestamp async for e in unused] == [2]
    assert statistics()["null"].subscribers == before


async def test_a_stream_closed_before_use_never_subscribes() -> None:
    stream = events.subscribe()
    await stream.aclose()
    with pytest.raises(anyio.EndOfStream):
        await stream.receive()
    events.record(_ev(1))
    assert len(stream) == 0

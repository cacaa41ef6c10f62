"""Hand-off and dispatch: sync and async handlers, arecord, flush, errors, overflow, threads."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from aelastic import events
from aelastic.events import Event, EventSource, _dispatch
from aelastic.events._dispatch import (
    arecord,
    flush,
    flush_blocking,
    shutdown_blocking,
    statistics,
    unregister_handler,
)
from aelastic.events._exceptions import EventHandlerError


def _ev(i: int) -> Event:
    return Event(f"e{i}", EventSource.AGENT, i)


async def test_async_handler_runs_on_its_home_loop_in_order() -> None:
    seen: list[tuple[str, int]] = []
    loop_thread = threading.get_ident()

    async def handler(event: Event) -> None:
        await anyio.lowlevel.checkpoint()
        seen.append((event.name, threading.get_ident()))

    events.register_handler("custom-async", handler)
    for i in range(20):
        events.record(_ev(i), "custom-async")
    await arecord(_ev(20), "custom-async")
    assert [name for name, _ in seen] == [f"e{i}" for i in range(21)]
    assert {thread for _, thread in seen} == {loop_thread}


async def test_sync_handler_runs_in_the_dispatcher_thread() -> None:
    threads: list[str] = []

    class Handler:
        def record(self, event: Event) -> None:
            threads.append(threading.current_thread().name)

    events.register_handler("custom-sync", Handler())
    await arecord(_ev(0), "custom-sync")
    assert threads == ["aelastic-events"]


async def test_async_callable_object_handler() -> None:
    seen: list[str] = []

    class Handler:
        async def __call__(self, event: Event) -> None:
            seen.append(event.name)

    events.register_handler("custom-callable", Handler())
    await arecord(_ev(1), "custom-callable")
    assert seen == ["e1"]


async def test_handler_failure_is_raised_by_arecord_and_counted() -> None:
    async def broken(event: Event) -> None:
        raise OSError("disk full")

    events.register_handler("broken", broken)
    events.record(_ev(0), "broken")  # never raises on the caller's path
    with pytest.raises(EventHandlerError, match="disk full") as info:
        await arecord(_ev(1), "broken")
    assert isinstance(info.value.__cause__, OSError)
    assert statistics()["broken"].handler_errors == 2


async def test_flush_waits_for_slow_handlers() -> None:
    done: list[int] = []

    async def slow(event: Event) -> None:
        await anyio.sleep(0.001)
        done.append(event.timestamp)

    events.register_handler("slow", slow)
    for i in range(10):
        events.record(_ev(i), "slow")
    await flush()
    assert done == list(range(10))


async def test_unregister_handler() -> None:
    seen: list[Event] = []
    events.register_handler("gone", seen.append)
    assert unregister_handler("gone", seen.append)  # an equal bound method
    assert not unregister_handler("gone", seen.append)
    assert not unregister_handler("never-registered", seen.append)
    await arecord(_ev(0), "gone")
    assert seen == []


async def test_record_from_worker_threads() -> None:
    seen: list[str] = []
    events.register_handler("threads", lambda e: seen.append(e.name))

    def work(prefix: str) -> None:
        for i in range(100):
            events.record(Event(f"{prefix}{i}", EventSource.WORKER), "threads")
        assert flush_blocking(10)

    async with anyio.create_task_group() as tg:
        for prefix in "ab":
            tg.start_soon(anyio.to_thread.run_sync, work, prefix)
    assert sorted(seen) == sorted(f"{p}{i}" for p in "ab" for i in range(100))
    for prefix in "ab":  # per-recorder order is kept
        mine = [n for n in seen if n.startswith(prefix)]
        assert mine == [f"{prefix}{i}" for i in range(100)]


async def test_full_queue_drops_new_events_and_counts_them() -> None:
    gate = threading.Event()
    seen: list[int] = []

    def blocked(event: Event) -> None:
        gate.wait(30)
        seen.append(event.timestamp)

    events.register_handler("tiny", blocked)
    _dispatch.registry.get("tiny").capacity = 10
    for i in range(100):
        events.record(_ev(i), "tiny")
    gate.set()
    await flush()
    stats = statistics()["tiny"]
    assert stats.dropped >= 80
    assert stats.processed + stats.dropped == 100
    assert seen == sorted(seen)


def test_record_from_plain_sync_code_is_flushed_at_exit(tmp_path: pytest.TempPathFactory) -> None:
    """No loop anywhere: record() from a script; the atexit flush delivers the events."""
    script = (
        "import time\n"
        "from aelastic import events\n"
        "def slow(e):\n"
        "    time.sleep(0.01)\n"
        "    print(e.name, flush=True)\n"
        "events.register_handler('slow', slow)\n"
        "for i in range(5):\n"
        "    events.record(events.Event(f'e{i}', events.EventSource.AGENT), 'slow')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == [f"e{i}" for i in range(5)]


def test_forked_child_restarts_the_dispatcher() -> None:
    script = (
        "import os\n"
        "from aelastic import events\n"
        "from aelastic.events._dispatch import flush_blocking\n"
        "events.register_handler('p', lambda e: print(os.getpid() == PID, e.name, flush=True))\n"
        "PID = os.getpid()\n"
        "events.record(events.Event('parent', events.EventSource.AGENT), 'p')\n"
        "assert flush_blocking(10)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    events.record(events.Event('child', events.EventSource.AGENT), 'p')\n"
        "    assert flush_blocking(10)\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.splitlines() == ["True parent", "False child"]


async def test_async_handler_registered_outside_a_loop_runs_on_the_dispatcher() -> None:
    names: list[str] = []

    async def handler(event: Event) -> None:
        names.append(threading.current_thread().name)

    await anyio.to_thread.run_sync(events.register_handler, "no-home", handler)
    await arecord(_ev(0), "no-home")
    assert names == ["aelastic-events"]


async def test_handler_whose_loop_ended_fails_cleanly() -> None:
    seen: list[Event] = []

    def register_in_own_loop() -> None:
        async def main() -> None:
            async def handler(event: Event) -> None:
                seen.append(event)

            events.register_handler("dead-loop", handler)

        anyio.run(main)

    await anyio.to_thread.run_sync(register_in_own_loop)
    with pytest.raises(EventHandlerError, match="no longer running"):
        await arecord(_ev(0), "dead-loop")
    assert seen == []


def _async_handler_on_trio() -> list[tuple[str, int]]:
    """Register an async handler under trio and arecord to it from that same trio loop."""
    import sniffio

    seen: list[tuple[str, int]] = []

    async def main() -> None:
        async def handler(event: Event) -> None:
            await anyio.lowlevel.checkpoint()
            seen.append((sniffio.current_async_library(), threading.get_ident()))

        events.register_handler("on-trio", handler)
        try:
            for i in range(3):
                events.record(_ev(i), "on-trio")
            await arecord(_ev(3), "on-trio")
            await flush()
        finally:
            unregister_handler("on-trio", handler)

    anyio.run(main, backend="trio")
    return seen


async def test_async_handler_registered_under_trio_runs_on_its_trio_loop() -> None:
    pytest.importorskip("trio")
    seen = await anyio.to_thread.run_sync(_async_handler_on_trio)
    assert len(seen) == 4
    assert {library for library, _ in seen} == {"trio"}
    assert len({thread for _, thread in seen}) == 1
    assert seen[0][1] != threading.get_ident()


def _dispatcher_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "aelastic-events"]


async def test_shutdown_flushes_stops_the_thread_and_a_later_record_restarts_it() -> None:
    seen: list[int] = []
    events.register_handler("stoppable", lambda e: seen.append(e.timestamp))
    for i in range(5):
        events.record(_ev(i), "stoppable")
    assert await events.shutdown()
    assert seen == list(range(5))
    assert _dispatcher_threads() == []
    events.record(_ev(5), "stoppable")
    await flush()
    assert seen == list(range(6)) and len(_dispatcher_threads()) == 1
    assert shutdown_blocking(10) and _dispatcher_threads() == []
    assert shutdown_blocking(10)  # idempotent


def test_dispatch_does_not_import_the_handlers_module() -> None:
    """No cycle: _handlers builds on _dispatch, never the other way round."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(_dispatch))
    imported = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module is not None
    }
    assert "_handlers" not in imported and "_subscribe" not in imported


class _StopsFirst:
    """The dispatcher's loop as a wake() that read it just before a stop() sees it: the
    first wake-up call lets the whole stop run first, then reaches the closed loop."""

    def __init__(self, loop: Any) -> None:
        self._loop = loop
        self.raced = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loop, name)

    def call_soon_threadsafe(self, callback: Any, *args: Any, **kw: Any) -> Any:
        if not self.raced and callback == _dispatch._dispatcher._wake_in_loop:
            self.raced = True
            assert _dispatch._dispatcher.stop(10)  # the loop is closed after this
        return self._loop.call_soon_threadsafe(callback, *args, **kw)


def test_a_wake_that_loses_the_race_with_stop_leaves_its_event_delivered() -> None:
    seen: list[int] = []
    done = threading.Event()

    def handler(event: Event) -> None:
        seen.append(event.timestamp)
        done.set()

    events.register_handler("race", handler)
    events.record(Event("warm", EventSource.WORKER, 0), "race")  # starts the dispatcher
    assert flush_blocking(10) and seen == [0]
    dispatcher = _dispatch._dispatcher
    stale = _StopsFirst(dispatcher._loop)
    dispatcher._loop = stale  # type: ignore[assignment]
    done.clear()
    events.record(Event("raced", EventSource.WORKER, 1), "race")
    assert stale.raced
    assert done.wait(10), "the event stayed queued after the stop"
    assert seen == [0, 1]
    dest = _dispatch.registry.destinations["race"]
    assert flush_blocking(10) and not dest.queue
    events.record(Event("after", EventSource.WORKER, 2), "race")  # the state is still sound
    assert flush_blocking(10) and seen == [0, 1, 2]

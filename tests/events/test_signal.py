"""The thread-safe wake-up behind subscribe() and arecord(), on every anyio backend."""

from __future__ import annotations

import threading

import anyio
import anyio.to_thread
import pytest
import sniffio

from aelastic.events._signal import AsyncWaiter, Signal

pytestmark = pytest.mark.anyio


async def test_set_from_the_loop_and_from_another_thread_wakes_the_waiter() -> None:
    signal = Signal()
    signal.set()
    with anyio.fail_after(10):
        await signal.wait()
    signal.clear()
    woken = anyio.Event()

    async def waiter() -> None:
        await signal.wait()
        woken.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.lowlevel.checkpoint()
        assert not woken.is_set()
        thread = threading.Thread(target=signal.set)
        thread.start()
        with anyio.fail_after(10):
            await woken.wait()
        await anyio.to_thread.run_sync(thread.join)


async def test_a_waiter_completed_by_another_thread_gets_its_errors() -> None:
    waiter = AsyncWaiter()
    error = RuntimeError("handler failed")
    await anyio.to_thread.run_sync(waiter.done, [error])
    with anyio.fail_after(10):
        await waiter.wait()
    assert waiter.errors == [error]


def test_a_set_after_the_loop_ended_is_ignored(anyio_backend: object) -> None:
    name, options = anyio_backend if isinstance(anyio_backend, tuple) else (anyio_backend, {})

    async def make() -> Signal:
        return Signal()

    signal = anyio.run(make, backend=name, backend_options=options)
    thread = threading.Thread(target=signal.set)  # another thread: scheduled on a dead loop
    thread.start()
    thread.join()


def test_outside_an_event_loop_it_says_so() -> None:
    with pytest.raises(sniffio.AsyncLibraryNotFoundError):
        Signal()

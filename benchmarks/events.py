"""Events: aelastic vs torch.distributed.elastic.events, in the same run.

    python benchmarks/events.py [--n 100000]

1. ``record(event)`` to the ``null`` destination: time per call.
2. ``record(event)`` to a file (JSON lines). torch has no file destination; it is given one
   the way its docs suggest for custom handlers: a ``logging.FileHandler`` registered in
   ``torch.distributed.elastic.events.handlers._log_handlers`` (torch then serialises and
   writes synchronously on the caller's path). For aelastic we report the caller's cost
   (the hand-off) and the total until the file is flushed (``flush()``).
3. ``construct_and_record_rdzv_event`` with the null ``dynamic_rendezvous`` handler.
4. The ``store`` destination: record() to a StoreServer queue over loopback (no torch
   counterpart).
5. Fan-out to one subscriber: events/s delivered to ``async for`` in another task,
   producer in the same loop and producer in another thread.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time

import anyio
import anyio.lowlevel
import anyio.to_thread


def _per_event(fn, n: int, repeat: int = 3) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn(n)
        best = min(best, time.perf_counter() - start)
    return best / n


def bench_null(n: int) -> tuple[float, float]:
    import torch.distributed.elastic.events as tev

    from aelastic import events

    ours_ev = events.Event("bench", events.EventSource.AGENT, 0, {"rank": 0, "run_id": "r"})
    torch_ev = tev.Event("bench", tev.EventSource.AGENT, 0, {"rank": 0, "run_id": "r"})

    def ours(k: int) -> None:
        record = events.record
        for _ in range(k):
            record(ours_ev)

    def theirs(k: int) -> None:
        record = tev.record
        for _ in range(k):
            record(torch_ev)

    return _per_event(ours, n), _per_event(theirs, n)


def bench_rdzv(n: int) -> tuple[float, float]:
    import torch.distributed.elastic.events as tev

    from aelastic import events
    from aelastic.events._record import construct_and_record_rdzv_event

    def ours(k: int) -> None:
        f, state = construct_and_record_rdzv_event, events.NodeState.RUNNING
        for _ in range(k):
            f("run", "message", state)

    def theirs(k: int) -> None:
        f, state = tev.construct_and_record_rdzv_event, tev.NodeState.RUNNING
        for _ in range(k):
            f("run", "message", state)

    return _per_event(ours, n), _per_event(theirs, n)


def bench_file(n: int, tmp: str) -> tuple[float, float, float]:
    import torch.distributed.elastic.events as tev
    from torch.distributed.elastic.events import handlers as thandlers

    from aelastic import events
    from aelastic.events._dispatch import flush_blocking, statistics

    ours_ev = events.Event("bench", events.EventSource.AGENT, 0, {"rank": 0, "run_id": "r"})
    torch_ev = tev.Event("bench", tev.EventSource.AGENT, 0, {"rank": 0, "run_id": "r"})

    events.configure_file(os.path.join(tmp, "ours.jsonl"))
    thandlers._log_handlers["file"] = logging.FileHandler(os.path.join(tmp, "torch.jsonl"))

    record = events.record
    events.record(ours_ev, "file")
    flush_blocking()
    start = time.perf_counter()
    for _ in range(n):
        record(ours_ev, "file")
    handoff = time.perf_counter() - start
    assert flush_blocking(120)
    total = time.perf_counter() - start
    assert statistics()["file"].dropped == 0, "queue overflowed; raise the queue size"

    trecord = tev.record
    start = time.perf_counter()
    for _ in range(n):
        trecord(torch_ev, "file")
    theirs = time.perf_counter() - start
    with open(os.path.join(tmp, "ours.jsonl")) as f:
        lines = sum(1 for _ in f)
    assert lines == n + 1, lines
    return handoff / n, total / n, theirs / n


async def bench_fanout(n: int, max_buffer: int) -> list[tuple[str, float, int]]:
    """Delivered events/s to one ``async for`` subscriber, and events dropped."""
    from aelastic import events
    from aelastic.events._subscribe import EventStream

    ev = events.Event("bench", events.EventSource.AGENT)
    results = []

    async def consume(stream: EventStream) -> None:
        got = 0
        async for _ in stream:
            got += 1
            if got + stream.dropped >= n:
                return

    async with events.subscribe(max_buffer=max_buffer) as stream:
        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            tg.start_soon(consume, stream)
            for i in range(n):  # producer in the same loop, yielding every 100 events
                events.record(ev)
                if i % 100 == 99:
                    await anyio.lowlevel.checkpoint()
        elapsed = time.perf_counter() - start
        results.append(("producer task, same loop", (n - stream.dropped) / elapsed, stream.dropped))

    def produce() -> None:
        for _ in range(n):
            events.record(ev)

    async with events.subscribe(max_buffer=max_buffer) as stream:
        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            tg.start_soon(consume, stream)
            await anyio.to_thread.run_sync(produce)
        elapsed = time.perf_counter() - start
        results.append(("producer thread", (n - stream.dropped) / elapsed, stream.dropped))
    return results


async def bench_store(n: int) -> float:
    """Events/s from record() to a StoreServer queue (in-process server, loopback TCP)."""
    from aelastic import events
    from aelastic.events._dispatch import flush, unregister_handler
    from aelastic.events._store import configure_store, events_key
    from aelastic.store import StoreServer, TCPStoreClient

    ev = events.Event("bench", events.EventSource.AGENT, metadata={"run_id": "bench"})
    async with (
        StoreServer("127.0.0.1", 0) as server,
        TCPStoreClient("127.0.0.1", server.port, timeout=60) as client,
    ):
        handler = configure_store(client, "bench")
        try:
            start = time.perf_counter()
            for _ in range(n):
                events.record(ev, "store")
            await flush()
            elapsed = time.perf_counter() - start
            assert await client.queue_len(events_key("bench")) == n
        finally:
            unregister_handler("store", handler)
    return n / elapsed


def _row(label: str, ours: float, theirs: float) -> None:
    print(
        f"{label:<17}: aelastic {ours * 1e9:8.0f} ns/event   torch {theirs * 1e9:8.0f} ns/event"
        f"   ratio {ours / theirs:.3f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="events per measurement")
    args = parser.parse_args()
    n = args.n

    ours, theirs = bench_null(n)
    _row("null record", ours, theirs)
    ours, theirs = bench_rdzv(n)
    _row("rdzv event (null)", ours, theirs)
    with tempfile.TemporaryDirectory() as tmp:
        handoff, total, theirs = bench_file(n, tmp)
    print(f"file record      : aelastic {handoff * 1e9:8.0f} ns/event on the caller "
          f"({total * 1e9:.0f} ns/event until flushed)   torch {theirs * 1e9:8.0f} ns/event"
          f"   ratio caller {handoff / theirs:.3f}x, flushed {total / theirs:.3f}x")  # fmt: skip
    n_store = min(n, 20_000)
    rate = anyio.run(bench_store, n_store)
    print(f"store destination: {rate:,.0f} events/s record() -> queue_push ({n_store} events)")
    for max_buffer in (n, 10_000):
        for label, rate, dropped in anyio.run(bench_fanout, n, max_buffer):
            print(
                f"fan-out, 1 subscriber (buffer {max_buffer}), {label}: "
                f"{rate:,.0f} events/s delivered, {dropped} dropped"
            )


if __name__ == "__main__":
    main()

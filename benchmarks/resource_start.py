"""What starting and stopping a store server costs: ours (``async with`` and ``serve``) vs torch's.

    python benchmarks/resource_start.py [--cycles 200] [--backends asyncio,uvloop,trio]

One cycle starts a server on 127.0.0.1 (free port), connects one client, does one
``set`` and one ``get`` through it, closes the client and stops the server. Ours runs
on each anyio backend, both ways a server starts (``async with StoreServer(...)`` and
``port = await tg.start(server.serve)``, then cancelling the task); torch's is
``TCPStore(is_master=True)`` (its libuv server) with a ``TCPStore`` client, created and
deleted in the same process, in the same run. Prints the median and 90th percentile of
a cycle in milliseconds and the ratio of torch's median to ours. A torch cycle that
fails (its client timed out connecting to its fresh server, seen once in 400 cycles
here) is counted and left out.

Issue 21 (one way to start a resource) changed how our server starts and stops;
point ``PYTHONPATH`` at an older tree to compare (RESULTS.md has both).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import statistics
import time
from collections.abc import Awaitable, Callable

import anyio

from aelastic.store import StoreServer, TCPStoreClient


async def _use(port: int) -> None:
    async with TCPStoreClient("127.0.0.1", port, timeout=10) as client:
        await client.set("k", "v")
        assert await client.get("k") == b"v"


async def _with_block() -> None:
    async with StoreServer("127.0.0.1", 0) as server:
        await _use(server.port)


async def _with_serve() -> None:
    server = StoreServer("127.0.0.1", 0)
    if not hasattr(server, "serve"):  # a tree from before serve() existed
        raise NotImplementedError
    async with anyio.create_task_group() as tg:
        port = await tg.start(server.serve)
        await _use(port)
        tg.cancel_scope.cancel()


async def _time_ours(cycle: Callable[[], Awaitable[None]], cycles: int) -> list[float]:
    await cycle()  # warm-up
    times = []
    for _ in range(cycles):
        start = time.perf_counter()
        await cycle()
        times.append(time.perf_counter() - start)
    return times


def _time_torch(cycles: int) -> tuple[list[float], int]:
    from torch.distributed import TCPStore

    timeout = datetime.timedelta(seconds=10)

    def cycle() -> None:
        master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timeout)
        client = TCPStore("127.0.0.1", master.port, is_master=False, timeout=timeout)
        client.set("k", "v")
        assert client.get("k") == b"v"
        del client
        del master

    cycle()
    times, failures = [], 0
    for _ in range(cycles):
        start = time.perf_counter()
        try:
            cycle()
        except RuntimeError as exc:  # DistNetworkError: its client timed out (seen here)
            failures += 1
            print(f"torch cycle failed after {time.perf_counter() - start:.1f} s: {exc}")
            continue
        times.append(time.perf_counter() - start)
    return times, failures


def _summary(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    return statistics.median(ordered) * 1e3, ordered[int(len(ordered) * 0.9)] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--backends", default="asyncio,uvloop,trio")
    args = parser.parse_args()
    torch_times, torch_failures = _time_torch(args.cycles)
    torch_median, torch_p90 = _summary(torch_times)
    rows = [("torch TCPStore(is_master=True)", torch_median, torch_p90)]
    for name in args.backends.split(","):
        if name == "uvloop" and importlib.util.find_spec("uvloop") is None:
            continue
        backend, options = ("asyncio", {"use_uvloop": True}) if name == "uvloop" else (name, {})
        for how, cycle in (("async with", _with_block), ("tg.start(serve)", _with_serve)):
            try:
                times = anyio.run(
                    _time_ours, cycle, args.cycles, backend=backend, backend_options=options
                )
            except NotImplementedError:
                continue
            rows.append((f"aelastic {how} on {name}", *_summary(times)))
    print(f"{args.cycles} cycles: start, connect, set, get, close, stop")
    if torch_failures:
        print(f"torch: {torch_failures} cycles failed (left out of its figures)")
    print(f"| {'server':<38} | median ms | p90 ms | torch's median / ours |")
    print(f"|{'-' * 40}|-----------|--------|------------------------|")
    for label, median, p90 in rows:
        print(f"| {label:<38} | {median:9.3f} | {p90:6.3f} | {torch_median / median:22.2f} |")


if __name__ == "__main__":
    main()

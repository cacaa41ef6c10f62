"""What a 64-node rendezvous costs below aelastic's own code: the event loop's floor.

    python benchmarks/rendezvous_floor.py [--nodes 64] [--trips 7] [--repeat 7]

A cold 64-node rendezvous makes ~450 store requests, each a round trip on its own
loopback TCP connection, client and server on one event loop. Three cases make the
same number of round trips (``nodes`` connections, ``trips`` each, all at once):

* ``raw``: a bare anyio ping-pong (``send``, ``wait_readable``, ``recv`` on both ends):
  what the loop, anyio and the kernel cost, with no store at all;
* ``store``: ``TCPStoreClient.add`` against an in-process ``StoreServer``: the store's
  client and server path on top of that;
* the rendezvous itself is ``rendezvous_scale.py --ours 64`` (the same ~450 requests).

Prints the median and minimum milliseconds per case, on asyncio, uvloop and trio (the
store case on asyncio only, as the rendezvous benchmark runs). A diagnostic: there is no
torch counterpart; it shows how much of the rendezvous is above the floor.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
from contextlib import AsyncExitStack
from typing import Any

import anyio


def _pairs(n: int) -> list[tuple[socket.socket, socket.socket]]:
    """``n`` connected loopback TCP pairs (client, server), non-blocking, TCP_NODELAY."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(n)
        pairs = []
        for _ in range(n):
            client = socket.create_connection(listener.getsockname())
            server, _ = listener.accept()
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.setblocking(False)
            pairs.append((client, server))
    return pairs


async def raw_case(nodes: int, trips: int) -> float:
    pairs = _pairs(nodes)

    async def serve(sock: socket.socket) -> None:
        while True:
            await anyio.wait_readable(sock)
            if not sock.recv(65536):
                return
            sock.send(bytes(8))

    async def client(sock: socket.socket) -> None:
        for _ in range(trips):
            sock.send(b"\x04" + bytes(30))  # the size of an ADD request
            await anyio.wait_readable(sock)
            sock.recv(65536)

    try:
        async with anyio.create_task_group() as servers:
            for _, s in pairs:
                servers.start_soon(serve, s)
            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for c, _ in pairs:
                    tg.start_soon(client, c)
            elapsed = time.perf_counter() - t0
            servers.cancel_scope.cancel()
    finally:
        for c, s in pairs:
            c.close()
            s.close()
    return elapsed


async def store_case(nodes: int, trips: int) -> float:
    from aelastic.store import StoreServer, TCPStoreClient

    async with StoreServer("127.0.0.1", 0) as server, AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(TCPStoreClient("127.0.0.1", server.port))
            for _ in range(nodes)
        ]
        for c in clients:
            await c.add("warm", 0)

        async def node(c: TCPStoreClient) -> None:
            for _ in range(trips):
                await c.add("k", 1)

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for c in clients:
                tg.start_soon(node, c)
        return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--trips", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    cases: list[tuple[str, Any, str, dict[str, Any]]] = [
        ("raw", raw_case, "asyncio", {}),
        ("raw", raw_case, "asyncio", {"use_uvloop": True}),
        ("raw", raw_case, "trio", {}),
        ("store", store_case, "asyncio", {}),
    ]
    print(f"{args.nodes} connections x {args.trips} round trips, {args.repeat} runs per case")
    for name, fn, backend, options in cases:
        label = "uvloop" if options else backend
        try:
            runs = [
                anyio.run(fn, args.nodes, args.trips, backend=backend, backend_options=options)
                for _ in range(args.repeat)
            ]
        except ImportError as exc:
            print(f"{name:6} {label:8} skipped ({exc})")
            continue
        print(
            f"{name:6} {label:8} median {statistics.median(runs) * 1000:6.1f} ms"
            f"  min {min(runs) * 1000:6.1f} ms"
        )
    print("load average", " ".join(f"{x:.1f}" for x in os.getloadavg()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

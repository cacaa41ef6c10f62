"""Status publishing load, ``status`` answer time and the live page, at scale.

    python benchmarks/jobview.py [--agents 1000] [--window 20] [--nodes 256]

1. Store load: ``--agents`` simulated agents, each on its own connection, publish a
   worst-case status document (8 workers, a full history: 32 step samples, 12 marks)
   every 5 s, or less often beyond 500 nodes (1,000: every 10 s; the publisher's
   ``period`` rule), with a random phase, as the agents' ``StatusPublisher`` does, into
   (a) aelastic's store server and (b) torch's own TCPStore server (libuv), each in its
   own process. Reported: requests/s, bytes/s and the server process's CPU (user +
   system, ``/proc/<pid>/stat``) over ``--window`` seconds, as % of one core.
2. ``status`` answer time: ``--nodes`` statuses in each server; the time of
   :func:`aelastic.jobview.read_view` (two requests: index, multi_get) in-process
   (median of 7), and of ``python -m aelastic status --json`` end to end (with the
   interpreter's start).
3. The page: its size, ``view.json``'s size at ``--nodes`` nodes, and the time
   Chromium (``--headless --dump-dom``) takes to load and render it from
   ``python -m aelastic dashboard`` minus its time for ``about:blank`` (median of 3).
torch has no job view of its own: the side by side is the store under the same load.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from store_throughput import load_average, server_cpu, start_our_server, start_torch_server, stop

from aelastic.jobview import read_view
from aelastic.jobview._history import History
from aelastic.jobview._publish import period
from aelastic.store import PrefixStore, TCPStoreClient

RUN = "bench"
INTERVAL = 5.0


def worst_case_doc(node: str, now: float) -> dict[str, Any]:
    history = History()
    for i in range(200):
        history.sample(now - 1000 + 5 * i, [1000 + i * 10 + r for r in range(8)])
    for i in range(20):
        history.mark(now - 100 + i, "restart", f"restart {i}: rank {i} exited 1")
    return {
        "v": 1, "node": node, "host": "host-" + node, "pid": 12345, "run_id": RUN,
        "role": "default_role", "state": "HEALTHY", "round": 3, "group_rank": 17,
        "restart_count": 2, "restarts_left": 1, "max_restarts": 3,
        "workers": [
            {"global_rank": 136 + r, "local_rank": r, "pid": 20000 + r, "step": 3000 + r,
             "heartbeat_age_ms": 250}
            for r in range(8)
        ],
        "last_failure": {"global_rank": 140, "local_rank": 4, "pid": 19999, "exitcode": 1,
                         "attempt": 2, "time": now - 100, "message": "exited 1"},
        "hangs": 1,
        "last_hang": {"global_rank": 141, "local_rank": 5, "rule": "heartbeat",
                      "section": "train_step", "step": 2800, "time": now - 300},
        "history": history.to_json(), "interval": INTERVAL, "time": round(now, 2),
    }  # fmt: skip


def encode(node: str) -> bytes:
    return json.dumps(worst_case_doc(node, time.time()), separators=(",", ":")).encode()


async def publish_load(port: int, agents: int, window: float, pid: int) -> dict[str, float]:
    """``agents`` publishers on their own connections; the server's CPU over ``window``."""
    sent = [0, 0]  # requests, bytes
    measuring = anyio.Event()
    async with anyio.create_task_group() as tg:
        clients = []
        for i in range(agents):
            client = TCPStoreClient("127.0.0.1", port, timeout=30, connect_timeout=30)
            await client.__aenter__()
            clients.append(client)
            store = PrefixStore(f"aelastic/status/{RUN}", client)
            await store.set(f"n/node-{i}", encode(f"node-{i}"))
            await store.append("nodes", f"node-{i}\n")

        every = period(INTERVAL, agents)

        async def agent(i: int) -> None:
            store = PrefixStore(f"aelastic/status/{RUN}", clients[i])
            await anyio.sleep(random.uniform(0, every))
            while True:
                raw = encode(f"node-{i}")
                await store.set(f"n/node-{i}", raw)
                if measuring.is_set():
                    sent[0] += 1
                    sent[1] += len(raw)
                await anyio.sleep(every)

        for i in range(agents):
            tg.start_soon(agent, i)
        await anyio.sleep(every)  # every agent in its rhythm
        cpu0, t0 = server_cpu(pid), time.monotonic()
        measuring.set()
        await anyio.sleep(window)
        cpu1, t1 = server_cpu(pid), time.monotonic()
        tg.cancel_scope.cancel()
    for client in clients:
        await client.__aexit__(None, None, None)
    wall = t1 - t0
    return {
        "requests_per_s": sent[0] / wall,
        "kbytes_per_s": sent[1] / wall / 1024,
        "cpu_percent": 100 * (cpu1 - cpu0) / wall,
    }


async def status_time(port: int, nodes: int) -> tuple[float, float, int]:
    """Fill ``nodes`` statuses; return (read_view median s, CLI wall s, view.json bytes)."""
    async with TCPStoreClient("127.0.0.1", port, timeout=30) as client:
        store = PrefixStore(f"aelastic/status/{RUN}", client)
        await store.delete_key("nodes")
        names = [f"node-{i}" for i in range(nodes)]
        await store.multi_set([f"n/{n}" for n in names], [encode(n) for n in names])
        await store.append("nodes", "".join(n + "\n" for n in names))
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            view = await read_view(store, RUN)
            times.append(time.perf_counter() - t0)
        assert len(view["nodes"]) == nodes
    t0 = time.perf_counter()
    done = await anyio.run_process(
        [sys.executable, "-m", "aelastic", "status", "--json",
         "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", RUN]
    )  # fmt: skip
    cli = time.perf_counter() - t0
    return statistics.median(times), cli, len(done.stdout)


async def render_time(port: int, nodes: int) -> tuple[float, float]:
    """Chromium's median time for the dashboard page and for about:blank."""
    chromium = shutil.which("chromium")
    assert chromium, "apt-get install -y chromium"
    dash = await anyio.open_process(
        [sys.executable, "-m", "aelastic", "dashboard", "--rdzv-endpoint", f"127.0.0.1:{port}",
         "--rdzv-id", RUN, "--port", "0"]
    )  # fmt: skip
    async with dash:
        assert dash.stdout is not None
        url = (await dash.stdout.receive()).decode().split()[-1]
        flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom"]

        async def run(target: str) -> float:
            t0 = time.perf_counter()
            out = await anyio.run_process([*flags, "--virtual-time-budget=3000", target])
            if target != "about:blank":
                assert b"<polyline" in out.stdout and out.stdout.count(b"<tr") > nodes
            return time.perf_counter() - t0

        page = statistics.median([await run(url) for _ in range(3)])
        blank = statistics.median([await run("about:blank") for _ in range(3)])
        dash.terminate()
    return page, blank


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--agents", type=int, default=1000)
    p.add_argument("--window", type=float, default=20.0)
    p.add_argument("--nodes", type=int, default=256)
    args = p.parse_args()
    doc = len(encode("node-999"))
    print(f"{load_average()}; status document (worst case) {doc} bytes")
    for name, start in (
        ("aelastic", lambda: start_our_server(False)),
        ("torch", start_torch_server),
    ):
        proc, port = start()
        try:
            load = await publish_load(port, args.agents, args.window, proc.pid)
            print(
                f"{name:8} store, {args.agents} agents: {load['requests_per_s']:.0f} req/s, "
                f"{load['kbytes_per_s']:.0f} KiB/s, server CPU {load['cpu_percent']:.2f}% of a core"
            )
            read, cli, size = await status_time(port, args.nodes)
            print(
                f"{name:8} store, {args.nodes} nodes: read_view {read * 1000:.1f} ms, "
                f"'aelastic status --json' {cli * 1000:.0f} ms end to end ({size} bytes)"
            )
            if name == "aelastic":
                page, blank = await render_time(port, args.nodes)
                html = (Path(__file__).parent.parent / "aelastic/jobview/page.html").stat().st_size
                print(
                    f"page {html} bytes; Chromium load+render at {args.nodes} nodes "
                    f"{page * 1000:.0f} ms (about:blank {blank * 1000:.0f} ms: "
                    f"+{(page - blank) * 1000:.0f} ms)"
                )
        finally:
            stop(proc)
    print(load_average())


if __name__ == "__main__":
    anyio.run(main)

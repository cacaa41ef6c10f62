"""What idle heartbeats cost one store at 1,000 nodes (issue 18: before changing the 15 s default).

    python benchmarks/heartbeat_cost.py [--nodes 1000] [--intervals 5,1] [--idle 20]
                                        [--torch-nodes 16]

**aelastic**: N ``C10dRendezvousHandler`` (tasks of one event loop, standing for N
agents) form one round against ``python -m aelastic store`` in its own process, with
``keep_alive_interval=K`` and ``heartbeat_timeout=3K`` (the defaults' ratio: 5 s / 15 s).
Then, with the round running and nothing changing, for ``--idle`` seconds: the store
requests per second (counted on the client API, fire-and-forget SETs included) and
the store process's CPU (utime + stime from ``/proc``) per second of wall time.

**torch**: ``--torch-nodes`` N torch ``DynamicRendezvousHandler`` (c10d, threads)
against a torch ``TCPStore`` in its own thread, keep-alive interval K: the store's
requests per second while idle (torch's rendezvous cannot form 128 nodes here in
900 s, see ``rendezvous_scale.py``, so it is measured at a small N and per node).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid

import anyio
from rendezvous_scale import Counter, count_client_calls, store_process_pid

_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


async def aelastic_case(n: int, interval: float, idle: float) -> dict[str, float]:
    from aelastic.rendezvous import RendezvousParameters, get_rendezvous_handler

    with store_process_pid() as (pid, port):
        params = RendezvousParameters(
            "c10d",
            f"127.0.0.1:{port}",
            f"hb-{uuid.uuid4().hex[:8]}",
            n,
            n,
            local_addr="127.0.0.1",
            is_host="false",
            join_timeout="300",
            read_timeout="300",
            keep_alive_interval=str(interval),
            heartbeat_timeout=str(3 * interval),
        )
        admitted = Counter(n)
        finish = anyio.Event()
        changed: list[int] = []

        async def node() -> None:
            async with get_rendezvous_handler(params) as h:
                await h.next_rendezvous()
                admitted.tick()
                with anyio.move_on_after(idle + 3 * interval):
                    await h.wait_for_membership_change()
                    changed.append(1)
                await finish.wait()

        with count_client_calls() as (counts, _):
            async with anyio.create_task_group() as tg:
                for _ in range(n):
                    tg.start_soon(node)
                await admitted.done.wait()
                await anyio.sleep(2 * interval)  # past the admission burst
                counts.clear()
                cpu0, own0, t0 = _cpu_seconds(pid), time.process_time(), time.perf_counter()
                await anyio.sleep(idle)
                wall = time.perf_counter() - t0
                cpu, own = _cpu_seconds(pid) - cpu0, time.process_time() - own0
                requests = sum(counts.values())
                finish.set()
    return {
        "nodes": n,
        "interval": interval,
        "requests_per_s": requests / wall,
        "store_cpu_pct": 100 * cpu / wall,
        "nodes_cpu_pct": 100 * own / wall,
        "spurious_changes": len(changed),
    }


def torch_case(n: int, interval: float, idle: float) -> dict[str, float]:
    import threading
    from datetime import timedelta

    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    port = server.port
    calls = [0]
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as backend

    original_get, original_set = backend.C10dRendezvousBackend.get_state, None
    original_set = backend.C10dRendezvousBackend.set_state

    def get_state(self, *a, **k):  # type: ignore[no-untyped-def]
        calls[0] += 1
        return original_get(self, *a, **k)

    def set_state(self, *a, **k):  # type: ignore[no-untyped-def]
        calls[0] += 1
        return original_set(self, *a, **k)

    backend.C10dRendezvousBackend.get_state = get_state  # type: ignore[method-assign]
    backend.C10dRendezvousBackend.set_state = set_state  # type: ignore[method-assign]
    run_id = f"hb-{uuid.uuid4().hex[:8]}"
    handlers = []
    for _ in range(n):
        params = RendezvousParameters(
            "c10d", f"127.0.0.1:{port}", run_id, n, n, local_addr="127.0.0.1",
            is_host=False, keep_alive_interval=interval, join_timeout=600,
        )  # fmt: skip
        handlers.append(get_rendezvous_handler(params))
    threads = [threading.Thread(target=h.next_rendezvous) for h in handlers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(2 * interval)
    calls[0] = 0
    cpu0, t0 = time.process_time(), time.perf_counter()
    time.sleep(idle)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    requests = calls[0]
    for h in handlers:
        h.shutdown()
    del server
    _ = timedelta
    return {
        "nodes": n,
        "interval": interval,
        "requests_per_s": requests / wall,
        "store_cpu_pct": float("nan"),
        "nodes_cpu_pct": 100 * cpu / wall,
        "spurious_changes": 0,
    }


def show(kind: str, r: dict[str, float]) -> None:
    print(
        f"{kind:8} N={int(r['nodes']):5} interval={r['interval']:g}s: "
        f"{r['requests_per_s']:8.1f} req/s ({r['requests_per_s'] / r['nodes']:.2f}/node/s), "
        f"store CPU {r['store_cpu_pct']:.1f}%, nodes' CPU {r['nodes_cpu_pct']:.1f}%, "
        f"spurious membership changes {int(r['spurious_changes'])}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--intervals", default="5,1")
    parser.add_argument("--idle", type=float, default=20.0)
    parser.add_argument("--torch-nodes", type=int, default=16)
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()}", flush=True)
    for interval in (float(x) for x in args.intervals.split(",")):
        show("aelastic", anyio.run(aelastic_case, args.nodes, interval, args.idle))
        if args.torch_nodes:
            show("torch", torch_case(args.torch_nodes, interval, args.idle))
    return 0


if __name__ == "__main__":
    sys.exit(main())

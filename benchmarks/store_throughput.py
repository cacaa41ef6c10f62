"""Store throughput: our StoreServer vs torch's libuv TCPStore server, same torch clients.

    python benchmarks/store_throughput.py [--pairs 12000] [--clients 1,4,16] [--tasks 64]
                                          [--repeat 3] [--no-uvloop | --loop trio]

Each server runs in its own process. K client processes (stock
``torch.distributed.TCPStore`` clients, started once and reused) each do
``pairs / K`` ``set`` + ``get`` pairs, so every run does the same total work;
throughput is total ops / wall time from "go" to the last client's "done".
Each setting starts with an untimed warm-up run per server, then runs
``--repeat`` times alternating the two servers (which one goes first alternates
too) and keeps each server's best run (the machine is shared and noisy); the
ratio of the medians is printed too, and ``--clients 16 --repeat 8`` gives a
steadier K=16 figure. On Linux it also prints each server process's CPU time
per request (user+system, all threads, from ``/proc/<pid>/stat``), which is less
sensitive to other load than throughput: a torch set+get is three requests
(SET, WAIT, GET).
Then our async ``TCPStoreClient`` with 64 concurrent tasks in one process is
compared with one torch client, on both servers.
Prints ops/s and ratios ours/torch.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import time
from typing import IO

import anyio

CLIENT = r"""
import sys, time, datetime
from torch.distributed import TCPStore
cid = sys.argv[1]
print("imported", flush=True)
store = None
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "connect":
        store = TCPStore(cmd[1], int(cmd[2]), is_master=False,
                         timeout=datetime.timedelta(seconds=60))
        print("ready", flush=True)
    elif cmd[0] == "go":
        m = int(cmd[1])
        keys = [f"bench/{cid}/{i % 64}" for i in range(m)]
        value = b"x" * 64
        t0 = time.perf_counter()
        for k in keys:
            store.set(k, value)
            store.get(k)
        print("done", time.perf_counter() - t0, flush=True)
    elif cmd[0] == "quit":
        break
"""

TORCH_SERVER = r"""
import sys, datetime
from torch.distributed import TCPStore
s = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
             timeout=datetime.timedelta(seconds=60))
print("port", s.port, "libuv", s.libuvBackend, flush=True)
sys.stdin.read()
"""


def server_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) used so far by process ``pid``; 0 if unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_average() -> str:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "load average unknown"
    return f"load average {one:.1f} {five:.1f} {fifteen:.1f}"


def _readline(stream: IO[str], expect: str) -> str:
    line = stream.readline()
    if not line.startswith(expect):
        raise RuntimeError(f"expected {expect!r}, got {line!r}")
    return line


def start_torch_server() -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", TORCH_SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = _readline(proc.stdout, "port")
    return proc, int(line.split()[1])


def start_our_server(loop: str) -> tuple[subprocess.Popen[str], int]:
    cmd = [sys.executable, "-m", "aelastic", "store", "--port", "0", "--loop", loop]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = _readline(proc.stdout, "aelastic store listening on")
    return proc, int(line.rsplit(":", 1)[1])


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.stdin is not None:
        proc.stdin.close()
    proc.terminate()
    proc.wait(timeout=30)


class Clients:
    def __init__(self, n: int) -> None:
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-c", CLIENT, str(i)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                bufsize=1,
                env={**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"},
            )
            for i in range(n)
        ]
        for p in self.procs:
            assert p.stdout is not None
            _readline(p.stdout, "imported")

    def _send(self, procs: list[subprocess.Popen[str]], line: str) -> None:
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(line + "\n")
            p.stdin.flush()

    def run(self, k: int, port: int, m: int) -> float:
        """Return ops/s of the first ``k`` clients doing ``m`` set+get each against ``port``."""
        procs = self.procs[:k]
        self._send(procs, f"connect 127.0.0.1 {port}")
        for p in procs:
            assert p.stdout is not None
            _readline(p.stdout, "ready")
        t0 = time.perf_counter()
        self._send(procs, f"go {m}")
        for p in procs:
            assert p.stdout is not None
            _readline(p.stdout, "done")
        elapsed = time.perf_counter() - t0
        return 2 * m * k / elapsed

    def close(self) -> None:
        for p in self.procs:
            try:
                self._send([p], "quit")
                assert p.stdin is not None
                p.stdin.close()
            except OSError:
                pass
        for p in self.procs:
            p.wait(timeout=30)


async def _async_client_run(port: int, tasks: int, m: int) -> float:
    from aelastic.store import TCPStoreClient

    async with TCPStoreClient("127.0.0.1", port, timeout=60) as client:
        value = b"x" * 64

        async def worker(t: int) -> None:
            for i in range(m):
                k = f"abench/{t}/{i % 64}"
                await client.set(k, value)
                await client.get(k)

        await worker(-1)  # warm up (first-use imports, connection pool)
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for t in range(tasks):
                tg.start_soon(worker, t)
        elapsed = time.perf_counter() - t0
    return 2 * m * tasks / elapsed


def async_client_run(port: int, tasks: int, m: int) -> float:
    return anyio.run(_async_client_run, port, tasks, m)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--pairs", type=int, default=12000, help="set+get pairs per run, split over the K clients"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per setting (best kept)")
    parser.add_argument("--clients", default="1,4,16", help="client process counts")
    parser.add_argument("--tasks", type=int, default=64, help="tasks sharing our async client")
    parser.add_argument("--no-uvloop", action="store_true", help="run our server on asyncio")
    parser.add_argument(
        "--loop", choices=("uvloop", "asyncio", "trio"), help="our server's loop (default uvloop)"
    )
    args = parser.parse_args(argv)
    ks = [int(x) for x in args.clients.split(",")]
    m = args.pairs
    loop = args.loop or ("asyncio" if args.no_uvloop else "uvloop")
    if loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
        loop = "asyncio"

    t_start = time.perf_counter()
    clients = Clients(max(ks))
    print(f"started {max(ks)} torch client processes in {time.perf_counter() - t_start:.1f} s")
    torch_proc, torch_port = start_torch_server()
    our_proc, our_port = start_our_server(loop)
    print(f"our server loop: {loop}; {m} set+get pairs per run")
    print(load_average())
    print(
        f"{'clients':>8} {'torch ops/s':>12} {'ours ops/s':>12} {'ours/torch':>10}"
        f" {'(median)':>8} {'server CPU us/request: torch':>29} {'ours':>5}"
    )
    servers = {"torch": (torch_port, torch_proc.pid), "ours": (our_port, our_proc.pid)}
    one_torch: dict[str, float] = {}
    try:
        for k in ks:
            # warm up, then alternate the servers (and which goes first) and keep
            # each one's best run: the machine is shared
            runs: dict[str, list[float]] = {"torch": [], "ours": []}
            cpu = {"torch": 0.0, "ours": 0.0}
            for name in runs:
                clients.run(k, servers[name][0], max(m // k // 10, 1))
            for r in range(args.repeat):
                for name in ("torch", "ours") if r % 2 == 0 else ("ours", "torch"):
                    port, pid = servers[name]
                    c0 = server_cpu(pid)
                    runs[name].append(clients.run(k, port, m // k))
                    cpu[name] += server_cpu(pid) - c0
            theirs, ours = max(runs["torch"]), max(runs["ours"])
            median = statistics.median(runs["ours"]) / statistics.median(runs["torch"])
            # per request: 3 requests per set+get pair, m // k pairs per client
            reqs = 3 * (m // k) * k * args.repeat
            if k == 1:
                one_torch = {"torch": theirs, "ours": ours}
            print(
                f"{k:>8} {theirs:>12,.0f} {ours:>12,.0f} {ours / theirs:>9.2f}x {median:>7.2f}x"
                f" {1e6 * cpu['torch'] / reqs:>29.1f} {1e6 * cpu['ours'] / reqs:>5.1f}",
                flush=True,
            )
        if not one_torch:
            one_torch = {
                "torch": clients.run(1, torch_port, m),
                "ours": clients.run(1, our_port, m),
            }
        per_task = max(m * 2 // args.tasks, 100)
        print(f"\nour async client, {args.tasks} tasks x {per_task} set+get, vs one torch client:")
        for name, port in (("torch", torch_port), ("ours", our_port)):
            rate = max(async_client_run(port, args.tasks, per_task) for _ in range(args.repeat))
            print(
                f"  on {name:>5} server: {rate:>10,.0f} ops/s = "
                f"{rate / one_torch[name]:.2f}x one torch client ({one_torch[name]:,.0f} ops/s)",
                flush=True,
            )
    finally:
        clients.close()
        stop(torch_proc)
        stop(our_proc)
    print(f"\n{load_average()}; total wall time {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""User-space instructions per request of our store server, under callgrind (load-independent).

    python benchmarks/store_instructions.py [--loop uvloop|asyncio|trio] [--clients 16]
                                            [--pairs 300]

The server (``python -m aelastic store``, the tree on ``PYTHONPATH``) runs under
``valgrind --tool=callgrind`` with instrumentation off; it is switched on once the
K stock torch clients are connected, for ``pairs`` set+get pairs each, and off
again. Prints the instructions counted divided by the requests (3 per pair: SET,
WAIT, GET). Unlike CPU time on a shared machine this does not move with load, but
it counts instructions, not cache misses or kernel time (both dominate the real
CPU per request: see RESULTS.md, issue 20). Needs valgrind; takes ~30 s.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

CLIENT = r"""
import sys, datetime
from torch.distributed import TCPStore
store = TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False,
                 timeout=datetime.timedelta(seconds=600))
cid, m = sys.argv[2], int(sys.argv[3])
keys = [f"bench/{cid}/{i}" for i in range(64)]
print("ready", flush=True)
sys.stdin.readline()
for i in range(m):
    store.set(keys[i % 64], b"x" * 64)
    store.get(keys[i % 64])
print("done", flush=True)
sys.stdin.readline()
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loop", default="uvloop", choices=("uvloop", "asyncio", "trio"))
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--pairs", type=int, default=300, help="set+get pairs per client")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
        store = [sys.executable, "-m", "aelastic", "store", "--port", "0", "--loop", args.loop]
        server = subprocess.Popen(
            [*valgrind, f"--callgrind-out-file={out}", *store],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert server.stdout is not None
        port = server.stdout.readline().rsplit(":", 1)[1].strip()
        env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"}
        clients = [
            subprocess.Popen(
                [sys.executable, "-c", CLIENT, port, str(i), str(args.pairs)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for i in range(args.clients)
        ]

        def tell(line: str, expect: str | None) -> None:
            for c in clients:
                assert c.stdin is not None and c.stdout is not None
                c.stdin.write(line + "\n")
                c.stdin.flush()
            for c in clients:
                assert c.stdout is not None
                if expect is not None and not c.stdout.readline().startswith(expect):
                    raise RuntimeError("a client failed")

        try:
            for c in clients:
                assert c.stdout is not None
                if not c.stdout.readline().startswith("ready"):
                    raise RuntimeError("a client failed to connect")
            quiet = {"stdout": subprocess.DEVNULL, "check": True}
            subprocess.run(["callgrind_control", "-i", "on", str(server.pid)], **quiet)
            tell("go", "done")
            subprocess.run(["callgrind_control", "-i", "off", str(server.pid)], **quiet)
            tell("quit", None)
        finally:
            for c in clients:
                c.kill()
                c.wait()
            server.terminate()
            server.wait()
        report = subprocess.run(["callgrind_annotate", out], capture_output=True, text=True).stdout
    match = re.search(r"([\d,]+) \(100.0%\)\s+PROGRAM TOTALS", report)
    if match is None:
        print("no callgrind totals found", file=sys.stderr)
        return 1
    total = int(match.group(1).replace(",", ""))
    requests = 3 * args.clients * args.pairs
    print(f"{args.loop} K={args.clients}: {total / requests:,.0f} instructions/request")
    return 0


if __name__ == "__main__":
    sys.exit(main())

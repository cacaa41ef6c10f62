"""A rendezvous endpoint that is not a store: time to the error, aelastic vs torchrun.

    python benchmarks/not_a_store.py [--join-timeout 5] [--cap 150]

Runs ``torchrun`` and ``python -m aelastic run`` with the same flags
(``--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT --rdzv-conf join_timeout=N``,
one node, one no-op worker) against two servers on loopback that are not stores:

* ``http-400``: answers the first bytes it reads with an HTTP 400 and closes (as uvicorn
  or nginx do with a request line they cannot parse);
* ``silent``: accepts and reads, never answers (as Python's ``http.server`` until a line
  end, or a hung service).

Prints, per launcher and server, the wall time to exit (capped at ``--cap`` seconds,
then killed), the exit code and the last line of its stderr.
"""

from __future__ import annotations

import argparse
import os
import socket
import socketserver
import subprocess
import sys
import threading
import time

HTTP_400 = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


def _serve(reply: bytes | None) -> socketserver.ThreadingTCPServer:
    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            sock: socket.socket = self.request
            try:
                data = sock.recv(4096)
                if reply is not None:
                    sock.sendall(reply)
                    return
                while data:
                    data = sock.recv(4096)
            except OSError:
                pass

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _run(cmd: list[str], cap: float) -> tuple[float, str, str]:
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=cap)
        code = str(proc.returncode)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        code = f"killed at {cap:.0f} s"
    wall = time.perf_counter() - start
    lines = [line for line in err.splitlines() if line.strip()]
    return wall, code, (lines[-1] if lines else "")[:300]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--join-timeout", type=float, default=5.0)
    parser.add_argument("--cap", type=float, default=150.0)
    opts = parser.parse_args()
    launchers = {
        "torchrun": [sys.executable, "-m", "torch.distributed.run"],
        "aelastic": [sys.executable, "-m", "aelastic", "run"],
    }
    print(f"load average: {os.getloadavg()}")
    for kind, reply in (("http-400", HTTP_400), ("silent", None)):
        server = _serve(reply)
        port = server.server_address[1]
        for name, prefix in launchers.items():
            cmd = [
                *prefix,
                "--nnodes",
                "1",
                "--nproc-per-node",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-conf",
                f"join_timeout={opts.join_timeout:g}",
                "--max-restarts",
                "0",
                "--no-python",
                "/bin/true",
            ]
            wall, code, last = _run(cmd, opts.cap)
            print(f"{kind:9} {name:9} {wall:7.2f} s  exit {code}\n    {last}")
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    main()

"""A non-torch worker for job-handle tests; it talks to the test over TCP, never sleeps.

    job_worker.py PORT [--fail-first] [--wait]

Connects to 127.0.0.1:PORT and sends ``ready <local_rank> <restart_count> <pid>``.
``--fail-first``: local rank 0 of the first attempt exits 5. ``--wait``: reports each
SIGUSR1 as ``usr1 <local_rank>`` and runs until the test sends ``exit <code>`` (or
closes the connection: exit 0); SIGTERM ends it as usual. Otherwise it exits 0.
"""

from __future__ import annotations

import os
import signal
import socket
import sys


def main(argv: list[str]) -> int:
    port = int(argv[0])
    rank = os.environ["LOCAL_RANK"]
    restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
    conn = socket.create_connection(("127.0.0.1", port))
    if "--wait" in argv:  # before 'ready': the test may signal as soon as it reads it
        signal.signal(signal.SIGUSR1, lambda *_: conn.sendall(f"usr1 {rank}\n".encode()))
    conn.sendall(f"ready {rank} {restart} {os.getpid()}\n".encode())
    if "--fail-first" in argv and restart == "0" and rank == "0":
        return 5
    if "--wait" not in argv:
        return 0
    data = b""
    while b"\n" not in data:
        chunk = conn.recv(64)
        if not chunk:
            return 0
        data += chunk
    return int(data.split()[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

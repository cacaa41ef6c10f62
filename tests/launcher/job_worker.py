"""A non-torch worker for job-handle tests; it talks to the test over TCP, never sleeps.

    job_worker.py PORT [--fail-first] [--hang-first] [--wait] [--hello]

Connects to 127.0.0.1:PORT and sends ``ready <local_rank> <restart_count> <pid>``.
``--fail-first``: local rank 0 of the first attempt exits 5. ``--wait``: reports each
SIGUSR1 as ``usr1 <local_rank>`` and runs until the test sends ``exit <code>`` (or
closes the connection: exit 0); SIGTERM ends it as usual. ``--hang-first``: local rank
0 of the first attempt sends one ``aelastic.progress`` heartbeat (and ``beat 0``), then
hangs: waits for the test (exits 0 when it sends anything). Otherwise it exits 0.
``--hello``: first sends ``hello <restart_count> <pid> <warm> <AELASTIC_JOB_VAR> <cwd>``
(``warm``: 1 in a pre-started interpreter; the variable ``-`` when unset).
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
    if "--hello" in argv:  # what a service gave it: environment, cwd, warm interpreter
        with open("/proc/self/cmdline", "rb") as fp:
            warm = int(b"_warm_boot" in fp.read())
        var = os.environ.get("AELASTIC_JOB_VAR", "-")
        conn.sendall(f"hello {restart} {os.getpid()} {warm} {var} {os.getcwd()}\n".encode())
    if "--wait" in argv:  # before 'ready': the test may signal as soon as it reads it
        signal.signal(signal.SIGUSR1, lambda *_: conn.sendall(f"usr1 {rank}\n".encode()))
    conn.sendall(f"ready {rank} {restart} {os.getpid()}\n".encode())
    if "--fail-first" in argv and restart == "0" and rank == "0":
        return 5
    if "--hang-first" in argv and restart == "0" and rank == "0":
        from aelastic.progress import heartbeat

        heartbeat()
        conn.sendall(f"beat {rank}\n".encode())
        conn.recv(64)  # the test never answers: hung until the agent stops it
        return 0
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

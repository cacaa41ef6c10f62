"""A non-torch worker that makes ``aelastic.progress`` steps and talks to the test over TCP.

    step_worker.py PORT [--fail-once FILE]

Connects to 127.0.0.1:PORT and makes a step every 20 ms, sending
``stepped <global_rank> <restart_count> <pid> <step>`` after every 5th, until the test sends
``exit <code>`` (or closes the connection: exit 0). ``--fail-once FILE``: the first
worker of global rank 1 to create FILE exits 3 once it has sent ``stepped`` (so the
job fails once, whichever node holds rank 1 after the restart).
"""

from __future__ import annotations

import os
import socket
import sys

from aelastic.progress import step


def _first(path: str) -> bool:
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def main(argv: list[str]) -> int:
    rank = os.environ["RANK"]
    restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
    conn = socket.create_connection(("127.0.0.1", int(argv[0])))
    conn.settimeout(0.02)  # the pace of the steps: a recv that times out is one step
    steps = 0
    data = b""
    while b"\n" not in data:
        try:
            chunk = conn.recv(64)
        except TimeoutError:
            steps += 1
            step(steps)
            if steps % 5 == 0:
                conn.sendall(f"stepped {rank} {restart} {os.getpid()} {steps}\n".encode())
                if steps == 5 and "--fail-once" in argv and rank == "1" and _first(argv[-1]):
                    return 3
            continue
        if not chunk:
            return 0
        data += chunk
    return int(data.split()[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

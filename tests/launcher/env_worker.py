"""A worker reporting what a service gives it; it talks to the test over TCP, never sleeps.

    env_worker.py PORT

Connects to 127.0.0.1:PORT, sends ``hello <restart_count> <pid> <warm> <AELASTIC_JOB_VAR>
<cwd>`` (``warm``: 1 when it runs in a pre-started interpreter; the variable ``-`` when
unset), then exits with the code the test sends as ``exit <code>`` (0 when it closes).
"""

from __future__ import annotations

import os
import socket
import sys


def main(port: int) -> int:
    conn = socket.create_connection(("127.0.0.1", port))
    with open("/proc/self/cmdline", "rb") as fp:
        warm = int(b"_warm_boot" in fp.read())
    restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
    var = os.environ.get("AELASTIC_JOB_VAR", "-")
    conn.sendall(f"hello {restart} {os.getpid()} {warm} {var} {os.getcwd()}\n".encode())
    data = b""
    while b"\n" not in data:
        chunk = conn.recv(64)
        if not chunk:
            return 0
        data += chunk
    return int(data.split()[1])


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))

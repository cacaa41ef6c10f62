"""A torch-free worker for the agent tests, steered over TCP by the test.

It connects to ``127.0.0.1:<port>`` (``--report``), sends one JSON line (its pid and
torchrun environment), then follows ``--mode``:

* ``hold``: wait for one command byte from the test: ``0``-``9`` exits with that
  code; EOF exits 0.
* ``fail-first``: exit ``--code`` if ``TORCHELASTIC_RESTART_COUNT == 0`` and local rank
  0, else ``hold``.
* ``exit``: exit ``--code`` at once.
* ``ignore-term``: ignore SIGTERM, then ``hold``.
"""

import argparse
import json
import os
import signal
import socket
import sys

KEYS = (
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "OMP_NUM_THREADS",
)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--report", type=int, required=True)
    parser.add_argument("--mode", default="hold")
    parser.add_argument("--code", type=int, default=3)
    args = parser.parse_args()
    if args.mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.create_connection(("127.0.0.1", args.report))
    info = {"pid": os.getpid(), "env": {k: os.environ.get(k) for k in KEYS}}
    sock.sendall(json.dumps(info).encode() + b"\n")
    first = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["LOCAL_RANK"] == "0"
    if args.mode == "exit" or (args.mode == "fail-first" and first):
        return int(args.code)
    data = sock.recv(1)
    return int(data) if data else 0


if __name__ == "__main__":
    sys.exit(main())

"""A tiny non-torch worker for launcher tests: records its environment, then acts.

    node_worker.py OUT_DIR [--finish-at-world N] [--when-file PATH] [--exit-code C]
                   [--notify PORT] [--tag TAG] [--fail-first C] [--hold-once PATH]

Writes ``OUT_DIR/<rank>-<world>-<restart>-<pid>.json`` with the torchelastic variables
and prints ``READY rank=R world=W`` (flushed). Then exits with ``--exit-code``, except
with ``--finish-at-world N`` when WORLD_SIZE != N (or, with ``--when-file``, while
that file does not exist): it then waits (at most 60 s) to be stopped by the agent,
which a membership change does. On its first run (TORCHELASTIC_RESTART_COUNT 0),
``--fail-first C`` exits C at once. ``--hold-once PATH``: the first worker to run with it
creates PATH, waits (at most 60 s) to be stopped and takes 2 s to exit once SIGTERM
asks it to (its agent rejoins that much later); later ones act as without it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

KEYS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_SIGNALS_TO_HANDLE",
    "OMP_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "TORCHELASTIC_ERROR_FILE",
)


def main(argv: list[str]) -> int:
    out = argv[0]
    opts = dict(zip(argv[1::2], argv[2::2], strict=False))
    env = {k: os.environ.get(k) for k in KEYS}
    env["argv"] = argv  # type: ignore[assignment]
    env["tag"] = opts.get("--tag")
    rank, world = env["RANK"], env["WORLD_SIZE"]
    name = f"{rank}-{world}-{env['TORCHELASTIC_RESTART_COUNT']}-{os.getpid()}.json"
    tmp = os.path.join(out, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(env, f)
    os.replace(tmp, os.path.join(out, name))
    # One write per line: under ``python -u`` print() writes the text and the newline
    # separately, and two workers sharing the console pipe can interleave between them.
    sys.stdout.write(f"READY rank={rank} world={world}\n")
    sys.stdout.flush()
    notify = opts.get("--notify")  # a test's TCP listener on 127.0.0.1: send our pid
    if notify is not None:
        import socket

        with socket.create_connection(("127.0.0.1", int(notify))) as conn:
            conn.sendall(f"{os.getpid()}\n".encode())
    if env["TORCHELASTIC_RESTART_COUNT"] == "0" and "--fail-first" in opts:
        return int(opts["--fail-first"])
    hold = opts.get("--hold-once")
    if hold is not None and not os.path.exists(hold):
        open(hold, "w").close()

        def slow_exit(signum: int, frame: object) -> None:
            time.sleep(2)
            sys.exit(143)

        signal.signal(signal.SIGTERM, slow_exit)
        end = time.monotonic() + 60
        while time.monotonic() < end:
            time.sleep(0.05)
        return 3
    finish = opts.get("--finish-at-world")
    marker = opts.get("--when-file")

    def done() -> bool:
        return (finish is None or world == finish) and (marker is None or os.path.exists(marker))

    deadline = time.monotonic() + 60
    while not done():
        if time.monotonic() > deadline:
            return 3
        time.sleep(0.05)
    return int(opts.get("--exit-code", "0"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

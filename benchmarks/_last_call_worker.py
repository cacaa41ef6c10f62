"""The worker of ``benchmarks/last_call.py`` (imports no torch).

    _last_call_worker.py OUT NODE

Appends its start time (``time.time()``) to ``OUT/NODE.log`` first thing. Its node's
first worker: on node ``b`` exits 1 at once; elsewhere waits (at most 300 s) to be
stopped. Every later worker exits 0.
"""

from __future__ import annotations

import os
import sys
import time


def main(out: str, node: str) -> int:
    now = time.time()
    path = os.path.join(out, f"{node}.log")
    with open(path, "a") as f:
        f.write(f"{now!r}\n")
    with open(path) as f:
        first = len(f.read().split()) == 1
    if not first:
        return 0
    if node == "b":
        return 1
    end = time.monotonic() + 300
    while time.monotonic() < end:
        time.sleep(0.05)
    return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))

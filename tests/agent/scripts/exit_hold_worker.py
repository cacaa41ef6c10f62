"""A worker for the exiting-is-not-hung tests: ``exit_hold_worker.py MODE DIR``.

Rank 0 reports step 1, writes the time of that report to ``DIR/r0_step`` and ends its
script; an ``atexit`` handler then touches ``DIR/r0_exiting`` and holds the interpreter's
shutdown until ``DIR/release`` exists (the test controls it). Rank 1 heartbeats until
rank 0 is held in its shutdown, then, in MODE ``clean``, goes on heartbeating until
``DIR/release`` exists and exits 0; in MODE ``hung``, reports step 1 and hangs for good.
"""

import atexit
import os
import sys
import threading
import time
from pathlib import Path

from aelastic.progress import heartbeat, step

MODE = sys.argv[1]
DIR = Path(sys.argv[2])
RANK = int(os.environ["LOCAL_RANK"])
BOUND = time.monotonic() + 120  # never outlive a failed test by much


def beat_until(path: Path) -> None:
    while not path.exists() and time.monotonic() < BOUND:
        heartbeat()
        time.sleep(0.05)


def held() -> None:
    (DIR / "r0_exiting").touch()
    while not (DIR / "release").exists() and time.monotonic() < BOUND:
        time.sleep(0.05)


if RANK == 0:
    step(1)
    (DIR / "r0_step.tmp").write_text(str(time.monotonic_ns()))
    os.rename(DIR / "r0_step.tmp", DIR / "r0_step")
    atexit.register(held)
else:
    beat_until(DIR / "r0_exiting")
    if MODE == "clean":
        beat_until(DIR / "release")
    else:
        step(1)
        threading.Event().wait()

"""Worker of the hung-rank benchmark (``benchmarks/_nvrx_hang.py``), for aelastic and NVRx.

    HANG_DIR=DIR HANG_API=aelastic|nvrx <launcher> ... _hang_worker.py

Every file it writes in ``HANG_DIR`` holds one wall-clock time (``time.time()``, repr):

- ``start_<attempt>_<rank>``: the script's first statement, on every attempt.
- ``last_beat``: rank 1, attempt 0: the time of its last heartbeat, written right after
  it; then it waits forever inside ``hung_in_allreduce()`` (no more heartbeats).
- ``signal_<attempt>_<rank>_<SIGNAME>``: when a SIGTERM/SIGINT/SIGCONT handler ran (the
  time the launcher acted on this worker); SIGTERM and SIGINT then exit 143 / 130.

Attempt 0: heartbeat every 50 ms for 0.5 s (steady state), then rank 1 hangs and the other
ranks keep heartbeating until the launcher stops them. Attempt >= 1: write the start time and
exit 0 at once (no heartbeat client, so nothing is imported: the restart is timed to the
first statement). The attempt is ``TORCHELASTIC_RESTART_COUNT``, which both launchers set.
"""

import time

T0 = time.time()

import importlib  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402

DIR = os.environ["HANG_DIR"]
RANK = int(os.environ["RANK"])
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _write(name: str, value: float) -> None:
    tmp = os.path.join(DIR, f".{name}.tmp")
    with open(tmp, "w") as f:
        f.write(repr(value))
    os.replace(tmp, os.path.join(DIR, name))


_write(f"start_{ATTEMPT}_{RANK}", T0)
if ATTEMPT > 0:
    sys.exit(0)


def _on_signal(signum: int, _frame: object) -> None:
    _write(f"signal_{ATTEMPT}_{RANK}_{signal.Signals(signum).name}", time.time())
    if signum != signal.SIGCONT:
        os._exit(128 + signum)


for _sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCONT):
    signal.signal(_sig, _on_signal)

# Imported by name: each API lives only in its own launcher's interpreter.
if os.environ["HANG_API"] == "nvrx":
    _client = importlib.import_module("nvidia_resiliency_ext.fault_tolerance").RankMonitorClient()
    _client.init_workload_monitoring()
    beat = _client.send_heartbeat
else:
    beat = importlib.import_module("aelastic.progress").heartbeat


def hung_in_allreduce() -> None:
    """Where the hung rank waits forever: its stacks should name this function."""
    threading.Event().wait()


for _ in range(10):
    beat()
    time.sleep(0.05)
if RANK == 1:
    beat()
    _write("last_beat", time.time())
    hung_in_allreduce()
while True:
    beat()
    time.sleep(0.05)

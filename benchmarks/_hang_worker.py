"""Worker of the hung-rank benchmark (``benchmarks/hang_detection.py``), for aelastic and NVRx.

    HANG_DIR=DIR HANG_API=aelastic|nvrx [HANG_STEADY=SECONDS] <launcher> ... _hang_worker.py

Every file it writes in ``HANG_DIR`` holds one number (``repr``); times are wall clock
(``time.time()``):

- ``start_<attempt>_<rank>``: the script's first statement, on every attempt.
- ``beat_cost``: rank 0, attempt 0: seconds per heartbeat call, the best of 5 batches
  (20 000 calls for aelastic, 400 for NVRx) timed right after its heartbeat client is up.
- ``last_beat``: rank 1, attempt 0: the time of its last heartbeat, written right after
  it; then it waits forever inside ``hung_in_allreduce()`` (no more heartbeats).
- ``signal_<attempt>_<rank>_<SIGNAME>``: when a SIGTERM/SIGINT/SIGCONT handler ran (the
  time the launcher acted on this worker); SIGTERM and SIGINT then exit 143 / 130.
- ``ready_<pid>``: (``HANG_STEADY`` only) the heartbeat client is up; the name gives the
  worker's pid, so a sampler can tell workers from the launcher's helper processes.

Attempt 0: heartbeat every 50 ms for 0.5 s (steady state), then rank 1 hangs and the other
ranks keep heartbeating until the launcher stops them. Attempt >= 1: write the start time and
exit 0 at once (no heartbeat client, so nothing is imported: the restart is timed to the
first statement). The attempt is ``TORCHELASTIC_RESTART_COUNT``, which both launchers set.
With ``HANG_STEADY``, no rank hangs: every rank heartbeats every 10 ms for that many
seconds, then exits 0 (the launcher's steady-state CPU is sampled meanwhile).
"""

import time

T0 = time.time()

import importlib  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402

DIR = os.environ["HANG_DIR"]
API = os.environ["HANG_API"]
RANK = int(os.environ["RANK"])
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
STEADY = float(os.environ.get("HANG_STEADY", "0"))


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
if API == "nvrx":
    _client = importlib.import_module("nvidia_resiliency_ext.fault_tolerance").RankMonitorClient()
    _client.init_workload_monitoring()
    beat = _client.send_heartbeat
else:
    beat = importlib.import_module("aelastic.progress").heartbeat

if STEADY:
    _write(f"ready_{os.getpid()}", time.time())
    end = time.time() + STEADY
    while time.time() < end:
        beat()
        time.sleep(0.01)
    sys.exit(0)


def hung_in_allreduce() -> None:
    """Where the hung rank waits forever: its stacks should name this function."""
    threading.Event().wait()


if RANK == 0:  # the per-call cost with a live launcher; best batch, the machine is shared
    n = 400 if API == "nvrx" else 20000
    costs = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            beat()
        costs.append((time.perf_counter() - t) / n)
    _write("beat_cost", min(costs))
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

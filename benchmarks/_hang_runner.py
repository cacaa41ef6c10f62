"""Hung rank: run aelastic or NVRx ``ft_launcher`` on ``_hang_worker.py`` and time it.

The one runner behind ``benchmarks/hang_detection.py`` (the entry point; see its
docstring for what is measured and how to call it)::

    aelastic_launcher(nproc=2, timeout=2.0, *, python=sys.executable) -> Launcher
    nvrx_launcher(nproc=2, timeout=2.0, *, check_interval=None, venv=None) -> Launcher
    hang_run(launcher, nproc) -> dict[str, float]        # one run, in a fresh directory
    summary(launcher, runs) -> dict                      # medians of runs of one launcher
    open_steady(launcher, seconds, d) -> Popen           # heartbeating job, no hang

Commands (``--max-restarts 1``, an initial-heartbeat timeout of 60 s so that interpreter
and torch start-up under load are not what is measured)::

    python -m aelastic run --standalone --nproc-per-node 2 --max-restarts 1 \\
        --heartbeat-timeout 2 --initial-heartbeat-timeout 60 \\
        --event-log-handler file _hang_worker.py
    ft_launcher --standalone --nproc-per-node 2 --max-restarts 1 \\
        --ft-rank-heartbeat-timeout 2 --ft-initial-rank-heartbeat-timeout 60 _hang_worker.py

Per run, from the hung rank's last heartbeat (all wall clock, one machine):

``detect_s``
    to the launcher's own record of the decision. NVRx: the rank monitor's warning
    ``[Cycle 0] Did not get subsequent heartbeat. Waited 2.00 seconds.`` (``asctime``, ms
    resolution; it is logged right before the monitor sends SIGCONT+SIGKILL to the rank).
    aelastic: the ``aelastic.progress.hang`` event's ``detected_at``. This is the cleanest
    observable: the hung rank itself cannot report it, since NVRx's default termination
    signal is SIGKILL, sent right after SIGCONT (no handler gets to run), and changing
    ``--ft-rank-termination-signal`` would change what is measured.
    Note that NVRx's "Waited 2.00 seconds" prints the configured timeout, not the time
    waited: its rank monitor checks the deadline only every ``workload_check_interval``
    (default 5 s), so detection lands anywhere in [timeout, timeout + 5 s].
``peer_stopped_s``
    to the moment a healthy peer's SIGTERM handler ran (the launcher stopping the group):
    the same worker-side observable for both launchers, a cross-check of ``detect_s``.
``recover_s``
    to the first statement of the LAST restarted worker (attempt 1): workers running.

Also per run (not intervals): ``beat_us``, one heartbeat call in rank 0 (best of 5
batches, attempt 0); and for aelastic ``stacks``, 1.0 when the hung rank's
``attempt_0/1/stacks.txt`` names ``hung_in_allreduce`` (else 0.0).

Errors: a run whose launcher exits non-zero, or does not finish within ``RUN_TIMEOUT``
s, or lacks one of the observables, raises ``RuntimeError`` with the launcher's output
tail (never a hang).

NVRx comes from ``benchmarks/nvrx_setup.sh``, which builds a separate venv on demand (the
0.7.0 wheel is cp312-only and is retagged there, benchmark only: never a dependency of
aelastic, and no NVRx code is committed).
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORKER = HERE / "_hang_worker.py"
NVRX_SETUP = HERE / "nvrx_setup.sh"
DEFAULT_NVRX_VENV = Path(os.environ.get("NVRX_VENV", "/work/nvrx-venv"))

#: The event whose ``metadata["detected_at"]`` (``time.time()``) is aelastic's decision.
AELASTIC_HANG_EVENT = "aelastic.progress.hang"
#: Start-up allowance before the first heartbeat (not what is measured).
INITIAL_TIMEOUT = 60.0
#: Bound on one launcher run (detection + restart + NVRx's exit delays, under load).
RUN_TIMEOUT = 180.0
HUNG_RANK = 1

NVRX_DETECTED = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*Did not get subsequent heartbeat", re.M
)


@dataclass(frozen=True)
class Launcher:
    """How to run one launcher on the worker, and how to read its decision."""

    name: str
    #: the command, without the worker script
    cmd: list[str]
    env: dict[str, str]
    #: (launcher output, run directory) -> {"detected": wall time, **other observables}
    observe: Callable[[str, Path], dict[str, float]]

    @property
    def command(self) -> str:
        return " ".join([*self.cmd, WORKER.name])


@functools.cache
def _nvrx_ft_launcher(venv: Path) -> Path:
    """The ``ft_launcher`` of NVRx's venv, built by ``nvrx_setup.sh`` when missing.

    Cached per venv. Raises ``RuntimeError`` with the setup's output if it cannot be built
    (bounded: 15 min).
    """
    try:
        proc = subprocess.run(
            ["bash", str(NVRX_SETUP), str(venv)],
            capture_output=True,
            text=True,
            timeout=900,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"NVRx setup took over 15 min; run `bash {NVRX_SETUP} {venv}` to see where"
        ) from None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"NVRx setup failed (exit {proc.returncode}); run `bash {NVRX_SETUP} {venv}` "
            f"to see why:\n{proc.stderr[-3000:]}"
        )
    return Path(lines[-1])


def _clean_env() -> dict[str, str]:
    """The caller's environment without launcher variables that would leak into the runs."""
    drop = ("AELASTIC_", "PET_", "TORCHELASTIC_", "HANG_")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def _nvrx_observe(output: str, _d: Path) -> dict[str, float]:
    m = NVRX_DETECTED.search(output)
    if m is None:
        raise RuntimeError("NVRx logged no 'Did not get subsequent heartbeat'")
    return {"detected": datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()}


def _aelastic_observe(_output: str, d: Path) -> dict[str, float]:
    events = d / "events.jsonl"
    for line in events.read_text().splitlines():
        event = json.loads(line)
        if event.get("name") == AELASTIC_HANG_EVENT:
            detected = float(event["metadata"]["detected_at"])
            break
    else:
        raise RuntimeError(f"no {AELASTIC_HANG_EVENT} event in {events}")
    # the default log dir is under TMPDIR, which is the run directory
    hung = os.path.join("attempt_0", str(HUNG_RANK))
    named = any(
        "hung_in_allreduce" in (Path(root) / "stacks.txt").read_text()
        for root, _dirs, files in os.walk(d)
        if root.endswith(hung) and "stacks.txt" in files
    )
    return {"detected": detected, "stacks": 1.0 if named else 0.0}


def nvrx_launcher(
    nproc: int = 2,
    timeout: float = 2.0,
    *,
    check_interval: float | None = None,
    venv: Path | None = None,
) -> Launcher:
    """NVRx ``ft_launcher`` 0.7.0, its venv built on first use (``nvrx_setup.sh``).

    ``check_interval``: ``--ft-workload-check-interval`` (how often each rank monitor looks
    at the deadline); None keeps NVRx's default (5 s), what its users get. Raises
    ``RuntimeError`` when the venv cannot be built.
    """
    cmd = [
        str(_nvrx_ft_launcher(venv or DEFAULT_NVRX_VENV)),
        "--standalone",
        "--nproc-per-node", str(nproc),
        "--max-restarts", "1",
        "--ft-rank-heartbeat-timeout", f"{timeout:g}",
        "--ft-initial-rank-heartbeat-timeout", f"{INITIAL_TIMEOUT:g}",
    ]  # fmt: skip
    if check_interval is not None:
        cmd += ["--ft-workload-check-interval", f"{check_interval:g}"]
    name = "nvrx" if check_interval is None else f"nvrx (check every {check_interval:g} s)"
    return Launcher(name, cmd, {**_clean_env(), "HANG_API": "nvrx"}, _nvrx_observe)


def aelastic_launcher(
    nproc: int = 2, timeout: float = 2.0, *, python: str = sys.executable
) -> Launcher:
    """``python -m aelastic run`` of the interpreter ``python`` (its installed aelastic)."""
    cmd = [
        python, "-m", "aelastic", "run",
        "--standalone",
        "--nproc-per-node", str(nproc),
        "--max-restarts", "1",
        "--heartbeat-timeout", f"{timeout:g}",
        "--initial-heartbeat-timeout", f"{INITIAL_TIMEOUT:g}",
        "--event-log-handler", "file",
    ]  # fmt: skip
    return Launcher("aelastic", cmd, {**_clean_env(), "HANG_API": "aelastic"}, _aelastic_observe)


def _read(path: Path) -> float:
    return float(path.read_text())


def _run_env(launcher: Launcher, d: str) -> dict[str, str]:
    return {
        **launcher.env,
        "HANG_DIR": d,
        "AELASTIC_EVENTS_FILE": os.path.join(d, "events.jsonl"),
        "TMPDIR": d,  # the launchers' own log dirs go away with the run
    }


def hang_run(launcher: Launcher, nproc: int) -> dict[str, float]:
    """One run in a fresh directory -> the observables the module names (seconds, us)."""
    with tempfile.TemporaryDirectory(prefix="hang-") as tmp:
        d = Path(tmp)
        proc = subprocess.Popen(
            [*launcher.cmd, str(WORKER)],
            env=_run_env(launcher, tmp),
            cwd=tmp,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = proc.communicate(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            raise RuntimeError(
                f"{launcher.name} did not finish in {RUN_TIMEOUT} s:\n{output[-3000:]}"
            ) from None
        try:
            if proc.returncode != 0:
                raise RuntimeError(f"exit code {proc.returncode}")
            last = _read(d / "last_beat")
            peers = [_read(d / f"signal_0_{r}_SIGTERM") for r in range(nproc) if r != HUNG_RANK]
            running = max(_read(d / f"start_1_{r}") for r in range(nproc))
            observed = launcher.observe(output, d)
            return {
                "detect_s": observed.pop("detected") - last,
                "peer_stopped_s": min(peers) - last,
                "recover_s": running - last,
                "beat_us": _read(d / "beat_cost") * 1e6,
                **observed,
            }
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            files = sorted(p.name for p in d.iterdir())
            raise RuntimeError(
                f"{launcher.command}: {e}; files: {files}\n--- output tail ---\n{output[-4000:]}"
            ) from e


def summary(launcher: Launcher, runs: list[dict[str, float]]) -> dict[str, Any]:
    """``runs`` of one launcher with the median of every observable."""
    medians = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    return {"launcher": launcher.name, "command": launcher.command, "runs": runs, **medians}


def open_steady(launcher: Launcher, seconds: float, d: str) -> subprocess.Popen[bytes]:
    """Start ``launcher`` with its workers heartbeating every 10 ms for ``seconds``.

    Runs in ``d`` in a new session (stop it with ``os.killpg``); each worker writes
    ``ready_<pid>`` in ``d`` once its heartbeat client is up. Never hangs: it only starts.
    """
    env = {**_run_env(launcher, d), "HANG_STEADY": f"{seconds:g}"}
    return subprocess.Popen(
        [*launcher.cmd, str(WORKER)],
        env=env,
        cwd=d,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

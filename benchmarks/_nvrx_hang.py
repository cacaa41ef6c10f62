"""Hung rank, heartbeat timeout 2 s: NVRx ``ft_launcher`` and aelastic measured the same way.

    python benchmarks/_nvrx_hang.py [--repeats 5] [--only nvrx|nvrx-fast|aelastic]
                                    [--nvrx-venv DIR] [--aelastic-python PY]

Library use (``benchmarks/hang_detection.py`` can call these)::

    measure_nvrx(repeats, nproc=2, timeout=2.0, *, check_interval=None, venv=None) -> dict
    measure_aelastic(repeats, nproc=2, timeout=2.0, *, python=sys.executable) -> dict
    combine([result, ...]) -> dict   # results of one launcher merged (interleaved runs)

The job (``benchmarks/_hang_worker.py``, the same file for both): every rank heartbeats
every 50 ms for 0.5 s; on attempt 0, rank 1 then beats once more, writes the wall time of
that last heartbeat, and waits forever in ``hung_in_allreduce()``; the other ranks keep
heartbeating. On attempt 1 every worker writes the time of its first statement and exits 0.
Commands (``--max-restarts 1``, an initial-heartbeat timeout of 60 s so that interpreter
and torch start-up under load are not what is measured)::

    ft_launcher --standalone --nproc-per-node 2 --max-restarts 1 \\
        --ft-rank-heartbeat-timeout 2 --ft-initial-rank-heartbeat-timeout 60 _hang_worker.py
    python -m aelastic run --standalone --nproc-per-node 2 --max-restarts 1 \\
        --heartbeat-timeout 2 --initial-heartbeat-timeout 60 \\
        --event-log-handler file _hang_worker.py

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

Each result dict: ``launcher``, ``command`` (str), ``runs`` (per-run dicts with the three
keys above), the medians ``detect_s``, ``peer_stopped_s``, ``recover_s``, and ``load``
(1-min load average before the first and after the last run). Errors: a run whose
launcher exits non-zero, or does not finish within ``RUN_TIMEOUT`` s, or lacks one of the
observables, raises ``RuntimeError`` with the launcher's output tail (never a hang).

NVRx comes from ``benchmarks/nvrx_setup.sh``, which builds a separate venv on demand (the
0.7.0 wheel is cp312-only and is retagged there, benchmark only: never a dependency of
aelastic, and no NVRx code is committed).
"""

from __future__ import annotations

import argparse
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
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORKER = HERE / "_hang_worker.py"
NVRX_SETUP = HERE / "nvrx_setup.sh"
DEFAULT_NVRX_VENV = Path(os.environ.get("NVRX_VENV", "/work/nvrx-venv"))

#: aelastic's hang-detection flags (h/progress: aelastic/progress/_options.py).
AELASTIC_HEARTBEAT_TIMEOUT_FLAG = "--heartbeat-timeout"
AELASTIC_INITIAL_HEARTBEAT_TIMEOUT_FLAG = "--initial-heartbeat-timeout"
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


@functools.cache
def nvrx_launcher(venv: Path | None = None) -> Path:
    """The ``ft_launcher`` of NVRx's venv, built by ``nvrx_setup.sh`` when missing.

    Cached per venv. Raises ``RuntimeError`` with the setup's output if it cannot be built
    (bounded: 15 min).
    """
    venv = venv or DEFAULT_NVRX_VENV
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


def _read_time(path: Path) -> float:
    return float(path.read_text())


def _load() -> float:
    return os.getloadavg()[0]


def _one_run(
    cmd: list[str],
    env: dict[str, str],
    nproc: int,
    detected: Callable[[str, Path], float],
) -> dict[str, float]:
    """One launcher run in a fresh directory -> the three intervals (seconds)."""
    with tempfile.TemporaryDirectory(prefix="hang-") as tmp:
        d = Path(tmp)
        run_env = {
            **env,
            "HANG_DIR": tmp,
            "AELASTIC_EVENTS_FILE": str(d / "events.jsonl"),
            "TMPDIR": tmp,  # the launchers' own log dirs go away with the run
        }
        proc = subprocess.Popen(
            [*cmd, str(WORKER)],
            env=run_env,
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
                f"{cmd[0]} did not finish in {RUN_TIMEOUT} s:\n{output[-3000:]}"
            ) from None
        try:
            if proc.returncode != 0:
                raise RuntimeError(f"exit code {proc.returncode}")
            last = _read_time(d / "last_beat")
            peers = [
                _read_time(d / f"signal_0_{r}_SIGTERM") for r in range(nproc) if r != HUNG_RANK
            ]
            running = max(_read_time(d / f"start_1_{r}") for r in range(nproc))
            return {
                "detect_s": detected(output, d) - last,
                "peer_stopped_s": min(peers) - last,
                "recover_s": running - last,
            }
        except (OSError, ValueError, RuntimeError) as e:
            files = sorted(p.name for p in d.iterdir())
            raise RuntimeError(
                f"{' '.join(cmd)}: {e}; files: {files}\n--- output tail ---\n{output[-4000:]}"
            ) from e


def _measure(
    launcher: str,
    cmd: list[str],
    env: dict[str, str],
    repeats: int,
    nproc: int,
    detected: Callable[[str, Path], float],
) -> dict[str, Any]:
    load_before = _load()
    runs = []
    for i in range(repeats):
        r = _one_run(cmd, env, nproc, detected)
        print(
            f"  {launcher} run {i}: " + ", ".join(f"{k}={v:.3f}" for k, v in r.items()),
            file=sys.stderr,
            flush=True,
        )
        runs.append(r)
    return _summary(launcher, " ".join([*cmd, "_hang_worker.py"]), runs, (load_before, _load()))


def _summary(
    launcher: str, command: str, runs: list[dict[str, float]], load: tuple[float, float]
) -> dict[str, Any]:
    medians = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    return {"launcher": launcher, "command": command, "runs": runs, **medians, "load": load}


def combine(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several results of one launcher (e.g. interleaved single runs) as one result."""
    runs = [r for res in results for r in res["runs"]]
    load = (results[0]["load"][0], results[-1]["load"][1])
    return _summary(results[0]["launcher"], results[0]["command"], runs, load)


def _nvrx_detected(output: str, _d: Path) -> float:
    m = NVRX_DETECTED.search(output)
    if m is None:
        raise RuntimeError("NVRx logged no 'Did not get subsequent heartbeat'")
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _aelastic_detected(_output: str, d: Path) -> float:
    events = d / "events.jsonl"
    for line in events.read_text().splitlines():
        event = json.loads(line)
        if event.get("name") == AELASTIC_HANG_EVENT:
            return float(event["metadata"]["detected_at"])
    raise RuntimeError(f"no {AELASTIC_HANG_EVENT} event in {events}")


def _clean_env() -> dict[str, str]:
    """The caller's environment without launcher variables that would leak into the runs."""
    drop = ("AELASTIC_", "PET_", "TORCHELASTIC_", "HANG_")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def measure_nvrx(
    repeats: int,
    nproc: int = 2,
    timeout: float = 2.0,
    *,
    check_interval: float | None = None,
    venv: Path | None = None,
) -> dict[str, Any]:
    """NVRx ``ft_launcher`` 0.7.0: hung rank -> detected -> restarted workers running.

    ``check_interval``: ``--ft-workload-check-interval`` (how often each rank monitor looks
    at the deadline); None keeps NVRx's default (5 s), what its users get. The venv is
    built on first use (see :func:`nvrx_launcher`). Raises ``RuntimeError`` as the module
    says.
    """
    cmd = [
        str(nvrx_launcher(venv)),
        "--standalone",
        "--nproc-per-node", str(nproc),
        "--max-restarts", "1",
        "--ft-rank-heartbeat-timeout", f"{timeout:g}",
        "--ft-initial-rank-heartbeat-timeout", f"{INITIAL_TIMEOUT:g}",
    ]  # fmt: skip
    if check_interval is not None:
        cmd += ["--ft-workload-check-interval", f"{check_interval:g}"]
    env = {**_clean_env(), "HANG_API": "nvrx"}
    name = "nvrx" if check_interval is None else f"nvrx (check every {check_interval:g} s)"
    return _measure(name, cmd, env, repeats, nproc, _nvrx_detected)


def measure_aelastic(
    repeats: int,
    nproc: int = 2,
    timeout: float = 2.0,
    *,
    python: str = sys.executable,
) -> dict[str, Any]:
    """aelastic: the same job and observables through ``python -m aelastic run``.

    ``python``: the interpreter whose aelastic is measured (it must have hang detection,
    i.e. :data:`AELASTIC_HEARTBEAT_TIMEOUT_FLAG` and ``aelastic.progress``). Raises
    ``RuntimeError`` as the module says.
    """
    cmd = [
        python, "-m", "aelastic", "run",
        "--standalone",
        "--nproc-per-node", str(nproc),
        "--max-restarts", "1",
        AELASTIC_HEARTBEAT_TIMEOUT_FLAG, f"{timeout:g}",
        AELASTIC_INITIAL_HEARTBEAT_TIMEOUT_FLAG, f"{INITIAL_TIMEOUT:g}",
        "--event-log-handler", "file",
    ]  # fmt: skip
    env = {**_clean_env(), "HANG_API": "aelastic"}
    return _measure("aelastic", cmd, env, repeats, nproc, _aelastic_detected)


def _row(label: str, key: str, results: list[dict[str, Any]]) -> str:
    cells = []
    for res in results:
        values = [r[key] for r in res["runs"]]
        cells.append(f"{res[key]:.2f} s ({min(values):.2f}-{max(values):.2f})")
    return f"| {label} | " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--only", choices=("nvrx", "nvrx-fast", "aelastic"), action="append")
    parser.add_argument("--nvrx-venv", type=Path, default=None)
    parser.add_argument("--fast-interval", type=float, default=0.1)
    parser.add_argument("--aelastic-python", default=sys.executable)
    args = parser.parse_args()
    which = args.only or ["nvrx", "nvrx-fast"]
    per_kind: dict[str, list[dict[str, Any]]] = {kind: [] for kind in which}
    for _ in range(args.repeats):  # interleaved, so that every launcher shares the load
        for kind in which:
            if kind == "aelastic":
                res = measure_aelastic(1, args.nproc, args.timeout, python=args.aelastic_python)
            else:
                interval = args.fast_interval if kind == "nvrx-fast" else None
                res = measure_nvrx(
                    1, args.nproc, args.timeout, check_interval=interval, venv=args.nvrx_venv
                )
            per_kind[kind].append(res)
    results = [combine(per_kind[kind]) for kind in which]
    for res in results:
        print(f"{res['launcher']}: {res['command']}")
    print(f"load average (1 min): {results[0]['load'][0]:.1f} before, {_load():.1f} after")
    print()
    print(
        f"| from the last heartbeat (median of {args.repeats}; min-max) | "
        + " | ".join(r["launcher"] for r in results)
        + " |"
    )
    print("|---|" + "---|" * len(results))
    print(_row("launcher decides the rank hung", "detect_s", results))
    print(_row("a healthy peer gets SIGTERM (group stopping)", "peer_stopped_s", results))
    print(_row("restarted workers running (last one's first statement)", "recover_s", results))


if __name__ == "__main__":
    main()

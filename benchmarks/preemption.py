"""Steps lost and seconds from a preemption signal to the restarted job's next step:
aelastic (memory checkpoint every step, persisted to ``--checkpoint-dir`` on the signal)
against torchrun (``torch.save`` every ``--every`` steps, resumed from that file).

    python benchmarks/preemption.py --repeats 3

Both jobs are standalone (2 workers, gloo on CPU; each step 20 ms of sleep plus a small
model) and receive the same signal (SIGTERM, what Slurm sends at a requeue or a
preemption) to the launcher once rank 0 reports step ``--at`` (varied per repeat, so the
signal falls at different points of torchrun's checkpoint interval); the same command is
then started again, as a requeued job would be. "lost" = the newest step completed before
the stop minus the step the restarted job resumed from; "seconds" = from the signal to the
restarted job's first completed step. The launchers alternate in one run.

    python benchmarks/preemption.py --slurm --repeats 2

``--slurm``: the same worker as a 2-node sbatch job (one task per node, one worker per
node) on the tests' real Slurm cluster (``tests/schedulers/_slurm_cluster.py``: munged,
slurmctld, slurmd n1..n3 on loopback), started and stopped here. aelastic runs under
``srun`` with no rendezvous flag but ``--master-port`` (``--checkpoint-dir``,
``--requeue``); torchrun
(``torch.distributed.run``) with its documented Slurm flags (``--nnodes $SLURM_NNODES
--rdzv-id $SLURM_JOB_ID --rdzv-endpoint <first node>:<port>``). The notice is
``scontrol requeue``, what a preemption with ``PreemptMode=REQUEUE`` does: SIGTERM to
every process of the job, then Slurm requeues it and starts it again when the old
credential expires (the cluster's ``cred_expire`` + 1 s after the old job's end: 6 s since
issue 39 item 7, 21 s before) and the scheduler next looks (every second since then;
before, at the next full or backfill pass, up to 30 s later).
The batch script writes ``job <restart count> <time>`` first, so the seconds split into
Slurm's share (the notice to the requeued script's start) and the launcher's (that start
to the next step).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
WORKER = str(HERE / "_preempt_worker.py")
REPO = HERE.parent
LAUNCHERS = ("aelastic", "torchrun")


def _steps(progress: Path) -> tuple[list[int], list[tuple[int, float]]]:
    """(the start lines' steps, [(step, time)] of completed steps), in file order."""
    starts, steps = [], []
    if progress.exists():
        for line in progress.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == "start":
                starts.append(int(parts[1]))
            elif len(parts) == 2:
                steps.append((int(parts[0]), float(parts[1])))
    return starts, steps


def _wait(what, done, seconds: float) -> None:  # type: ignore[no-untyped-def]
    """Poll ``done()`` up to ``seconds``; ``what`` (a string, or a callable for the state
    at that moment) names it in the error."""
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            what = what() if callable(what) else what
            raise SystemExit(f"{what} did not happen within {seconds} s")
        time.sleep(0.01)


def _worker(launcher: str, every: int, root: Path) -> list[str]:
    """The worker and its arguments: the same job under either launcher."""
    argv = [WORKER, "--progress", str(root / "progress")]
    if launcher == "aelastic":
        return [*argv, "--mode", "aelastic"]
    return [*argv, "--mode", "torch", "--file", str(root / "ckpt.pt"), "--every", str(every)]


def once(launcher: str, at: int, every: int, root: Path) -> tuple[int, float, int]:
    """One preemption and restart; returns (steps lost, seconds, the first job's exit)."""
    progress = root / "progress"
    if launcher == "aelastic":
        head = [sys.executable, "-m", "aelastic", "run", "--checkpoint-dir", str(root / "ckpt")]
    else:
        head = [sys.executable, "-m", "torch.distributed.run"]
    argv = [*head, "--standalone", "--nproc-per-node", "2", *_worker(launcher, every, root)]
    (root / "tmp").mkdir()  # the launchers' log folders, removed with root
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LOGLEVEL": "ERROR", "TMPDIR": str(root / "tmp")}
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": env}
    first = subprocess.Popen(argv, **quiet)  # type: ignore[call-overload]
    _wait("step --at", lambda: any(s >= at for s, _ in _steps(progress)[1]), 300)
    sent = time.time()
    first.send_signal(signal.SIGTERM)
    code = first.wait(timeout=120)
    reached = max(s for s, _ in _steps(progress)[1])
    count = len(_steps(progress)[1])
    second = subprocess.Popen(argv, **quiet)  # type: ignore[call-overload]
    try:
        _wait("the restarted job's step", lambda: len(_steps(progress)[1]) > count, 300)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=120)
    starts, steps = _steps(progress)
    return reached - starts[-1], steps[count][1] - sent, code


def _batch_script(launcher: str, every: int, root: Path, port: int) -> str:
    """The sbatch script: note the job's start, then one agent per node under ``srun``.

    torchrun gets the rendezvous written out as its Slurm recipe does; the first node's
    address comes from Slurm's record because the test cluster's node names (n1..n3) are
    not in DNS. Both get ``port``, a free one: torchrun's 29500, or aelastic's port
    derived from the job id, can be taken by another job on this host (a test cluster of
    an older tree numbers its jobs from 1 too); ``--master-port`` keeps the rest of
    aelastic's values from Slurm."""
    py = sys.executable
    env = f"export OMP_NUM_THREADS=1 LOGLEVEL=ERROR TMPDIR={root / 'tmp'}"
    lines = [
        "#!/bin/bash",
        f'echo "job ${{SLURM_RESTART_COUNT:-0}} $(date +%s.%N)" >> {root}/progress',
        env,
    ]
    worker = " ".join(_worker(launcher, every, root))
    if launcher == "aelastic":
        run = f"{py} -m aelastic run --nproc-per-node 1 --master-port {port} "
        run += f"--checkpoint-dir {root / 'ckpt'} --requeue"
    else:
        lines += [
            'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            "addr=$(scontrol show node \"$head\" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)",
        ]
        run = (
            f'{py} -m torch.distributed.run --nnodes "$SLURM_NNODES" --nproc-per-node 1 '
            f'--rdzv-backend c10d --rdzv-id "$SLURM_JOB_ID" --rdzv-endpoint "$addr:{port}"'
        )
    return "\n".join([*lines, f"srun --ntasks-per-node=1 {run} {worker}", ""])


def _timeline(progress: Path) -> list[tuple[str, int, float]]:
    """The progress file's lines in order: ("job", restart, t), ("start", step, t),
    ("step", step, t)."""
    rows = []
    for line in progress.read_text().splitlines() if progress.exists() else []:
        parts = line.split()
        if len(parts) == 3 and parts[0] in ("job", "start"):
            rows.append((parts[0], int(parts[1]), float(parts[2])))
        elif len(parts) == 2:
            rows.append(("step", int(parts[0]), float(parts[1])))
    return rows


def once_slurm(
    cluster: Any, launcher: str, at: int, every: int, root: Path, port: int
) -> tuple[int, float, float, float, float, list[str]]:
    """One ``scontrol requeue`` of a 2-node job and its next start; returns (steps lost,
    seconds from the notice to the requeued job's next step, Slurm's share of them (the
    notice to the requeued batch script's start), the seconds from the notice to the
    requeued job's ``EligibleTime`` (Slurm's hold; whole seconds), those from the start to the
    workers' start line (launch, rendezvous, torch, the checkpoint load), the steps aelastic
    logged as persisted). Raises SystemExit with the job's log if a stage takes over 300 s;
    the job is cancelled and the nodes idle again on every way out."""
    progress, log, script = root / "progress", root / "job.log", root / "job.sh"
    (root / "tmp").mkdir()
    script.write_text(_batch_script(launcher, every, root, port))
    argv = ["sbatch", "--parsable", "-N2", "--ntasks-per-node=1", "--requeue"]
    argv += ["--open-mode=append", "-o", str(log), "-D", str(REPO), str(script)]
    job = cluster.run(*argv).stdout.strip().split(";")[0]

    def why(what: str) -> Callable[[], str]:
        def text() -> str:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            return f"{what}\n{tail}\njob {job}: {_state(cluster, job)}"

        return text

    try:
        _wait(
            why(f"step {at}"),
            lambda: any(r[0] == "step" and r[1] >= at for r in _timeline(progress)),
            300,
        )
        sent = time.time()
        cluster.run("scontrol", "requeue", job)
        eligible = _begin_time(cluster, job) - sent
        _wait(
            why("the requeued job's next step"),
            lambda: any(r[0] == "step" for r in _after_restart(_timeline(progress))),
            300,
        )
        # before the scancel below, whose SIGTERM makes aelastic persist a step again
        text = log.read_text(errors="replace") if log.exists() else ""
    finally:
        cluster.run("scancel", job)
        _wait(why("the job's end"), lambda: _state(cluster, job) == "CANCELLED", 120)
        _wait(why("the nodes idle again"), lambda: _idle(cluster), 120)
    rows = _timeline(progress)
    cut = [i for i, r in enumerate(rows) if r[0] == "job"][1]
    # rank 0 logs a step after the barrier that follows every rank's save: killed between
    # the two, it leaves the newest complete step unlogged, and the requeued job resumes
    # one past the last logged step ("lost" -1, counted as 0 in the medians)
    reached = max(r[1] for r in rows[:cut] if r[0] == "step")
    after = rows[cut:]
    start = next(r for r in after if r[0] == "start")
    first = next(r for r in after if r[0] == "step")
    saved = sorted(set(re.findall(r"step (\d+) is in ", text)))
    up = start[2] - after[0][2]
    return reached - start[1], first[2] - sent, after[0][2] - sent, eligible, up, saved


def _after_restart(rows: list[tuple[str, int, float]]) -> list[tuple[str, int, float]]:
    cut = [i for i, r in enumerate(rows) if r[0] == "job"]
    return rows[cut[1] :] if len(cut) > 1 else []


def _begin_time(cluster: Any, job: str) -> float:
    """The requeued job's ``EligibleTime`` (when Slurm's hold ends), read while it is pending;
    NaN if it was not seen pending within 60 s."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        out = cluster.run("scontrol", "show", "job", "-o", job).stdout
        begin = re.search(r"EligibleTime=(\S+)", out)
        if "JobState=PENDING" in out and begin:
            return time.mktime(time.strptime(begin.group(1), "%Y-%m-%dT%H:%M:%S"))
        time.sleep(0.2)
    return float("nan")


def _state(cluster: Any, job: str) -> str:
    """The job's state (and nothing else) from ``scontrol show job``."""
    out = cluster.run("scontrol", "show", "job", "-o", job).stdout
    found = re.search(r"JobState=(\S+)", out)
    return found.group(1) if found else out


def _idle(cluster: Any) -> bool:
    """Every node idle: the last job's processes are gone."""
    out = cluster.run("sinfo", "-h", "-N", "-o", "%t").stdout.split()
    return bool(out) and all(state == "idle" for state in out)


def _cluster() -> Any:
    """The tests' Slurm cluster context manager, imported by path."""
    sys.path[:0] = [str(REPO / "tests" / "schedulers"), str(REPO / "tests")]
    from _slurm_cluster import slurm_cluster  # type: ignore[import-not-found]

    return slurm_cluster()


def _standalone(repeats: int, every: int) -> None:
    results: dict[str, list[tuple[int, float, int]]] = {"aelastic": [], "torchrun": []}
    for at, launcher in _order(repeats, every):
        root = Path(tempfile.mkdtemp(prefix="aelastic_preempt_bench_"))
        try:
            lost, seconds, code = once(launcher, at, every, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        results[launcher].append((lost, seconds, code))
        print(f"{launcher:9s} at={at:4d} lost={lost:3d} steps  {seconds:6.2f} s  exit {code}")
    for launcher, rows in results.items():
        losts = [r[0] for r in rows]
        secs = [r[1] for r in rows]
        print(
            f"{launcher:9s} steps lost median {statistics.median(losts)} (max {max(losts)}), "
            f"signal to next step median {statistics.median(secs):.2f} s "
            f"(min {min(secs):.2f}, max {max(secs):.2f}); exits {sorted({r[2] for r in rows})}"
        )


def _slurm(repeats: int, every: int, keep: Path | None) -> None:
    """Start the cluster, run the jobs, print each row and the medians; ``keep``: a folder
    for each job's log (``<n>-<launcher>-<at>.log``)."""
    done: list[str] = []
    # per launcher: (lost, seconds, Slurm's share, workers up, eligible at)
    results: dict[str, list[tuple[int, float, float, float, float]]] = {k: [] for k in LAUNCHERS}
    with _cluster() as cluster:
        port = _free_port()
        for at, launcher in _order(repeats, every):
            root = Path(tempfile.mkdtemp(prefix="aelastic_preempt_bench_"))
            os.chmod(root, 0o755)
            try:
                lost, seconds, slurm, eligible, up, saved = once_slurm(
                    cluster, launcher, at, every, root, port
                )
            finally:
                if keep is not None and (root / "job.log").exists():
                    keep.mkdir(parents=True, exist_ok=True)
                    copy = keep / f"{len(done)}-{launcher}-{at}.log"
                    shutil.copy(root / "job.log", copy)
                    files = sorted(
                        str(f.relative_to(root))
                        for f in root.rglob("*")
                        if f.relative_to(root).parts[0].startswith("ckpt")
                    )
                    with open(copy, "a") as f:  # what the checkpoint directory held at the end
                        f.write("".join(f"--- {name}\n" for name in files))
                shutil.rmtree(root, ignore_errors=True)
            done.append(launcher)
            results[launcher].append((lost, seconds, slurm, up, eligible))
            print(
                f"{launcher:9s} at={at:4d} lost={lost:3d} steps  {seconds:6.2f} s "
                f"(Slurm {slurm:5.2f} s [eligible at {eligible:3.0f} s], launcher "
                f"{seconds - slurm:5.2f} s [workers up {up:5.2f} s])  "
                f"persisted {saved or '-'}",
                flush=True,
            )
    launch = {k: statistics.median(r[1] - r[2] for r in rows) for k, rows in results.items()}
    for launcher, rows in results.items():
        mid = [statistics.median(r[i] for r in rows) for i in range(5)]
        kept = [max(0, r[0]) for r in rows]
        print(
            f"{launcher:9s} steps lost median {statistics.median(kept)} (max {max(kept)}), notice "
            f"to next step median {mid[1]:.2f} s (Slurm {mid[2]:.2f} s, eligible at "
            f"{mid[4]:.0f} s; launcher {launch[launcher]:.2f} s, workers up {mid[3]:.2f} s)"
        )
    whole = {k: statistics.median(r[1] for r in rows) for k, rows in results.items()}
    print(
        f"torchrun / aelastic: {whole['torchrun'] / whole['aelastic']:.2f}x the seconds, "
        f"{launch['torchrun'] / launch['aelastic']:.2f}x the launcher's share"
    )


def _order(repeats: int, every: int) -> list[tuple[int, str]]:
    """(at, launcher): the launchers alternate, ``at`` moves through the interval."""
    out = []
    for i in range(repeats):
        at = 2 * every + (17 + 13 * i) % every  # a different point of the interval
        for launcher in LAUNCHERS if i % 2 == 0 else LAUNCHERS[::-1]:
            out.append((at, launcher))
    return out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--slurm", action="store_true", help="as sbatch jobs on a test cluster")
    parser.add_argument("--keep-logs", type=Path, help="--slurm: copy each job's log here")
    opts = parser.parse_args()
    if opts.slurm:
        _slurm(opts.repeats, opts.every, opts.keep_logs)
    else:
        _standalone(opts.repeats, opts.every)


if __name__ == "__main__":
    main()

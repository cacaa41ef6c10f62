"""``scontrol requeue`` during training, on the real test cluster: the agent persists the
step its workers reached, Slurm runs the job again, and it resumes at exactly that step
with the parameters of a run that was never interrupted."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from launcher.test_preemption import HELD_AT, _argv

from ._slurm_cluster import SlurmCluster, until

pytestmark = pytest.mark.timeout(600)  # two short jobs and a requeue on a loaded machine

REPO = Path(__file__).parent.parent.parent


def _job(disk: Path, out: Path, *extra: str) -> list[str]:
    """The standalone preemption test's job (``_argv``), as the command a batch script runs;
    ``--tee 3`` keeps each rank's lines whole in the job's log."""
    return [sys.executable, "-m", "aelastic", "run", "--tee", "3", *_argv(disk, out, *extra)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], Any]]:
    """The ``--out`` line of the same job never interrupted, run once for both tests: it
    starts beside the first test's Slurm job, and a test waits for it only when it needs
    the line. A run still going at the module's end is killed."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    run = subprocess.Popen(
        _job(tmp / "base", tmp / "base.jsonl"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )

    def line() -> Any:
        assert run.wait(timeout=240) == 0
        (whole,) = [json.loads(line) for line in (tmp / "base.jsonl").read_text().splitlines()]
        return whole

    try:
        yield line
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()


@pytest.mark.parametrize("how", ["scontrol requeue", "USR1 notice, --requeue"])
def test_a_requeued_job_resumes_at_the_step_it_reached(
    slurm: SlurmCluster, tmp_path: Path, how: str, uninterrupted: Callable[[], Any]
) -> None:
    disk, out, log = tmp_path / "ckpt", tmp_path / "out.jsonl", tmp_path / "job.log"
    notice = how.startswith("USR1")
    job = _job(disk, out, "--hold-after-save", str(HELD_AT))
    if notice:  # the agent requeues the job itself
        job.insert(job.index("--checkpoint-dir"), "--requeue")
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\nexec " + " ".join(job) + "\n")
    submitted = slurm.run(
        "sbatch",
        "--parsable",
        "-N1",
        "--requeue",
        "--open-mode=append",
        "-o",
        str(log),
        "-D",
        str(REPO),
        str(script),
    )
    job_id = submitted.stdout.strip().split(";")[0]

    def text() -> str:
        return log.read_text(errors="replace") if log.exists() else ""

    def why() -> str:
        return text() + slurm.log_tail()

    try:
        # the workers' own lines: both ranks saved step HELD_AT and stopped there
        until("both ranks holding", lambda: text().count(f":HELD {HELD_AT} rank ") == 2, 240, why)
        if notice:  # --signal=USR1@N's notice, as Slurm sends it: to every process of the
            # job (--full: the batch step too, which is the agent: the script execs it), the
            # workers as well, which ignore it while the agent traps it (docs/slurm.md)
            slurm.run("scancel", "--full", "--signal=USR1", job_id)
        else:
            slurm.run("scontrol", "requeue", job_id)
        # Slurm holds a requeued job while the old credential stays revoked (the cluster's
        # cred_expire + 1 s, 6 s): lifting the hold sooner got the restart refused ("Job
        # credential revoked"), so the test waits for Slurm to start it
        until(
            "the requeued job's end",
            lambda: out.exists() and out.read_text().strip() != "",
            240,
            why,
        )
        assert (
            f"preempted ({'SIGUSR1' if notice else 'SIGTERM'})" in text()
            and f"step {HELD_AT} is in {disk}" in text()
        ), why()
    except BaseException:  # a failed test leaves no job behind
        subprocess.run(["scancel", job_id], env=slurm.env, capture_output=True, timeout=60)
        raise
    (resumed,) = [json.loads(line) for line in out.read_text().splitlines()]
    whole = uninterrupted()
    assert resumed["start"] == HELD_AT and whole["start"] == 0, (resumed, whole)
    assert resumed["checksum"] == whole["checksum"]

"""``scontrol requeue`` during training, on the real test cluster: the agent persists the
step its workers reached, Slurm runs the job again, and it resumes at exactly that step
with the parameters of a run that was never interrupted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from launcher.test_preemption import HELD_AT, _argv

from ._slurm_cluster import SlurmCluster, until

pytestmark = pytest.mark.timeout(600)  # two short jobs and a requeue on a loaded machine

REPO = Path(__file__).parent.parent.parent


def _job(disk: Path, out: Path, *extra: str) -> list[str]:
    """The standalone preemption test's job (``_argv``), as the command a batch script runs;
    ``--tee 3`` keeps each rank's lines whole in the job's log."""
    return [sys.executable, "-m", "aelastic", "run", "--tee", "3", *_argv(disk, out, *extra)]


@pytest.mark.parametrize("how", ["scontrol requeue", "USR1 notice, --requeue"])
def test_a_requeued_job_resumes_at_the_step_it_reached(
    slurm: SlurmCluster, tmp_path: Path, how: str
) -> None:
    disk, out, log = tmp_path / "ckpt", tmp_path / "out.jsonl", tmp_path / "job.log"
    notice = how.startswith("USR1")
    job = _job(disk, out, "--hold-after-save", str(HELD_AT))
    if notice:  # the agent requeues the job itself
        job.insert(job.index("--checkpoint-dir"), "--requeue")
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\nexec " + " ".join(job) + "\n")
    baseline = subprocess.Popen(
        _job(tmp_path / "base", tmp_path / "base.jsonl"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    try:
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

        # the workers' own lines: both ranks saved step HELD_AT and stopped there
        until("both ranks holding", lambda: text().count(f":HELD {HELD_AT} rank ") == 2, 240, why)
        if notice:  # --signal=USR1@N's notice, as Slurm sends it: to every process of the
            # job (--full: the batch step too, which is the agent: the script execs it), the
            # workers as well, which ignore it while the agent traps it (docs/slurm.md)
            slurm.run("scancel", "--full", "--signal=USR1", job_id)
        else:
            slurm.run("scontrol", "requeue", job_id)
        # Slurm holds a requeued job while the old credential stays revoked (the cluster's
        # cred_expire, 20 s): lifting the hold sooner got the restart refused ("Job
        # credential revoked"), so the test waits for Slurm to start it
        until(
            "the requeued job's end",
            lambda: out.exists() and out.read_text().strip() != "",
            300,
            why,
        )
        assert (
            f"preempted ({'SIGUSR1' if notice else 'SIGTERM'})" in text()
            and f"step {HELD_AT} is in {disk}" in text()
        ), why()
        assert baseline.wait(timeout=240) == 0
    finally:
        if baseline.poll() is None:
            baseline.kill()
            baseline.wait()
    (resumed,) = [json.loads(line) for line in out.read_text().splitlines()]
    (whole,) = [json.loads(line) for line in (tmp_path / "base.jsonl").read_text().splitlines()]
    assert resumed["start"] == HELD_AT and whole["start"] == 0, (resumed, whole)
    assert resumed["checksum"] == whole["checksum"]

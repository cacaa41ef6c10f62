"""examples/train_ddp.py as a 2-node sbatch job on the real test cluster, with no
rendezvous flag and aelastic's memory checkpoints (``--memory-checkpoint``: each rank
saves into its agent's memory, and the crashed run resumes from there, no file): the
launcher takes everything from the Slurm step.

One worker per node: a world of 2 sums each gradient exactly, so a run resumed from its
checkpoint ends bit for bit where an uninterrupted one does. With 4 ranks gloo's ring
sums in chunk order, and DDP rebuilds its buckets after the first step of each attempt,
so a resumed run differs in the last bits (standalone too, with no Slurm involved).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ._slurm_cluster import FINISHED, SlurmCluster, until

pytestmark = pytest.mark.timeout(300)  # a standalone run beside a 2-node job, loaded machine

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_ddp.py"
PYTHON = sys.executable
STEPS = ["--steps", "12", "--checkpoint-every", "4", "--memory-checkpoint"]


def _checksums(text: str) -> list[str]:
    return re.findall(r"^FINAL step=12 .* checksum=(\S+)$", text, re.M)


def test_two_node_job_needs_no_rendezvous_flag_and_restarts_inside_it(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    run = f"srun --ntasks-per-node=1 {PYTHON} -m aelastic run --nproc-per-node 1"
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        "set -e\n"
        f"{run} {EXAMPLE} {' '.join(STEPS)}\n"
        f"{run} --max-restarts 1 {EXAMPLE} {' '.join(STEPS)} --crash-at-step 6\n"
    )
    out = tmp_path / "job.out"
    submitted = slurm.run(
        "sbatch", "--parsable", "-N2", f"--chdir={REPO}", f"--output={out}", str(script)
    )  # fmt: skip
    job_id = submitted.stdout.strip().split(";")[0]
    try:
        # ground truth, beside the job: the same 2 ranks as one standalone node, no Slurm
        env = {k: v for k, v in slurm.env.items() if k != "SLURM_CONF"}
        standalone = subprocess.run(
            [
                PYTHON,
                "-m",
                "aelastic",
                "run",
                "--standalone",
                "--nproc-per-node",
                "2",
                str(EXAMPLE),
                *STEPS,
            ],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert standalone.returncode == 0, standalone.stderr[-3000:]
        [expected] = _checksums(standalone.stdout)
        # the job's end, seen at once (sbatch --wait polls at 2, 10 and 42 s)
        until(
            "the job's end",
            lambda: slurm.job_state(job_id) in FINISHED,
            240,
            lambda: (out.read_text()[-4000:] if out.exists() else "") + slurm.log_tail(),
        )
    except BaseException:  # a failed test leaves no job behind
        subprocess.run(["scancel", job_id], env=slurm.env, capture_output=True, timeout=60)
        raise
    text = out.read_text()
    assert slurm.job_state(job_id) == "COMPLETED", text[-4000:]  # both steps exited 0
    assert _checksums(text) == [expected, expected], text[-4000:]
    # the crash restarted inside the allocation, resumed at the newest step both ranks had
    # saved into their agents' memory, and finished
    assert "crashing on purpose at step 6" in text
    assert "attempt=1 world_size=2 resuming_from_step=4" in text, text[-4000:]
    # each agent printed the chosen settings once; both steps kept to their own run id
    for step in (0, 1):
        notes = re.findall(rf"slurm step: run id slurm-{job_id}\.{step}, nodes 2, store .*", text)
        assert len(notes) == 2, text[-4000:]
        assert sum("hosted here" in note for note in notes) == 1
        assert "store 127.0.0.1:" in notes[0]  # n1's NodeAddr: the name n1 resolves nowhere
    assert not os.path.exists(tmp_path / "job.err")

"""A node Slurm takes away leaves the job, and the allocation's spare takes its place.

An sbatch job of 3 nodes runs ``aelastic run --nnodes 2:2`` (no rendezvous flag): two
nodes train, the third waits as a spare. Once both ranks hold step 6, a training node that
is not the batch host (node 0, which hosts the store) is set DOWN with ``scontrol``. Slurm
SIGKILLs that node's task (found here on 22.05: no SIGTERM first); with ``--no-kill`` on
both ``sbatch`` and ``srun`` the allocation and the step go on without it, the survivors
meet the spare in a new round, and the job finishes at the step count with the checksum of
an uninterrupted 2-rank run, read from the workers' own output.

Each node keeps its memory checkpoints in its own directory
(``AELASTIC_CHECKPOINT_MEMORY_ROOT``), as separate machines would: the lost node's copy goes
with it, and the spare resumes its rank from the peer copy the survivor holds.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ._slurm_cluster import SlurmCluster, until

pytestmark = pytest.mark.timeout(300)  # a 3-node job and a 2-rank baseline, loaded machine

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "checkpoint" / "scripts" / "ckpt_ddp.py"
HELD_AT = 6
JOB = ["--steps", "12", "--every", "2", "--print-world"]


def _states(slurm: SlurmCluster) -> dict[str, str]:
    done = slurm.run("sinfo", "-h", "-N", "-o", "%N %t")
    return dict(line.split() for line in done.stdout.splitlines() if line.strip())


class _Taken:
    """What a test changed on the shared cluster: its jobs, and the nodes it set down."""

    def __init__(self) -> None:
        self.jobs: list[str] = []
        self.nodes: list[str] = []


@pytest.fixture
def taken(slurm: SlurmCluster) -> Iterator[_Taken]:
    """Record a job once submitted and a node before its ``scontrol update``. After the
    test, also a failed one: the jobs cancelled, the nodes resumed, and all nodes idle
    again (bounded), so later tests of the session see the cluster as it started."""
    changed = _Taken()
    yield changed
    for job in changed.jobs:  # a finished job's id is answered with a harmless error
        subprocess.run(["scancel", job], env=slurm.env, capture_output=True, timeout=60)
    for name in changed.nodes:
        # ReturnToService=2 may have resumed it already ("Invalid node state specified")
        subprocess.run(
            ["scontrol", "update", f"nodename={name}", "state=resume"],
            env=slurm.env,
            capture_output=True,
            timeout=60,
        )
    until(
        "all nodes idle again",
        lambda: all(_states(slurm).get(n) == "idle" for n in slurm.nodes),
        120,
        lambda: f"{_states(slurm)}\n{slurm.log_tail()}",
    )


def test_a_node_set_down_leaves_and_the_spare_takes_its_place(
    slurm: SlurmCluster, tmp_path: Path, taken: _Taken
) -> None:
    log, out = tmp_path / "job.log", tmp_path / "out.jsonl"
    # ground truth: the same job as one standalone node of 2 ranks, never interrupted
    alone = {k: v for k, v in slurm.env.items() if k != "SLURM_CONF"}
    baseline = subprocess.Popen(
        [sys.executable, "-m", "aelastic", "run", "--standalone", "--nproc-per-node", "2",
         str(SCRIPT), "--out", str(tmp_path / "base.jsonl"), *JOB],
        env=alone, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        # each task names its node first (srun --label: "TASK: node NAME"), then runs the
        # agent with a memory directory of its own, as on separate machines
        task = (
            'echo "node $SLURMD_NODENAME"; '
            f"AELASTIC_CHECKPOINT_MEMORY_ROOT={tmp_path}/mem-$SLURMD_NODENAME exec "
            f"{sys.executable} -m aelastic run --tee 3 --nnodes 2:2 --nproc-per-node 1 "
            f"{SCRIPT} --out {out} {' '.join(JOB)} --hold-after-save {HELD_AT}"
        )
        script = tmp_path / "job.sh"
        script.write_text(
            "#!/bin/bash\n"
            f"srun --no-kill --ntasks-per-node=1 --label bash -c '{task}'\n"
            'echo "srun exited $?"\n'
        )
        submitted = slurm.run(
            "sbatch", "--parsable", "--no-kill", "-N3", "-D", str(REPO), "-o", str(log),
            str(script),
        )  # fmt: skip
        taken.jobs.append(submitted.stdout.strip().split(";")[0])

        def text() -> str:
            return log.read_text(errors="replace") if log.exists() else ""

        def why() -> str:
            return text()[-6000:] + "\n" + slurm.log_tail()

        # the workers' own lines: the two training ranks saved step HELD_AT and hold there
        held = re.compile(rf"^(\d+): \[default0\]:HELD {HELD_AT} rank (\d)$", re.M)

        def ended() -> bool:
            return "srun exited" in text()

        until("both ranks holding", lambda: len(held.findall(text())) == 2 or ended(), 180, why)
        assert not ended(), f"the job ended before both ranks held step {HELD_AT}\n{why()}"
        node_of = dict(re.findall(r"^(\d+): node (\S+)$", text(), re.M))
        rank_of = dict(held.findall(text()))
        assert len(node_of) == 3 and len(rank_of) == 2, why()
        # a training node other than task 0 (the batch host, which hosts the store)
        victim_task = max(rank_of)
        victim, survivor = node_of[victim_task], node_of[min(rank_of)]
        # the survivor holds the victim's rank of that step (its peer copy, made in the
        # background): without it the new round resumes from an older step
        copy = f"mem-{survivor}/*/step_{HELD_AT:012d}/rank_{rank_of[victim_task]}_of_2.pt"
        until("the peer copy", lambda: any(tmp_path.glob(copy)), 60, why)
        taken.nodes.append(victim)
        slurm.run("scontrol", "update", f"nodename={victim}", "state=down", "reason=aelastic-test")

        def again() -> bool:  # a round that resumed before HELD_AT holds there again
            return len(held.findall(text())) > 2

        until("the job's end", lambda: ended() or again(), 180, why)
        assert not again(), f"the new round resumed before step {HELD_AT}\n{why()}"
        assert baseline.wait(timeout=240) == 0
    finally:
        if baseline.poll() is None:
            baseline.kill()
            baseline.wait()
    final = text()
    # Slurm took the node away and killed its task; the step itself went on
    assert f"Node failure on {victim}" in final, why()
    assert f"{victim}: task {victim_task}: Killed" in final, why()
    (resumed,) = [json.loads(line) for line in out.read_text().splitlines()]
    (whole,) = [json.loads(line) for line in (tmp_path / "base.jsonl").read_text().splitlines()]
    # a world of 2 again without the victim: only the spare can have been the second node
    assert resumed["world"] == 2 and resumed["start"] == HELD_AT, (resumed, final[-4000:])
    assert resumed["checksum"] == whole["checksum"] and whole["start"] == 0, (resumed, whole)

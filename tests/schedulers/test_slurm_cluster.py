"""The test cluster itself: one task per node, and each node knows its own id."""

from __future__ import annotations

from ._slurm_cluster import SlurmCluster


def test_srun_runs_one_task_on_each_of_three_nodes(slurm: SlurmCluster) -> None:
    done = slurm.run(
        "srun", "-N3", "-n3", "--label", "bash", "-c", 'echo "$SLURM_NODEID $SLURMD_NODENAME"'
    )
    lines = sorted(line.split(": ", 1)[1] for line in done.stdout.splitlines())
    assert lines == ["0 n1", "1 n2", "2 n3"], done.stdout + slurm.log_tail()

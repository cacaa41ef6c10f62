"""The test cluster itself: one task per node, each node knows its own id, and job ids
that no other test cluster on this host derives a rendezvous port from."""

from __future__ import annotations

from aelastic.schedulers._slurm import rendezvous_port

from ._slurm_cluster import JOB_ID_BLOCK, SlurmCluster, _claim_job_ids


def test_srun_runs_one_task_on_each_of_three_nodes(slurm: SlurmCluster) -> None:
    done = slurm.run(
        "srun", "-N3", "-n3", "--label", "bash", "-c",
        'echo "$SLURM_NODEID $SLURMD_NODENAME $SLURM_JOB_ID"',
    )  # fmt: skip
    rows = sorted(line.split(": ", 1)[1].split() for line in done.stdout.splitlines())
    assert [row[:2] for row in rows] == [["0", "n1"], ["1", "n2"], ["2", "n3"]], (
        done.stdout + slurm.log_tail()
    )
    # the cluster numbers its jobs from its own FirstJobId
    assert {row[2] for row in rows} == {rows[0][2]}
    assert int(rows[0][2]) >= slurm.first_job_id > 1


def test_clusters_at_once_get_job_ids_with_ports_of_their_own() -> None:
    with _claim_job_ids() as first, _claim_job_ids() as second:
        pass
    ports = [
        {
            rendezvous_port(job, step)
            for job in range(start, start + JOB_ID_BLOCK)
            for step in range(8)
        }
        for start in (first, second)
    ]
    assert first != second and len(ports[0]) == len(ports[1]) == JOB_ID_BLOCK * 8
    assert not ports[0] & ports[1]

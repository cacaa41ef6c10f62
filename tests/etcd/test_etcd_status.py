"""``python -m aelastic status --rdzv-backend etcd`` against a live two-node etcd job."""

from __future__ import annotations

from pathlib import Path

import anyio
from jobview._live import publish, status, status_json, two_nodes


async def test_status_of_a_two_node_etcd_job_with_one_restart(
    etcd_endpoint: str, run_id: str, tmp_path: Path
) -> None:
    flags = ("--rdzv-backend", "etcd", "--rdzv-endpoint", etcd_endpoint, "--rdzv-id", run_id)
    with anyio.fail_after(90):
        async with two_nodes(
            tmp_path,
            rdzv_backend="etcd",
            rdzv_endpoint=etcd_endpoint,
            run_id=run_id,
            rdzv_configs={"last_call_timeout": 0.5},
        ) as (_, jobs):
            await publish(jobs)
            view = await status_json(*flags)
            wrong = await status(*flags[:-1], "no-such-run")
    nodes = view["nodes"]
    assert view["run_id"] == run_id and len({n["node"] for n in nodes}) == 2
    assert {n["state"] for n in nodes} == {"HEALTHY"}
    assert sorted(n["restart_count"] for n in nodes) == [0, 1]
    assert sorted(w["global_rank"] for n in nodes for w in n["workers"]) == [0, 1]
    assert all(w["step"] >= 5 for n in nodes for w in n["workers"])
    assert wrong.returncode == 2 and "'no-such-run'" in wrong.stderr.decode()

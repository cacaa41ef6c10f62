"""``--node-health-check``: an unhealthy node never runs a worker and the others finish."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from aelastic import BadNodeSettings, LaunchConfig, open_job
from aelastic.events import subscribe
from aelastic.health._settings import HealthSettings
from aelastic.launcher._args import UsageError, parse_run_args
from aelastic.nodes import NODE_UNHEALTHY_EXIT_CODE

from ._nodes import WORKER, cluster, free_port, records, wait_all
from .test_health import get
from .test_multinode import FAST, _c10d


async def test_unhealthy_node_stays_out_and_the_others_finish(tmp_path: Path) -> None:
    port = free_port()
    healthy_out, sick_out = tmp_path / "healthy", tmp_path / "sick"
    healthy_out.mkdir()
    sick_out.mkdir()
    check = ["--node-health-check", "echo GPU 3 fell off the bus; exit 1"]
    check += ["--node-health-cooldown", "0.5"]
    tail = ["--finish-at-world", "2"]
    async with cluster() as c:
        # the sick node is first in line: it must not take the round's ticket 0
        sick = await c.start([*_c10d("2:3", port, "sick", FAST + ",is_host=0"), *check, WORKER,
                              str(sick_out), *tail])  # fmt: skip
        host = await c.start([*_c10d("2:3", port, "sick", FAST + ",is_host=1"), WORKER,
                              str(healthy_out), *tail])  # fmt: skip
        other = await c.start([*_c10d("2:3", port, "sick", FAST + ",is_host=0"), WORKER,
                               str(healthy_out), *tail])  # fmt: skip
        codes = await wait_all([host, other, sick], 90)
    assert codes == [0, 0, NODE_UNHEALTHY_EXIT_CODE], [n.err for n in c.nodes]
    assert list(sick_out.iterdir()) == []  # never ran a worker
    assert sorted(r["RANK"] for r in records(healthy_out)) == ["0", "1"]
    assert "GPU 3 fell off the bus" in sick.err and "exit status 1" in sick.err
    assert "unhealthy node:" in sick.err


async def test_unhealthy_store_host_exits_when_the_others_finish(tmp_path: Path) -> None:
    # The sick node hosts the rendezvous store: it serves it, never runs a worker, and
    # learns that the job ended from the rendezvous closed by the finished group rank 0.
    port = free_port()
    check = ["--node-health-check", "exit 1", "--node-health-cooldown", "0.5"]
    tail = [WORKER, str(tmp_path), "--finish-at-world", "2"]
    async with cluster() as c:
        sick = await c.start([*_c10d("2:3", port, "sickhost", FAST + ",is_host=1"), *check, *tail])
        others = [
            await c.start([*_c10d("2:3", port, "sickhost", FAST + ",is_host=0"), *tail])
            for _ in range(2)
        ]
        codes = await wait_all([*others, sick], 90)
    assert codes == [0, 0, NODE_UNHEALTHY_EXIT_CODE], [n.err for n in c.nodes]
    assert "its rendezvous was closed" in sick.err
    assert sorted(r["RANK"] for r in records(tmp_path)) == ["0", "1"]


async def test_readyz_and_status_name_the_failed_check() -> None:
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=1,
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        health=HealthSettings(port=0),
        run_id="readyz-health",
        bad_nodes=BadNodeSettings(health_checks=("echo no space >&2; exit 7",), health_cooldown=60),
    )
    with anyio.fail_after(60):
        async with (
            subscribe(run_id="readyz-health") as events,
            open_job(config, "/bin/true") as job,
        ):
            address = job.health_address
            assert address is not None
            async for event in events:
                if event.name == "aelastic.node.unhealthy":
                    break
            assert event.metadata["reason"] == job.unhealthy_reason()
            code, _, body = await get(address, "/readyz")
            assert (code, body) == (
                503,
                "not ready: unhealthy node: echo no space >&2; exit 7: FAILED "
                "(exit status 7: no space)\n",
            )
            status = json.loads((await get(address, "/status"))[2])["node_health"]
            assert status["healthy"] is False and status["strikes"] == 1
            failed = [c for c in status["checks"] if not c["ok"]]
            assert [c["name"] for c in failed] == ["echo no space >&2; exit 7"]
            assert not job.workers()[0].pid


def test_flags() -> None:
    argv = ["--node-health-check", "a", "--node-health-check", "b", "--node-health-timeout", "5"]
    config = parse_run_args([*argv, "--no-builtin-health-checks", "x.py"], {}).config
    bad_nodes = config.bad_nodes
    assert bad_nodes.health_checks == ("a", "b") and bad_nodes.health_timeout == 5.0
    assert bad_nodes.builtin_checks is False and bad_nodes.health_cooldown == 30.0
    with pytest.raises(UsageError, match="--node-health-check: empty command"):
        parse_run_args(["--node-health-check", " ", "x.py"], {})
    # the range is BadNodeSettings' (tests/nodes/test_bad_node_settings.py)
    with pytest.raises(UsageError, match="--node-health-cooldown 0: need seconds > 0"):
        parse_run_args(["--node-health-cooldown", "0", "x.py"], {})
    env = {"PET_NODE_HEALTH_CHECK": "c"}
    assert parse_run_args(["x.py"], env).config.bad_nodes.health_checks == ("c",)

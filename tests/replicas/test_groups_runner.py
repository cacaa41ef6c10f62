"""``run_replica_groups`` on every anyio backend: the groups, their environment, the
exclusion and the spares, with tiny real workers (no torch) and the real Lighthouse."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import anyio
import pytest

from aelastic import LaunchConfig, events
from aelastic.errors import ChildFailedError
from aelastic.events._dispatch import flush, unregister_handler
from aelastic.health._settings import HealthSettings
from aelastic.launcher._replica_groups import group_config, run_replica_groups
from aelastic.launcher._replica_view import failure_line, quorum_left
from aelastic.replicas._lighthouse import check_lighthouse
from aelastic.replicas._settings import ReplicaGroups

pytest.importorskip("torchft")
pytestmark = pytest.mark.anyio

# Writes its environment to <dir>/env-<group>-<attempt>.json; the groups listed in
# argv[2] exit 3 at every start.
WORKER = """
import json, os, sys
g, a = os.environ["REPLICA_GROUP_ID"], os.environ["TORCHELASTIC_RESTART_COUNT"]
with open(os.path.join(sys.argv[1], f"env-{g}-{a}.json"), "w") as f:
    json.dump(dict(os.environ), f)
sys.exit(3 if g in sys.argv[2].split(",") else 0)
"""


def _config(**kw: object) -> LaunchConfig:
    return LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=1, rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0", run_id="job", max_restarts=1, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def _env(tmp_path: Path, group: int, attempt: int = 0) -> dict[str, str]:
    return json.loads((tmp_path / f"env-{group}-{attempt}.json").read_text())  # type: ignore[no-any-return]


async def test_each_group_runs_alone_with_torchfts_variables(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = _config(env={"MINE": "1"}, event_log_handler="groups-test")
    seen: list[events.Event] = []
    events.register_handler("groups-test", seen.append)
    try:
        with caplog.at_level(logging.WARNING, "aelastic"):
            result = await run_replica_groups(
                config,
                sys.executable,
                ["-c", WORKER, str(tmp_path), "2"],
                ReplicaGroups(3, spares=1),
            )
        await flush(["groups-test"])
    finally:
        unregister_handler("groups-test", seen.append)
    # issue 40: each failure names its group, in the agent's line, an event and status
    failed = [e.metadata for e in seen if e.name == "aelastic.replicas.group_failed"]
    # group 2 and its spare: a start that restarts, a restart that spends the budget
    assert [(m["replica_group"], m["restarting"]) for m in failed] == [
        (2, True), (2, False), (2, True), (2, False)
    ]  # fmt: skip
    assert all(m["exitcode"] == 3 and m["run_id"] == "job-rg2" for m in failed)
    assert "replica group 2 (run job-rg2) failed: rank 0 exited 3; restarting" in str(
        failed[0]["message"]
    )
    agent = [r.getMessage() for r in caplog.records if r.name == "aelastic.agent"]
    assert agent and all(m.startswith("replica group 2: [") for m in agent), agent
    assert any("worker group FAILED" in m for m in agent)
    # one goodput line for the node's groups (no steps reported: no ratio)
    assert result.goodput is not None and "(replica groups 0, 1, 2 on this node)" in result.goodput
    assert result.goodput.startswith("goodput unknown of ")
    assert sorted(result.results) == [0, 1] and list(result.excluded) == [2]
    assert result.replaced == 1  # the spare ran, then was excluded in its turn
    # each budget: a start and 1 restart (the spare's files overwrite the first's)
    spare = {p.name async for p in anyio.Path(tmp_path).glob("env-2-*")}
    assert spare == {"env-2-0.json", "env-2-1.json"}
    envs = [_env(tmp_path, g) for g in range(3)]
    for group, env in enumerate(envs):
        assert env["REPLICA_GROUP_ID"] == str(group)
        assert env["NUM_REPLICA_GROUPS"] == "3"
        assert env["TORCHFT_LIGHTHOUSE"] == result.lighthouse_url
        assert env["TORCHFT_QUORUM_RETRIES"] == "600"
        assert env["MINE"] == "1"
    assert len({env["MASTER_PORT"] for env in envs}) == 3  # a worker store each
    assert len({env["TORCHELASTIC_RUN_ID"] for env in envs}) == 3  # a rendezvous each
    assert config.env == {"MINE": "1"}  # the caller's config is left alone
    with pytest.raises(Exception, match="Connection refused"):  # stopped at the end
        await check_lighthouse(result.lighthouse_url)


async def test_the_job_fails_when_every_group_is_excluded(tmp_path: Path) -> None:
    with pytest.raises(ChildFailedError) as failed:
        await run_replica_groups(
            _config(), sys.executable, ["-c", WORKER, str(tmp_path), "0,1"], ReplicaGroups(2)
        )
    assert failed.value.get_first_failure()[1].exitcode == 3


def test_groups_on_one_node_get_a_health_endpoint_each() -> None:
    config = _config(health=HealthSettings(port=9000, host="::1"))
    health = [group_config(config, k, ReplicaGroups(3), "http://h:1").health for k in range(3)]
    assert [(h.port, h.host) for h in health] == [(9000, "::1"), (9001, "::1"), (9002, "::1")]
    many_nodes = ReplicaGroups(3, group_id=2, lighthouse="http://h:1")
    assert group_config(config, 2, many_nodes, "http://h:1").health.port == 9000
    assert group_config(_config(), 1, ReplicaGroups(3), "http://h:1").health.port is None


def test_a_failure_line_names_the_group_and_the_quorum_it_leaves() -> None:
    quorum = {"quorum_id": 7, "members": [{"replica_id": "rg0:a"}, {"replica_id": "rg1:b"},
                                          {"replica_id": "rg2:c"}]}  # fmt: skip
    line = failure_line(1, "job-rg1", "rank 0 exited 3", 2, 3, quorum)
    assert line == (
        "replica group 1 (run job-rg1) failed: rank 0 exited 3; restarting (2/3 restarts "
        "left); it leaves quorum 7 (goes on with rg0, rg2)"
    )
    assert (
        failure_line(1, "r", "x", None, 3, None)
        == "replica group 1 (run r) failed: x; no restarts left"
    )
    assert quorum_left(quorum, 5) == "quorum 7 (it was not a member)"
    assert quorum_left({"quorum_id": 7, "members": [{"replica_id": "rg1:b"}]}, 1) == (
        "quorum 7 (goes on with no other group)"
    )

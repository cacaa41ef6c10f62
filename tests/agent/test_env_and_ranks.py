"""The worker environment contract and rank assignment, as pure functions."""

from __future__ import annotations

import pytest

from aelastic.agent import AgentError
from aelastic.agent._env import worker_env
from aelastic.agent._ranks import RankAssignment, RoleInfo, assign_ranks, identical_assignment


def _env(**kw: object) -> dict[str, str]:
    args: dict[str, object] = dict(
        local_rank=1,
        global_rank=5,
        role_rank=3,
        world_size=8,
        role_world_size=6,
        role="trainer",
        local_world_size=2,
        group_rank=2,
        group_world_size=4,
        master_addr="127.0.0.1",
        master_port=1234,
        restart_count=1,
        max_restarts=3,
        run_id="r",
        use_agent_store=True,
        error_file="/tmp/e.json",
    )
    args.update(kw)
    base = args.pop("base", {"PATH": "/bin", "RANK": "stale"})
    return worker_env(base, **args)  # type: ignore[arg-type]


def test_env_contract() -> None:
    env = _env()
    expected = {
        "PATH": "/bin",
        "RANK": "5",
        "LOCAL_RANK": "1",
        "GROUP_RANK": "2",
        "ROLE_RANK": "3",
        "ROLE_NAME": "trainer",
        "LOCAL_WORLD_SIZE": "2",
        "WORLD_SIZE": "8",
        "GROUP_WORLD_SIZE": "4",
        "ROLE_WORLD_SIZE": "6",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1234",
        "TORCHELASTIC_RESTART_COUNT": "1",
        "TORCHELASTIC_MAX_RESTARTS": "3",
        "TORCHELASTIC_RUN_ID": "r",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_ERROR_FILE": "/tmp/e.json",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "OMP_NUM_THREADS": "1",
    }
    assert env == expected


def test_env_defaults_do_not_override_and_base_is_not_mutated() -> None:
    base = {"OMP_NUM_THREADS": "4", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}
    env = _env(base=base, error_file=None, use_agent_store=False)
    assert env["OMP_NUM_THREADS"] == "4"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"
    assert env["TORCHELASTIC_ERROR_FILE"] == ""
    assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False"
    assert base == {"OMP_NUM_THREADS": "4", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}


def test_single_worker_gets_no_omp_default() -> None:
    assert "OMP_NUM_THREADS" not in _env(base={}, local_world_size=1)


def test_ranks_heterogeneous_roles_and_sizes() -> None:
    infos = [
        RoleInfo("trainer", 0, 2),
        RoleInfo("reader", 1, 1),
        RoleInfo("trainer", 2, 3),
        RoleInfo("reader", 3, 2),
    ]
    out = assign_ranks(infos)
    assert [a.base_global_rank for a in out] == [0, 2, 3, 6]
    assert {a.world_size for a in out} == {8}
    assert [(a.base_role_rank, a.role_world_size) for a in out] == [(0, 5), (0, 3), (2, 5), (1, 3)]


def test_ranks_match_fast_path_for_identical_nodes() -> None:
    out = assign_ranks([RoleInfo("default", r, 4) for r in range(3)])
    assert out == [identical_assignment(r, 3, 4) for r in range(3)]


def test_ranks_reject_inconsistent_infos() -> None:
    with pytest.raises(AgentError, match="group rank"):
        assign_ranks([RoleInfo("a", 0, 1), RoleInfo("a", 0, 1)])


def test_wire_format_round_trips_and_rejects_garbage() -> None:
    a = RankAssignment(2, 8, 1, 4, "127.0.0.1", 99, False)
    assert RankAssignment.deserialize(a.serialize()) == a
    assert RoleInfo.deserialize(RoleInfo("x", 1, 2).serialize()) == RoleInfo("x", 1, 2)
    with pytest.raises(AgentError, match="malformed"):
        RoleInfo.deserialize(b"{nope")


def test_local_rank_macro_and_virtual_device() -> None:
    from aelastic.agent._env import substitute_local_rank, virtual_device

    args = ["--rank=${local_rank}", "${other}", "$$x", "plain"]
    assert substitute_local_rank(args, 3) == ["--rank=3", "${other}", "$x", "plain"]
    assert virtual_device({"CUDA_VISIBLE_DEVICES": "4, 6"}, 1) == "6"
    assert virtual_device({"CUDA_VISIBLE_DEVICES": "4"}, 1) == "1"
    assert virtual_device({}, 2) == "2"

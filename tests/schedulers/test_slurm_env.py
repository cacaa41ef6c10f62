"""A Slurm step's environment -> the launcher's rendezvous settings (pure functions)."""

from __future__ import annotations

import pytest

from aelastic._exceptions import ConfigError
from aelastic.launcher._args import UsageError, parse_run_args
from aelastic.schedulers._slurm import (
    PORT_BASE,
    PORT_SPAN,
    parse_node_addr,
    rendezvous_port,
    slurm_defaults,
    slurm_job,
)


def step_env(**extra: str) -> dict[str, str]:
    """What srun -N3 --ntasks-per-node=1 sets on the second node (copied from a real step)."""
    env = {
        "SLURM_JOB_ID": "4711",
        "SLURM_STEP_ID": "2",
        "SLURM_JOB_NODELIST": "gpu-[07-08],cpu1",
        "SLURM_JOB_NUM_NODES": "3",
        "SLURM_NODEID": "1",
        "SLURM_STEP_TASKS_PER_NODE": "1(x3)",
        "SLURM_CPUS_ON_NODE": "6",
        "SLURM_RESTART_COUNT": "1",
    }
    env.update(extra)
    return env


def test_no_step_no_settings() -> None:
    assert slurm_job({}) is None
    assert slurm_job({"SLURM_JOB_ID": "5"}) is None  # the batch script itself, not a step


def test_a_step_gives_run_id_nodes_store_host_and_port() -> None:
    job = slurm_job(step_env())
    assert job is not None
    defaults = slurm_defaults(job, "10.1.2.3")
    assert defaults.run_id == "slurm-4711.2"
    assert defaults.num_nodes == 3
    assert defaults.store_host == "10.1.2.3"
    assert not defaults.is_host
    assert defaults.nproc_auto == 6
    assert defaults.restart_count == 1
    assert slurm_defaults(job).store_host == "gpu-07"  # no NodeAddr: the name, for DNS
    node0 = slurm_job(step_env(SLURM_NODEID="0", SLURM_GPUS_ON_NODE="4"))
    assert node0 is not None and slurm_defaults(node0).is_host
    assert slurm_defaults(node0).nproc_auto == 4


def test_ports_stay_in_range_and_neighbouring_jobs_differ() -> None:
    ports = {rendezvous_port(job, step) for job in range(1000, 1187) for step in range(16)}
    assert len(ports) == 187 * 16
    assert all(PORT_BASE <= p < PORT_BASE + PORT_SPAN for p in ports)
    assert PORT_BASE + PORT_SPAN <= 32768  # below Linux's ephemeral ports


@pytest.mark.parametrize(
    "extra",
    [{"SLURM_STEP_TASKS_PER_NODE": "2(x3)"}, {"SLURM_NTASKS_PER_NODE": "4"}],
)
def test_several_tasks_per_node_are_refused(extra: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="--ntasks-per-node=1"):
        slurm_job(step_env(**extra))
    with pytest.raises(UsageError, match="--ntasks-per-node=1"):
        parse_run_args(["train.py"], step_env(**extra))


def test_node_addr_from_scontrol_output() -> None:
    line = "NodeName=n2 Arch=x86_64 NodeAddr=127.0.0.1 NodeHostName=vm Port=25338"
    assert parse_node_addr(line) == "127.0.0.1"
    assert parse_node_addr("NodeName=n2 State=IDLE") is None


def test_launcher_takes_the_step_s_settings_with_no_flag() -> None:
    parsed = parse_run_args(
        ["--nproc-per-node", "auto", "train.py"], step_env(), slurm_address="10.1.2.3"
    )
    config = parsed.config
    assert (config.min_nodes, config.max_nodes) == (3, 3)
    assert config.run_id == "slurm-4711.2"
    assert config.rdzv_backend == "c10d"
    assert config.rdzv_endpoint == f"10.1.2.3:{rendezvous_port(4711, 2)}"
    assert config.rdzv_configs["is_host"] == "0"
    assert config.nproc_per_node == 6
    assert len(parsed.notes) == 1 and "slurm-4711.2" in parsed.notes[0]


def test_explicit_flags_and_pet_variables_win() -> None:
    env = step_env(PET_RDZV_ID="mine")
    argv = ["--nnodes", "2:3", "--master-port", "31000", "--nproc-per-node", "2", "train.py"]
    config = parse_run_args(argv, env, slurm_address="10.1.2.3").config
    assert (config.min_nodes, config.max_nodes) == (2, 3)
    assert config.run_id == "mine"
    assert config.rdzv_endpoint == "10.1.2.3:31000"
    assert config.nproc_per_node == 2
    argv = ["--rdzv-endpoint", "head:1234", "train.py"]
    config = parse_run_args(argv, step_env(), slurm_address="10.1.2.3").config
    assert config.rdzv_endpoint == "head:1234"
    assert "is_host" not in config.rdzv_configs  # the user's endpoint: detected as usual


def test_outside_slurm_nothing_changes() -> None:
    config = parse_run_args(["train.py"], {}).config
    assert config.rdzv_endpoint == "localhost:0"  # torchrun's one-node standalone

"""``aelastic run`` argument parsing: argv + env -> LaunchConfig, with no process started."""

from __future__ import annotations

import sys

import pytest

from aelastic import LaunchConfig
from aelastic.launcher._args import (
    LOGS_SPECS_GROUP,
    UsageError,
    count_gpus,
    parse_run_args,
    split_filters,
)
from aelastic.launcher._exceptions import LaunchConfigError


def parse(*argv: str, **env: str):  # type: ignore[no-untyped-def]
    return parse_run_args(list(argv), env)


def test_torchrun_defaults_switch_to_standalone_c10d() -> None:
    r = parse("train.py", "--lr", "0.1")
    c = r.config
    assert (c.min_nodes, c.max_nodes, c.nproc_per_node) == (1, 1, 1)
    # static with no endpoint, no --master-port and one node: torchrun switches to c10d
    assert c.rdzv_backend == "c10d" and c.rdzv_endpoint == "localhost:0"
    assert c.run_id != "none" and len(c.run_id) == 36
    assert c.max_restarts == 0 and c.monitor_interval == 0.1 and c.role == "default"
    assert c.signals_to_handle == "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    assert c.shutdown_timeout is None and c.exit_barrier_timeout == 300
    assert c.rdzv_configs == {"timeout": 900}
    assert r.entrypoint == sys.executable
    assert r.args == ["-u", "train.py", "--lr", "0.1"]
    assert r.set_env == {}  # nproc 1: OMP_NUM_THREADS untouched


def test_static_backend_keeps_master_endpoint_and_node_rank() -> None:
    c = parse("--nnodes", "2", "--node-rank", "1", "--master-port", "1234", "x.py").config
    assert c.rdzv_backend == "static"
    assert c.rdzv_endpoint == "127.0.0.1:1234"
    assert c.rdzv_configs["rank"] == 1
    c = parse("--master_port", "1234", "x.py").config  # one node but explicit port: static
    assert c.rdzv_backend == "static"


def test_standalone_ignores_explicit_rendezvous_flags() -> None:
    c = parse("--standalone", "--rdzv-backend", "etcd", "--rdzv-id", "job", "x.py").config
    assert (c.rdzv_backend, c.rdzv_endpoint) == ("c10d", "localhost:0")
    assert c.run_id != "job"


def test_underscore_aliases_and_elastic_nnodes() -> None:
    r = parse(
        "--nnodes=2:3",
        "--nproc_per_node=4",
        "--rdzv_backend=c10d",
        "--rdzv_endpoint=127.0.0.1:5555",
        "--rdzv_id=job7",
        "--rdzv_conf=keep_alive_interval=0.2,heartbeat_timeout=1",
        "--max_restarts=3",
        "--monitor_interval=0.5",
        "--log_dir=/tmp/x",
        "--local_ranks_filter=0,2",
        "--shutdown_timeout=5",
        "--exit_barrier_timeout=7",
        "--local_addr=127.0.0.1",
        "--signals_to_handle=SIGTERM,USR1",
        "-r",
        "3",
        "-t",
        "0:1,1:2",
        "-m",
        "pkg.train",
        "--epochs",
        "3",
    )
    c = r.config
    assert (c.min_nodes, c.max_nodes, c.nproc_per_node) == (2, 3, 4)
    assert (c.rdzv_backend, c.rdzv_endpoint, c.run_id) == ("c10d", "127.0.0.1:5555", "job7")
    assert c.rdzv_configs == {
        "keep_alive_interval": "0.2",
        "heartbeat_timeout": "1",
        "timeout": 900,
    }
    assert (c.max_restarts, c.monitor_interval, c.log_dir) == (3, 0.5, "/tmp/x")
    assert c.local_ranks_filter == {0, 2}
    assert (c.shutdown_timeout, c.exit_barrier_timeout) == (5, 7)
    assert c.signals_to_handle == "SIGTERM,SIGUSR1"
    assert (c.redirects, c.tee) == ("3", "0:1,1:2")
    assert r.args == ["-u", "-m", "pkg.train", "--epochs", "3"]
    assert r.set_env == {"OMP_NUM_THREADS": "1"}


def test_pet_environment_defaults_and_command_line_wins() -> None:
    env = {
        "PET_NNODES": "2:4",
        "PET_NPROC_PER_NODE": "3",
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": "127.0.0.1:29999",
        "PET_RDZV_ID": "kubeflow-job",
        "PET_MAX_RESTARTS": "5",
        "PET_STANDALONE": "0",
        "PET_NO_PYTHON": "1",
        "OMP_NUM_THREADS": "4",
    }
    r = parse_run_args(["--max-restarts", "1", "/bin/true", "a"], env)
    c = r.config
    assert (c.min_nodes, c.max_nodes, c.nproc_per_node) == (2, 4, 3)
    assert (c.rdzv_backend, c.rdzv_endpoint, c.run_id) == (
        "c10d",
        "127.0.0.1:29999",
        "kubeflow-job",
    )
    assert c.max_restarts == 1  # the command line wins over PET_MAX_RESTARTS
    assert (r.entrypoint, r.args) == ("/bin/true", ["a"])  # PET_NO_PYTHON=1
    assert r.set_env == {}  # OMP_NUM_THREADS already set


def test_pet_standalone_flag() -> None:
    c = parse("x.py", PET_STANDALONE="1", PET_RDZV_BACKEND="static", PET_NNODES="1").config
    assert c.rdzv_backend == "c10d"


def test_exit_barrier_and_shutdown_env() -> None:
    c = parse("x.py", TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT="12").config
    assert c.exit_barrier_timeout == 12
    c = parse("x.py", TORCH_ELASTIC_SHUTDOWN_TIMEOUT="4").config
    assert c.shutdown_timeout is None
    assert c.resolved_shutdown_timeout({"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "4"}) == 4
    assert c.resolved_shutdown_timeout({}) == 30


def test_exit_grace_default_flag_env_and_bad_value() -> None:
    # issue 39: the restart policy's fields moved into LaunchConfig.restarts
    assert parse("t.py").config.restarts.exit_grace == 60.0
    assert parse("--exit-grace", "5", "t.py").config.restarts.exit_grace == 5.0
    assert parse("t.py", PET_EXIT_GRACE="0").config.restarts.exit_grace == 0.0  # no bound
    with pytest.raises(UsageError, match="--exit-grace -1: must be >= 0"):
        parse("--exit-grace", "-1", "t.py")


def test_nproc_per_node_words() -> None:
    assert parse("--nproc-per-node", "cpu", "x.py").config.nproc_per_node >= 1
    expected = count_gpus({}) or parse("--nproc-per-node", "cpu", "x.py").config.nproc_per_node
    assert parse("--nproc-per-node", "auto", "x.py").config.nproc_per_node == expected


def test_run_path_and_no_python_and_macro_kept() -> None:
    r = parse("--no-python", "/bin/echo", "${local_rank}")
    assert (r.entrypoint, r.args) == ("/bin/echo", ["${local_rank}"])
    r = parse("--run-path", "--no-python", "/abs/train.py", "x")
    # runpy.run_path under @record, as torchrun's --run-path does
    runner = ["-u", "-m", "aelastic.errors._run_script"]
    assert r.entrypoint == sys.executable and r.args == [*runner, "/abs/train.py", "x"]
    r = parse("x.py", PYTHON_EXEC="/opt/py")
    assert r.entrypoint == "/opt/py"
    # torchrun runs --run-path in its own interpreter whatever PYTHON_EXEC says
    assert parse("--run-path", "x.py", PYTHON_EXEC="/opt/py").entrypoint == sys.executable


def test_numa_and_logs_specs_accepted_with_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint

    import aelastic._entry_points

    provided = [EntryPoint("mine", "pkg.logs:MineSpecs", LOGS_SPECS_GROUP)]
    monkeypatch.setattr(
        aelastic._entry_points,
        "entry_points_of",
        lambda group: provided if group == LOGS_SPECS_GROUP else [],
    )
    r = parse("--numa-binding", "node", "--logs-specs", "mine", "x.py")
    assert len(r.warnings) == 2 and "numa" in r.warnings[0]
    assert "--logs-specs mine is accepted but ignored" in r.warnings[1]


def test_logs_specs_no_plugin_provides_is_refused() -> None:
    # torchrun: ValueError "Could not find entrypoint under 'torchrun.logs_specs[nope]'"
    with pytest.raises(UsageError, match=r"--logs-specs 'nope': no installed package"):
        parse("--logs-specs", "nope", "x.py")
    with pytest.raises(ValueError):
        parse("--logs-specs", "nope", "x.py")


def test_duplicate_filter_syntax() -> None:
    assert split_filters("loss,,x,acc") == ["loss,x", "acc"]
    assert split_filters("") == []


@pytest.mark.parametrize(
    ("argv", "env", "names"),
    [
        (["--nnodes", "3:2", "x.py"], {}, "--nnodes"),
        (["--nnodes", "0", "x.py"], {}, "--nnodes"),
        (["--nnodes", "1:2:3", "x.py"], {}, "--nnodes"),
        (["--nproc-per-node", "x", "x.py"], {}, "--nproc-per-node"),
        (["--nproc-per-node", "0", "x.py"], {}, "--nproc-per-node"),
        (["--rdzv-conf", "foo", "x.py"], {}, "--rdzv-conf"),
        (["--rdzv-conf", "a=", "x.py"], {}, "--rdzv-conf"),
        (["--max-restarts", "-1", "x.py"], {}, "--max-restarts"),
        (["--monitor-interval", "0", "x.py"], {}, "--monitor-interval"),
        (["--shutdown-timeout", "-2", "x.py"], {}, "--shutdown-timeout"),
        (["--start-method", "thread", "x.py"], {}, "--start-method"),
        (["--signals-to-handle", "SIGNOPE", "x.py"], {}, "--signals-to-handle"),
        (["--signals-to-handle", "SIGKILL", "x.py"], {}, "SIGKILL"),
        (["--local-ranks-filter", "a", "x.py"], {}, "--local-ranks-filter"),
        (["-r", "7", "x.py"], {}, "--redirects"),
        (["--numa-binding", "weird", "x.py"], {}, "--numa-binding"),
        (["-m", "--no-python", "x"], {}, "--no-python"),
        ([], {}, "training script"),
        (["--bogus", "x.py"], {}, "--bogus"),
        (["x.py"], {"PET_NNODES": "a"}, "PET_NNODES"),
        (["x.py"], {"PET_STANDALONE": "yes"}, "PET_STANDALONE"),
        (["x.py"], {"PET_MAX_RESTARTS": "-3"}, "PET_MAX_RESTARTS"),
        (["x.py"], {"TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT": "soon"}, "EXIT_BARRIER"),
    ],
)
def test_bad_values_name_the_problem(argv: list[str], env: dict[str, str], names: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_run_args(argv, env)
    message = str(info.value)
    assert names in message and "\n" not in message


def test_gpu_without_gpu_is_a_clear_error() -> None:
    if count_gpus({}):
        pytest.skip("this machine has a GPU")
    with pytest.raises(UsageError, match="no NVIDIA GPU"):
        parse("--nproc-per-node", "gpu", "x.py")


def test_launch_config_torch_defaults_and_validation() -> None:
    c = LaunchConfig(min_nodes=1, max_nodes=2, nproc_per_node=2)
    assert (c.rdzv_backend, c.role, c.max_restarts, c.run_id) == ("etcd", "default_role", 3, "")
    assert c.rdzv_configs == {"timeout": 900}
    assert LaunchConfig(1, 1, 1, rdzv_timeout=60).rdzv_configs["timeout"] == 60
    with pytest.raises(LaunchConfigError, match="min_nodes"):
        LaunchConfig(min_nodes=3, max_nodes=2, nproc_per_node=1)
    with pytest.raises(LaunchConfigError, match="max_restarts"):
        LaunchConfig(1, 1, 1, max_restarts=-1)
    with pytest.raises(LaunchConfigError, match="TORCH_ELASTIC_SHUTDOWN_TIMEOUT"):
        c.resolved_shutdown_timeout({"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "x"})


def test_preload_flags() -> None:
    c = parse("--preload", "auto,torch", "--preload-exclude", "deepspeed", "train.py").config
    assert c.preload.modules == ("auto", "torch") and c.preload.exclude == ("deepspeed",)
    assert parse("train.py").config.preload.modules == ()
    assert parse("train.py", PET_PRELOAD="auto").config.preload.modules == ("auto",)
    with pytest.raises(UsageError, match="--preload: 'torch optim' is not a module name"):
        parse("--preload", "torch optim", "train.py")
    r = parse("--no-python", "--preload", "torch", "/bin/true")
    assert any("--preload has no effect with --no-python" in w for w in r.warnings)
    # issue 39: LaunchConfig.preload is a PreloadSettings now, which refuses the name
    # itself (tests/agent/test_preload_settings.py); a bare tuple is refused by the config
    with pytest.raises(LaunchConfigError, match=r"preload=\('torch',\): need a PreloadSettings"):
        LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, preload=("torch",))  # type: ignore[arg-type]

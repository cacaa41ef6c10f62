"""launch()'s smaller contracts: config copying, documented errors, graceful exit."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import anyio
import pytest

from aelastic import LaunchConfig, launch
from aelastic.launcher._exceptions import LaunchConfigError
from aelastic.rendezvous import (
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    register,
)
from aelastic.workers import WorkerStartError


def _config(**kw: Any) -> LaunchConfig:
    settings: dict[str, Any] = {
        "min_nodes": 1,
        "max_nodes": 1,
        "nproc_per_node": 1,
        "rdzv_backend": "c10d",
        "rdzv_endpoint": "127.0.0.1:0",
        "max_restarts": 0,
    }
    return LaunchConfig(**{**settings, **kw})


def test_config_leaves_the_callers_rdzv_configs_alone() -> None:
    mine = {"join_timeout": 5}
    config = _config(rdzv_configs=mine, rdzv_timeout=7)
    assert mine == {"join_timeout": 5}
    assert config.rdzv_configs == {"join_timeout": 5, "timeout": 7}
    _config(rdzv_configs=mine)
    assert mine == {"join_timeout": 5}


@pytest.mark.parametrize("port", [-1, 65536, "80", True])
def test_config_rejects_a_bad_health_port(port: Any) -> None:
    # issue 39: the port is HealthSettings' now (tests/jobview/test_health_settings.py)
    from aelastic import ConfigError
    from aelastic.health._settings import HealthSettings

    with pytest.raises(ConfigError, match="--health-port"):
        HealthSettings(port=port)
    with pytest.raises(LaunchConfigError, match="need a HealthSettings"):
        _config(health={"port": 0})


async def test_a_worker_that_cannot_start_raises_worker_start_error(tmp_path: Any) -> None:
    assert launch.__doc__ is not None and "WorkerStartError" in launch.__doc__
    missing = str(tmp_path / "no-such-binary")
    with anyio.fail_after(60), pytest.raises(WorkerStartError):
        await launch(_config(), missing)


class _LetGo(RendezvousHandler):
    """A backend whose rendezvous lets this node go (a spare of a job that ended)."""

    def __init__(self, params: RendezvousParameters) -> None:
        self._run_id = params.run_id

    def get_backend(self) -> str:
        return "let-go"

    def get_run_id(self) -> str:
        return self._run_id

    async def next_rendezvous(self) -> RendezvousInfo:
        raise RendezvousGracefulExitError("rendezvous closed while this node was a spare")

    async def is_closed(self) -> bool:
        return True

    async def set_closed(self) -> None:
        pass

    async def num_nodes_waiting(self) -> int:
        return 0

    async def shutdown(self) -> bool:
        return True


async def test_a_graceful_exit_is_not_mistaken_for_success() -> None:
    register("let-go", _LetGo)
    with anyio.fail_after(60), pytest.raises(RendezvousGracefulExitError, match="spare"):
        await launch(_config(rdzv_backend="let-go"), "/bin/true")


def test_the_launch_path_loads_no_http_parser() -> None:
    """h11 is the health endpoint's: loaded only when a job serves one."""
    code = "import sys, aelastic.launcher, aelastic.launcher._cli; print('h11' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_health_port_flag_and_torchrun_variable() -> None:
    from aelastic.launcher._args import UsageError, parse_run_args

    assert parse_run_args(["x.py"], environ={}).config.health.port is None
    flag = parse_run_args(["--health-port", "0", "x.py"], environ={}).config
    assert (flag.health.port, flag.health.host) == (0, "127.0.0.1")
    env = {"TORCHELASTIC_HEALTH_CHECK_PORT": "8123"}
    assert parse_run_args(["x.py"], environ=env).config.health.port == 8123
    both = parse_run_args(["--health-port", "9", "--health-host", "::1", "x.py"], environ=env)
    assert (both.config.health.port, both.config.health.host) == (9, "::1")  # the flag wins
    with pytest.raises(UsageError, match="TORCHELASTIC_HEALTH_CHECK_PORT='http'"):
        parse_run_args(["x.py"], environ={"TORCHELASTIC_HEALTH_CHECK_PORT": "http"})
    with pytest.raises(UsageError, match="--health-port 70000: a TCP port is 0-65535"):
        parse_run_args(["--health-port", "70000", "x.py"], environ={})


def test_entrypoint_name_follows_torchs_rule() -> None:
    from aelastic.launcher._launch import entrypoint_name

    assert entrypoint_name(sys.executable, []) == ""  # torch's _get_entrypoint_name
    assert entrypoint_name(sys.executable, ["-u"]) == ""
    assert entrypoint_name(sys.executable, ["-u", "train.py", "--lr"]) == "train.py"
    assert entrypoint_name("/bin/echo", []) == "/bin/echo"
    assert entrypoint_name(None, []) == ""

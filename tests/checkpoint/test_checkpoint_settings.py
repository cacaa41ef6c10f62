"""CheckpointSettings: one place for the defaults and the checks of --checkpoint-*."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from _settings_doors import assert_held_as_given, assert_one_message

from aelastic import CheckpointSettings, ConfigError, LaunchConfig
from aelastic.launcher._args import build_parser, parse_run_args


@pytest.mark.parametrize(
    ("values", "flags"),
    [
        ({"persist_interval": 0}, ["--checkpoint-persist-interval", "0"]),
        ({"persist_interval": -3.5}, ["--checkpoint-persist-interval", "-3.5"]),
        ({"persist_interval": float("inf")}, ["--checkpoint-persist-interval", "inf"]),
        ({"peer_copies": -1}, ["--checkpoint-peer-copies", "-1"]),
        ({"requeue": True}, ["--requeue"]),
    ],
)
def test_the_api_and_the_flags_refuse_a_value_with_one_message(
    values: dict[str, object], flags: list[str]
) -> None:
    """Both go through CheckpointSettings' checks: the same words, whichever door (the
    API once accepted ``checkpoint_persist_interval=0``, which the command line refused)."""
    assert_one_message(CheckpointSettings, values, flags)


@pytest.mark.parametrize(
    "values",
    [
        {"dir": ""},
        {"dir": 3},
        {"persist_interval": "300"},
        {"persist_interval": True},
        {"peer_copies": 1.5},
        {"job_secret_file": ""},
    ],
)
def test_values_of_the_wrong_kind_are_refused_when_made(values: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="need "):
        CheckpointSettings(**values)  # type: ignore[arg-type]


def test_launch_config_holds_one_settings_object(tmp_path: Path) -> None:
    settings = CheckpointSettings(dir=str(tmp_path), persist_interval=30, requeue=True)
    assert_held_as_given("checkpoints", settings)
    with pytest.raises(
        ConfigError, match=r"checkpoints=./d.: need an aelastic\.CheckpointSettings"
    ):
        LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, checkpoints="/d")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="checkpoint_dir"):  # the flat name is gone (docs: Names)
        LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, checkpoint_dir="/d")  # type: ignore[call-arg]


def test_defaults_are_the_settings_objects_everywhere() -> None:
    """Stated once, on CheckpointSettings: the API's config, the agent's default, the
    parsed flags and the help text all show that object's values (read from it)."""
    from aelastic.agent import LocalElasticAgent, WorkerSpec

    defaults = {f.name: f.default for f in dataclasses.fields(CheckpointSettings)}
    assert defaults["persist_interval"] > 0 and defaults["dir"] is None
    assert LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1).checkpoints == (
        CheckpointSettings(**defaults)
    )
    assert parse_run_args(["x.py"], {}).config.checkpoints == CheckpointSettings(**defaults)
    spec = WorkerSpec(role="r", local_world_size=1, rdzv_handler=None, entrypoint="x.py")  # type: ignore[arg-type]
    assert LocalElasticAgent(spec)._checkpoint_settings == CheckpointSettings(**defaults)
    helps = {a.option_strings[0]: a.help or "" for a in build_parser()._actions if a.option_strings}
    for name in ("persist_interval", "peer_copies"):
        flag = "--checkpoint-" + name.replace("_", "-")
        assert helps[flag].endswith(f"(default: {defaults[name]:g})"), helps[flag]

"""BadNodeSettings: one place for the defaults and the checks of --node-health-* and
--exclude-node-*."""

from __future__ import annotations

import dataclasses

import pytest
from _settings_doors import assert_one_message

from aelastic import BadNodeSettings, ConfigError, LaunchConfig
from aelastic.launcher._args import build_parser, parse_run_args
from aelastic.launcher._node_args import gate_for
from aelastic.nodes._exceptions import NodeHealthConfigError


@pytest.mark.parametrize(
    ("values", "flags"),
    [
        ({"health_checks": (" ",)}, ["--node-health-check", " "]),
        ({"health_timeout": 0}, ["--node-health-timeout", "0"]),
        ({"health_cooldown": -1.5}, ["--node-health-cooldown", "-1.5"]),
        ({"exclude_after": -1}, ["--exclude-node-after", "-1"]),
        ({"exclude_window": 0}, ["--exclude-node-window", "0"]),
        ({"exclude_cooldown_max": float("nan")}, ["--exclude-node-cooldown-max", "nan"]),
    ],
)
def test_the_api_and_the_flags_refuse_a_value_with_one_message(
    values: dict[str, object], flags: list[str]
) -> None:
    """Both go through BadNodeSettings' checks: the same words, whichever door (the API
    once took a health timeout of 0 that the command line refused)."""
    assert_one_message(BadNodeSettings, values, flags)
    with pytest.raises(NodeHealthConfigError):  # the nodes' own ConfigError
        BadNodeSettings(**values)  # type: ignore[arg-type]


def test_defaults_are_the_settings_objects_everywhere() -> None:
    defaults = {f.name: f.default for f in dataclasses.fields(BadNodeSettings)}
    assert defaults["exclude_after"] == 0 and defaults["health_checks"] == ()
    assert LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1).bad_nodes == (
        BadNodeSettings(**defaults)
    )
    assert parse_run_args(["x.py"], {}).config.bad_nodes == BadNodeSettings(**defaults)
    helps = {a.option_strings[0]: a.help or "" for a in build_parser()._actions if a.option_strings}
    for name, flag in (
        ("health_timeout", "--node-health-timeout"),
        ("health_cooldown", "--node-health-cooldown"),
        ("exclude_after", "--exclude-node-after"),
        ("exclude_window", "--exclude-node-window"),
        ("exclude_cooldown", "--exclude-node-cooldown"),
        ("exclude_cooldown_max", "--exclude-node-cooldown-max"),
    ):
        assert helps[flag].endswith(f"(default: {defaults[name]:g})"), helps[flag]


def test_the_gate_is_built_from_the_settings() -> None:
    settings = BadNodeSettings(
        health_checks=["true"],  # type: ignore[arg-type]
        builtin_checks=False,
        exclude_after=2,
        exclude_window=10,
        health_timeout=7,
    )
    assert settings.health_checks == ("true",)  # kept as a tuple: the object is frozen
    config = LaunchConfig(min_nodes=1, max_nodes=2, nproc_per_node=1, bad_nodes=settings)
    gate = gate_for(config)
    assert gate is not None and gate.exclusion is not None
    assert gate.exclusion.settings == settings.exclusion
    assert (settings.exclusion.after, settings.exclusion.window) == (2, 10)
    with pytest.raises(ConfigError, match=r"bad_nodes=3: need an aelastic\.BadNodeSettings"):
        LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, bad_nodes=3)  # type: ignore[arg-type]

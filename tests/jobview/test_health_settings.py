"""HealthSettings: one place for the defaults and the checks of --health-port/--health-host."""

from __future__ import annotations

import pytest
from _settings_doors import assert_held_as_given, assert_one_message

from aelastic import ConfigError
from aelastic.health._settings import HealthSettings
from aelastic.launcher._args import UsageError, parse_run_args


@pytest.mark.parametrize(
    ("values", "flags"),
    [
        ({"port": 70000}, ["--health-port", "70000"]),
        ({"port": -1}, ["--health-port", "-1"]),
        ({"port": 0, "host": ""}, ["--health-port", "0", "--health-host", ""]),
    ],
)
def test_the_api_and_the_flags_refuse_a_value_with_one_message(
    values: dict[str, object], flags: list[str]
) -> None:
    """Both go through HealthSettings' checks: the same words, whichever door (the API
    named ``health_port=`` where the command line named ``--health-port``)."""
    assert_one_message(HealthSettings, values, flags, flag=flags[-2])


@pytest.mark.parametrize("values", [{"port": "80"}, {"port": True}, {"port": 8.0}, {"host": 1}])
def test_values_of_the_wrong_kind_are_refused_when_made(values: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="--health-"):
        HealthSettings(**values)  # type: ignore[arg-type]


def test_the_torchrun_variable_goes_through_the_same_check() -> None:
    env = {"TORCHELASTIC_HEALTH_CHECK_PORT": "65536"}
    with pytest.raises(UsageError, match="a TCP port is 0-65535"):
        parse_run_args(["x.py"], env)
    assert parse_run_args(["x.py"], {}).config.health == HealthSettings()


def test_launch_config_holds_one_settings_object() -> None:
    settings = HealthSettings(port=0, host="::1")
    assert_held_as_given("health", settings)
    assert (settings.port, settings.host) == (0, "::1") and HealthSettings().port is None

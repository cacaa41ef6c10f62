"""RestartSettings: one place for the defaults and the checks of the restart flags."""

from __future__ import annotations

import dataclasses

import pytest
from _settings_doors import assert_held_as_given, assert_one_message

from aelastic import ConfigError, LaunchConfig, RestartSettings
from aelastic.agent import WorkerSpec
from aelastic.launcher._args import parse_run_args
from aelastic.launcher._build import make_spec
from aelastic.rendezvous import RendezvousParameters, get_rendezvous_handler


@pytest.mark.parametrize(
    ("values", "flags"),
    [
        ({"max_no_progress_restarts": 0}, ["--max-no-progress-restarts", "0"]),
        ({"restart_backoff": -1}, ["--restart-backoff", "-1"]),
        ({"restart_backoff_max": -0.5}, ["--restart-backoff-max", "-0.5"]),
        ({"restart_backoff": float("nan")}, ["--restart-backoff", "nan"]),
        ({"exit_grace": -2}, ["--exit-grace", "-2"]),
    ],
)
def test_the_api_and_the_flags_refuse_a_value_with_one_message(
    values: dict[str, object], flags: list[str]
) -> None:
    """Both go through RestartSettings' checks: the same words, whichever door (the API
    once took ``restart_backoff=-1`` and failed later, in WorkerSpec, with other words)."""
    assert_one_message(RestartSettings, values, flags)


@pytest.mark.parametrize(
    "values",
    [
        {"max_no_progress_restarts": True},
        {"max_no_progress_restarts": 2.0},
        {"restart_backoff": "5"},
        {"exit_grace": False},
        {"job_wide_restarts": 1},
    ],
)
def test_values_of_the_wrong_kind_are_refused_when_made(values: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match=r"^--"):
        RestartSettings(**values)  # type: ignore[arg-type]


def test_the_flags_fill_one_object_and_the_spec_gets_its_fields() -> None:
    argv = ["--max-no-progress-restarts", "2", "--restart-backoff", "1.5", "--job-wide-restarts"]
    restarts = parse_run_args([*argv, "--exit-grace", "0", "x.py"], {}).config.restarts
    assert restarts == RestartSettings(
        max_no_progress_restarts=2, restart_backoff=1.5, job_wide_restarts=True, exit_grace=0.0
    )
    assert parse_run_args(["x.py"], {}).config.restarts == RestartSettings()
    env = {"PET_RESTART_BACKOFF_MAX": "7"}
    assert parse_run_args(["x.py"], env).config.restarts.restart_backoff_max == 7.0

    settings = RestartSettings(restart_backoff=2, restart_backoff_max=8, exit_grace=None)
    assert_held_as_given("restarts", settings)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, restarts=settings)
    params = RendezvousParameters("c10d", "127.0.0.1:0", "r", 1, 1, local_addr="127.0.0.1")
    spec = make_spec(config, get_rendezvous_handler(params), "/bin/true", ())
    got = {name: getattr(spec, name) for name in settings.spec_fields()}
    assert got == {
        "max_no_progress_restarts": None,
        "restart_backoff": 2,
        "restart_backoff_max": 8,
        "job_wide_restarts": False,
        "exit_grace": None,
    }


def test_the_defaults_are_the_worker_specs() -> None:
    """WorkerSpec (the agent's API) states the same defaults for its flat fields."""
    spec = {f.name: f.default for f in dataclasses.fields(WorkerSpec)}
    assert {k: spec[k] for k in RestartSettings().spec_fields()} == RestartSettings().spec_fields()

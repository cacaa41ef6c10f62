"""HangSettings: one place for the defaults and the checks of the hang-detection flags."""

from __future__ import annotations

import dataclasses

import pytest
from _settings_doors import assert_held_as_given, assert_one_message

from aelastic import ConfigError, LaunchConfig
from aelastic.launcher._args import UsageError, parse_run_args
from aelastic.launcher._build import make_spec
from aelastic.progress._settings import HangSettings
from aelastic.rendezvous import RendezvousParameters, get_rendezvous_handler


@pytest.mark.parametrize(
    ("values", "flags"),
    [
        ({"heartbeat_timeout": 0}, ["--heartbeat-timeout", "0"]),
        ({"initial_heartbeat_timeout": -2.5}, ["--initial-heartbeat-timeout", "-2.5"]),
        ({"out_of_section_timeout": float("inf")}, ["--out-of-section-timeout", "inf"]),
        ({"learn_timeouts": 1}, ["--learn-timeouts", "1"]),
        ({"section_timeouts": {"allreduce": 0}}, ["--section-timeouts", "allreduce=0"]),
    ],
)
def test_the_api_and_the_flags_refuse_a_value_with_one_message(
    values: dict[str, object], flags: list[str]
) -> None:
    """Both go through HangSettings' checks: the same words, whichever door (the API once
    took ``heartbeat_timeout=0`` and ``learn_timeouts=1``, which the command line refused)."""
    assert_one_message(HangSettings, values, flags)


@pytest.mark.parametrize(
    "values",
    [
        {"heartbeat_timeout": "60"},
        {"heartbeat_timeout": True},
        {"section_timeouts": {"": 5.0}},
        {"section_timeouts": [("fwd", 2.0)]},
        {"learn_timeouts": float("nan")},
    ],
)
def test_values_of_the_wrong_kind_are_refused_when_made(values: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="need "):
        HangSettings(**values)  # type: ignore[arg-type]


def test_a_section_that_is_not_name_equals_seconds_is_one_line() -> None:
    with pytest.raises(UsageError, match=r"--section-timeouts allreduce: need name=seconds"):
        parse_run_args(["--section-timeouts", "allreduce", "x.py"], {})


def test_the_flags_fill_one_object_and_the_spec_gets_its_fields() -> None:
    argv = ["--heartbeat-timeout", "60", "--section-timeouts", " fwd=2, checkpoint=600 ,"]
    argv += ["--learn-timeouts", "5", "x.py"]
    hangs = parse_run_args(argv, {}).config.hangs
    assert hangs == HangSettings(
        heartbeat_timeout=60.0,
        section_timeouts={"fwd": 2.0, "checkpoint": 600.0},
        learn_timeouts=5.0,
    )
    assert parse_run_args(["x.py"], {}).config.hangs == HangSettings()
    assert not HangSettings().enabled and hangs.enabled

    sections = {"allreduce": 1.8}
    settings = HangSettings(initial_heartbeat_timeout=60, section_timeouts=sections)
    sections["allreduce"] = 99.0  # the caller's dict is not the settings'
    assert_held_as_given("hangs", settings)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, hangs=settings)
    params = RendezvousParameters("c10d", "127.0.0.1:0", "r", 1, 1, local_addr="127.0.0.1")
    spec = make_spec(config, get_rendezvous_handler(params), "/bin/true", ())
    got = [getattr(spec, name) for name in ("initial_heartbeat_timeout", "heartbeat_timeout")]
    assert got == [60, None] and spec.section_timeouts == {"allreduce": 1.8}


def test_spec_fields_are_every_field_and_worker_spec_has_each_with_its_default() -> None:
    """``spec_fields()`` is derived from the dataclass, so it cannot drift from it; this
    pins the other side: WorkerSpec (the agent's API) has each field, with the same
    default. A field added to one and not the other fails here, not in a job."""
    from aelastic.agent import WorkerSpec

    names = [f.name for f in dataclasses.fields(HangSettings)]
    settings = HangSettings(heartbeat_timeout=30, section_timeouts={"fwd": 2})
    assert list(settings.spec_fields()) == names
    assert settings.spec_fields()["section_timeouts"] == {"fwd": 2}
    spec = {f.name: f.default for f in dataclasses.fields(WorkerSpec)}
    assert {name: spec.get(name, "missing") for name in names} == HangSettings().spec_fields()

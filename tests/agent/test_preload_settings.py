"""PreloadSettings: one place for the default and the check of --preload/--preload-exclude."""

from __future__ import annotations

import pytest
from _settings_doors import assert_held_as_given, assert_one_message

from aelastic import ConfigError, LaunchConfig
from aelastic.launcher._build import make_spec
from aelastic.workers._settings import PreloadSettings

from ._shared import LocalRendezvous


@pytest.mark.parametrize(
    ("values", "flags"),
    [
        ({"modules": ("torch optim",)}, ["--preload", "torch optim"]),
        ({"modules": "torch,1x"}, ["--preload", "torch,1x"]),
        ({"exclude": ("deep-speed",)}, ["--preload-exclude", "deep-speed"]),
    ],
)
def test_the_api_and_the_flags_refuse_a_name_with_one_message(
    values: dict[str, object], flags: list[str]
) -> None:
    """Both go through PreloadSettings' check: the same words, whichever door (the API
    once named ``LaunchConfig.preload`` where the command line named ``--preload``)."""
    message = assert_one_message(PreloadSettings, values, flags)
    assert message.startswith(f"{flags[0]}: ") and "is not a module name" in message, message


@pytest.mark.parametrize(
    "values", [{"modules": 3}, {"exclude": ("torch", None)}, {"modules": None}]
)
def test_values_of_the_wrong_kind_are_refused_when_made(values: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="need module names"):
        PreloadSettings(**values)  # type: ignore[arg-type]


def test_names_are_kept_as_one_tuple_in_order_without_repeats() -> None:
    settings = PreloadSettings(modules=" torch, auto,torch,, numpy ", exclude=["wave"])
    assert (settings.modules, settings.exclude) == (("torch", "auto", "numpy"), ("wave",))
    assert PreloadSettings() == PreloadSettings(modules=(), exclude="")


def test_launch_config_holds_one_settings_object_and_the_spec_gets_its_names() -> None:
    settings = PreloadSettings(modules=("auto", "torch"), exclude=("deepspeed",))
    assert_held_as_given("preload", settings)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, preload=settings)
    spec = make_spec(config, LocalRendezvous(), "/bin/true", ())
    assert (spec.preload, spec.preload_exclude) == (("auto", "torch"), ("deepspeed",))

"""The checks every settings object's tests share (``CheckpointSettings``,
``HangSettings``, ``PreloadSettings``, ...): the two doors, the command line and the
Python API, refuse a bad value with one message naming the flag, and ``LaunchConfig``
holds the frozen object as it was given."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from aelastic import ConfigError, LaunchConfig
from aelastic.launcher._args import UsageError, parse_run_args


def assert_one_message(
    settings_type: type, values: dict[str, Any], flags: list[str], flag: str | None = None
) -> str:
    """``settings_type(**values)`` and ``aelastic run FLAGS x.py`` fail with the same
    message, which starts with ``flag`` (default: the first of ``flags``); returns it."""
    with pytest.raises(ConfigError) as api:
        settings_type(**values)
    with pytest.raises(UsageError) as cli:
        parse_run_args([*flags, "x.py"], {})
    message = str(api.value)
    assert str(cli.value) == message, (cli.value, api.value)
    named = flag or flags[0]
    assert re.match(rf"{re.escape(named)}[ :]", message), message  # it names the flag
    return message


def assert_held_as_given(field: str, settings: Any) -> None:
    """``LaunchConfig(FIELD=settings)`` keeps that very object, which is frozen; the
    default is the settings type's own; anything else there is refused by name."""
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, **{field: settings})
    assert getattr(config, field) is settings
    first = dataclasses.fields(settings)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(settings, first, getattr(settings, first))
    default = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1)
    assert getattr(default, field) == type(settings)()
    name = type(settings).__name__
    with pytest.raises(ConfigError, match=rf"^{field}=.*: need an? .*{name}"):
        LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, **{field: {first: 1}})

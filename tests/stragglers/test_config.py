"""Bad straggler settings: one clear error each, from the command line and the API."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from aelastic import ConfigError, LaunchConfig, StragglerSettings
from aelastic.launcher._args import UsageError, build_parser, parse_run_args
from aelastic.launcher._cli import main


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--straggler-threshold", "1.2"], "--straggler-threshold 1.2: need a score strictly"),
        (["--straggler-threshold", "0"], "strictly between 0 and 1"),
        (["--straggler-threshold", "fast"], "--straggler-threshold 'fast': expected a number"),
        (["--straggler-window", "0"], "--straggler-window 0.0: need seconds > 0"),
        (["--straggler-action", "kill"], "choose one of report, exclude, off"),
        (
            ["--straggler-action", "exclude", "--rdzv-backend", "static", "--nnodes", "2"],
            "the static rendezvous backend has a fixed membership",
        ),
    ],
)
def test_bad_straggler_flags_exit_2_with_one_line(
    flags: list[str], needle: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    assert main([*flags, str(script)]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1, err
    assert lines[0].startswith("aelastic run: error: ") and needle in lines[0], lines[0]


@pytest.mark.parametrize(
    ("values", "flags"),
    [
        ({"threshold": 1.2}, ["--straggler-threshold", "1.2"]),
        ({"window": 0.0}, ["--straggler-window", "0"]),
        ({"min_duration": -1.0}, ["--straggler-min-duration", "-1"]),
        ({"warmup": -5.0}, ["--straggler-warmup", "-5"]),
        ({"action": "kill"}, ["--straggler-action", "kill"]),
    ],
)
def test_the_api_and_the_flags_refuse_a_value_with_one_message(
    values: dict[str, object], flags: list[str]
) -> None:
    """Both go through StragglerSettings' checks: the same words, whichever door."""
    with pytest.raises(ConfigError) as api:
        StragglerSettings(**values)  # type: ignore[arg-type]
    with pytest.raises(UsageError) as cli:
        parse_run_args([*flags, "x.py"], {})
    assert str(cli.value) == str(api.value), (cli.value, api.value)


def test_the_api_checks_what_meets_another_feature() -> None:
    with pytest.raises(ConfigError, match="--nnodes MIN:MAX to go on smaller"):
        LaunchConfig(
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=1,
            rdzv_backend="static",
            stragglers=StragglerSettings(action="exclude"),
        )
    with pytest.raises(ConfigError, match=r"stragglers=0\.8: need an aelastic\.StragglerSettings"):
        LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, stragglers=0.8)  # type: ignore[arg-type]


def test_defaults_are_the_settings_objects_everywhere() -> None:
    """The defaults are stated once, on StragglerSettings: the API's config, the parsed
    flags and the help text all show that object's values (read from it, not copied)."""
    defaults = {f.name: f.default for f in dataclasses.fields(StragglerSettings)}
    assert LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1).stragglers == (
        StragglerSettings()
    )
    assert parse_run_args(["x.py"], {}).config.stragglers == StragglerSettings(**defaults)
    helps = {a.option_strings[0]: a.help or "" for a in build_parser()._actions if a.option_strings}
    for name, value in defaults.items():
        shown = value if isinstance(value, str) else f"{value:g}"
        flag = "--straggler-" + name.replace("_", "-")
        assert helps[flag].endswith(f"(default: {shown})"), helps[flag]
    # a changed value reaches the config as the settings object the watch is given
    parsed = parse_run_args(["--straggler-threshold", "0.9", "x.py"], {})
    assert parsed.config.stragglers == StragglerSettings(threshold=0.9)


def test_status_table_shows_slow_ranks_and_slow_nodes() -> None:
    from aelastic.jobview._table import table

    def node(name: str, stragglers: object) -> dict[str, object]:
        return {
            "node": name,
            "state": "HEALTHY",
            "round": 1,
            "workers": [],
            "stragglers": stragglers,
        }

    view = {
        "run_id": "r",
        "round": 1,
        "nodes": [
            node("a", {"slow": None}),
            node("b", {"slow": {"ranks": {"3": 0.65}, "whole_node": False}}),
            node("c", {"slow": {"ranks": {"4": 0.6, "5": 0.58}, "whole_node": True}}),
            node("d", None),  # detection off
        ],
    }
    lines = table(view).splitlines()
    assert "SLOW" in lines[1]
    column = lines[1].index("SLOW")
    cells = [line[column:].split("  ")[0].strip() for line in lines[2:]]
    assert cells == ["-", "rank 3 0.65", "node 0.58", "-"], lines

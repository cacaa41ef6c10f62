"""Bad straggler settings: one clear error each, from the command line and the API."""

from __future__ import annotations

from pathlib import Path

import pytest

from aelastic import ConfigError, LaunchConfig
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


def test_the_api_checks_the_same() -> None:
    with pytest.raises(ConfigError, match="strictly between 0 and 1"):
        LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, straggler_threshold=2.0)
    with pytest.raises(ConfigError, match="--nnodes MIN:MAX to go on smaller"):
        LaunchConfig(
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=1,
            rdzv_backend="static",
            straggler_action="exclude",
        )
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1)
    assert (config.straggler_action, config.straggler_threshold) == ("report", 0.75)


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
